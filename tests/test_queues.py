"""Team review queues (issue 26): creation over filters, reservations with leases, several
reviewers per item, blind-first, resolution through the one review write, adjudication, undo,
progress and permissions — on SQLite and PostgreSQL."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import pytest
from sqlalchemy import Engine, event, text
from sqlmodel import Session, col, select

from lib import corrections, counters, queues, review_queue
from lib.auth import Actor, PermissionDenied
from lib.config import reset_settings
from lib.db import session_scope
from lib.models import (
    EvaluationSnapshot,
    Judgment,
    JudgmentEvent,
    MetricDefinition,
    ReviewAssignment,
    ReviewLabel,
    ReviewQueueItem,
    ReviewQueueJudgment,
)
from lib.queues import LabelInput, QueueSpec
from lib.review_queue import QueueFilter
from tests.conftest import sqlite_only
from tests.test_review_queue import evaluation, standalone

T0 = datetime(2024, 3, 1, tzinfo=UTC)
NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
LEAD = Actor(identity="lead", role="lead")


def items(
    engine: Engine, n: int, *, product: str = "acme", metrics: tuple[str, ...] = ("clarity", "truthfulness")
) -> None:
    for i in range(n):
        evaluation(engine, f"{product}-{i:03d}", hours=i, product=product, metrics=metrics)


def create(engine: Engine, **spec) -> int:
    spec.setdefault("name", "team")
    with session_scope(engine) as s:
        queue = queues.create_queue(session=s, actor=LEAD, spec=QueueSpec(**spec))
        assert queue.id is not None
        return queue.id


def take(engine: Engine, queue_id: int, reviewer: str, now: datetime = NOW) -> queues.Assignment | None:
    with session_scope(engine) as s:
        return queues.next_assignment(session=s, queue_id=queue_id, reviewer=reviewer, now=now)


def judgments_of(engine: Engine, queue_id: int, item_id: int) -> list[Judgment]:
    with session_scope(engine, read_only=True) as s:
        ids = s.exec(
            select(ReviewQueueJudgment.judgment_id).where(ReviewQueueJudgment.item_id == item_id)
        ).all()
        return list(
            s.exec(select(Judgment).where(col(Judgment.id).in_(ids)).order_by(col(Judgment.id))).all()
        )


def label_all(
    engine: Engine, queue_id: int, item_id: int, reviewer: str, decision: str, reason: str | None = "why",
    now: datetime = NOW,
) -> queues.LabelOutcome:  # fmt: skip
    given = [LabelInput(j.id or 0, decision, reason) for j in judgments_of(engine, queue_id, item_id)]
    with session_scope(engine) as s:
        return queues.label_item(
            session=s, queue_id=queue_id, item_id=item_id, reviewer=reviewer, labels=given, now=now
        )


def judgment(engine: Engine, change_id: str) -> Judgment:
    with session_scope(engine, read_only=True) as s:
        found = corrections.get_judgment(session=s, change_id=change_id)
        assert found is not None
        return found


# ---------------------------------------------------------------------------------------------
# Creation


def test_a_queue_freezes_the_oldest_items_of_its_filter_and_holds_their_judgments(engine: Engine) -> None:
    items(engine, 5)
    evaluation(engine, "beta-0", hours=0, product="beta")
    queue_id = create(engine, product="acme", size=3, metrics=("clarity",))
    with session_scope(engine, read_only=True) as s:
        queue = queues.get_queue(session=s, queue=queue_id)
        rows = s.exec(select(ReviewQueueItem).order_by(col(ReviewQueueItem.position))).all()
        held = s.exec(select(ReviewQueueJudgment.judgment_id)).all()
        held_ids = {j.change_id for j in s.exec(select(Judgment).where(col(Judgment.id).in_(held))).all()}
    assert (queue.items, queue.judgments) == (3, 3)
    assert [r.item_key for r in rows] == ["snapshot:acme-000", "snapshot:acme-001", "snapshot:acme-002"]
    assert held_ids == {"acme-000:clarity", "acme-001:clarity", "acme-002:clarity"}
    # The default queue hands out what no team queue holds: the truthfulness judgments of the same evaluations.
    with session_scope(engine, read_only=True) as s:
        item = review_queue.next_item(session=s, filters=QueueFilter(product="acme"))
        assert item is not None and item.key == "snapshot:acme-000"
        assert [j.metric for j in item.judgments] == ["truthfulness"]


@pytest.mark.pg_repeats("statements and lines of test_a_link_to_an_item_reserves_it_or_says_it_is_taken")
def test_a_second_queue_leaves_out_judgments_another_queue_holds(engine: Engine) -> None:
    items(engine, 4)
    create(engine, name="first", size=2)
    second = create(engine, name="second", size=10)
    with session_scope(engine, read_only=True) as s:
        keys = s.exec(select(ReviewQueueItem.item_key).where(ReviewQueueItem.queue_id == second)).all()
    assert sorted(keys) == ["snapshot:acme-002", "snapshot:acme-003"]
    with pytest.raises(queues.QueueError, match="no judgments match"):
        create(engine, name="third")


@pytest.mark.parametrize("order", ["largest_gap", "random"])
def test_largest_gap_and_seeded_random_orders(engine: Engine, order: str) -> None:
    for i, gap in enumerate([0.5, None, 3.0, 1.0]):
        evaluation(engine, f"e{i}", hours=i, gap=gap)
    standalone(engine, "pr#1", hours=9)
    queue_id = create(engine, size=4, order=order, seed=7)
    with session_scope(engine, read_only=True) as s:
        keys = s.exec(
            select(ReviewQueueItem.item_key)
            .where(ReviewQueueItem.queue_id == queue_id)
            .order_by(col(ReviewQueueItem.position))
        ).all()
    if order == "largest_gap":  # evaluations by their largest gap, then the rest oldest first
        assert keys == ["snapshot:e2", "snapshot:e3", "snapshot:e0", "snapshot:e1"]
    else:  # the same seed over the same data: the same sample in the same order, on either backend
        assert keys == _sample(engine, 7, 4)


def _sample(engine: Engine, seed: int, size: int) -> list[str]:
    with session_scope(engine, read_only=True) as s:
        rows = s.exec(select(Judgment.id, Judgment.snapshot_id)).all()
    every = sorted({f"snapshot:{sid}" if sid else f"judgment:{jid}" for jid, sid in rows})
    return random.Random(seed).sample(every, size)


@sqlite_only
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"name": " "}, "name the queue"),
        ({"size": 0}, "size"),
        ({"overlap": 0}, "overlap"),
        ({"order": "newest"}, "unknown order"),
        ({"mode": "sealed"}, "unknown mode"),
        ({"review_state": "maybe"}, "unknown review state"),
        ({"tolerance": -1.0}, "tolerance"),
        ({"overlap": 3, "reviewers": ("a", "b")}, "only 2 are assigned"),
        ({"since": date(2024, 5, 2), "until": date(2024, 5, 1)}, "date range is empty"),
    ],
)
def test_a_wrong_spec_is_refused_and_writes_nothing(engine: Engine, spec: dict, message: str) -> None:
    items(engine, 1)
    with pytest.raises(queues.QueueError, match=message):
        create(engine, **spec)
    with session_scope(engine, read_only=True) as s:
        assert s.exec(select(ReviewQueueItem)).first() is None


@pytest.mark.pg_repeats(
    "statements and lines of test_a_lapsed_lease_returns_the_item_and_its_holder_can_no_longer_label_it"
)
def test_a_queue_name_is_unique(engine: Engine) -> None:
    items(engine, 2)
    create(engine, name="Team A", size=1)
    with pytest.raises(queues.QueueError, match="exists"):
        create(engine, name="Team A", size=1)


def test_the_date_range_and_review_state_filters(engine: Engine) -> None:
    items(engine, 4)  # judged at T0 + 0..3 hours
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="acme-003:clarity", user_decision="3", reviewer="x"
        )
    reviewed = create(engine, name="reviewed", review_state="reviewed")
    ranged = create(engine, name="ranged", since=T0 + timedelta(hours=1), until=T0 + timedelta(hours=3))
    with session_scope(engine, read_only=True) as s:
        got = {
            q: sorted(s.exec(select(ReviewQueueItem.item_key).where(ReviewQueueItem.queue_id == q)).all())
            for q in (reviewed, ranged)
        }
    assert got[reviewed] == ["snapshot:acme-003"]
    assert got[ranged] == ["snapshot:acme-001", "snapshot:acme-002"]


# ---------------------------------------------------------------------------------------------
# Reservations


@pytest.mark.pg_repeats(
    "statements and lines of test_continuous_labels_agree_within_the_tolerance_and_their_mean_decides"
)
def test_overlap_two_gives_each_item_to_two_reviewers_and_never_twice_to_one(engine: Engine) -> None:
    items(engine, 3)
    queue_id = create(engine, overlap=2)
    a, b, c = (take(engine, queue_id, name) for name in ("ana", "ben", "cem"))
    assert a and b and c
    assert (a.position, b.position, c.position) == (1, 1, 2)
    # A reload (the same call again) gives the held item back, with its lease renewed.
    again = take(engine, queue_id, "ana", now=NOW + timedelta(minutes=5))
    assert again is not None and again.item_id == a.item_id and again.expires_at > a.expires_at
    label_all(engine, queue_id, a.item_id, "ana", "3")
    nxt = take(engine, queue_id, "ana")
    assert nxt is not None and nxt.position == 2  # never item 1 again for ana


@pytest.mark.pg_repeats("statements and lines of test_a_link_to_an_item_reserves_it_or_says_it_is_taken")
def test_overlap_one_hands_two_reviewers_different_items(engine: Engine) -> None:
    items(engine, 2)
    queue_id = create(engine)
    a, b = take(engine, queue_id, "ana"), take(engine, queue_id, "ben")
    assert a and b and a.item_id != b.item_id
    assert take(engine, queue_id, "cem") is None


def test_a_lapsed_lease_returns_the_item_and_its_holder_can_no_longer_label_it(engine: Engine) -> None:
    items(engine, 1)
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    assert take(engine, queue_id, "ben", now=NOW + timedelta(minutes=14)) is None
    later = NOW + timedelta(minutes=16)  # the default lease is 15 minutes
    b = take(engine, queue_id, "ben", now=later)
    assert b is not None and b.item_id == a.item_id
    with pytest.raises(queues.ItemTaken, match="went to other reviewers"):
        label_all(engine, queue_id, a.item_id, "ana", "3", now=later)
    with session_scope(engine, read_only=True) as s:
        statuses = dict(s.exec(select(ReviewAssignment.reviewer, ReviewAssignment.status)).all())
    assert statuses == {"ana": "expired", "ben": "reserved"}


@pytest.mark.pg_repeats(
    "statements and lines of test_a_lapsed_lease_returns_the_item_and_its_holder_can_no_longer_label_it"
)
def test_the_lease_follows_the_setting(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_RESERVATION_MINUTES", "2")
    reset_settings()
    items(engine, 1)
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None and a.expires_at == NOW + timedelta(minutes=2)
    assert take(engine, queue_id, "ben", now=NOW + timedelta(minutes=3)) is not None


@pytest.mark.pg_repeats(
    "statements and lines of test_random_queue_work_leaves_counters_history_and_queue_state_equal_to_a_recount"
)
def test_a_lapsed_lease_nobody_needed_stays_with_its_reviewer(engine: Engine) -> None:
    items(engine, 1)
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    back = take(engine, queue_id, "ana", now=NOW + timedelta(hours=3))
    assert back is not None and back.item_id == a.item_id
    outcome = label_all(engine, queue_id, a.item_id, "ana", "3", now=NOW + timedelta(hours=3))
    assert outcome.item_done


def test_skipped_items_go_to_others_and_come_back_on_request(engine: Engine) -> None:
    items(engine, 2)
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    with session_scope(engine) as s:
        queues.skip_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana", now=NOW)
    second = take(engine, queue_id, "ana")
    assert second is not None and second.position == 2
    b = take(engine, queue_id, "ben")
    assert b is not None and b.item_id == a.item_id  # the skipped item went to someone else
    with session_scope(engine, read_only=True) as s:
        assert queues.skipped_items(session=s, queue_id=queue_id, reviewer="ana") == [a.item_id]
    with session_scope(engine) as s:
        assert queues.bring_back_skipped(session=s, queue_id=queue_id, reviewer="ana") == 1


def test_a_link_to_an_item_reserves_it_or_says_it_is_taken(engine: Engine) -> None:
    items(engine, 2)
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    with session_scope(engine) as s, pytest.raises(queues.ItemTaken, match="reviewer"):
        queues.open_assignment(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ben", now=NOW)
    with session_scope(engine, read_only=True) as s:
        other = s.exec(select(ReviewQueueItem.id).where(ReviewQueueItem.position == 2)).one()
    with session_scope(engine) as s:
        moved = queues.open_assignment(session=s, queue_id=queue_id, item_id=other, reviewer="ana", now=NOW)
    assert moved.position == 2
    # Ana let go of item 1: Ben gets it.
    b = take(engine, queue_id, "ben")
    assert b is not None and b.item_id == a.item_id


@pytest.mark.pg_repeats(
    "statements and lines of test_random_queue_work_leaves_counters_history_and_queue_state_equal_to_a_recount"
)
def test_the_draft_lives_in_the_database(engine: Engine) -> None:
    items(engine, 1)
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    with session_scope(engine) as s:
        queues.save_draft(
            session=s,
            queue_id=queue_id,
            item_id=a.item_id,
            reviewer="ana",
            draft={"1": {"decision": "4", "reason": "typo"}},
        )
    again = take(engine, queue_id, "ana")
    assert again is not None and again.draft == {"1": {"decision": "4", "reason": "typo"}}


# ---------------------------------------------------------------------------------------------
# Labels, resolution, adjudication


def test_agreeing_labels_resolve_through_the_one_review_write(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine, overlap=2)
    a, b = take(engine, queue_id, "ana"), take(engine, queue_id, "ben")
    assert a and b
    first = label_all(engine, queue_id, a.item_id, "ana", "4", "too kind")
    assert first.item_done and first.states == {judgment(engine, "acme-000:clarity").id: "open"}
    assert judgment(engine, "acme-000:clarity").user_decision is None  # one label is not a decision
    second = label_all(engine, queue_id, b.item_id, "ben", "4", "misses a point")
    assert set(second.states.values()) == {"resolved"}
    j = judgment(engine, "acme-000:clarity")
    assert (j.user_decision, j.was_corrected, j.reviewer) == ("4", True, "ben")
    assert j.user_reasoning == "too kind | misses a point"
    with session_scope(engine, read_only=True) as s:
        events = corrections.events_for(session=s, judgment_id=j.id or 0)
        totals = counters.judgment_totals(session=s, product="acme")
    assert [(e.action, e.queue_id) for e in events] == [("overruled", queue_id)]
    assert (totals.reviewed, totals.corrected) == (1, 1)
    # The resolved judgment is no longer held: it is free for another queue.
    with session_scope(engine, read_only=True) as s:
        assert s.exec(select(ReviewQueueJudgment.held)).one() is False


# Statements a reviewer's step may send (issue 30: the label write path cost the suite and every
# user's save ~45 statements a label). Counted on the second label of a two-metric item that
# settles both judgments (one moves the evaluation's review state); a change that adds one fails
# here: find the statement it repeats instead of raising the bound.
STATEMENT_BUDGET = {
    "sqlite": {"next": 10, "first label": 14, "settling label": 46},
    # PostgreSQL: no BEGIN statement; the review lock once a transaction, taken before the first
    # judgment's row (lib.locks, lib.queues._write_decision), and one row lock of its evaluation
    # before each review recomputes its `reviewer_decisions` (lib.counters._bump_snapshot: a
    # recompute must start after a concurrent writer committed).
    # The review lock is per product (lib.locks.one_writer_per_product, review15 F3): each judgment's
    # product is read with its lock, so a settlement of two judgments sends that statement twice.
    "postgresql": {"next": 9, "first label": 13, "settling label": 49},
}


def test_a_label_sends_no_more_statements_than_its_budget(engine: Engine) -> None:
    items(engine, 1)
    queue_id = create(engine, overlap=2)
    sent: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        sent.append(statement)

    with session_scope(engine, read_only=True) as s:
        item_id = s.exec(select(ReviewQueueItem.id)).one()
    given = [LabelInput(j.id or 0, "4", "too kind") for j in judgments_of(engine, queue_id, item_id)]
    steps: dict[str, int] = {}

    def label(reviewer: str) -> queues.LabelOutcome:
        with session_scope(engine) as s:
            return queues.label_item(
                session=s, queue_id=queue_id, item_id=item_id, reviewer=reviewer, labels=given
            )

    event.listen(engine, "before_cursor_execute", count)
    try:
        for step, run in (
            ("next", lambda: take(engine, queue_id, "ana")),
            ("other", lambda: take(engine, queue_id, "ben")),
            ("first label", lambda: label("ana")),
            ("settling label", lambda: label("ben")),
        ):
            sent.clear()
            outcome = run()
            steps[step] = len(sent)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    del steps["other"]
    assert isinstance(outcome, queues.LabelOutcome) and set(outcome.states.values()) == {"resolved"}
    with session_scope(engine, read_only=True) as s:
        assert s.exec(select(EvaluationSnapshot.judgments_reviewed)).one() == 2
    budget = STATEMENT_BUDGET[engine.dialect.name]
    assert all(steps[k] <= budget[k] for k in budget), f"{steps} exceeds {budget}"


@pytest.mark.pg_repeats(
    "statements and lines of test_random_queue_work_leaves_counters_history_and_queue_state_equal_to_a_recount"
)
def test_disagreeing_labels_wait_for_a_lead_who_decides(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine, overlap=2)
    a, b = take(engine, queue_id, "ana"), take(engine, queue_id, "ben")
    assert a and b
    label_all(engine, queue_id, a.item_id, "ana", "3", None)
    outcome = label_all(engine, queue_id, b.item_id, "ben", "5", "clear enough")
    assert set(outcome.states.values()) == {"disputed"}
    j = judgment(engine, "acme-000:clarity")
    assert j.user_decision is None and j.reviewed_at is None
    with session_scope(engine, read_only=True) as s:
        [dispute] = queues.disputes(session=s, queue_id=queue_id)
        progress = queues.queue_progress(session=s, queue_id=queue_id, now=NOW)
    assert [(lv.reviewer, lv.decision, lv.reason) for lv in dispute.labels] == [
        ("ana", "3", None),
        ("ben", "5", "clear enough"),
    ]
    assert (progress.items_done, progress.disputed, progress.resolved) == (1, 1, 0)
    with session_scope(engine) as s, pytest.raises(PermissionDenied):
        queues.adjudicate(
            session=s, queue_id=queue_id, judgment_id=j.id or 0, actor=Actor("ben", "reviewer"), decision="5"
        )
    with session_scope(engine) as s, pytest.raises(corrections.InvalidDecision, match="reason"):
        queues.adjudicate(session=s, queue_id=queue_id, judgment_id=j.id or 0, actor=LEAD, decision="5")
    with session_scope(engine) as s:
        queues.adjudicate(
            session=s,
            queue_id=queue_id,
            judgment_id=j.id or 0,
            actor=LEAD,
            decision="5",
            reason="ben is right",
        )
    j = judgment(engine, "acme-000:clarity")
    assert (j.user_decision, j.reviewer, j.user_reasoning) == ("5", "lead", "ben is right")
    # The lead takes it back: disputed again, the judgment unreviewed again.
    with session_scope(engine) as s:
        queues.undo_adjudication(session=s, queue_id=queue_id, judgment_id=j.id or 0, actor=LEAD)
    assert judgment(engine, "acme-000:clarity").reviewed_at is None
    with session_scope(engine, read_only=True) as s:
        assert queues.queue_progress(session=s, queue_id=queue_id, now=NOW).disputed == 1


def test_overlap_one_resolves_at_once_like_a_review(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    outcome = label_all(engine, queue_id, a.item_id, "ana", "3", None)  # the judge's own decision: confirm
    assert set(outcome.states.values()) == {"resolved"}
    j = judgment(engine, "acme-000:clarity")
    assert (j.user_decision, j.was_corrected, j.reviewer) == ("3", False, "ana")


@pytest.mark.pg_repeats(
    "statements and lines of test_a_blind_item_shows_the_judge_only_to_those_who_can_no_longer_be_anchored"
)
def test_a_label_that_overrules_the_judge_needs_a_reason(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    with pytest.raises(corrections.InvalidDecision, match="reason"):
        label_all(engine, queue_id, a.item_id, "ana", "5", None)
    with pytest.raises(corrections.InvalidDecision, match=r"1–5|between|outside|range"):
        label_all(engine, queue_id, a.item_id, "ana", "9", "x")
    with session_scope(engine, read_only=True) as s:
        assert s.exec(select(ReviewLabel)).first() is None


def test_continuous_labels_agree_within_the_tolerance_and_their_mean_decides(engine: Engine) -> None:
    with session_scope(engine) as s:
        s.add(MetricDefinition(product="cont", slug="faith", display_name="Faithfulness", min_value=0.0,
                               max_value=1.0, integer_scale=False))  # fmt: skip
    evaluation(engine, "c0", product="cont", metrics=("faith",))
    evaluation(engine, "c1", hours=1, product="cont", metrics=("faith",))
    queue_id = create(engine, overlap=2, tolerance=0.1)
    for reviewer, first, second in (("ana", "0.5", "0.2"), ("ben", "0.6", "0.9")):
        for decision in (first, second):
            got = take(engine, queue_id, reviewer)
            assert got is not None
            label_all(engine, queue_id, got.item_id, reviewer, decision, "r")
    assert judgment(engine, "c0:faith").user_decision == "0.55"
    assert judgment(engine, "c1:faith").user_decision is None  # 0.2 and 0.9: disputed


@pytest.mark.parametrize(
    ("decisions", "spec", "expected"),
    [
        (["4", "4.0"], MetricDefinition(slug="m", display_name="m"), "4"),
        (["4", "5"], MetricDefinition(slug="m", display_name="m"), None),
        (
            ["0.3", "0.35", "0.4"],
            MetricDefinition(slug="m", display_name="m", min_value=0, max_value=1, integer_scale=False),
            "0.35",
        ),
        (["INCLUDE", "INCLUDE"], None, "INCLUDE"),
        (["INCLUDE", "EXCLUDE"], None, None),
    ],
)
def test_agreed_decision(decisions: list[str], spec: MetricDefinition | None, expected: str | None) -> None:
    from lib.corrections import DecisionScale
    from lib.metrics import MetricSpec

    scale = (
        DecisionScale(labels=("INCLUDE", "EXCLUDE", "UNCERTAIN"))
        if spec is None
        else DecisionScale(
            spec=MetricSpec(spec.slug, spec.display_name, spec.min_value, spec.max_value, spec.integer_scale)
        )
    )
    assert queues.agreed_decision(scale, decisions, 0.1) == expected


# ---------------------------------------------------------------------------------------------
# Blind-first


def test_blind_first_shows_nothing_of_the_judge_until_every_blind_label_is_in(engine: Engine) -> None:
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="blind", question="What is 2+2?", model_answer="Four.", product="acme",
                judge_scores_json={"clarity": 2, "truthfulness": 5},
                user_scores_json={"clarity": 4},
                evidence_json={"clarity": [{"quote": "Four.", "why": "JUDGE-EVIDENCE-WHY"}]},
            )
        )  # fmt: skip
        s.flush()
        for metric, decision in (("clarity", "2"), ("truthfulness", "5")):
            s.add(Judgment(change_id=f"blind:{metric}", product="acme", metric=metric, snapshot_id="blind",
                           decision=decision, reasoning="JUDGE-REASON-" + metric, timestamp=T0))  # fmt: skip
    queue_id = create(engine, mode="blind")
    a = take(engine, queue_id, "ana")
    assert a is not None and a.stage == "blind"
    with session_scope(engine) as s:
        with pytest.raises(queues.NotRevealed):
            queues.load_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana")
        blind = queues.load_blind_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana")
    shown = repr(blind) + repr(queues.blind_item_record(blind))
    for secret in ("JUDGE-REASON", "JUDGE-EVIDENCE", "judge_scores", "user_scores", "reasoning"):
        assert secret not in shown
    # Nothing carries a decision but the reviewer's own (none yet): the scale keys are the whole scale.
    assert {m.blind_decision for m in blind.metrics} == {None}
    assert "decision=" not in repr(blind).replace("blind_decision=", "")
    assert [m.metric for m in blind.metrics] == ["truthfulness", "clarity"]  # rubric order
    assert (blind.question, blind.answer) == ("What is 2+2?", "Four.")
    clarity, truth = (judgment(engine, f"blind:{m}") for m in ("clarity", "truthfulness"))
    with session_scope(engine) as s:
        half = queues.label_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana",
                                 labels=[LabelInput(clarity.id or 0, 4, "reads well")], now=NOW)  # fmt: skip
    assert (half.stage, half.revealed) == ("blind", False)
    with session_scope(engine) as s, pytest.raises(queues.NotRevealed):
        queues.load_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana")
    with session_scope(engine) as s:
        full = queues.label_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana",
                                 labels=[LabelInput(truth.id or 0, 5)], now=NOW)  # fmt: skip
    assert (full.stage, full.revealed, full.item_done) == ("blind", True, False)
    with session_scope(engine) as s:
        shown_item = queues.load_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana")
        assert {j.reasoning for j in shown_item.item.judgments} == {
            "JUDGE-REASON-clarity",
            "JUDGE-REASON-truthfulness",
        }
        # After the reveal: keep 5 on truthfulness, move clarity to 3 (the blind reason still counts).
        final = queues.label_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana",
                                  labels=[LabelInput(clarity.id or 0, 3), LabelInput(truth.id or 0, 5)], now=NOW)  # fmt: skip
    assert (final.stage, final.item_done) == ("final", True)
    with session_scope(engine, read_only=True) as s:
        rows = {lab.judgment_id: lab for lab in s.exec(select(ReviewLabel)).all()}
    assert (rows[clarity.id].blind_decision, rows[clarity.id].decision, rows[clarity.id].reason) == (
        "4",
        "3",
        "reads well",
    )
    assert (rows[truth.id].blind_decision, rows[truth.id].decision) == ("5", "5")
    assert judgment(engine, "blind:clarity").user_decision == "3"


# ---------------------------------------------------------------------------------------------
# Undo


def test_a_reviewer_withdraws_a_label_before_the_item_is_decided(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine, overlap=2)
    a = take(engine, queue_id, "ana")
    assert a is not None
    label_all(engine, queue_id, a.item_id, "ana", "4", "x")
    j = judgment(engine, "acme-000:clarity")
    with session_scope(engine) as s:
        queues.undo_label(session=s, queue_id=queue_id, judgment_id=j.id or 0, reviewer="ana", now=NOW)
    again = take(engine, queue_id, "ana")
    assert again is not None and again.item_id == a.item_id and again.status == "reserved"
    assert again.draft == {str(j.id): {"decision": "4", "reason": "x"}}
    with session_scope(engine, read_only=True) as s:
        assert s.exec(select(ReviewQueueJudgment.labels)).one() == 0
        assert s.exec(select(ReviewQueueItem.done)).one() == 0


def test_the_label_that_resolved_a_judgment_can_take_the_resolution_back(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine, overlap=2)
    a, b = take(engine, queue_id, "ana"), take(engine, queue_id, "ben")
    assert a and b
    label_all(engine, queue_id, a.item_id, "ana", "4", "x")
    label_all(engine, queue_id, b.item_id, "ben", "4", "y")
    j = judgment(engine, "acme-000:clarity")
    assert j.user_decision == "4"
    with session_scope(engine) as s, pytest.raises(queues.QueueError, match="only the label that resolved"):
        queues.undo_label(session=s, queue_id=queue_id, judgment_id=j.id or 0, reviewer="ana", now=NOW)
    # The plain undo (the review page's) does not see a queue's decision.
    with session_scope(engine) as s:
        assert corrections.undoable_reviews(session=s, reviewer="ben") == []
        with pytest.raises(corrections.NothingToUndo):
            corrections.undo_review(
                session=s, judgment_id=j.id or 0, expected_version=j.version, reviewer="ben"
            )
    with session_scope(engine) as s:
        queues.undo_label(session=s, queue_id=queue_id, judgment_id=j.id or 0, reviewer="ben", now=NOW)
    j = judgment(engine, "acme-000:clarity")
    assert j.user_decision is None and j.reviewed_at is None
    with session_scope(engine, read_only=True) as s:
        qj = s.exec(select(ReviewQueueJudgment)).one()
        events = corrections.events_for(session=s, judgment_id=j.id or 0)
        totals = counters.judgment_totals(session=s, product="acme")
    assert (qj.state, qj.held, qj.labels) == ("open", True, 1)
    assert [(e.action, e.queue_id) for e in events] == [("overruled", queue_id), ("undone", queue_id)]
    assert totals.reviewed == 0


# ---------------------------------------------------------------------------------------------
# Permissions and listing


@pytest.fixture
def signin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OVERRULE_AUTH_MODE", "signin")
    monkeypatch.setenv("OVERRULE_DEFAULT_ROLE", "viewer")
    reset_settings()


def test_roles_a_lead_creates_a_reviewer_labels_a_viewer_reads(engine: Engine, signin: None) -> None:
    items(engine, 2)
    viewer, reviewer = Actor("vi@x.org", "viewer"), Actor("re@x.org", "reviewer")
    with session_scope(engine) as s, pytest.raises(PermissionDenied, match="lead"):
        queues.create_queue(session=s, actor=reviewer, spec=QueueSpec(name="q"))
    queue_id = create(engine)
    with session_scope(engine) as s, pytest.raises(PermissionDenied, match="reviewer"):
        queues.next_assignment(session=s, queue_id=queue_id, reviewer=viewer, now=NOW)
    with session_scope(engine) as s, pytest.raises(PermissionDenied):
        queues.next_assignment(
            session=s, queue_id=queue_id, reviewer="vi@x.org", now=NOW
        )  # a name: its role row
    with session_scope(engine) as s:
        assert queues.next_assignment(session=s, queue_id=queue_id, reviewer=reviewer, now=NOW) is not None
    with session_scope(engine, read_only=True) as s:
        assert queues.queue_progress(session=s, queue_id=queue_id, now=NOW).reserved == 1
    with session_scope(engine) as s, pytest.raises(PermissionDenied):
        queues.close_queue(session=s, actor=reviewer, queue_id=queue_id)


def test_an_assigned_queue_takes_only_its_reviewers_and_lists_first_for_them(engine: Engine) -> None:
    items(engine, 3)
    open_id = create(engine, name="everyone", size=1)
    mine_id = create(engine, name="ana's", size=1, reviewers=("Ana",))
    with session_scope(engine) as s, pytest.raises(queues.NotAssigned, match="assigned to Ana"):
        queues.next_assignment(session=s, queue_id=mine_id, reviewer="ben", now=NOW)
    assert take(engine, mine_id, "ana") is not None  # names compare case-insensitively
    with session_scope(engine, read_only=True) as s:
        assert [q.id for q in queues.list_queues(session=s, reviewer="ana")] == [mine_id, open_id]
        assert [q.id for q in queues.list_queues(session=s, reviewer="ben")] == [open_id, mine_id]


def test_closing_a_queue_releases_its_undecided_judgments(engine: Engine) -> None:
    items(engine, 2, metrics=("clarity",))
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    label_all(engine, queue_id, a.item_id, "ana", "3")
    with session_scope(engine) as s:
        queues.close_queue(session=s, actor=LEAD, queue_id=queue_id, now=NOW)
    with session_scope(engine, read_only=True) as s:
        states = sorted(s.exec(select(ReviewQueueJudgment.state, ReviewQueueJudgment.held)).all())
        item = review_queue.next_item(session=s, filters=QueueFilter())
    assert states == [("released", False), ("resolved", False)]
    assert item is not None and item.key == "snapshot:acme-001"
    with session_scope(engine) as s, pytest.raises(queues.QueueError, match="closed"):
        queues.next_assignment(session=s, queue_id=queue_id, reviewer="ben", now=NOW)


def test_reviewer_progress_counts_done_held_skipped_and_items_per_hour(engine: Engine) -> None:
    items(engine, 3, metrics=("clarity",))
    queue_id = create(engine, overlap=2, reviewers=("ana", "ben", "cem"))
    a = take(engine, queue_id, "ana")
    assert a is not None
    label_all(engine, queue_id, a.item_id, "ana", "3", now=NOW + timedelta(minutes=6))
    b = take(engine, queue_id, "ben")
    assert b is not None
    label_all(engine, queue_id, b.item_id, "ben", "5", "r", now=NOW + timedelta(minutes=2))
    take(engine, queue_id, "ben")
    with session_scope(engine, read_only=True) as s:
        rows = {p.reviewer: p for p in queues.reviewer_progress(session=s, queue_id=queue_id, now=NOW)}
        frame = queues.reviewer_progress_frame(list(rows.values()))
    assert (rows["ana"].done, rows["ana"].items_per_hour, rows["ana"].awaiting_adjudication) == (1, 10.0, 1)
    assert (rows["ben"].done, rows["ben"].reserved) == (1, 1)
    assert (rows["cem"].done, rows["cem"].assigned) == (0, True)
    assert list(frame.columns) == queues.PROGRESS_COLUMNS


# ---------------------------------------------------------------------------------------------
# The default queue's reservations


def test_two_reviewers_on_the_default_queue_are_never_handed_the_same_evaluation(engine: Engine) -> None:
    items(engine, 3)
    with session_scope(engine) as s:
        a = review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
        b = review_queue.reserve_next(session=s, reviewer="ben", filters=QueueFilter(), now=NOW)
    assert a and b and (a.key, b.key) == ("snapshot:acme-000", "snapshot:acme-001")
    with session_scope(engine) as s:  # a reload gives Ana her item back
        again = review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
        assert again is not None and again.key == a.key
        review_queue.skip_item(session=s, reviewer="ana", key=a.key, now=NOW)
    with session_scope(engine) as s:
        nxt = review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
        assert nxt is not None and nxt.key == "snapshot:acme-002"
        assert review_queue.skipped_items(session=s, reviewer="ana") == [a.key]
    # Ana's skipped item is free for Cem; her lapsed one goes too after its lease.
    with session_scope(engine) as s:
        c = review_queue.reserve_next(session=s, reviewer="cem", filters=QueueFilter(), now=NOW)
        assert c is not None and c.key == "snapshot:acme-000"
    with session_scope(engine) as s:
        late = review_queue.reserve_next(
            session=s, reviewer="dan", filters=QueueFilter(), now=NOW + timedelta(minutes=20)
        )
        assert late is not None and late.key == "snapshot:acme-000"  # Cem's lease ran out; oldest first


def test_a_reviewed_default_item_lets_go_of_its_reservation(engine: Engine) -> None:
    items(engine, 2, metrics=("clarity",))
    with session_scope(engine) as s:
        a = review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
    assert a is not None
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="acme-000:clarity", user_decision="3", reviewer="ana"
        )
    with session_scope(engine) as s:
        nxt = review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
        assert nxt is not None and nxt.key == "snapshot:acme-001"
        assert s.exec(select(ReviewAssignment.item_key)).all() == ["snapshot:acme-001"]


def test_a_link_to_a_default_item_someone_holds_says_who(engine: Engine) -> None:
    items(engine, 1)
    with session_scope(engine) as s:
        review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
    with session_scope(engine) as s, pytest.raises(queues.ItemTaken, match="ana is reviewing"):
        review_queue.reserve_item(session=s, reviewer="ben", key="snapshot:acme-000", now=NOW)


# ---------------------------------------------------------------------------------------------
# Recount


def test_the_queue_counters_equal_a_recount(engine: Engine) -> None:
    items(engine, 3, metrics=("clarity",))
    queue_id = create(engine, overlap=2)
    for name in ("ana", "ben", "ana", "cem"):
        got = take(engine, queue_id, name)
        if got is not None:
            label_all(engine, queue_id, got.item_id, name, "3")
    take(engine, queue_id, "dan")
    with session_scope(engine, read_only=True) as s:
        before = _queue_counts(s)
    with session_scope(engine) as s:
        s.execute(text("UPDATE review_queue_items SET claimed = 0, done = 0"))
        s.execute(text("UPDATE review_queue_judgments SET labels = 0"))
    with session_scope(engine) as s:
        counters.recount(session=s, only=["review_queue_items"])
    with session_scope(engine, read_only=True) as s:
        assert _queue_counts(s) == before


def _queue_counts(s: Session) -> list:
    return [
        s.exec(select(ReviewQueueItem.id, ReviewQueueItem.claimed, ReviewQueueItem.done, ReviewQueueItem.available)
               .order_by(col(ReviewQueueItem.id))).all(),
        s.exec(select(ReviewQueueJudgment.id, ReviewQueueJudgment.labels).order_by(col(ReviewQueueJudgment.id))).all(),
    ]  # fmt: skip


def test_clearing_a_product_takes_its_queue_rows_along(engine: Engine) -> None:
    items(engine, 2, metrics=("clarity",))
    queue_id = create(engine, overlap=2)
    a = take(engine, queue_id, "ana")
    assert a is not None
    label_all(engine, queue_id, a.item_id, "ana", "3")
    with session_scope(engine) as s:
        corrections.clear_product(session=s, product="acme", reviewer=Actor("root", "admin"))
    assert take(engine, queue_id, "ben") is None
    with session_scope(engine, read_only=True) as s:
        assert s.exec(select(ReviewLabel)).first() is None
        assert s.exec(select(JudgmentEvent)).first() is None


# ---------------------------------------------------------------------------------------------
# Random label / adjudicate / undo sequences: everything derived equals a recount


def _random_step(engine: Engine, rng: random.Random, queue_id: int, step: int) -> str:
    when = NOW + timedelta(seconds=step)
    name = rng.choice(("ana", "ben", "cem"))
    roll = rng.random()
    with session_scope(engine) as s:
        try:
            if roll < 0.55:
                got = queues.next_assignment(session=s, queue_id=queue_id, reviewer=name, now=when)
                if got is None:
                    return f"{name}: nothing"
                metrics = [j.id or 0 for j in judgments_of(engine, queue_id, got.item_id)]
                labels = [LabelInput(j, rng.choice(["3", "4"]), "r") for j in metrics]
                queues.label_item(
                    session=s, queue_id=queue_id, item_id=got.item_id, reviewer=name, labels=labels, now=when
                )
                return f"{name} labelled item {got.position}"
            if roll < 0.7:
                [dispute, *_] = queues.disputes(session=s, queue_id=queue_id) or [None]
                if dispute is None:
                    return "no dispute"
                decision = rng.choice(["3", "4"])
                queues.adjudicate(session=s, queue_id=queue_id, judgment_id=dispute.judgment.id or 0, actor=LEAD,
                                  decision=decision, reason="lead", now=when)  # fmt: skip
                return f"adjudicated {dispute.judgment.id}"
            if roll < 0.8:
                adjudicated = queues.disputes(session=s, queue_id=queue_id, state="adjudicated")
                if not adjudicated:
                    return "nothing adjudicated"
                target = rng.choice(adjudicated).judgment.id or 0
                queues.undo_adjudication(
                    session=s, queue_id=queue_id, judgment_id=target, actor=LEAD, now=when
                )
                return f"undid adjudication {target}"
            own = s.exec(
                select(ReviewLabel.judgment_id).where(
                    ReviewLabel.reviewer == name, col(ReviewLabel.decision).is_not(None)
                )
            ).all()
            if not own:
                return f"{name}: no label"
            target = rng.choice(own)
            queues.undo_label(session=s, queue_id=queue_id, judgment_id=target, reviewer=name, now=when)
            return f"{name} withdrew {target}"
        except (queues.QueueError, corrections.NothingToUndo) as exc:
            return f"refused: {exc}"


def _replayed_decisions(s: Session) -> dict[int, str | None]:
    """Each judgment's decision as its audit trail says (the undo stack replayed)."""
    events: dict[int, list[JudgmentEvent]] = {}
    for e in s.exec(select(JudgmentEvent)).all():
        events.setdefault(e.judgment_id, []).append(e)
    out = {}
    for j in s.exec(select(Judgment)).all():
        stack = corrections._review_stack(events.get(j.id or 0, []))
        out[j.id or 0] = stack[-1].to_decision if stack else None
    return out


