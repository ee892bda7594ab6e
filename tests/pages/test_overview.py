"""Overview page under AppTest: what a user sees on an empty and on a filled database."""

from __future__ import annotations

from datetime import timedelta

from lib.db import session_scope
from lib.models import EvaluationSnapshot, Judgment, SessionNote, utcnow


def _metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def test_empty_database_shows_how_to_get_data(app_engine, open_page) -> None:
    at = open_page("pages/overview.py")
    assert not at.exception
    assert any("database is empty" in i.value for i in at.info)
    assert _metric(at, "Evaluations") == "0"
    assert _metric(at, "Correction rate") == "—"


def test_counts_come_from_the_database(app_engine, open_page) -> None:
    now = utcnow()
    with session_scope(app_engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_a",
                question="q",
                model_answer="a",
                product="p1",
                evidence_count=4,
                evidence_highlighted=2,
                evidence_unlocated=1,
                evidence_unverified=1,
            )
        )
        s.add(
            EvaluationSnapshot(
                id="snap_b", question="q", model_answer="a", product="p2", deleted_at=now, status="archived"
            )
        )
        s.add(
            Judgment(
                change_id="snap_a:clarity",
                product="p1",
                metric="clarity",
                decision="4",
                user_decision="2",
                was_corrected=True,
                reviewed_at=now,
                reviewer="ayse",
            )
        )
        s.add(
            Judgment(
                change_id="snap_a:safety",
                product="p1",
                metric="safety",
                decision="5",
                user_decision="5",
                reviewed_at=now,
                reviewer="ayse",
            )
        )
        s.add(
            Judgment(
                change_id="snap_a:bias",
                product="p1",
                metric="bias",
                decision="5",
                second_opinion_action="validated",
            )
        )
        s.add(
            Judgment(change_id="gen:1", product="p1", decision="INCLUDE", second_opinion_action="questioned")
        )
        s.add(
            Judgment(change_id="gen:2", product="p1", decision="INCLUDE", second_opinion_action="unchanged")
        )
        s.add(
            SessionNote(
                note_type="TIP", content="<b>tip</b>", session_id="s1", timestamp=now - timedelta(hours=1)
            )
        )
    at = open_page("pages/overview.py")
    assert not at.exception
    assert _metric(at, "Evaluations") == "1"
    assert _metric(at, "Pending reviews") == "3"
    assert _metric(at, "Second-opinion agreement") == "50%"
    assert _metric(at, "Correction rate") == "50%"
    assert _metric(at, "Agreement rate") == "50%"
    assert _metric(at, "Evidence verified") == "75%"
    assert _metric(at, "Session notes") == "1"
    assert not at.info
