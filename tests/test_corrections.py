"""The correction cache: seed-004 selection (checked against the seed's own code), reviews with
optimistic locking and an audit trail, stats, clearing, listing, the trend query, the prompt block,
the JSON cache file and the `history` CLI — on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, delete, func
from sqlmodel import Session, select

from lib import corrections, export, importer
from lib.__main__ import main as cli_main
from lib.corrections import (
    HISTORY_EMPTY_TEXT,
    InvalidDecision,
    JudgmentFilter,
    JudgmentNotFound,
    MissingReviewer,
    ReviewConflict,
)
from lib.db import init_db, session_scope
from lib.importer import ImportFailed
from lib.models import (
    AlignmentCall,
    AlignmentExperiment,
    AlignmentItem,
    EvaluationSnapshot,
    Judgment,
    JudgmentEvent,
    MetricDefinition,
)
from tests.conftest import sqlite_only
from tests.seed004 import CachedJudgment, seed_get_history_for_prompt

T0 = datetime(2024, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------
# Helpers (the seed's own algorithm, the oracle, is in tests/seed004.py)


def add(
    session: Session,
    change_id: str,
    *,
    corrected: bool = False,
    reviewed: bool | None = None,
    product: str = "acme",
    metric: str | None = None,
    hours: float = 0,
    decision: str = "INCLUDE",
) -> Judgment:
    """A stored judgment; `corrected` means the reviewer chose another label."""
    reviewed = corrected if reviewed is None else reviewed
    user = (
        ("EXCLUDE" if decision == "INCLUDE" else "INCLUDE") if corrected else (decision if reviewed else None)
    )
    j = Judgment(
        change_id=change_id,
        product=product,
        metric=metric,
        decision=decision,
        user_decision=user,
        user_reasoning="because" if corrected else None,
        reviewer="ayse" if reviewed else None,
        reviewed_at=T0 if reviewed else None,
        was_corrected=corrected,
        timestamp=T0 + timedelta(hours=hours),
    )
    session.add(j)
    return j


def pools(engine: Engine, n_corrected: int, n_correct: int, product: str = "acme") -> None:
    """Corrections get even hours, correct ones odd hours, so the pools interleave in time."""
    with session_scope(engine) as s:
        for i in range(n_corrected):
            add(s, f"{product}-c{i}", corrected=True, product=product, hours=2 * i)
        for i in range(n_correct):
            add(s, f"{product}-k{i}", product=product, hours=2 * i + 1)


def history_ids(engine: Engine, product: str = "acme", **kwargs) -> list[str]:
    with session_scope(engine, read_only=True) as s:
        return [j.change_id for j in corrections.select_history(s, product, **kwargs)]


def newest(prefix: str, n: int, count: int) -> list[str]:
    """The ids of the `count` newest of `n` entries of one pool."""
    return [f"{prefix}{i}" for i in range(n - 1, n - 1 - count, -1)]


def interleave(corrected: list[str], correct: list[str]) -> list[str]:
    out: list[str] = []
    for i in range(max(len(corrected), len(correct))):
        out += corrected[i : i + 1] + correct[i : i + 1]
    return out


def snapshot_with_metric(
    engine: Engine, *, product: str = "acme", metric: str = "clarity", decision: str = "4"
) -> int:
    with session_scope(engine) as s:
        s.add(EvaluationSnapshot(id=f"snap_{product}", question="q", model_answer="a", product=product))
        s.flush()
        j = Judgment(
            change_id=f"snap_{product}:{metric}",
            product=product,
            metric=metric,
            snapshot_id=f"snap_{product}",
            decision=decision,
        )
        s.add(j)
        s.flush()
        assert j.id is not None
        return j.id


def label_judgment(engine: Engine, decision: str = "INCLUDE") -> int:
    with session_scope(engine) as s:
        j = add(s, "pr#1", decision=decision)
        s.flush()
        assert j.id is not None
        return j.id


def load(engine: Engine, judgment_id: int) -> Judgment:
    with session_scope(engine, read_only=True) as s:
        j = s.get(Judgment, judgment_id)
        assert j is not None
        return j


def events(engine: Engine, judgment_id: int | None = None) -> list[JudgmentEvent]:
    with session_scope(engine, read_only=True) as s:
        stmt = select(JudgmentEvent).order_by(JudgmentEvent.id)
        if judgment_id is not None:
            stmt = stmt.where(JudgmentEvent.judgment_id == judgment_id)
        return list(s.exec(stmt).all())


# ---------------------------------------------------------------------------------------------
# select_history: the seed-004 edge cases


@pytest.mark.pg_repeats(
    "statements and lines of test_default_split_is_15_corrections_and_5_correct_interleaved_newest_first"
)
def test_cold_start_returns_no_history_and_the_seed_note(engine) -> None:
    assert history_ids(engine) == []
    assert corrections.format_history_for_prompt([]) == "No previous judgments available"


@pytest.mark.pg_repeats(
    "statements and lines of test_default_split_is_15_corrections_and_5_correct_interleaved_newest_first"
)
def test_all_correct_fills_every_slot_from_the_correct_pool(engine) -> None:
    pools(engine, 0, 50)
    assert history_ids(engine) == newest("acme-k", 50, 20)


@pytest.mark.pg_repeats(
    "statements and lines of test_default_split_is_15_corrections_and_5_correct_interleaved_newest_first"
)
def test_all_wrong_fills_every_slot_from_the_corrections(engine) -> None:
    pools(engine, 100, 0)
    assert history_ids(engine) == newest("acme-c", 100, 20)


def test_default_split_is_15_corrections_and_5_correct_interleaved_newest_first(engine) -> None:
    pools(engine, 30, 30)
    expected = interleave(newest("acme-c", 30, 15), newest("acme-k", 30, 5))
    assert history_ids(engine) == expected
    assert expected[:4] == ["acme-c29", "acme-k29", "acme-c28", "acme-k28"]


@pytest.mark.parametrize(
    ("n_corrected", "n_correct", "max_entries", "ratio", "want_corrected", "want_correct"),
    [
        (3, 50, 20, 0.75, 3, 17),  # short corrections: the correct pool fills
        (50, 2, 20, 0.75, 18, 2),  # short correct pool: the corrections fill
        (3, 2, 20, 0.75, 3, 2),  # both short: everything there is
        (10, 10, 20, 0.5, 10, 10),
        (10, 10, 7, 0.75, 5, 2),  # int(7 * 0.75) = 5
        (10, 10, 10, 0.29, 2, 8),  # int(10 * 0.29) = 2
        (10, 3, 10, 0.0, 7, 3),  # ratio 0, correct pool short: the corrections still fill
        (2, 10, 10, 1.0, 2, 8),  # ratio 1, corrections short: the correct pool fills
        (10, 10, 0, 0.75, 0, 0),
        (1, 0, 1, 0.75, 1, 0),
        (0, 1, 1, 0.75, 0, 1),
    ],
)
def test_slots_follow_the_seed_allocation(
    sqlite_engine, n_corrected, n_correct, max_entries, ratio, want_corrected, want_correct
) -> None:
    pools(sqlite_engine, n_corrected, n_correct)
    got = history_ids(sqlite_engine, max_entries=max_entries, correction_ratio=ratio)
    assert got == interleave(
        newest("acme-c", n_corrected, want_corrected), newest("acme-k", n_correct, want_correct)
    )


def test_interleave_starts_with_a_correction_and_appends_the_longer_pool(engine) -> None:
    pools(engine, 2, 10)
    assert history_ids(engine, max_entries=6) == [
        "acme-c1", "acme-k9", "acme-c0", "acme-k8", "acme-k7", "acme-k6",
    ]  # fmt: skip


@pytest.mark.pg_repeats(
    "statements and lines of test_default_split_is_15_corrections_and_5_correct_interleaved_newest_first"
)
def test_history_never_mixes_products(engine) -> None:
    pools(engine, 5, 5, product="acme")
    pools(engine, 5, 5, product="other")
    got = history_ids(engine, product="acme")
    assert got and all(c.startswith("acme-") for c in got)
    assert history_ids(engine, product="nobody") == []


@pytest.mark.pg_repeats(
    "statements and lines of test_default_split_is_15_corrections_and_5_correct_interleaved_newest_first"
)
def test_user_agreeing_with_the_judge_counts_as_correct_not_as_a_correction(engine) -> None:
    with session_scope(engine) as s:
        add(s, "agreed", reviewed=True, hours=5)  # user_decision == decision
        add(s, "fixed", corrected=True, hours=1)
    with session_scope(engine, read_only=True) as s:
        chosen = corrections.select_history(s, "acme", max_entries=2)
    assert [(j.change_id, j.was_corrected) for j in chosen] == [("fixed", True), ("agreed", False)]


def test_metric_filter_draws_only_from_that_metric(engine) -> None:
    with session_scope(engine) as s:
        add(s, "clarity-1", corrected=True, metric="clarity", hours=1)
        add(s, "safety-1", corrected=True, metric="safety", hours=2)
        add(s, "clarity-2", metric="clarity", hours=3)
    assert history_ids(engine, metric="clarity") == ["clarity-1", "clarity-2"]
    assert history_ids(engine) == ["safety-1", "clarity-2", "clarity-1"]


def test_equal_timestamps_keep_insertion_order_like_the_seed_sort(engine) -> None:
    with session_scope(engine) as s:
        for name in ("first", "second", "third"):
            add(s, name, corrected=True, hours=1)
    assert history_ids(engine, max_entries=3) == ["first", "second", "third"]


@pytest.mark.parametrize(
    ("max_entries", "ratio"),
    [(-1, 0.75), (20, 1.5), (20, -0.1), (20, float("nan")), (True, 0.75), (2.5, 0.5)],
)
def test_out_of_range_parameters_are_refused(sqlite_engine, max_entries, ratio) -> None:
    with session_scope(sqlite_engine, read_only=True) as s, pytest.raises(ValueError):
        corrections.select_history(s, "acme", max_entries=max_entries, correction_ratio=ratio)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    entries=st.lists(
        st.tuples(st.booleans(), st.integers(0, 12), st.sampled_from(["acme", "other"])), max_size=45
    ),
    max_entries=st.integers(0, 25),
    ratio=st.sampled_from([0.0, 0.1, 0.25, 0.29, 0.5, 0.7, 0.75, 0.9, 1.0]),
)
def test_selection_equals_the_seed_algorithm_on_any_cache(sqlite_engine, entries, max_entries, ratio) -> None:
    # Small timestamp range on purpose: many ties, which the seed breaks by insertion order.
    with session_scope(sqlite_engine) as s:
        s.execute(delete(Judgment))
        for i, (was_corrected, hour, product) in enumerate(entries):
            add(s, f"j{i}", corrected=was_corrected, product=product, hours=hour)
    cache = {
        f"j{i}": CachedJudgment(f"j{i}", product, was_corrected, T0 + timedelta(hours=hour))
        for i, (was_corrected, hour, product) in enumerate(entries)
    }
    expected = [j.change_id for j in seed_get_history_for_prompt(cache, "acme", max_entries, ratio)]
    assert history_ids(sqlite_engine, max_entries=max_entries, correction_ratio=ratio) == expected


@pytest.mark.parametrize(
    ("metric", "index"), [(None, "ix_judgment_history"), ("clarity", "ix_judgment_history_metric")]
)
@pytest.mark.parametrize("corrected", [True, False])
def test_pool_query_searches_the_history_index(sqlite_engine, metric, index, corrected) -> None:
    with session_scope(sqlite_engine, read_only=True) as s:
        sql = corrections.history_pool_sql(
            session=s, product="acme", metric=metric, corrected=corrected, limit=20
        )
        plan = " ".join(str(row[-1]) for row in s.connection().exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
    assert f"SEARCH judgments USING INDEX {index}" in plan
    assert "SCAN judgments" not in plan


# ---------------------------------------------------------------------------------------------
# Reviews: confirm / overrule, optimistic locking, audit trail


@pytest.mark.pg_repeats(
    "statements and lines of test_every_review_appends_one_event_with_who_from_to_and_why"
)
def test_overrule_stores_decision_reviewer_and_bumps_version(engine) -> None:
    jid = snapshot_with_metric(engine)
    with session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=2,
            reviewer="ayse",
            reason="vague",
        )
    j = load(engine, jid)
    assert (j.user_decision, j.was_corrected, j.reviewer, j.version, j.user_reasoning) == (
        "2",
        True,
        "ayse",
        2,
        "vague",
    )
    assert j.reviewed_at is not None and j.reviewed_at.tzinfo is not None


def test_every_review_appends_one_event_with_who_from_to_and_why(engine) -> None:
    jid = snapshot_with_metric(engine)
    with session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision="2",
            reviewer="ayse",
            reason="vague",
        )
    with session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=2,
            action="confirm",
            user_decision="4",
            reviewer="bob",
        )
    got = [
        (e.action, e.reviewer, e.from_decision, e.to_decision, e.reason, e.version)
        for e in events(engine, jid)
    ]
    assert got == [("overruled", "ayse", "4", "2", "vague", 2), ("confirmed", "bob", "2", "4", None, 3)]


@pytest.mark.pg_repeats(
    "statements and lines of test_every_review_appends_one_event_with_who_from_to_and_why"
)
def test_confirming_after_an_overrule_clears_was_corrected(engine) -> None:
    jid = snapshot_with_metric(engine)
    with session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=1,
            reviewer="a",
            reason="x",
        )
    with session_scope(engine) as s:
        corrections.record_review(
            session=s, judgment_id=jid, expected_version=2, action="confirm", user_decision="4", reviewer="b"
        )
    assert load(engine, jid).was_corrected is False


@sqlite_only
@pytest.mark.parametrize("answer", ["4", "4.0", 4, 4.0, " 4 "])
def test_an_overrule_equal_to_the_judge_is_refused_and_writes_nothing(engine, answer) -> None:
    jid = snapshot_with_metric(engine, decision="4")
    with pytest.raises(InvalidDecision, match="equals the judge"), session_scope(engine) as s:
        corrections.record_review(
            session=s, judgment_id=jid, expected_version=1, action="overrule", user_decision=answer,
            reviewer="a", reason="r",
        )  # fmt: skip
    assert (load(engine, jid).version, events(engine, jid)) == (1, [])


@pytest.mark.parametrize("answer", [None, "2", 1])
@pytest.mark.pg_repeats(
    "statements and lines of test_the_seed_api_takes_a_decision_and_treats_the_judges_own_as_a_confirmation"
)
def test_a_confirmation_stores_the_judges_exact_text_whatever_value_came_with_it(engine, answer) -> None:
    jid = snapshot_with_metric(engine, decision="4")
    with session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="confirm",
            user_decision=answer,
            reviewer="a",
        )
    j = load(engine, jid)
    assert (j.user_decision, j.was_corrected) == ("4", False)


@sqlite_only
@pytest.mark.parametrize("action", ["", "confirmed", "OVERRULE", None])
def test_an_unknown_action_is_refused_and_writes_nothing(engine, action) -> None:
    jid = snapshot_with_metric(engine, decision="4")
    with pytest.raises(InvalidDecision, match="action"), session_scope(engine) as s:
        corrections.record_review(
            session=s, judgment_id=jid, expected_version=1, action=action, user_decision=2, reviewer="a",
            reason="r",
        )  # fmt: skip
    assert (load(engine, jid).version, events(engine, jid)) == (1, [])


@pytest.mark.parametrize(("answer", "stored"), [("4.0", "4"), (" 4 ", "4"), ("2", "2")])
def test_the_seed_api_takes_a_decision_and_treats_the_judges_own_as_a_confirmation(
    engine, answer, stored
) -> None:
    jid = snapshot_with_metric(engine, decision="4")
    with session_scope(engine) as s:
        change_id = load(engine, jid).change_id
        corrections.update_with_user_decision(
            session=s, change_id=change_id, user_decision=answer, reviewer="a"
        )
    assert load(engine, jid).user_decision == stored
    assert [e.action for e in events(engine, jid)] == ["confirmed" if stored == "4" else "overruled"]


def test_stale_version_raises_conflict_carrying_the_other_reviewers_decision(engine) -> None:
    jid = snapshot_with_metric(engine)
    with session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=1,
            reviewer="bob",
            reason="wrong",
        )
    with pytest.raises(ReviewConflict) as info, session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=5,
            reviewer="ayse",
            reason="r",
        )
    cur = info.value.current
    assert (cur.changed_by, cur.user_decision, cur.user_reasoning, cur.version) == ("bob", "1", "wrong", 2)
    assert "bob" in str(info.value) and "wrong" in str(info.value) and "Not saved" in str(info.value)
    assert load(engine, jid).user_decision == "1"
    assert len(events(engine, jid)) == 1


def test_two_reviewers_racing_on_one_judgment_exactly_one_wins(engine) -> None:
    jid = snapshot_with_metric(engine)
    barrier = threading.Barrier(2, timeout=20)
    outcomes: dict[str, object] = {}

    def review(name: str, score: int) -> None:
        try:
            with session_scope(engine) as s:
                barrier.wait()  # both start their transaction having seen version 1
                corrections.record_review(
                    session=s,
                    judgment_id=jid,
                    expected_version=1,
                    action="overrule",
                    user_decision=score,
                    reviewer=name,
                    reason="r",
                )
            outcomes[name] = "saved"
        except Exception as exc:  # the outcome is what the test checks
            outcomes[name] = exc

    threads = [threading.Thread(target=review, args=args) for args in (("ayse", 1), ("bob", 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [n for n, o in outcomes.items() if o == "saved"]
    losers = [o for o in outcomes.values() if isinstance(o, ReviewConflict)]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert losers[0].current.changed_by == winners[0]
    final = load(engine, jid)
    assert (final.reviewer, final.version) == (winners[0], 2)
    assert len(events(engine, jid)) == 1


@sqlite_only
@pytest.mark.parametrize("reviewer", [None, "", "   "])
def test_a_review_without_a_reviewer_is_refused_and_writes_nothing(engine, reviewer) -> None:
    jid = snapshot_with_metric(engine)
    with pytest.raises(MissingReviewer), session_scope(engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=2,
            reviewer=reviewer,
            reason="r",
        )
    assert load(engine, jid).version == 1 and events(engine) == []


@pytest.mark.parametrize("reason", [None, "", "  \n "])
def test_overruling_without_a_reason_is_refused(sqlite_engine, reason) -> None:
    jid = snapshot_with_metric(sqlite_engine)
    with pytest.raises(InvalidDecision, match="reason"), session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=2,
            reviewer="a",
            reason=reason,
        )
    assert load(sqlite_engine, jid).user_decision is None


def _define(engine: Engine, product: str, slug: str, lo: float, hi: float, integer: bool) -> None:
    with session_scope(engine) as s:
        s.add(
            MetricDefinition(
                product=product,
                slug=slug,
                display_name=slug.title(),
                min_value=lo,
                max_value=hi,
                integer_scale=integer,
            )
        )


@pytest.mark.parametrize(
    ("scale", "answer"),
    [
        (None, 6), (None, 0), (None, "abc"), (None, float("inf")), (None, True),
        ((0.0, 1.0, False), 1.5), ((0.0, 1.0, False), -0.1), ((1.0, 3.0, True), 4),
    ],
)  # fmt: skip
def test_a_score_off_the_metrics_scale_is_refused(sqlite_engine, scale, answer) -> None:
    if scale is not None:
        _define(sqlite_engine, "acme", "clarity", *scale)
    jid = snapshot_with_metric(sqlite_engine, decision="1")
    with pytest.raises(InvalidDecision), session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=answer,
            reviewer="a",
            reason="r",
        )


@pytest.mark.parametrize(
    ("scale", "answer", "stored"), [((0.0, 1.0, False), 0.35, "0.35"), ((1.0, 3.0, True), 2.67, "2.67")]
)
def test_a_score_on_a_custom_scale_is_accepted(sqlite_engine, scale, answer, stored) -> None:
    _define(sqlite_engine, "acme", "clarity", *scale)
    jid = snapshot_with_metric(sqlite_engine, decision="1")
    with session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=answer,
            reviewer="a",
            reason="r",
        )
    assert load(sqlite_engine, jid).user_decision == stored


@pytest.mark.parametrize(
    ("answer", "stored"), [("EXCLUDE", "EXCLUDE"), ("exclude", "EXCLUDE"), ("UNCERTAIN", "UNCERTAIN")]
)
def test_a_label_judgment_takes_one_of_its_labels(sqlite_engine, answer, stored) -> None:
    jid = label_judgment(sqlite_engine)
    with session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=answer,
            reviewer="a",
            reason="r",
        )
    assert load(sqlite_engine, jid).user_decision == stored


@pytest.mark.parametrize("answer", ["MAYBE", "", "3"])
def test_a_label_judgment_refuses_other_answers(sqlite_engine, answer) -> None:
    jid = label_judgment(sqlite_engine)
    with pytest.raises(InvalidDecision), session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision=answer,
            reviewer="a",
            reason="r",
        )


@pytest.mark.parametrize(
    ("decision", "metric", "described"),
    [("INCLUDE", None, "INCLUDE / EXCLUDE / UNCERTAIN"), ("4", "clarity", "1–5"), ("0.5", "mystery", "any number"),
     ("RELEVANT", None, "INCLUDE / EXCLUDE / UNCERTAIN / RELEVANT")],
)  # fmt: skip
def test_decision_scale_follows_the_rubric_or_the_label_set(
    sqlite_engine, decision, metric, described
) -> None:
    with session_scope(sqlite_engine) as s:
        j = Judgment(change_id="x", product="acme", metric=metric, decision=decision)
        assert corrections.decision_scale(session=s, judgment=j).describe() == described


def test_update_with_user_decision_works_by_change_id_and_reason_is_optional(engine) -> None:
    label_judgment(engine)
    with session_scope(engine) as s:
        j = corrections.update_with_user_decision(
            session=s, change_id="pr#1", user_decision="EXCLUDE", reviewer="cli"
        )
        assert (j.was_corrected, j.user_reasoning, j.version) == (True, None, 2)


def test_update_with_user_decision_on_an_unknown_change_id_raises(sqlite_engine) -> None:
    with pytest.raises(JudgmentNotFound), session_scope(sqlite_engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="nope", user_decision="EXCLUDE", reviewer="a"
        )


# ---------------------------------------------------------------------------------------------
# add_judgment, get_judgment, clear_product, stats


@pytest.mark.pg_repeats(
    "statements and lines of test_a_rejudge_agreeing_with_the_reviewer_keeps_the_reviewed_entry"
)
def test_add_judgment_inserts_version_1_with_a_judged_event(engine) -> None:
    with session_scope(engine) as s:
        corrections.add_judgment(
            session=s,
            judgment=Judgment(change_id="pr#9", product="acme", decision="INCLUDE"),
            reviewer="judge:gpt-4o",
        )
    with session_scope(engine) as s:
        j = corrections.get_judgment(session=s, change_id="pr#9")
        assert j is not None and j.version == 1
    assert [(e.action, e.reviewer, e.to_decision) for e in events(engine)] == [
        ("judged", "judge:gpt-4o", "INCLUDE")
    ]


@pytest.mark.parametrize("reviewer", [None, "ana"])
def test_a_judgment_added_with_a_user_decision_counts_as_the_list_shows_it(engine, reviewer) -> None:
    """Seed 004's entries carry a user override without a review time: the Corrections count (the
    counters, or a capped count with a reviewer filter) and the list agree on what is reviewed."""
    with session_scope(engine) as s:
        corrections.add_judgment(
            session=s,
            judgment=Judgment(
                change_id="pr#5", product="acme", decision="INCLUDE", user_decision="EXCLUDE", reviewer="ana"
            ),
            reviewer="ana",
        )
        corrections.add_judgment(
            session=s, judgment=Judgment(change_id="pr#6", product="acme", decision="INCLUDE"), reviewer="ana"
        )
    with session_scope(engine, read_only=True) as s:
        for state in (None, *corrections.REVIEW_STATES):
            filters = corrections.JudgmentFilter(product="acme", state=state, reviewer=reviewer)
            listed = corrections.list_judgments(session=s, filters=filters)
            assert corrections.count_judgments(session=s, filters=filters) == len(listed), state
            assert all(corrections.review_state(j) == state for j in listed if state), state
        corrected = corrections.JudgmentFilter(product="acme", state="corrected")
        assert [j.change_id for j in corrections.list_judgments(session=s, filters=corrected)] == ["pr#5"]


def _rejudge(engine: Engine, decision: str, **kwargs) -> Judgment:
    with session_scope(engine) as s:
        corrections.add_judgment(
            session=s,
            judgment=Judgment(change_id="pr#1", product="acme", decision=decision, reasoning="new run"),
            reviewer="judge",
            **kwargs,
        )
    with session_scope(engine, read_only=True) as s:
        j = corrections.get_judgment(session=s, change_id="pr#1")
        assert j is not None and s.exec(select(func.count()).select_from(Judgment)).one() == 1
        return j


@pytest.mark.pg_repeats(
    "statements and lines of test_a_rejudge_disagreeing_with_the_reviewer_keeps_the_correction_and_records_the_conflict"
)
def test_a_rejudge_replaces_an_unreviewed_judgment(engine) -> None:
    label_judgment(engine)
    j = _rejudge(engine, "EXCLUDE")
    assert (j.decision, j.user_decision, j.was_corrected, j.version, j.reasoning) == (
        "EXCLUDE", None, False, 2, "new run",
    )  # fmt: skip
    assert [e.action for e in events(engine)] == ["rejudged"]


def test_a_rejudge_agreeing_with_the_reviewer_keeps_the_reviewed_entry(engine) -> None:
    label_judgment(engine)
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="pr#1", user_decision="EXCLUDE", user_reasoning="internal", reviewer="a"
        )
    j = _rejudge(engine, "EXCLUDE")
    # Seed 004: the correction stays a correction (INCLUDE overruled by EXCLUDE) for the history.
    assert (j.decision, j.user_decision, j.user_reasoning, j.was_corrected, j.version) == (
        "INCLUDE", "EXCLUDE", "internal", True, 2,
    )  # fmt: skip
    assert [(e.action, e.to_decision) for e in events(engine)] == [
        ("overruled", "EXCLUDE"), ("rejudge_kept", "EXCLUDE"),
    ]  # fmt: skip


def test_a_rejudge_disagreeing_with_the_reviewer_keeps_the_correction_and_records_the_conflict(
    engine,
) -> None:
    label_judgment(engine)
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="pr#1", user_decision="EXCLUDE", user_reasoning="internal", reviewer="a"
        )
    j = _rejudge(engine, "UNCERTAIN")
    assert (j.decision, j.user_decision, j.user_reasoning, j.reviewer, j.was_corrected, j.version) == (
        "UNCERTAIN", "EXCLUDE", "internal", "a", True, 3,
    )  # fmt: skip
    last = events(engine)[-1]
    assert (last.action, last.from_decision, last.to_decision) == ("rejudge_conflict", "EXCLUDE", "UNCERTAIN")
    assert "EXCLUDE" in last.reason and "internal" in last.reason and "kept" in last.reason


@pytest.mark.pg_repeats(
    "statements and lines of test_a_rejudge_agreeing_with_the_reviewer_keeps_the_reviewed_entry"
)
def test_a_rejudge_against_a_version_that_moved_is_refused_and_changes_nothing(engine) -> None:
    label_judgment(engine)
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="pr#1", user_decision="EXCLUDE", reviewer="a"
        )
    with pytest.raises(ReviewConflict):
        _rejudge(engine, "UNCERTAIN", expected_version=1)
    with session_scope(engine, read_only=True) as s:
        j = corrections.get_judgment(session=s, change_id="pr#1")
        assert j is not None and (j.decision, j.user_decision, j.version) == ("INCLUDE", "EXCLUDE", 2)
    assert [e.action for e in events(engine)] == ["overruled"]


def test_add_judgment_without_a_reviewer_is_refused(sqlite_engine) -> None:
    with pytest.raises(MissingReviewer), session_scope(sqlite_engine) as s:
        corrections.add_judgment(
            session=s, judgment=Judgment(change_id="x", product="p", decision="INCLUDE"), reviewer=None
        )


def test_get_judgment_returns_none_for_an_unknown_change_id(engine) -> None:
    with session_scope(engine) as s:
        assert corrections.get_judgment(session=s, change_id="missing") is None


@pytest.mark.pg_repeats(
    "statements and lines of test_clear_product_deletes_its_alignment_experiments_in_the_same_transaction"
)
def test_clear_product_removes_that_product_and_its_events_only(engine) -> None:
    pools(engine, 2, 3, product="acme")
    pools(engine, 1, 1, product="other")
    with session_scope(engine) as s:
        corrections.update_with_user_decision(
            session=s, change_id="acme-k0", user_decision="EXCLUDE", reviewer="a"
        )
        corrections.update_with_user_decision(
            session=s, change_id="other-k0", user_decision="EXCLUDE", reviewer="a"
        )
    with session_scope(engine) as s:
        assert corrections.clear_product(session=s, product="acme", reviewer="admin") == 5
    with session_scope(engine) as s:
        assert set(s.exec(select(Judgment.product)).all()) == {"other"}
    assert [e.change_id for e in events(engine)] == ["other-k0"]


def experiment_on(engine: Engine, product: str, judgment_product: str | None = None) -> int:
    """An alignment experiment of `product` that sampled one judgment of `judgment_product` (same
    product by default), with one call, as lib.alignment.create_experiment leaves them."""
    with session_scope(engine) as s:
        judgment = s.exec(select(Judgment).where(Judgment.product == (judgment_product or product))).first()
        assert judgment is not None and judgment.id is not None
        experiment = AlignmentExperiment(name=f"lab {product}", product=product, metrics=["m"], arms=["bare"])
        s.add(experiment)
        s.flush()
        assert experiment.id is not None
        s.add(
            AlignmentItem(
                experiment_id=experiment.id,
                judgment_id=judgment.id,
                snapshot_id="snap",
                metric="m",
                reviewer_score=1.0,
                as_of=T0,
            )
        )
        s.add(AlignmentCall(experiment_id=experiment.id, arm="bare", snapshot_id="snap"))
        return experiment.id


def test_clear_product_deletes_its_alignment_experiments_in_the_same_transaction(engine) -> None:
    """Issue 24.9: an experiment's items reference the judgments, so clearing crashed (foreign key)."""
    pools(engine, 2, 1, product="acme")
    pools(engine, 1, 1, product="other")
    own, borrowed, kept = (
        experiment_on(engine, "acme"),
        experiment_on(engine, "x", "acme"),
        experiment_on(engine, "other"),
    )
    with session_scope(engine, read_only=True) as s:
        assert [e.id for e in corrections.experiments_on_product(session=s, product="acme")] == [
            own,
            borrowed,
        ]
    with session_scope(engine) as s:
        assert corrections.clear_product(session=s, product="acme", reviewer="admin") == 3
    with session_scope(engine, read_only=True) as s:
        assert set(s.exec(select(Judgment.product)).all()) == {"other"}
        assert s.exec(select(AlignmentExperiment.id)).all() == [kept]
        assert set(s.exec(select(AlignmentItem.experiment_id)).all()) == {kept}
        assert set(s.exec(select(AlignmentCall.experiment_id)).all()) == {kept}


