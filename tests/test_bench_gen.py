"""bench/gen.py: deterministic rows whatever process builds them, and a database a full recount agrees with."""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, text
from sqlmodel import Session, col, select

from bench import gen
from lib import corrections, counters, importer
from lib.db import create_db_engine
from lib.models import NOTE_TYPES, EvaluationSnapshot, Judgment, JudgmentEvent, SessionNote
from lib.search import text_match
from tests.conftest import sqlite_only

# Small, but several batches (so forked workers really share the build) and every kind of row.
SIZE = {"judgments": 1_200, "snapshots": 120, "notes": 7, "batch": 40}
TABLES = ("evaluation_snapshots", "judgments", "judgment_events", "session_notes", "metric_scores")
DERIVED = (
    "product_counts", "judgment_day_counts", "judgment_language_counts", "agreement_counts", "agreement_totals",
)  # fmt: skip


def _rows(engine: Engine, tables: tuple[str, ...]) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        return {
            t: sorted(map(tuple, conn.execute(text(f"SELECT * FROM {t}")).all()), key=repr) for t in tables
        }


def _copy(engine: Engine, tmp_path: Path, name: str) -> Engine:
    """A second migrated SQLite file next to the fixture's (same schema, no Alembic run)."""
    target = tmp_path / name
    shutil.copyfile(engine.url.database or "", target)
    return create_db_engine(f"sqlite:///{target}")


@sqlite_only
def test_the_same_seed_builds_the_same_rows_in_one_process_or_in_workers(
    engine: Engine, tmp_path: Path
) -> None:
    others = [_copy(engine, tmp_path, f"{n}.db") for n in ("workers", "seed1")]
    try:
        counts = gen.generate(engine, seed=0, workers=0, **SIZE)
        assert gen.generate(others[0], seed=0, workers=2, **SIZE) == counts
        gen.generate(others[1], seed=1, workers=2, **SIZE)
        here, forked, other_seed = (_rows(e, (*TABLES, *DERIVED)) for e in (engine, *others))
    finally:
        for other in others:
            other.dispose()
    assert counts == {
        "snapshots": 120, "judgments": 1_200, "events": len(here["judgment_events"]), "notes": 7,
        "scores": len(here["metric_scores"]),
    }  # fmt: skip
    assert len(here["judgments"]) == 1_200 and len(here["session_notes"]) == 7
    assert here == forked
    assert here["evaluation_snapshots"] != other_seed["evaluation_snapshots"]
    ids = [row[0] for row in here["evaluation_snapshots"]]
    assert ids == [f"snap_{i:07d}" for i in range(120)]  # batches cover every number once


def test_a_generated_database_is_what_a_full_recount_gives(engine: Engine) -> None:
    """Score rows written during the load, the search index built after it and the counters all
    equal what lib's rebuilds compute from the stored rows; the search trigger is back afterwards."""
    gen.generate(engine, seed=3, workers=2, **SIZE)
    built = _rows(engine, (*DERIVED, "metric_scores"))
    with engine.connect() as conn:
        snapshot_counts = conn.execute(
            text("SELECT id, judgments_total, judgments_reviewed, judged_metrics FROM evaluation_snapshots")
        ).all()
    assert sum(len(rows) for rows in built.values()) > 100
    assert any(total == 8 for _id, total, _r, _m in snapshot_counts)
    with Session(engine) as s:
        counters.recount(session=s)
        s.commit()
    assert _rows(engine, (*DERIVED, "metric_scores")) == built
    with engine.connect() as conn:
        assert (
            conn.execute(
                text(
                    "SELECT id, judgments_total, judgments_reviewed, judged_metrics FROM evaluation_snapshots"
                )
            ).all()
            == snapshot_counts
        )
    if engine.dialect.name != "sqlite":
        return
    with engine.begin() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
        conn.exec_driver_sql(
            "INSERT INTO session_notes_search(session_notes_search) VALUES ('integrity-check')"
        )
        # The evaluations' index holds the live rows, every one of them (lib.search.INDEX_LEAVES_OUT).
        indexed = conn.exec_driver_sql(
            "SELECT rowid FROM evaluation_snapshots_search WHERE evaluation_snapshots_search MATCH '\"(case\"' "
            "ORDER BY rowid"
        ).all()
        live = conn.exec_driver_sql(
            "SELECT rowid FROM evaluation_snapshots WHERE deleted_at IS NULL ORDER BY rowid"
        ).all()
        archived = conn.exec_driver_sql(
            "SELECT count(*) FROM evaluation_snapshots WHERE deleted_at IS NOT NULL"
        )
        assert archived.scalar_one() > 0  # the seed archives some: the index must leave them out
        assert indexed == live
    record = {
        "question": "Which giraffe crossing?", "model_answer": "That one.", "product": gen.PRODUCTS[0],
        "user_scores": {"clarity": 4}, "judge_scores": {"clarity": 3},
    }  # fmt: skip
    with Session(engine) as s:  # imported after the build: indexed by the restored insert trigger
        importer.import_evaluations(session=s, records=[record])
        s.commit()
    snapshots = EvaluationSnapshot.__table__  # type: ignore[attr-defined]
    with engine.connect() as conn:
        found = conn.execute(snapshots.select().where(text_match(snapshots, "(case 117)"))).all()
        assert [row.id for row in found] == ["snap_0000117"]
        found = conn.execute(snapshots.select().where(text_match(snapshots, "GIRAFFE"))).all()
        assert [row.question for row in found] == [record["question"]]