# Seed 2 sends PostgreSQL no statement shape and runs no PostgreSQL-only line that seeds 1 and 3 do not.
@pytest.mark.parametrize(
    "seed",
    [1, pytest.param(2, marks=pytest.mark.pg_repeats("seed 1 and 3's statements and lines")), 3],
)
def test_random_queue_work_leaves_counters_history_and_queue_state_equal_to_a_recount(
    engine: Engine, seed: int
) -> None:
    from tests.test_counters import _snapshot_of_counters

    items(engine, 6)
    queue_id = create(engine, overlap=2)
    rng = random.Random(seed)
    story = [_random_step(engine, rng, queue_id, n) for n in range(70)]
    with session_scope(engine, read_only=True) as s:
        kept, queue_kept = _snapshot_of_counters(s), _queue_counts(s)
        history = [j.change_id for j in corrections.select_history(s, "acme", max_entries=50)]
        replayed = _replayed_decisions(s)
        judgments = {j.id: j for j in s.exec(select(Judgment)).all()}
        qjs = s.exec(select(ReviewQueueJudgment)).all()
    with session_scope(engine) as s:
        counters.recount(session=s)
    with session_scope(engine, read_only=True) as s:
        assert _snapshot_of_counters(s) == kept, story
        assert _queue_counts(s) == queue_kept, story
        assert [j.change_id for j in corrections.select_history(s, "acme", max_entries=50)] == history
    for judgment_id, decision in replayed.items():
        assert judgments[judgment_id].user_decision == decision, story
    for qj in qjs:  # only decided queue judgments reached the judgment, with the queue's decision
        j = judgments[qj.judgment_id]
        if qj.state in ("resolved", "adjudicated"):
            assert j.user_decision == qj.decision and not qj.held, story
        else:
            assert j.reviewed_at is None and qj.held and qj.decision is None, story
    assert any("labelled" in line for line in story) and any("adjudicated" in line for line in story)