def test_a_run_of_a_cleared_experiment_stops_instead_of_failing(engine) -> None:
    from lib import alignment
    from lib.config import get_settings

    pools(engine, 1, 1, product="acme")
    experiment_id = experiment_on(engine, "acme")
    with session_scope(engine, read_only=True) as s:
        call_id = s.exec(select(AlignmentCall.id)).one()
    with session_scope(engine) as s:
        corrections.clear_product(session=s, product="acme", reviewer="admin")
    assert alignment.run_call(engine, call_id, get_settings()) == "deleted"
    assert alignment._cancelled(engine, experiment_id)


def test_clear_product_without_a_reviewer_is_refused(sqlite_engine) -> None:
    pools(sqlite_engine, 1, 1)
    with pytest.raises(MissingReviewer), session_scope(sqlite_engine) as s:
        corrections.clear_product(session=s, product="acme", reviewer="")


@pytest.mark.pg_repeats("statements and lines of test_stats_counts_corrections_products_and_age")
def test_stats_on_an_empty_cache(engine) -> None:
    with session_scope(engine) as s:
        assert corrections.stats(session=s) == {
            "total_judgments": 0, "reviewed_count": 0, "corrected_count": 0, "correct_count": 0,
            "correction_rate": None, "products": [], "oldest_judgment": None, "newest_judgment": None,
        }  # fmt: skip


