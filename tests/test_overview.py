"""lib.overview: the Overview page's numbers and tables, on SQLite and PostgreSQL.

The page test (tests/pages/test_overview.py) checks what is shown; these check the figures themselves
against a small database whose every count is known.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib import overview
from lib.metrics import DEFAULT_METRICS, upsert_metric_definitions
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, SessionNote, utcnow

T0 = datetime(2024, 5, 1, 9, tzinfo=UTC)


def _snapshot(
    sid: str, product: str, *, hours: int, archived: bool = False, **evidence: int
) -> EvaluationSnapshot:
    return EvaluationSnapshot(
        id=sid,
        question="q",
        model_answer="a",
        product=product,
        created_at=T0 + timedelta(hours=hours),
        created_by="import",
        deleted_at=T0 + timedelta(days=1) if archived else None,
        status="archived" if archived else "active",
        evidence_count=evidence.get("count", 0),
        evidence_highlighted=evidence.get("highlighted", 0),
        evidence_unlocated=evidence.get("unlocated", 0),
        evidence_unverified=evidence.get("unverified", 0),
    )


def _judgment(
    cid: str, product: str, *, reviewed: bool = False, corrected: bool = False, opinion: str | None = None
) -> Judgment:
    return Judgment(
        change_id=cid,
        product=product,
        metric="clarity",
        decision="4",
        user_decision="2" if corrected else ("4" if reviewed else None),
        was_corrected=corrected,
        reviewed_at=T0 + timedelta(hours=5) if reviewed else None,
        reviewed_by="ayse" if reviewed else None,
        second_opinion_action=opinion,
        timestamp=T0,
    )


@pytest.fixture
def filled(engine: Engine) -> Engine:
    with Session(engine) as s:
        s.add(_snapshot("s1", "acme", hours=1, count=4, highlighted=2, unlocated=1, unverified=1))
        s.add(_snapshot("s2", "acme", hours=2, count=1, highlighted=1))
        s.add(_snapshot("s3", "beta", hours=3))
        # Archived: counted as archived only, its evidence and product left out.
        s.add(_snapshot("s4", "gamma", hours=4, archived=True, count=9, unverified=9))
        s.add(_judgment("a1", "acme", reviewed=True, corrected=True, opinion="validated"))
        s.add(_judgment("a2", "acme", reviewed=True, opinion="improved"))
        s.add(_judgment("a3", "acme", opinion="questioned"))
        s.add(_judgment("b1", "beta"))
        s.add(_judgment("b2", "beta", opinion="error"))  # a failed second opinion is not an opinion
        # A judgment of the archived evaluation: left out of every judgment figure (seed 002 AD-13).
        archived = _judgment("s4:clarity", "gamma", reviewed=True, corrected=True, opinion="validated")
        archived.snapshot_id = "s4"
        s.add(archived)
        s.commit()
        j = s.get(Judgment, 1)
        assert j is not None and j.id is not None
        s.add(
            JudgmentEvent(
                judgment_id=j.id, change_id=j.change_id, action="overruled", reviewer="ayse",
                at=T0 + timedelta(hours=10), from_decision="4", to_decision="2",
            )
        )  # fmt: skip
        for minutes, sid in ((1, "run1"), (2, "run1"), (3, "run2")):
            s.add(SessionNote(session_id=sid, note_type="TIP", content=f"tip {minutes}",
                              timestamp=T0 + timedelta(minutes=minutes)))  # fmt: skip
        s.commit()
    return engine


def test_overview_stats_count_every_figure(filled: Engine) -> None:
    with Session(filled) as s:
        stats = overview.overview_stats(session=s)
    assert (stats.evaluations, stats.archived, stats.products) == (3, 1, 2)
    assert (stats.judgments, stats.pending_reviews, stats.reviewed, stats.corrected) == (5, 3, 2, 1)
    assert stats.evidence_total == 5
    assert stats.evidence_by_state == {"highlighted": 3, "unlocated": 1, "unverified": 1}
    assert (stats.notes, stats.note_sessions) == (3, 2)
    assert stats.latest_note is not None and stats.latest_note.replace(tzinfo=UTC) == T0 + timedelta(
        minutes=3
    )
    assert (stats.second_opinions, stats.second_opinion_validated) == (3, 1)
    assert (stats.second_opinion_improved, stats.second_opinion_questioned) == (1, 1)
    assert stats.corrected_of_reviewed == 0.5 and stats.agreement_rate == 0.5
    assert stats.second_opinion_agreement == pytest.approx(1 / 3)
    assert stats.verification_rate == pytest.approx(4 / 5)


def test_an_empty_database_has_zeros_and_no_rates(engine: Engine) -> None:
    with Session(engine) as s:
        stats = overview.overview_stats(session=s)
    assert stats == overview.OverviewStats(
        evidence_by_state={"highlighted": 0, "unlocated": 0, "unverified": 0}
    )
    assert stats.corrected_of_reviewed is None and stats.agreement_rate is None
    assert stats.second_opinion_agreement is None and stats.verification_rate is None


def test_evidence_state_frame_has_a_row_per_state() -> None:
    stats = overview.OverviewStats(evidence_by_state={"highlighted": 3, "unlocated": 1, "unverified": 2})
    frame = overview.evidence_state_frame(stats)
    assert list(frame.columns) == ["state", "items"]
    assert list(frame["items"]) == [3, 1, 2]
    assert frame["state"].iloc[0] == "Verified, highlighted (exact, substring, anchor)"


def test_recent_activity_mixes_events_and_evaluations_newest_first(filled: Engine) -> None:
    with Session(filled) as s:
        frame = overview.recent_activity(session=s, limit=3)
    assert list(frame.columns) == ["when", "who", "what", "link"]
    assert list(frame["what"]) == [
        "overruled a1: 4 → 2",
        "new evaluation (beta): q",  # s4 is archived: not shown; titled by the question
        "new evaluation (acme): q",
    ]
    assert list(frame["who"]) == ["ayse", "import", "import"]
    # Each row links to what changed: a1 belongs to no evaluation, so to its judgment on Corrections.
    assert list(frame["link"]) == [
        "corrections?change_id=a1",
        "evaluations?snapshot=s3",
        "evaluations?snapshot=s2",
    ]


def test_recent_activity_links_a_review_to_its_evaluation_and_never_says_none(filled: Engine) -> None:
    with Session(filled) as s:
        judgment = s.exec(select(Judgment).where(Judgment.change_id == "a1")).one()
        judgment.snapshot_id = "s2"
        s.add(JudgmentEvent(judgment_id=judgment.id, change_id="a1", action="review", reviewer="zeynep",
                            at=utcnow(), from_decision=None, to_decision="3"))  # fmt: skip
        s.commit()
        frame = overview.recent_activity(session=s, limit=2)
    assert frame["what"].iloc[0] == "review a1: — → 3"
    assert list(frame["link"]) == ["evaluations?snapshot=s2", "evaluations?snapshot=s2"]


def test_recent_activity_of_an_empty_database_is_an_empty_table(engine: Engine) -> None:
    with Session(engine) as s:
        frame = overview.recent_activity(session=s)
    assert frame.empty and list(frame.columns) == ["when", "who", "what", "link"]


def test_metric_sets_list_each_rubric_then_the_default_set(engine: Engine) -> None:
    with Session(engine) as s:
        upsert_metric_definitions(
            s, [{"product": "bot", "slug": "tone", "display_name": "Tone", "min": 0, "max": 1}]
        )
        s.commit()
        frame = overview.metric_sets_frame(session=s)
    assert list(frame.columns) == ["product", "metric", "slug", "scale", "rubric"]
    assert list(frame["product"]) == ["bot"] + ["(default set)"] * len(DEFAULT_METRICS)
    assert list(frame["slug"]) == ["tone"] + [m.slug for m in DEFAULT_METRICS]


def test_per_product_frame_counts_live_evaluations_and_review_progress(filled: Engine) -> None:
    with Session(filled) as s:
        frame = overview.per_product_frame(session=s)
    rows = {r.product: r for r in frame.itertuples()}
    assert list(frame["product"]) == ["acme", "beta"]
    assert (rows["acme"].evaluations, rows["acme"].judgments, rows["acme"].pending) == (2, 3, 1)
    assert rows["acme"].corrected_of_reviewed == 0.5
    assert (rows["beta"].evaluations, rows["beta"].judgments, rows["beta"].pending) == (1, 2, 2)
    assert pd.isna(rows["beta"].corrected_of_reviewed)  # nothing reviewed: no rate, not 0%
    assert rows["beta"].link == "evaluations?product=beta"