def test_a_skipped_item_opened_by_its_link_or_labelled_is_yours_again(engine: Engine) -> None:
    items(engine, 2, metrics=("clarity",))
    queue_id = create(engine)
    a = take(engine, queue_id, "ana")
    assert a is not None
    with session_scope(engine) as s:
        queues.skip_item(session=s, queue_id=queue_id, item_id=a.item_id, reviewer="ana", now=NOW)
    outcome = label_all(engine, queue_id, a.item_id, "ana", "3")
    assert outcome.item_done
    with session_scope(engine, read_only=True) as s:
        assert queues.skipped_items(session=s, queue_id=queue_id, reviewer="ana") == []


@pytest.mark.pg_repeats(
    "statements and lines of test_a_blind_item_shows_the_judge_only_to_those_who_can_no_longer_be_anchored"
)
def test_a_label_on_an_item_that_went_to_others_says_so(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine)
    b = take(engine, queue_id, "ben")
    assert b is not None
    with pytest.raises(queues.ItemTaken, match="take the next item instead"):
        label_all(engine, queue_id, b.item_id, "ana", "3")


@pytest.mark.pg_repeats(
    "statements and lines of test_a_blind_item_shows_the_judge_only_to_those_who_can_no_longer_be_anchored"
)
def test_the_adjudication_list_downloads_with_labels_side_by_side(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine, overlap=2, mode="blind")
    for name, blind, final in (("ana", "2", "3"), ("ben", "5", "5")):
        got = take(engine, queue_id, name)
        assert got is not None
        label_all(engine, queue_id, got.item_id, name, blind, "because")
        label_all(engine, queue_id, got.item_id, name, final, None)
    with session_scope(engine, read_only=True) as s:
        frame = queues.disputes_frame(queues.disputes(session=s, queue_id=queue_id))
    assert list(frame.columns) == queues.DISPUTE_COLUMNS
    assert frame.loc[0, "labels"] == "ana: 3 (blind 2) — because; ben: 5 — because"