def test_stats_counts_corrections_products_and_age(engine) -> None:
    pools(engine, 3, 9, product="acme")
    pools(engine, 1, 0, product="beta")
    with session_scope(engine) as s:
        everything = corrections.stats(session=s)
        acme = corrections.stats(session=s, product="acme")
    assert (everything["total_judgments"], everything["corrected_count"], everything["correct_count"]) == (
        13,
        4,
        9,
    )
    assert everything["products"] == ["acme", "beta"]
    # Seed 004's rate is corrected ÷ every judgment: the 9 unreviewed ones count as correct.
    assert (acme["total_judgments"], acme["reviewed_count"], acme["products"]) == (12, 3, ["acme"])
    assert acme["correction_rate"] == 0.25
    assert acme["oldest_judgment"] == T0.date().isoformat()  # days: what the counters keep
    assert acme["newest_judgment"] == (T0 + timedelta(hours=17)).date().isoformat()


@pytest.mark.pg_repeats("statements and lines of test_stats_counts_corrections_products_and_age")
def test_stats_correction_rate_is_the_seeds_corrected_of_every_judgment(engine) -> None:
    """Seed 004's example: 45 corrected of 150 judgments is 0.30, and correct_count is 150 − 45."""
    with session_scope(engine) as s:
        for i in range(150):
            # 45 overruled, 30 confirmed, 75 never reviewed
            add(s, f"j{i}", corrected=i < 45, reviewed=i < 75, hours=i)
    with session_scope(engine) as s:
        summary = corrections.stats(session=s)
    assert summary["correction_rate"] == 0.30
    assert (summary["total_judgments"], summary["corrected_count"], summary["correct_count"]) == (
        150,
        45,
        105,
    )
    assert summary["reviewed_count"] == 75  # what the pages divide by: 45 of 75 reviewed


