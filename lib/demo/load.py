"""Loading the demo: every part written in one transaction, once per database (or forced, idempotently)."""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlmodel import Session, col

from lib.auth import system_actor
from lib.db import session_scope
from lib.demo import versions
from lib.demo.evaluations import build_evaluations
from lib.demo.experiment import demo_experiment_id, run_demo_experiment
from lib.demo.inputs import DEMO_AUTHOR, demo_anchor
from lib.demo.notes import _note_ids, _write_relevance, build_notes, plan_relevance
from lib.demo.precedents import _write_precedents, build_precedents
from lib.demo.queues import write_team_queues
from lib.demo.reviews import _apply_reviews, _write_cache_judgments, build_cache_judgments, plan_reviews
from lib.importer import import_evaluations, import_metrics, import_notes
from lib.locks import PG_DEMO_LOCK, one_writer_at_a_time
from lib.models import EvaluationSnapshot, LessonTagRelevance, SessionAudit, TagRelevanceEvent


def _relevance_rows(session: Session) -> tuple[int, int]:
    """(tag score rows, tag history events) in the database."""
    scores = session.execute(select(func.count()).select_from(LessonTagRelevance)).scalar_one()
    events = session.execute(select(func.count()).select_from(TagRelevanceEvent)).scalar_one()
    return int(scores), int(events)


def _lock(session: Session) -> None:
    """Serialise demo loads: two app replicas starting on an empty PostgreSQL load it only once."""
    one_writer_at_a_time(session, PG_DEMO_LOCK)


def _has_evaluations(session: Session) -> bool:
    return session.execute(select(EvaluationSnapshot.id).limit(1)).first() is not None


def load_demo(*, engine: Engine, force: bool = False) -> dict[str, int]:
    """Load the demo data set; {} without writing when evaluations exist and `force` is False.

    Returns how many rows of each kind were added. Everything is written in one transaction.
    """
    evaluations = build_evaluations()
    reviews = plan_reviews(evaluations)
    cache_rows = build_cache_judgments()
    notes = build_notes()
    precedents = build_precedents()
    with session_scope(engine) as session:
        _lock(session)
        if not force and _has_evaluations(session):
            return {}
        counts: dict[str, int] = {}
        import_metrics(
            session=session,
            data=evaluations.metric_definitions,
            source="demo rubric",
            reviewer=system_actor(DEMO_AUTHOR),
        )
        versions.ensure_first_version(session)
        report = import_evaluations(
            session=session,
            records=versions.with_first_version(evaluations.records),
            source="demo",
            reviewer=system_actor(DEMO_AUTHOR),
        )
        counts["evaluations"] = report.inserted
        cache_added, cache_events = _write_cache_judgments(session, cache_rows)
        counts["judgments"] = report.judgments + cache_added
        counts["reviews"] = _apply_reviews(session, reviews) + cache_events

        note_report = import_notes(
            session=session, records=notes.records, source="demo notes", reviewer=system_actor(DEMO_AUTHOR)
        )
        counts["notes"] = note_report.inserted
        note_ids = _note_ids(session, notes.records)
        audit_ids = [s.session_id for s in notes.sessions]
        have_audits = session.execute(
            select(SessionAudit.id).where(col(SessionAudit.session_id).in_(audit_ids)).limit(1)
        ).first()
        counts["session audits"] = 0
        before = _relevance_rows(session)
        if not have_audits:
            plan = plan_relevance(notes, note_ids, evaluations)
            counts["session audits"] = _write_relevance(session, plan, demo_anchor())
        after = _relevance_rows(session)
        counts["tag scores"], counts["tag events"] = after[0] - before[0], after[1] - before[1]
        counts.update(_write_precedents(session, precedents))
    # After the commit: the experiment reads the demo through its own sessions, as the CLI does.
    counts["alignment experiments"] = 0 if demo_experiment_id(engine) is not None else 1
    run_demo_experiment(engine)
    # Last, over what the reviews left pending (the experiment above samples the single reviews).
    with session_scope(engine) as session:
        _lock(session)
        team = write_team_queues(session)
    counts["reviews"] += team.pop("queue decisions")
    counts.update(team)
    with session_scope(engine) as session:
        _lock(session)
        counts["judge verdicts"] = versions.write_later_versions(session)
    return counts