def test_the_audit_trail_is_the_one_the_app_writes(engine: Engine) -> None:
    """Every judgment's events replay to its stored review state and version (reviews, undos, a
    decision replaced by another reviewer), code-review judgments carry the importer's events, and
    an undo in the app takes back a generated decision as it would one made in the app."""
    gen.generate(engine, seed=5, workers=0, **SIZE)
    with Session(engine) as s:
        judgments = {j.id: j for j in s.exec(select(Judgment)).all()}
        trails: dict[int, list[JudgmentEvent]] = {}
        for event in s.exec(select(JudgmentEvent).order_by(col(JudgmentEvent.id))).all():
            trails.setdefault(event.judgment_id, []).append(event)
    assert sorted(judgments) == list(range(1, 1_201))  # ids given by the generator, in batch order
    shapes: Counter[str] = Counter()
    for judgment_id, judgment in judgments.items():
        events = trails.get(judgment_id, [])
        stack = corrections._review_stack(events)
        if judgment.snapshot_id is None:
            assert events[0].action == "imported"
        if judgment.reviewed_at is None:
            assert stack == []
        else:
            last = stack[-1]
            assert (last.to_decision, last.reviewer) == (judgment.user_decision, judgment.reviewer)
            # The importer's events are dated by the import, the app's by the review itself.
            assert judgment.snapshot_id is None or last.at == judgment.reviewed_at
            assert last.action == ("overruled" if judgment.was_corrected else "confirmed")
        assert [e.version for e in events][-1:] == ([judgment.version] if events else [])
        assert [e.at for e in events] == sorted(e.at for e in events)
        shapes[" ".join(e.action for e in events if e.action != "imported")] += 1
    undone = [k for k in shapes if "undone" in k]
    assert any(k.endswith("undone") for k in undone) and any(not k.endswith("undone") for k in undone)
    assert any(len(k.split()) == 2 and "undone" not in k for k in shapes), shapes  # replaced decisions
    replaced = next(
        j for j in judgments.values()
        if [e.action for e in trails.get(j.id or 0, [])][-2:] in (["confirmed"] * 2, ["overruled"] * 2,
                                                                   ["confirmed", "overruled"], ["overruled", "confirmed"])
    )  # fmt: skip
    assert replaced.id is not None and replaced.reviewer is not None
    earlier = trails[replaced.id][-2]
    with Session(engine) as s:
        after = corrections.undo_review(
            session=s, judgment_id=replaced.id, expected_version=replaced.version, reviewer=replaced.reviewer
        )
        assert (after.user_decision, after.reviewer) == (earlier.to_decision, earlier.reviewer)
        s.commit()


def test_a_notes_database_has_every_type_up_to_its_last_moment(engine: Engine) -> None:
    """`--notes`: ten notes a session, all five types, "refund" in about a quarter, from 2025 up to
    `notes_until` (so the Notes page's age filters keep notes); the plain notes stay four types over 2025."""
    until = datetime(2026, 11, 27, 21, 0, tzinfo=UTC)
    gen.generate(engine, judgments=100, snapshots=10, notes=400, notes_until=until, seed=0, workers=0)
    with Session(engine) as s:
        found = s.exec(select(SessionNote)).all()
    assert len(found) == 400 and len({n.session_id for n in found}) == 40
    assert Counter(n.note_type for n in found) == dict.fromkeys(NOTE_TYPES, 80)
    assert {n.language for n in found} == {"en", "tr"}
    assert 60 <= sum("refund" in n.content for n in found) <= 140
    stamps = sorted(n.timestamp.replace(tzinfo=UTC) for n in found)
    assert stamps[0] >= gen.START and stamps[-1] <= until and stamps[-1].year == 2026
    assert sum(s > until - timedelta(days=60) for s in stamps) > 0