def test_stats_honour_the_reviewer_and_metric_filters(engine) -> None:
    with session_scope(engine) as s:
        add(s, "a1", corrected=True, metric="clarity", hours=1)  # reviewer ayse
        add(s, "a2", reviewed=True, metric="safety", hours=30)
        add(s, "a3", reviewed=True, metric="clarity", product="beta", hours=50)
        b = add(s, "b1", corrected=True, metric="clarity", hours=2)
        b.reviewer = "bora"
        add(s, "open", metric="clarity", hours=3)  # nobody reviewed it
    with session_scope(engine) as s:
        ayse = corrections.stats(session=s, reviewer="ayse")
        ayse_clarity = corrections.stats(session=s, reviewer="ayse", metric="clarity")
        ayse_acme = corrections.stats(session=s, reviewer="ayse", product="acme")
        bora = corrections.stats(session=s, reviewer="bora")
        clarity = corrections.stats(session=s, metric="clarity")
        nobody = corrections.stats(session=s, reviewer="nobody")
    assert (ayse["total_judgments"], ayse["reviewed_count"], ayse["corrected_count"]) == (3, 3, 1)
    assert ayse["products"] == ["acme", "beta"] and ayse["correction_rate"] == pytest.approx(1 / 3)
    assert (ayse["oldest_judgment"], ayse["newest_judgment"]) == ("2024-01-01", "2024-01-03")
    assert (ayse_clarity["total_judgments"], ayse_clarity["products"]) == (2, ["acme", "beta"])
    assert (ayse_acme["total_judgments"], ayse_acme["products"], ayse_acme["newest_judgment"]) == (
        2, ["acme"], "2024-01-02",
    )  # fmt: skip
    assert (bora["total_judgments"], bora["corrected_count"], bora["correction_rate"]) == (1, 1, 1.0)
    assert (clarity["total_judgments"], clarity["corrected_count"], clarity["products"]) == (
        4,
        2,
        ["acme", "beta"],
    )
    assert nobody == {
        "total_judgments": 0, "reviewed_count": 0, "corrected_count": 0, "correct_count": 0,
        "correction_rate": None, "products": [], "oldest_judgment": None, "newest_judgment": None,
    }  # fmt: skip