@pytest.mark.pg_repeats("statements and lines of test_a_link_to_a_default_item_someone_holds_says_who")
def test_a_default_queue_draft_comes_back_after_a_reload(engine: Engine) -> None:
    items(engine, 1)
    with session_scope(engine) as s:
        item = review_queue.reserve_next(session=s, reviewer="ana", filters=QueueFilter(), now=NOW)
        assert item is not None
        assert review_queue.save_draft(
            session=s, reviewer="ana", key=item.key, draft={"reason": "half typed"}
        )
        assert not review_queue.save_draft(session=s, reviewer="ben", key=item.key, draft={"reason": "x"})
    with session_scope(engine, read_only=True) as s:
        assert review_queue.draft_of(session=s, reviewer="ana", key="snapshot:acme-000") == {
            "reason": "half typed"
        }


def test_oldest_first_merges_every_product_by_judgment_time(engine: Engine) -> None:
    evaluation(engine, "a0", hours=0, product="alpha")
    evaluation(engine, "b1", hours=1, product="beta")
    standalone(engine, "pr#2", hours=2, product="alpha")
    evaluation(engine, "a3", hours=3, product="alpha")
    evaluation(engine, "b4", hours=4, product="beta")
    queue_id = create(engine, size=4)
    with session_scope(engine, read_only=True) as s:
        keys = s.exec(
            select(ReviewQueueItem.item_key)
            .where(ReviewQueueItem.queue_id == queue_id)
            .order_by(col(ReviewQueueItem.position))
        ).all()
        default_first = review_queue.next_item(session=s, filters=QueueFilter())
    assert (
        keys[:2] == ["snapshot:a0", "snapshot:b1"]
        and keys[2].startswith("judgment:")
        and keys[3] == "snapshot:a3"
    )
    assert default_first is not None and default_first.key == "snapshot:b4"  # the rest of the pending work


def test_a_blind_item_shows_the_judge_only_to_those_who_can_no_longer_be_anchored(engine: Engine) -> None:
    items(engine, 1, metrics=("clarity",))
    queue_id = create(engine, mode="blind", reviewers=("ana", "ben"))
    with session_scope(engine, read_only=True) as s:
        item_id = s.exec(select(ReviewQueueItem.id)).one()

    def load(who: Actor) -> queues.TeamItem:
        with session_scope(engine, read_only=True) as s:
            return queues.load_item(session=s, queue_id=queue_id, item_id=item_id, reviewer=who)

    with pytest.raises(queues.NotRevealed):  # ben may still take it: no peeking first
        load(Actor("ben", "reviewer"))
    assert load(Actor("vi", "viewer")).item.judgments  # a viewer never labels
    assert load(Actor("cem", "reviewer")).item.judgments  # not assigned to this queue
    got = take(engine, queue_id, "ana")
    assert got is not None
    label_all(engine, queue_id, got.item_id, "ana", "3")  # blind
    label_all(engine, queue_id, got.item_id, "ana", "3")  # final: the item has its one reviewer
    assert load(Actor("ben", "reviewer")).item.judgments
