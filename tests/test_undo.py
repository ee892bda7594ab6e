"""Undo of a reviewer's own last decision (issue 15): the state before it comes back, a new "undone"
event is appended, optimistic locking and permissions hold — on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import select

from lib import corrections
from lib.auth import Actor, PermissionDenied
from lib.corrections import NothingToUndo, ReviewConflict
from lib.db import session_scope
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent


def judged(engine: Engine, change_id: str = "snap:clarity", decision: str = "4") -> int:
    """An unreviewed 1–5 judgment of a stored evaluation; returns its id."""
    snapshot_id = change_id.split(":")[0]
    with session_scope(engine) as s:
        if s.get(EvaluationSnapshot, snapshot_id) is None:
            s.add(EvaluationSnapshot(id=snapshot_id, question="Q?", model_answer="A.", product="acme"))
            s.flush()
        j = Judgment(
            change_id=change_id, product="acme", metric="clarity", snapshot_id=snapshot_id, decision=decision
        )
        s.add(j)
        s.flush()
        assert j.id is not None
        return j.id


def review(
    engine: Engine, jid: int, reviewer: str, score: int | None = None, reason: str | None = None
) -> Judgment:
    """Confirm (score None) or overrule with `score`, as of the stored version."""
    with session_scope(engine) as s:
        version = s.get(Judgment, jid).version  # type: ignore[union-attr]
        return corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=version,
            action="confirm" if score is None else "overrule",
            user_decision=score,
            reviewer=reviewer,
            reason=reason,
        )


def undo(engine: Engine, jid: int, reviewer: str | Actor, version: int | None = None) -> Judgment:
    with session_scope(engine) as s:
        seen = s.get(Judgment, jid).version if version is None else version  # type: ignore[union-attr]
        return corrections.undo_review(session=s, judgment_id=jid, expected_version=seen, reviewer=reviewer)


def state(engine: Engine, jid: int) -> tuple:
    with session_scope(engine, read_only=True) as s:
        j = s.get(Judgment, jid)
        assert j is not None
        return (
            j.user_decision,
            j.user_reasoning,
            j.reviewer,
            j.reviewed_at is not None,
            j.was_corrected,
            j.version,
        )


def trail(engine: Engine, jid: int) -> list[tuple[str, str, str | None, str | None]]:
    with session_scope(engine, read_only=True) as s:
        return [
            (e.action, e.reviewer, e.from_decision, e.to_decision)
            for e in s.exec(
                select(JudgmentEvent).where(JudgmentEvent.judgment_id == jid).order_by(JudgmentEvent.id)
            )
        ]


def test_undoing_a_first_decision_makes_the_judgment_unreviewed_again_with_a_new_event(engine) -> None:
    jid = judged(engine)
    review(engine, jid, "ayse", 2, "rambles")
    undone = undo(engine, jid, "ayse")
    assert (undone.user_decision, undone.version) == (None, 3)
    assert state(engine, jid) == (None, None, None, False, False, 3)
    assert trail(engine, jid) == [("overruled", "ayse", "4", "2"), ("undone", "ayse", "2", None)]


def test_undo_restores_the_earlier_decision_with_its_reason_and_reviewer(engine) -> None:
    jid = judged(engine)
    review(engine, jid, "bob", 1, "bob's view")
    review(engine, jid, "ayse")  # ayse confirms the judge over bob's overrule
    undo(engine, jid, "ayse")
    assert state(engine, jid) == ("1", "bob's view", "bob", True, True, 4)
    assert [a for a, *_ in trail(engine, jid)] == ["overruled", "confirmed", "undone"]


@pytest.mark.pg_repeats(
    "statements and lines of test_undoable_reviews_lists_the_reviewers_decisions_still_in_force_newest_first"
)
def test_a_decision_after_an_undo_is_undone_back_to_the_state_before_both(engine) -> None:
    jid = judged(engine)
    review(engine, jid, "ayse", 2, "first")
    undo(engine, jid, "ayse")
    review(engine, jid, "ayse", 3, "second")
    undo(engine, jid, "ayse")
    assert state(engine, jid)[:3] == (None, None, None)
    assert len(trail(engine, jid)) == 4  # nothing deleted


@pytest.mark.pg_repeats(
    "statements and lines of test_undoable_reviews_lists_the_reviewers_decisions_still_in_force_newest_first"
)
def test_only_your_own_latest_decision_can_be_undone(engine) -> None:
    jid = judged(engine)
    review(engine, jid, "bob", 1, "bob's view")
    with pytest.raises(NothingToUndo, match="not a decision of yours"):
        undo(engine, jid, "ayse")
    undo(engine, jid, "bob")
    with pytest.raises(NothingToUndo):  # an undo is not itself undone by pressing undo again
        undo(engine, jid, "bob")
    assert [a for a, *_ in trail(engine, jid)] == ["overruled", "undone"]


def test_undo_against_a_moved_version_is_a_conflict_and_changes_nothing(engine) -> None:
    jid = judged(engine)
    review(engine, jid, "ayse", 2, "mine")  # version 2
    review(engine, jid, "bob")  # version 3: bob confirmed meanwhile
    with pytest.raises(ReviewConflict) as info:
        undo(engine, jid, "ayse", version=2)
    assert "bob" in info.value.describe() and "Not saved" in info.value.describe()
    assert state(engine, jid)[2] == "bob" and len(trail(engine, jid)) == 2


@pytest.mark.pg_repeats(
    "statements and lines of test_undo_against_a_moved_version_is_a_conflict_and_changes_nothing"
)
def test_a_viewer_cannot_undo(engine) -> None:
    jid = judged(engine)
    review(engine, jid, "ayse", 2, "mine")
    with pytest.raises(PermissionDenied):
        undo(engine, jid, Actor(identity="ayse", role="viewer"))
    assert state(engine, jid)[0] == "2"


def test_undoable_reviews_lists_the_reviewers_decisions_still_in_force_newest_first(engine) -> None:
    first, second, third = judged(engine, "s:a"), judged(engine, "s:b"), judged(engine, "s:c")
    review(engine, first, "ayse")
    review(engine, second, "ayse", 1, "r")
    review(engine, third, "ayse")
    review(engine, third, "bob", 2, "changed since")  # ayse's decision on `third` is no longer the latest
    with session_scope(engine, read_only=True) as s:
        listed = corrections.undoable_reviews(session=s, reviewer="ayse")
        assert [(e.judgment_id, e.action) for e in listed] == [(second, "overruled"), (first, "confirmed")]
        assert corrections.undoable_reviews(session=s, reviewer="ayse", limit=1)[0].judgment_id == second
        assert corrections.undoable_reviews(session=s, reviewer="nobody") == []
    undo(engine, second, "ayse")
    with session_scope(engine, read_only=True) as s:
        assert [e.judgment_id for e in corrections.undoable_reviews(session=s, reviewer="ayse")] == [first]