def test_stats_under_a_reviewer_follow_reviews_and_undo(engine) -> None:
    """A review moves a judgment to its reviewer's figures; a second reviewer's re-review and an undo move it on."""
    with session_scope(engine) as s:
        j = add(s, "x", metric="clarity", decision="3")
        s.flush()
        jid = j.id

    def figures(reviewer: str) -> tuple[int, int, int]:
        with session_scope(engine) as s:
            found = corrections.stats(session=s, reviewer=reviewer)
        return found["total_judgments"], found["reviewed_count"], found["corrected_count"]

    def version() -> int:
        with session_scope(engine) as s:
            return s.get(Judgment, jid).version

    with session_scope(engine) as s:
        corrections.record_review(session=s, judgment_id=jid, expected_version=version(), action="overrule",
                                  user_decision="5", reason="too low", reviewer="ayse")  # fmt: skip
    assert figures("ayse") == (1, 1, 1) and figures("") == (0, 0, 0)
    with session_scope(engine) as s:
        corrections.record_review(session=s, judgment_id=jid, expected_version=version(), action="confirm",
                                  reviewer="bora")  # fmt: skip
    assert figures("ayse") == (0, 0, 0) and figures("bora") == (1, 1, 0)
    with session_scope(engine) as s:
        corrections.undo_review(session=s, judgment_id=jid, expected_version=version(), reviewer="bora")
    assert figures("bora") == (0, 0, 0) and figures("ayse") == (1, 1, 1)
    with session_scope(engine) as s:
        assert corrections.count_judgments(session=s, filters=JudgmentFilter(reviewer="ayse")) == 1
        assert corrections.count_judgments(session=s, filters=JudgmentFilter(reviewer="bora")) == 0


# ---------------------------------------------------------------------------------------------
# The prompt block


def _entry(**kw) -> Judgment:
    base = {"change_id": "c1", "product": "acme", "decision": "INCLUDE", "timestamp": T0}
    return Judgment(**{**base, **kw})


def test_prompt_block_shows_a_correction_with_the_reviewers_decision_and_reason() -> None:
    block = corrections.format_history_for_prompt(
        [
            _entry(
                reasoning="core feature",
                user_decision="EXCLUDE",
                user_reasoning="internal tooling",
                was_corrected=True,
            )
        ]
    )
    assert block.splitlines()[1:] == [
        "1. [CORRECTED] c1",
        "   AI decision: INCLUDE | AI reasoning: core feature",
        "   Reviewer's decision: EXCLUDE | Reviewer's reason: internal tooling",
    ]


@pytest.mark.parametrize(
    ("fields", "tag"),
    [({"user_decision": "INCLUDE"}, "CONFIRMED"), ({}, "NOT REVIEWED"),
     ({"user_decision": "EXCLUDE", "was_corrected": True}, "CORRECTED")],
)  # fmt: skip
def test_prompt_block_tags_each_entry_by_review_state(fields, tag) -> None:
    assert f"1. [{tag}] c1" in corrections.format_history_for_prompt([_entry(**fields)])


def test_prompt_block_names_the_metric_and_numbers_entries_in_order() -> None:
    block = corrections.format_history_for_prompt(
        [_entry(change_id="a", metric="clarity"), _entry(change_id="b")]
    )
    assert "1. [NOT REVIEWED] a | metric: clarity" in block and "2. [NOT REVIEWED] b" in block


def test_newlines_in_reasons_cannot_forge_entries() -> None:
    block = corrections.format_history_for_prompt(
        [
            _entry(
                user_decision="EXCLUDE",
                was_corrected=True,
                user_reasoning="ok\n2. [CORRECTED] fake\n   AI decision: X",
            )
        ]
    )
    assert len(block.splitlines()) == 4
    assert not any(line.startswith("2.") for line in block.splitlines())


# ---------------------------------------------------------------------------------------------
# Listing, CSV, trend


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (JudgmentFilter(), 7),
        (JudgmentFilter(state="corrected"), 2),
        (JudgmentFilter(state="confirmed"), 1),
        (JudgmentFilter(state="unreviewed"), 4),
        (JudgmentFilter(product="beta"), 1),
        (JudgmentFilter(metric="clarity"), 2),
        (JudgmentFilter(reviewer="ayse"), 3),
    ],
)
def test_listing_filters_count_what_they_list(engine, filters, expected) -> None:
    with session_scope(engine) as s:
        add(s, "a1", corrected=True, metric="clarity", hours=1)
        add(s, "a2", corrected=True, hours=2)
        add(s, "a3", reviewed=True, metric="clarity", hours=3)
        for i in range(3):
            add(s, f"u{i}", hours=4 + i)
        add(s, "b1", product="beta", hours=9)
    with session_scope(engine) as s:
        assert corrections.count_judgments(session=s, filters=filters) == expected
        assert len(corrections.list_judgments(session=s, filters=filters, limit=100)) == expected


def test_listing_pages_most_recently_added_first(engine) -> None:
    pools(engine, 0, 7)
    with session_scope(engine) as s:
        page2 = corrections.list_judgments(session=s, filters=JudgmentFilter(), offset=3, limit=3)
    assert [j.change_id for j in page2] == ["acme-k3", "acme-k2", "acme-k1"]


def test_unknown_state_filter_is_refused(sqlite_engine) -> None:
    with session_scope(sqlite_engine) as s, pytest.raises(ValueError):
        corrections.count_judgments(session=s, filters=JudgmentFilter(state="weird"))


def test_filtered_csv_holds_every_matching_row_with_formulas_neutralised(sqlite_engine) -> None:
    with session_scope(sqlite_engine) as s:
        j = add(s, "c1", corrected=True)
        j.user_reasoning = '=HYPERLINK("http://evil")'
        add(s, "k1", hours=1)
    raw = export.judgments_csv_bytes(engine=sqlite_engine, filters=JudgmentFilter(state="corrected"))
    rows = list(csv.DictReader(io.StringIO(raw.decode())))
    assert [r["change_id"] for r in rows] == ["c1"]
    assert rows[0]["reviewer_reason"].startswith("'=")


def test_csv_streams_judgments_in_batches_newest_first_up_to_the_limit(
    sqlite_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corrections, "CSV_BATCH_ROWS", 1)
    with session_scope(sqlite_engine) as s:
        for i in range(4):
            add(s, f"k{i}", hours=i)
    raw = export.judgments_csv_bytes(engine=sqlite_engine, filters=JudgmentFilter(), limit=3)
    rows = list(csv.DictReader(io.StringIO(raw.decode())))
    assert [r["change_id"] for r in rows] == ["k3", "k2", "k1"]
    assert rows[0]["state"] == "unreviewed" and rows[0]["timestamp"].endswith("Z")


def test_corrected_of_reviewed_over_time_is_per_product_and_week(engine) -> None:
    monday = datetime(2024, 1, 1, tzinfo=UTC)  # a Monday
    with session_scope(engine) as s:
        for i, (days, corrected) in enumerate(
            [(0, True), (1, False), (2, False), (3, True), (7, True), (8, True)]
        ):
            j = add(s, f"a{i}", corrected=corrected, reviewed=True)
            j.timestamp = monday + timedelta(days=days, hours=10)
        add(s, "unreviewed", hours=5)  # not counted: nobody has looked at it yet
        add(s, "b1", corrected=True, product="beta", hours=1)
    with session_scope(engine) as s:
        frame = corrections.corrected_of_reviewed_over_time(session=s)
    rows = [
        (r.product, r.period.date().isoformat(), r.reviewed, r.corrected, r.corrected_of_reviewed)
        for r in frame.itertuples()
    ]
    assert rows == [
        ("acme", "2024-01-01", 4, 2, 0.5),
        ("acme", "2024-01-08", 2, 2, 1.0),
        ("beta", "2024-01-01", 1, 1, 1.0),
    ]


def test_corrected_of_reviewed_over_time_is_empty_without_reviews(engine) -> None:
    pools(engine, 0, 3)
    with session_scope(engine) as s:
        assert corrections.corrected_of_reviewed_over_time(session=s).empty


def test_events_frame_lists_the_trail_oldest_first(sqlite_engine) -> None:
    jid = label_judgment(sqlite_engine)
    with session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=1,
            action="overrule",
            user_decision="EXCLUDE",
            reviewer="a",
            reason="r1",
        )
    with session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s,
            judgment_id=jid,
            expected_version=2,
            action="confirm",
            user_decision="INCLUDE",
            reviewer="b",
        )
    with session_scope(sqlite_engine) as s:
        frame = corrections.events_frame(corrections.events_for(session=s, judgment_id=jid))
    assert frame[["reviewer", "action", "from", "to"]].values.tolist() == [
        ["a", "overruled", "INCLUDE", "EXCLUDE"],
        ["b", "confirmed", "EXCLUDE", "INCLUDE"],
    ]


# ---------------------------------------------------------------------------------------------
# The seed-004 JSON cache file


def _cache(version: str = "1.0") -> bytes:
    return json.dumps(
        {
            "cache_version": version,
            "judgments": {
                "github.com/o/r#123": {
                    "change_id": "github.com/o/r#123", "decision": "INCLUDE", "reasoning": "core feature",
                    "user_decision": "EXCLUDE", "user_reasoning": "internal tooling", "product": "Acme Fungear",
                    "timestamp": "2024-11-15T10:30:00Z", "url": "https://github.com/o/r/pull/123",
                }
            },
        }
    ).encode()  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        _cache("2.0"),
        b'{"judgments": {}}',
        b"[]",
        _cache()[:-20],
        "\udcff".encode("utf-8", "surrogatepass"),
    ],
)
def test_a_corrupted_or_wrong_version_cache_is_refused_and_changes_nothing(sqlite_engine, raw) -> None:
    pools(sqlite_engine, 1, 1)
    with pytest.raises(ImportFailed, match="nothing was imported"), session_scope(sqlite_engine) as s:
        importer.import_cache_bytes(session=s, raw=raw, source="cache.json", reviewer="ayse")
    with session_scope(sqlite_engine) as s:
        assert s.exec(select(func.count()).select_from(Judgment)).one() == 2


def test_a_valid_cache_imports_with_was_corrected_and_optional_fields(sqlite_engine) -> None:
    with session_scope(sqlite_engine) as s:
        report = importer.import_cache_bytes(session=s, raw=_cache(), source="cache.json", reviewer="ayse")
    assert report.inserted == 1
    with session_scope(sqlite_engine) as s:
        j = corrections.get_judgment(session=s, change_id="github.com/o/r#123")
        assert j is not None and j.was_corrected and j.url == "https://github.com/o/r/pull/123"


def test_import_without_a_reviewer_is_refused(sqlite_engine) -> None:
    with pytest.raises(MissingReviewer), session_scope(sqlite_engine) as s:
        importer.import_cache_bytes(session=s, raw=_cache(), source="cache.json", reviewer=None)


def test_export_writes_the_seed_004_file_that_imports_back(sqlite_engine, tmp_path) -> None:
    with session_scope(sqlite_engine) as s:
        importer.import_cache_bytes(session=s, raw=_cache(), source="cache.json", reviewer="ayse")
        add(s, "other-1", product="Other")
    data = json.loads(export.export_cache_bytes(engine=sqlite_engine, product="Acme Fungear"))
    assert data["cache_version"] == "1.0"
    assert list(data["judgments"]) == ["github.com/o/r#123"]
    entry = data["judgments"]["github.com/o/r#123"]
    assert (entry["user_decision"], entry["timestamp"][:19]) == ("EXCLUDE", "2024-11-15T10:30:00")
    fresh = init_db(f"sqlite:///{tmp_path / 'fresh.db'}")  # a second database, migrated from scratch
    with session_scope(fresh) as s:
        report = importer.import_cache_bytes(
            session=s, raw=json.dumps(data).encode(), source="export.json", reviewer="ayse"
        )
    fresh.dispose()
    assert report.inserted == 1


# ---------------------------------------------------------------------------------------------
# CLI: python -m lib history


@pytest.fixture
def cli_db(monkeypatch, sqlite_engine, sqlite_url) -> Engine:
    monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
    from lib.config import reset_settings

    reset_settings()
    return sqlite_engine


def test_cli_history_json_lists_judgments_in_selection_order(cli_db, capsys) -> None:
    pools(cli_db, 3, 3)
    assert cli_main(["history", "--product", "acme", "--max-entries", "4", "--ratio", "0.5"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["change_id"] for r in records] == ["acme-c2", "acme-k2", "acme-c1", "acme-k1"]
    assert records[0]["was_corrected"] is True and records[0]["user_decision"] == "EXCLUDE"


def test_cli_history_prompt_prints_the_block_the_judge_gets(cli_db, capsys) -> None:
    pools(cli_db, 2, 2)
    assert cli_main(["history", "--product", "acme", "--format", "prompt"]) == 0
    with session_scope(cli_db) as s:
        expected = corrections.history_block(session=s, product="acme")
    assert capsys.readouterr().out.rstrip("\n") == expected


def test_cli_history_cold_start_prints_the_seed_note(cli_db, capsys) -> None:
    assert cli_main(["history", "--product", "nobody", "--format", "prompt"]) == 0
    assert capsys.readouterr().out.strip() == HISTORY_EMPTY_TEXT


def test_cli_history_with_a_bad_ratio_fails_on_stderr(cli_db, capsys) -> None:
    assert cli_main(["history", "--product", "acme", "--ratio", "1.5"]) == 1
    captured = capsys.readouterr()
    assert "correction_ratio" in captured.err and captured.out == ""


def test_distinct_products_and_metrics_come_from_loose_index_scans(engine) -> None:
    with session_scope(engine) as s:
        for i, (product, metric) in enumerate(
            [("b", "clarity"), ("a", None), ("a", "safety"), ("c", "clarity")]
        ):
            add(s, f"j{i}", product=product, metric=metric)
    with session_scope(engine) as s:
        products = corrections.distinct_products(session=s)
        assert products == ["a", "b", "c"]
        assert corrections.distinct_metrics(session=s, products=products) == ["clarity", "safety"]
        assert corrections.distinct_metrics(session=s, products=["b"]) == ["clarity"]


def test_confirming_the_judge_is_allowed_even_off_the_current_scale(sqlite_engine) -> None:
    _define(sqlite_engine, "acme", "clarity", 1.0, 3.0, True)  # the rubric shrank after the judge said 4
    jid = snapshot_with_metric(sqlite_engine, decision="4")
    with session_scope(sqlite_engine) as s:
        corrections.record_review(
            session=s, judgment_id=jid, expected_version=1, action="confirm", user_decision="4", reviewer="a"
        )
    j = load(sqlite_engine, jid)
    assert (j.user_decision, j.was_corrected) == ("4", False)


# ---------------------------------------------------------------------------------------------
# One text form of a score (format_score), used by every writer


@pytest.mark.parametrize(
    ("value", "text"),
    [(4, "4"), (4.0, "4"), (-0.0, "0"), (2.67, "2.67"), (1 / 3, "0.3333333333333333"), (1e-7, "1e-07")],
)
def test_format_score_writes_whole_numbers_bare_and_others_in_their_shortest_exact_form(value, text) -> None:
    assert corrections.format_score(value) == text


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_format_score_reads_back_to_the_same_number(value: float) -> None:
    text = corrections.format_score(value)
    assert float(text) == value and not text.endswith(".0")


def test_the_importer_and_the_judge_write_scores_with_format_score() -> None:
    from lib.snapshots import snapshot_judgment_rows

    row = {
        "id": "snap",
        "product": "acme",
        "judge_model": "m",
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    rows = snapshot_judgment_rows(row, [("groundedness", 1 / 3, None, None), ("clarity", 4.0, "ok", "good")])
    assert [(r["decision"], r["label"]) for r in rows] == [("0.3333333333333333", None), ("4", "good")]


# ---------------------------------------------------------------------------------------------
# Soft delete (seed 002 AD-13): an archived evaluation's judgments feed no normal query


@pytest.mark.pg_repeats(
    "statements and lines of test_the_cache_download_leaves_archived_evaluations_out_until_restored"
)
def test_judgments_of_an_archived_evaluation_leave_history_stats_and_lists_until_restored(engine) -> None:
    from lib.inspector import archive_evaluation, restore_evaluation

    pools(engine, 2, 2)
    with session_scope(engine) as s:
        s.add(EvaluationSnapshot(id="snap_old", question="q", model_answer="a", product="acme"))
        s.flush()
        for metric, corrected in (("clarity", True), ("safety", False)):
            j = add(s, f"snap_old:{metric}", corrected=corrected, reviewed=True, metric=metric, hours=100)
            j.snapshot_id = "snap_old"

    def seen() -> tuple[list[str], int, list[str], int, list[str]]:
        with session_scope(engine, read_only=True) as s:
            history = [j.change_id for j in corrections.select_history(s, "acme")]
            total = corrections.stats(session=s)["total_judgments"]
            metrics = corrections.distinct_metrics(session=s, products=["acme"])
            listed = corrections.count_judgments(
                session=s, filters=corrections.JudgmentFilter(product="acme")
            )
            rate = corrections.corrected_of_reviewed_over_time(session=s)
            return history, total, metrics, listed, rate["reviewed"].tolist()

    live = seen()
    assert "snap_old:clarity" in live[0] and "snap_old:safety" in live[0]
    assert (live[1], live[2], live[3], sum(live[4])) == (6, ["clarity", "safety"], 6, 4)
    with session_scope(engine) as s:
        assert archive_evaluation(session=s, snapshot_id="snap_old", reviewer="ayse")
    archived = seen()
    assert not any(c.startswith("snap_old") for c in archived[0])
    assert (archived[1], archived[2], archived[3], sum(archived[4])) == (4, [], 4, 2)
    with session_scope(engine) as s:
        assert restore_evaluation(session=s, snapshot_id="snap_old", reviewer="ayse")
    assert seen() == live


def test_the_cache_download_leaves_archived_evaluations_out_until_restored(engine) -> None:
    """The Corrections page's JSON download holds what history, stats and lists hold (issue 25 point 5)."""
    from lib.inspector import archive_evaluation, restore_evaluation

    with session_scope(engine) as s:
        add(s, "standalone", corrected=True)  # no evaluation: always live
        for sid in ("snap_old", "snap_live"):
            s.add(EvaluationSnapshot(id=sid, question="q", model_answer="a", product="acme"))
            s.flush()
            add(s, f"{sid}:clarity", corrected=True, metric="clarity").snapshot_id = sid
        add(s, "other:1", product="beta")

    def downloaded(product: str | None = "acme") -> list[str]:
        return sorted(json.loads(export.export_cache_bytes(engine=engine, product=product))["judgments"])

    assert downloaded() == ["snap_live:clarity", "snap_old:clarity", "standalone"]
    with session_scope(engine) as s:
        assert archive_evaluation(session=s, snapshot_id="snap_old", reviewer="ayse")
    assert downloaded() == ["snap_live:clarity", "standalone"]
    assert downloaded(None) == ["other:1", "snap_live:clarity", "standalone"]
    with session_scope(engine) as s:
        assert restore_evaluation(session=s, snapshot_id="snap_old", reviewer="ayse")
    assert downloaded() == ["snap_live:clarity", "snap_old:clarity", "standalone"]


def test_select_history_still_walks_the_history_index_with_the_archive_check(sqlite_engine) -> None:
    with session_scope(sqlite_engine, read_only=True) as s:
        sql = corrections.history_pool_sql(session=s, product="acme", metric=None, corrected=True, limit=20)
        plan = " ".join(str(r[-1]) for r in s.connection().exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
    assert "USING INDEX ix_judgment_history" in plan and "SCAN judgments" not in plan


def test_select_history_skips_archived_judgments_among_the_newest_and_still_fills_its_slots(engine) -> None:
    from lib.inspector import archive_evaluation

    pools(engine, 3, 3)
    with session_scope(engine) as s:
        for n in range(5):  # the five newest corrections belong to one evaluation, then archived
            s.add(EvaluationSnapshot(id=f"snap_{n}", question="q", model_answer="a", product="acme"))
            s.flush()
            add(
                s, f"snap_{n}:clarity", corrected=True, metric="clarity", hours=100 + n
            ).snapshot_id = f"snap_{n}"
        s.flush()
        for n in range(5):
            archive_evaluation(session=s, snapshot_id=f"snap_{n}", reviewer="ayse")
    assert history_ids(engine, max_entries=4, correction_ratio=0.5) == interleave(
        newest("acme-c", 3, 2), newest("acme-k", 3, 2)
    )
