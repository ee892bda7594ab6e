"""Tag relevance (seed 001): the EMA, the evidence average and decisions, pinning, audits, the
evaluator against the local OpenAI-compatible server, reviewer feedback, and `relevant_notes`.

Database tests run on SQLite and PostgreSQL through the `engine` fixture.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from lib import relevance
from lib.__main__ import main
from lib.config import reset_settings
from lib.db import session_scope
from lib.judge import EvaluationInput, judge_evaluation
from lib.llm import LLMNotConfigured
from lib.models import (
    LessonMatchStat,
    LessonTagRelevance,
    ProcessedRelevanceSession,
    SessionAudit,
    SessionNote,
    TagRelevanceEvent,
    utcnow,
)
from lib.notes import add_note, relevant_notes, remove_notes
from lib.relevance import (
    AlreadyRated,
    PinState,
    UnknownNote,
    apply_evaluation,
    apply_score,
    auto_pin_decision,
    build_env_tags,
    ema_update,
    evaluate_pending,
    explain,
    find_match_pin_tags,
    manual_pin_state,
    mark_failed,
    normalize_tags,
    parse_evaluator_reply,
    record_audit,
    record_feedback,
    record_matches,
    relevance_decision,
    set_manual_pin,
    shown_notes_for_snapshot,
    tag_relevance_with_evidence,
    tag_step,
    transcript_excerpt,
    unprocessed_audits,
    update_pin_state,
)
from lib.relevance_charts import ema_history_figure, tag_heatmap_figure
from tests.conftest import sqlite_only
from tests.llm_server import LLMServer, json_reply, server_error

pytestmark = pytest.mark.timeout(60)

SEED_TAGS = ["python", "github", "personal"]


def make_note(session: Session, content: str = "Check the rubric scale first.", **kw: Any) -> int:
    values: dict[str, Any] = {"language": "en", "note_type": "TIP", "session_id": "20250101_000000_1_000001"}
    values.update(kw)
    note = add_note(session=session, content=content, **values)
    return int(note.id or 0)


def set_row(session: Session, note_id: int, tag: str, score: float, pos: int = 0, neg: int = 0) -> None:
    session.add(
        LessonTagRelevance(lesson_id=note_id, tag=tag, score=score, positive_evals=pos, negative_evals=neg)
    )
    session.flush()


def seed_lesson(session: Session) -> int:
    """The seed's example lesson: python -0.283 (+0/-148), github -0.584 (+0/-197), acme 0.0 (+1/-0)."""
    note_id = make_note(session)
    set_row(session, note_id, "acme", 0.0, pos=1)
    set_row(session, note_id, "frontend", 0.0)
    set_row(session, note_id, "python", -0.283, neg=148)
    set_row(session, note_id, "github", -0.584, neg=197)
    return note_id


def note(session: Session, note_id: int) -> SessionNote:
    found = session.get(SessionNote, note_id, populate_existing=True)
    assert found is not None
    return found


# --------------------------------------------------------------------------------------------
# ema_update


@pytest.mark.parametrize(
    ("evaluations", "expected"), [(1, -0.300), (2, -0.510), (3, -0.657), (4, -0.760), (5, -0.832)]
)
def test_ema_follows_the_seed_sequence_for_repeated_negative_evaluations(
    evaluations: int, expected: float
) -> None:
    score = 0.0
    for _ in range(evaluations):
        score = ema_update(score, -1.0)
    assert round(score, 3) == expected


@pytest.mark.parametrize(("evaluations", "tolerance"), [(10, 0.03), (100, 1e-9)])
def test_ema_converges_toward_minus_one_and_never_past_it(evaluations: int, tolerance: float) -> None:
    score = 0.0
    for _ in range(evaluations):
        score = ema_update(score, -1.0)
        assert score >= -1.0
    assert abs(score - -1.0) < tolerance


@pytest.mark.parametrize(
    ("old", "raw", "weight", "expected"),
    [(3.0, 10.0, 2.0, 3.0), (-3.0, -10.0, 2.0, -3.0), (2.9, 5.0, 1.0, 3.0), (0.0, -20.0, 1.0, -3.0)],
)
def test_ema_is_clamped_to_plus_minus_three(old: float, raw: float, weight: float, expected: float) -> None:
    assert ema_update(old, raw, weight) == expected


@pytest.mark.parametrize(("raw", "weight", "expected"), [(1.0, 2.0, 0.6), (-1.0, 2.0, -0.6), (1.0, 1.0, 0.3)])
def test_ema_weight_multiplies_the_raw_score(raw: float, weight: float, expected: float) -> None:
    assert ema_update(0.0, raw, weight) == pytest.approx(expected)


@pytest.mark.parametrize(("raw", "weight", "expected"), [(5.0, 1.0, 1.5), (-4.0, 2.0, -2.4)])
def test_raw_score_is_not_clamped_before_the_update(raw: float, weight: float, expected: float) -> None:
    assert ema_update(0.0, raw, weight) == pytest.approx(expected)


def test_ema_keeps_seventy_percent_of_the_old_score() -> None:
    assert ema_update(1.0, 0.0) == pytest.approx(0.7)


@pytest.mark.parametrize(("raw", "counts"), [(0.5, (3, 1)), (-0.5, (2, 2)), (0.0, (2, 1))])
def test_tag_step_counts_the_direction_only(raw: float, counts: tuple[int, int]) -> None:
    score, positive, negative = tag_step(0.4, 2, 1, raw, 2.0)
    assert score == ema_update(0.4, raw, 2.0)
    assert (positive, negative) == counts


# --------------------------------------------------------------------------------------------
# The pure pin decisions (update_pin_state, set_manual_pin and the demo replay all use them)


@pytest.mark.parametrize(
    ("scores", "total", "change"),
    [({"a": 0.61}, 5, "pinned"), ({"a": 0.6}, 5, None), ({"a": 2.0}, 4, None), ({}, 9, None),
     ({"a": 1.5, "b": -0.2}, 6, "pinned")],
)  # fmt: skip
def test_auto_pin_decision_on_an_unpinned_note(
    scores: dict[str, float], total: int, change: str | None
) -> None:
    state, got = auto_pin_decision(PinState(), scores, total)
    assert got == change
    assert state.pinned is (change == "pinned")
    if change:
        assert state.prerequisites == {
            "auto_pinned": True,
            "tags": sorted(t for t, s in scores.items() if s > 0),
        }


@pytest.mark.parametrize(
    ("state", "change"),
    [(PinState(True, True, {"auto_pinned": True, "tags": ["a"]}), "unpinned"),
     (PinState(True, False, {"pinned_by": "ayse"}), None),
     (PinState(True, False, {"match_pinned": True}), None)],
)  # fmt: skip
def test_auto_pin_decision_unpins_only_auto_pins(state: PinState, change: str | None) -> None:
    new, got = auto_pin_decision(state, {"a": 0.1, "b": 0.2}, 10)
    assert got == change
    assert new.pinned is (change is None)
    if change:
        assert new.prerequisites == {"tags": ["a"]}


def test_manual_pin_state_replaces_auto_and_match_pins() -> None:
    at = datetime(2026, 11, 1, 12, 0)
    old = PinState(True, True, {"auto_pinned": True, "match_pinned": True, "tags": ["a"]})
    new = manual_pin_state(old, True, "ayse", at)
    assert new == PinState(True, False, {"tags": ["a"], "pinned_by": "ayse", "pinned_at": at.isoformat()})
    assert old.prerequisites["auto_pinned"] is True  # the input state is never mutated
    unpinned = manual_pin_state(new, False, "bora", at)
    assert (unpinned.pinned, unpinned.prerequisites["pinned_by"], unpinned.prerequisites["unpinned_at"]) == (
        False, "bora", at.isoformat(),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# relevance_decision: the seed's state table, row by row


@pytest.mark.parametrize(
    ("avg", "evals", "decision"),
    [
        pytest.param(0.0, 0, "neutral", id="new-no-data-passes-no-boost"),
        pytest.param(0.5, 3, "boosted", id="positive-signal-boosted"),
        pytest.param(-0.05, 3, "penalized", id="weak-negative-passes-slight-penalty"),
        pytest.param(-0.5, 3, "filtered", id="strong-negative-filtered"),
        pytest.param(-0.5, 2, "penalized", id="strong-negative-low-evidence-passes-exploration"),
    ],
)
def test_relevance_decision_matches_the_seed_state_table(avg: float, evals: int, decision: str) -> None:
    assert relevance_decision(avg, evals)[0] == decision


@pytest.mark.parametrize(
    ("avg", "evals", "expected_boost"),
    [(0.0, 0, 0.0), (0.5, 3, 0.5 / 300), (-0.05, 3, -0.05 / 300), (-0.5, 2, -0.5 / 300), (3.0, 9, 0.01)],
)
def test_boost_is_average_over_three_times_the_relevance_weight(
    avg: float, evals: int, expected_boost: float
) -> None:
    assert relevance_decision(avg, evals)[1] == pytest.approx(expected_boost)


@pytest.mark.parametrize(("avg", "evals"), [(-0.5, 3), (-0.289, 345), (-3.0, 100)])
def test_filtered_notes_get_no_boost(avg: float, evals: int) -> None:
    assert relevance_decision(avg, evals) == ("filtered", 0.0)


@pytest.mark.parametrize(
    ("avg", "evals", "filtered"),
    [(-0.1, 3, False), (-0.1001, 3, True), (-0.2, 2, False), (-0.2, 3, True), (-2.0, 0, False)],
)
def test_filter_needs_three_evaluations_and_an_average_strictly_below_minus_point_one(
    avg: float, evals: int, filtered: bool
) -> None:
    assert (relevance_decision(avg, evals)[0] == "filtered") is filtered


# --------------------------------------------------------------------------------------------
# Tags


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["python", "github", "python"], ["python", "github"]),
        ([" lang:en ", "", "  "], ["lang:en"]),
        (["a,b"], ["a;b"]),
        (["x\ny\tz"], ["x y z"]),
    ],
)
def test_tags_are_stripped_deduplicated_and_comma_free(given: list[str], expected: list[str]) -> None:
    assert normalize_tags(given) == expected


def test_build_env_tags_names_every_part_of_the_context() -> None:
    tags = build_env_tags(
        language="TR", product="Acme Bank", metric="clarity", model="mistral-nemo", category="Geo, maps"
    )
    assert tags == [
        "lang:tr",
        "product:acme-bank",
        "metric:clarity",
        "model:mistral-nemo",
        "category:geo-maps",
    ]


def test_build_env_tags_leaves_out_missing_parts() -> None:
    assert build_env_tags(language="en", product="acme", metric=None, model="", category="  ") == [
        "lang:en",
        "product:acme",
    ]


# --------------------------------------------------------------------------------------------
# tag_relevance_with_evidence: the seed's worked examples


def test_seed_worked_example_averages_over_all_requested_tags_and_is_filtered(session: Session) -> None:
    note_id = seed_lesson(session)
    avg, evals = tag_relevance_with_evidence(session, note_id, SEED_TAGS)
    assert round(avg, 3) == -0.289
    assert evals == 345
    assert relevance_decision(avg, evals) == ("filtered", 0.0)


def test_seed_worked_example_with_one_evaluation_passes(session: Session) -> None:
    note_id = seed_lesson(session)
    avg, evals = tag_relevance_with_evidence(session, note_id, ["acme", "frontend"])
    assert (avg, evals) == (0.0, 1)
    assert relevance_decision(avg, evals)[0] != "filtered"


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_evidence_without_tags_is_zero(session: Session) -> None:
    assert tag_relevance_with_evidence(session, seed_lesson(session), []) == (0.0, 0)


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_evidence_ignores_other_notes_rows(session: Session) -> None:
    note_id = seed_lesson(session)
    other = make_note(session, "another note")
    set_row(session, other, "python", 3.0, pos=50)
    assert tag_relevance_with_evidence(session, note_id, ["python"]) == (pytest.approx(-0.283), 148)


# --------------------------------------------------------------------------------------------
# apply_score


@pytest.mark.pg_repeats(
    "statements and lines of test_applied_scores_reproduce_the_seed_sequence_in_the_database"
)
@pytest.mark.parametrize(("raw", "positive", "negative"), [(0.7, 1, 0), (-0.2, 0, 1), (0.0, 0, 0)])
def test_raw_score_sign_decides_which_count_grows(
    session: Session, raw: float, positive: int, negative: int
) -> None:
    note_id = make_note(session)
    apply_score(session=session, note_id=note_id, tags=["lang:en"], raw=raw)
    row = session.get(LessonTagRelevance, (note_id, "lang:en"))
    assert row is not None
    assert (row.positive_evals, row.negative_evals) == (positive, negative)


def test_zero_raw_score_still_decays_the_ema_and_is_recorded(session: Session) -> None:
    note_id = make_note(session)
    set_row(session, note_id, "lang:en", 1.0, pos=4)
    apply_score(session=session, note_id=note_id, tags=["lang:en"], raw=0.0)
    assert tag_relevance_with_evidence(session, note_id, ["lang:en"]) == (pytest.approx(0.7), 4)
    assert session.exec(select(func.count()).select_from(TagRelevanceEvent)).one() == 1


@pytest.mark.pg_repeats(
    "statements and lines of test_applied_scores_reproduce_the_seed_sequence_in_the_database, test_apply_score_reports_the_auto_pin_it_caused"
)
def test_apply_score_moves_every_tag_and_writes_its_history(session: Session) -> None:
    note_id = make_note(session)
    set_row(session, note_id, "product:acme", 1.0, pos=2)
    moment = utcnow() - timedelta(hours=1)
    apply_score(
        session=session,
        note_id=note_id,
        tags=["lang:en", "product:acme"],
        raw=-1.0,
        weight=2.0,
        source="reviewer",
        session_id="run-1",
        reviewer="ayse",
        at=moment,
    )
    rows = {r.tag: r for r in session.exec(select(LessonTagRelevance)).all()}
    assert rows["lang:en"].score == pytest.approx(-0.6)
    assert rows["product:acme"].score == pytest.approx(0.7 - 0.6)
    assert rows["product:acme"].negative_evals == 1
    assert all(r.last_evaluated == moment for r in rows.values())
    events = session.exec(select(TagRelevanceEvent).order_by(col(TagRelevanceEvent.tag))).all()
    assert [(e.tag, e.old_score, round(e.new_score, 6)) for e in events] == [
        ("lang:en", 0.0, -0.6),
        ("product:acme", 1.0, 0.1),
    ]
    assert {(e.raw_score, e.weight, e.source, e.session_id, e.reviewer) for e in events} == {
        (-1.0, 2.0, "reviewer", "run-1", "ayse")
    }


def test_applied_scores_reproduce_the_seed_sequence_in_the_database(session: Session) -> None:
    note_id = make_note(session)
    seen = []
    for _ in range(3):
        apply_score(session=session, note_id=note_id, tags=["python"], raw=-1.0)
        seen.append(round(tag_relevance_with_evidence(session, note_id, ["python"])[0], 3))
    assert seen == [-0.300, -0.510, -0.657]


@sqlite_only
@pytest.mark.parametrize("raw", [math.nan, math.inf, -math.inf, True, "0.5"])
def test_apply_score_refuses_a_raw_score_that_is_not_a_finite_number(session: Session, raw: Any) -> None:
    note_id = make_note(session)
    with pytest.raises(ValueError, match="finite number"):
        apply_score(session=session, note_id=note_id, tags=["lang:en"], raw=raw)


def test_apply_score_refuses_an_unknown_note(session: Session) -> None:
    with pytest.raises(UnknownNote):
        apply_score(session=session, note_id=999, tags=["lang:en"], raw=1.0)


def test_apply_score_refuses_an_unknown_source(session: Session) -> None:
    with pytest.raises(ValueError, match="source"):
        apply_score(session=session, note_id=make_note(session), tags=["lang:en"], raw=1.0, source="gossip")


# --------------------------------------------------------------------------------------------
# Auto-pin and auto-unpin


def scored_note(session: Session, score: float, evals: int, *, tags: int = 1, **state: Any) -> int:
    """A note whose `tags` rows all have `score`, with `evals` evaluations in total."""
    note_id = make_note(session)
    for i in range(tags):
        set_row(session, note_id, f"t{i}", score, pos=evals // tags + (1 if i < evals % tags else 0))
    if state:
        current = note(session, note_id)
        for key, value in state.items():
            setattr(current, key, value)
        session.add(current)
        session.flush()
    return note_id


@pytest.mark.parametrize(
    ("score", "evals", "pinned"),
    [(0.61, 5, True), (0.6, 5, False), (2.0, 4, False), (0.61, 50, True), (-1.0, 50, False)],
)
def test_auto_pin_needs_average_above_point_six_and_five_evaluations(
    session: Session, score: float, evals: int, pinned: bool
) -> None:
    note_id = scored_note(session, score, evals, tags=2)
    assert (update_pin_state(session=session, note=note_id) == "pinned") is pinned
    assert note(session, note_id).pinned is pinned
    assert note(session, note_id).auto_pinned is pinned


@pytest.mark.pg_repeats("statements and lines of test_apply_score_reports_the_auto_pin_it_caused")
def test_auto_pin_averages_over_all_of_the_notes_tags(session: Session) -> None:
    note_id = make_note(session)
    set_row(session, note_id, "a", 1.5, pos=3)
    set_row(session, note_id, "b", -0.2, neg=3)  # (1.5 - 0.2) / 2 = 0.65
    assert update_pin_state(session=session, note=note_id) == "pinned"


@pytest.mark.pg_repeats("statements and lines of test_apply_score_reports_the_auto_pin_it_caused")
def test_auto_pin_records_the_positive_tags_as_prerequisites(session: Session) -> None:
    note_id = make_note(session)
    set_row(session, note_id, "lang:en", 2.0, pos=3)
    set_row(session, note_id, "product:b", -0.1, neg=1)
    set_row(session, note_id, "product:a", 0.5, pos=1)
    update_pin_state(session=session, note=note_id)
    assert note(session, note_id).prerequisites == {"auto_pinned": True, "tags": ["lang:en", "product:a"]}


@pytest.mark.parametrize(("score", "evals", "unpinned"), [(0.19, 5, True), (0.2, 5, False), (-3.0, 4, False)])
def test_auto_unpin_needs_average_below_point_two_and_five_evaluations(
    session: Session, score: float, evals: int, unpinned: bool
) -> None:
    note_id = scored_note(session, score, evals, pinned=True, auto_pinned=True)
    assert (update_pin_state(session=session, note=note_id) == "unpinned") is unpinned
    assert note(session, note_id).pinned is not unpinned


@pytest.mark.pg_repeats(
    "statements and lines of test_a_manual_pin_replaces_an_auto_pin_and_survives_bad_scores"
)
@pytest.mark.parametrize("prerequisites", [{}, {"match_pinned": True, "tags": ["lang:en"]}])
def test_manual_and_match_count_pins_are_never_auto_unpinned(session: Session, prerequisites: dict) -> None:
    note_id = scored_note(session, -3.0, 100, pinned=True, auto_pinned=False, prerequisites=prerequisites)
    assert update_pin_state(session=session, note=note_id) is None
    assert note(session, note_id).pinned is True


def test_apply_score_reports_the_auto_pin_it_caused(session: Session) -> None:
    note_id = make_note(session)
    results = [apply_score(session=session, note_id=note_id, tags=["a", "b"], raw=1.0).pin for _ in range(3)]
    # 2 tags × 3 evaluations = 6 ≥ 5, avg 0.657 > 0.6 on the third.
    assert results == [None, None, "pinned"]


def test_a_manual_pin_replaces_an_auto_pin_and_survives_bad_scores(session: Session) -> None:
    note_id = scored_note(
        session, 0.1, 10, pinned=True, auto_pinned=True, prerequisites={"auto_pinned": True}
    )
    set_manual_pin(session=session, note_id=note_id, pinned=True, reviewer="ayse")
    assert update_pin_state(session=session, note=note_id) is None
    pinned = note(session, note_id)
    assert (pinned.pinned, pinned.auto_pinned, pinned.prerequisites["pinned_by"]) == (True, False, "ayse")


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_manual_pin_needs_a_reviewer(session: Session) -> None:
    with pytest.raises(ValueError, match="reviewer"):
        set_manual_pin(session=session, note_id=make_note(session), pinned=True, reviewer=" ")


# --------------------------------------------------------------------------------------------
# Match-count auto-pin (threshold 15)


@pytest.mark.parametrize(("showings", "pinned"), [(14, False), (15, True)])
def test_match_count_pins_a_note_shown_fifteen_times(session: Session, showings: int, pinned: bool) -> None:
    note_id = make_note(session)
    for _ in range(showings):
        record_matches(session=session, note_ids=[note_id], tags=["lang:en", "product:acme"])
    shown = note(session, note_id)
    assert shown.pinned is pinned
    assert shown.auto_pinned is False


@pytest.mark.pg_repeats("statements and lines of test_match_count_pins_a_note_shown_fifteen_times")
def test_match_count_pin_takes_the_smallest_tag_subset_across_tag_sets(session: Session) -> None:
    note_id = make_note(session)
    for _ in range(8):
        record_matches(session=session, note_ids=[note_id], tags=["product:acme", "metric:clarity"])
    for _ in range(7):
        record_matches(session=session, note_ids=[note_id], tags=["product:acme", "metric:safety"])
    assert find_match_pin_tags(session=session, note_id=note_id) == ["product:acme"]
    assert note(session, note_id).prerequisites == {"tags": ["product:acme"], "match_pinned": True}


@pytest.mark.pg_repeats("statements and lines of test_match_count_pins_a_note_shown_fifteen_times")
def test_match_count_leaves_an_already_pinned_note_alone(session: Session) -> None:
    note_id = make_note(session)
    set_manual_pin(session=session, note_id=note_id, pinned=True, reviewer="ayse")
    before = dict(note(session, note_id).prerequisites)
    for _ in range(15):
        record_matches(session=session, note_ids=[note_id], tags=["lang:en"])
    assert note(session, note_id).prerequisites == before


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_match_counts_accumulate_per_tag_set(session: Session) -> None:
    note_id = make_note(session)
    for _ in range(3):
        record_matches(session=session, note_ids=[note_id], tags=["b", "a"])
    record_matches(session=session, note_ids=[note_id], tags=["a"])
    rows = session.exec(select(LessonMatchStat.tag_set, LessonMatchStat.times_matched)).all()
    assert sorted(rows) == [("a", 1), ("a,b", 3)]


# --------------------------------------------------------------------------------------------
# Audits


def test_record_audit_stores_sorted_tags_and_existing_shown_notes(session: Session) -> None:
    first, second = make_note(session, "one"), make_note(session, "two")
    audit = record_audit(
        session=session,
        session_id="run-1",
        shown_note_ids=[second, first, 999],
        env_tags=["product:acme", "lang:en"],
        product="acme",
        snapshot_id="snap_1",
        transcript=[{"role": "user", "content": "prompt"}],
    )
    assert audit is not None
    assert (audit.shown_lesson_ids, audit.env_tags, audit.repo) == (
        [first, second],
        ["lang:en", "product:acme"],
        "acme",
    )


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_record_audit_is_idempotent_per_run_and_counts_showings_once(session: Session) -> None:
    note_id = make_note(session)
    for _ in range(2):
        record_audit(session=session, session_id="run-1", shown_note_ids=[note_id], env_tags=["lang:en"])
    assert session.exec(select(func.count()).select_from(SessionAudit)).one() == 1
    assert session.exec(select(LessonMatchStat.times_matched)).one() == 1


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_record_audit_skips_a_run_that_showed_no_notes(session: Session) -> None:
    assert (
        record_audit(session=session, session_id="run-1", shown_note_ids=[999], env_tags=["lang:en"]) is None
    )
    assert session.exec(select(func.count()).select_from(SessionAudit)).one() == 0


@pytest.mark.parametrize(
    ("status", "retries", "pending"),
    [
        (None, 0, True),
        ("completed", 0, False),
        ("failed", 1, True),
        ("failed", 2, True),
        ("failed", 3, False),
    ],
)
def test_unprocessed_audits_are_new_or_failed_fewer_than_three_times(
    session: Session, status: str | None, retries: int, pending: bool
) -> None:
    record_audit(
        session=session, session_id="run-1", shown_note_ids=[make_note(session)], env_tags=["lang:en"]
    )
    if status is not None:
        session.add(ProcessedRelevanceSession(session_id="run-1", status=status, retry_count=retries))
        session.flush()
    assert [a.session_id for a in unprocessed_audits(session=session)] == (["run-1"] if pending else [])


def test_unprocessed_audits_come_oldest_first_up_to_the_limit(session: Session) -> None:
    note_id = make_note(session)
    now = utcnow()
    for i, name in enumerate(["new", "old", "mid"]):
        at = now - timedelta(minutes={"new": 1, "old": 30, "mid": 10}[name] + i)
        record_audit(session=session, session_id=name, shown_note_ids=[note_id], env_tags=["t"], at=at)
    assert [a.session_id for a in unprocessed_audits(session=session, limit=2)] == ["old", "mid"]


@pytest.mark.pg_repeats(
    "statements and lines of test_a_judge_run_that_showed_notes_records_its_audit, test_cli_evaluate_processes_pending_audits"
)
def test_applying_an_evaluation_twice_never_double_counts(session: Session) -> None:
    note_id = make_note(session)
    record_audit(
        session=session, session_id="run-1", shown_note_ids=[note_id], env_tags=["lang:en", "product:a"]
    )
    assert apply_evaluation(session=session, audit_session_id="run-1", scores={note_id: 1.0}) is True
    assert apply_evaluation(session=session, audit_session_id="run-1", scores={note_id: 1.0}) is False
    assert tag_relevance_with_evidence(session, note_id, ["lang:en", "product:a"]) == (pytest.approx(0.3), 2)


@pytest.mark.pg_repeats(
    "statements and lines of test_applied_scores_reproduce_the_seed_sequence_in_the_database, test_cli_evaluate_processes_pending_audits"
)
def test_a_failure_after_completion_leaves_the_audit_completed(session: Session) -> None:
    note_id = make_note(session)
    record_audit(session=session, session_id="run-1", shown_note_ids=[note_id], env_tags=["t"])
    apply_evaluation(session=session, audit_session_id="run-1", scores={note_id: 1.0})
    assert mark_failed(session=session, audit_session_id="run-1").status == "completed"


# --------------------------------------------------------------------------------------------
# The evaluator, against the local OpenAI-compatible server


def audited(engine: Engine, *contents: str, tags: tuple[str, ...] = ("lang:en", "product:acme")) -> list[int]:
    with session_scope(engine) as session:
        ids = [make_note(session, text) for text in contents]
        record_audit(
            session=session,
            session_id="run-1",
            shown_note_ids=ids,
            env_tags=tags,
            product="acme",
            transcript=[
                {"role": "user", "content": "JUDGE-PROMPT with the notes"},
                {"role": "assistant", "content": "JUDGE-REPLY"},
            ],
        )
    return ids


def scores_and_mark(engine: Engine) -> tuple[dict[tuple[int, str], tuple[float, int, int]], Any]:
    with Session(engine) as session:
        rows = {
            (r.lesson_id, r.tag): (round(r.score, 6), r.positive_evals, r.negative_evals)
            for r in session.exec(select(LessonTagRelevance)).all()
        }
        mark = session.get(ProcessedRelevanceSession, "run-1")
        return rows, (mark.status, mark.retry_count) if mark else None


@pytest.mark.pg_repeats("statements and lines of test_cli_evaluate_processes_pending_audits")
def test_evaluator_applies_scores_per_tag_and_marks_the_audit_processed(
    engine: Engine, llm_server: LLMServer
) -> None:
    useful, misleading = audited(engine, "Useful note", "Misleading note")
    llm_server.script(json_reply({"scores": {str(useful): 0.8, str(misleading): -1.0}, "reasons": {}}))
    report = evaluate_pending(engine)
    assert (report.total, report.completed, report.failed) == (1, 1, 0)
    rows, mark = scores_and_mark(engine)
    assert rows == {
        (useful, "lang:en"): (0.24, 1, 0),
        (useful, "product:acme"): (0.24, 1, 0),
        (misleading, "lang:en"): (-0.3, 0, 1),
        (misleading, "product:acme"): (-0.3, 0, 1),
    }
    assert mark == ("completed", 0)


@pytest.mark.pg_repeats("statements and lines of test_cli_evaluate_processes_pending_audits")
def test_evaluator_rerun_does_not_call_the_llm_or_count_again(engine: Engine, llm_server: LLMServer) -> None:
    (note_id,) = audited(engine, "A note")
    llm_server.script(json_reply({"scores": {str(note_id): 1.0}}))
    evaluate_pending(engine)
    before = scores_and_mark(engine)
    report = evaluate_pending(engine)
    assert report.total == 0
    assert len(llm_server.chat_requests) == 1
    assert scores_and_mark(engine) == before


@pytest.mark.pg_repeats("statements and lines of test_cli_evaluate_processes_pending_audits")
def test_evaluator_prompt_carries_the_notes_tags_and_transcript_as_data(
    engine: Engine, llm_server: LLMServer
) -> None:
    (note_id,) = audited(engine, "NOTE-TEXT about scales")
    llm_server.script(json_reply({"scores": {str(note_id): 0.0}}))
    evaluate_pending(engine)
    prompt = llm_server.chat_requests[0]["messages"][-1]["content"]
    assert f"ID {note_id} [TIP]: NOTE-TEXT about scales" in prompt
    assert (
        "<<<TRANSCRIPT\nuser: JUDGE-PROMPT with the notes\n\nassistant: JUDGE-REPLY\nTRANSCRIPT>>>" in prompt
    )
    assert '["lang:en", "product:acme"]' in prompt


def test_evaluator_failure_applies_nothing_and_counts_a_retry(engine: Engine, llm_server: LLMServer) -> None:
    audited(engine, "A note")
    llm_server.script(server_error(), server_error())
    report = evaluate_pending(engine)
    assert (report.completed, report.failed) == (0, 1)
    assert scores_and_mark(engine) == ({}, ("failed", 1))
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(TagRelevanceEvent)).one() == 0


@pytest.mark.pg_repeats(
    "statements and lines of test_cli_evaluate_processes_pending_audits, test_evaluator_failure_applies_nothing_and_counts_a_retry"
)
def test_a_failed_audit_is_retried_on_the_next_run(engine: Engine, llm_server: LLMServer) -> None:
    (note_id,) = audited(engine, "A note")
    llm_server.script(server_error(), server_error(), json_reply({"scores": {str(note_id): 1.0}}))
    evaluate_pending(engine)
    assert evaluate_pending(engine).completed == 1
    rows, mark = scores_and_mark(engine)
    assert mark == ("completed", 1)
    assert rows[(note_id, "lang:en")] == (0.3, 1, 0)


@pytest.mark.pg_repeats(
    "statements and lines of test_an_audit_whose_notes_were_removed_is_closed_without_an_llm_call"
)
@pytest.mark.parametrize(
    "reply", [{"scores": {"999": 1.0}}, {"scores": {}}, {"verdict": "fine"}, {"scores": {"1": "very"}}]
)
def test_a_reply_that_scores_no_shown_note_is_a_failure(
    engine: Engine, llm_server: LLMServer, reply: dict[str, Any]
) -> None:
    audited(engine, "A note")
    llm_server.script(json_reply(reply), json_reply(reply))  # the reply and its repair turn
    assert evaluate_pending(engine).failed == 1
    # A malformed reply is the model's fault: it spends none of the audit's retries (issue 18).
    assert scores_and_mark(engine) == ({}, ("malformed", 0))
    assert llm_server.pending == 0


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_evaluator_without_an_llm_refuses_before_touching_anything(engine: Engine) -> None:
    audited(engine, "A note")
    with pytest.raises(LLMNotConfigured):
        evaluate_pending(engine)
    assert scores_and_mark(engine) == ({}, None)


def test_an_audit_whose_notes_were_removed_is_closed_without_an_llm_call(
    engine: Engine, llm_server: LLMServer
) -> None:
    audited(engine, "A note")
    with session_scope(engine) as session:
        assert remove_notes(session=session, all_notes=True) == 1
    report = evaluate_pending(engine)
    assert (report.skipped, llm_server.chat_requests) == (1, [])
    assert scores_and_mark(engine) == ({}, ("completed", 0))


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ({"scores": {"1": 0.5, "2": -1}}, {1: 0.5, 2: -1.0}),
        ({"1": 0.5}, {1: 0.5}),
        ({"scores": {"1": {"score": 0.25, "reason": "applied"}}}, {1: 0.25}),
        ({"scores": [{"lesson_id": 2, "score": -0.5}, {"note_id": "1", "score": "0.5"}]}, {1: 0.5, 2: -0.5}),
        ({"scores": {"1": 2.5, "7": 1.0, "2": None}}, {1: 2.5}),  # not clamped; unknown ids dropped
        ({"scores": {"1": True, "2": 0}}, {2: 0.0}),
    ],
)
def test_evaluator_reply_shapes_are_read_tolerantly(
    reply: dict[str, Any], expected: dict[int, float]
) -> None:
    assert parse_evaluator_reply(reply, [1, 2]) == expected


def test_transcript_excerpt_keeps_the_head_and_the_tail() -> None:
    text = "HEAD" + "x" * 100 + "TAIL"
    excerpt = transcript_excerpt(text, max_chars=20)
    assert excerpt.startswith("HEAD") and excerpt.endswith("TAIL") and "omitted" in excerpt


# --------------------------------------------------------------------------------------------
# Reviewer feedback


def shown_run(session: Session) -> tuple[int, int]:
    shown, hidden = make_note(session, "shown"), make_note(session, "not shown")
    record_audit(
        session=session,
        session_id="run-1",
        shown_note_ids=[shown],
        env_tags=["lang:en", "product:a"],
        snapshot_id="snap_1",
    )
    return shown, hidden


@pytest.mark.pg_repeats("statements and lines of test_shown_notes_of_a_snapshot_carry_the_reviewers_own_vote")
@pytest.mark.parametrize(("useful", "score", "counts"), [(True, 0.6, (1, 0)), (False, -0.6, (0, 1))])
def test_reviewer_feedback_weighs_two_and_records_the_reviewer(
    session: Session, useful: bool, score: float, counts: tuple[int, int]
) -> None:
    shown, _ = shown_run(session)
    record_feedback(session=session, audit_session_id="run-1", note_id=shown, useful=useful, reviewer="ayse")
    row = session.get(LessonTagRelevance, (shown, "product:a"))
    assert row is not None
    assert (round(row.score, 6), (row.positive_evals, row.negative_evals)) == (score, counts)
    event = session.exec(select(TagRelevanceEvent)).first()
    assert event is not None
    assert (event.weight, event.source, event.reviewer, event.session_id) == (
        2.0,
        "reviewer",
        "ayse",
        "run-1",
    )


@pytest.mark.pg_repeats(
    "statements and lines of test_applied_scores_reproduce_the_seed_sequence_in_the_database, test_shown_notes_of_a_snapshot_carry_the_reviewers_own_vote"
)
def test_a_reviewer_scores_a_note_once_per_run(session: Session) -> None:
    shown, _ = shown_run(session)
    record_feedback(session=session, audit_session_id="run-1", note_id=shown, useful=True, reviewer="ayse")
    with pytest.raises(AlreadyRated):
        record_feedback(
            session=session, audit_session_id="run-1", note_id=shown, useful=False, reviewer="ayse"
        )
    record_feedback(session=session, audit_session_id="run-1", note_id=shown, useful=False, reviewer="mehmet")


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_feedback_on_a_note_the_run_did_not_show_is_refused(session: Session) -> None:
    _, hidden = shown_run(session)
    with pytest.raises(ValueError, match="not shown"):
        record_feedback(
            session=session, audit_session_id="run-1", note_id=hidden, useful=True, reviewer="ayse"
        )


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_feedback_needs_a_reviewer(session: Session) -> None:
    shown, _ = shown_run(session)
    with pytest.raises(ValueError, match="reviewer"):
        record_feedback(session=session, audit_session_id="run-1", note_id=shown, useful=True, reviewer="  ")


def test_shown_notes_of_a_snapshot_carry_the_reviewers_own_vote(session: Session) -> None:
    shown, _ = shown_run(session)
    record_feedback(session=session, audit_session_id="run-1", note_id=shown, useful=False, reviewer="ayse")
    [mine] = shown_notes_for_snapshot(session=session, snapshot_id="snap_1", reviewer="ayse")
    [theirs] = shown_notes_for_snapshot(session=session, snapshot_id="snap_1", reviewer="mehmet")
    assert (mine.note_id, mine.vote, theirs.vote) == (shown, "not useful", None)
    assert mine.evidence.total_evals == 2


# --------------------------------------------------------------------------------------------
# The explainer


@pytest.mark.pg_repeats(
    "statements and lines of test_explainer_lists_scored_and_pinned_notes_unless_asked_for_all"
)
def test_explainer_spells_out_the_seed_worked_example(session: Session) -> None:
    note_id = seed_lesson(session)
    row = explain(session=session, tags=SEED_TAGS).set_index("note_id").loc[note_id]
    assert (row["decision"], row["total_evals"], round(row["avg_score"], 3)) == ("filtered", 345, -0.289)
    assert "sum = -0.283 [python] + -0.584 [github] + +0.000 [personal] = -0.867" in row["arithmetic"]
    assert "avg = -0.867 / 3 = -0.289" in row["arithmetic"]
    assert "345 ≥ 3 and -0.289 < -0.1 → FILTERED OUT" in row["arithmetic"]


@pytest.mark.pg_repeats(
    "statements and lines of test_explainer_lists_scored_and_pinned_notes_unless_asked_for_all"
)
def test_explainer_says_a_note_with_little_evidence_passes_for_exploration(session: Session) -> None:
    note_id = seed_lesson(session)
    row = explain(session=session, tags=["acme", "frontend"]).set_index("note_id").loc[note_id]
    assert row["decision"] == "neutral"
    assert "1 < 3 evals → not enough evidence to filter, passes (exploration)" in row["arithmetic"]


def test_explainer_lists_scored_and_pinned_notes_unless_asked_for_all(session: Session) -> None:
    scored = seed_lesson(session)
    pinned = make_note(session, "pinned")
    set_manual_pin(session=session, note_id=pinned, pinned=True, reviewer="ayse")
    unscored = make_note(session, "never scored")
    assert set(explain(session=session, tags=["python"])["note_id"]) == {scored, pinned}
    assert set(explain(session=session, tags=["python"], include_unscored=True)["note_id"]) == {
        scored,
        pinned,
        unscored,
    }


# --------------------------------------------------------------------------------------------
# relevant_notes applies the decisions


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_relevant_notes_with_tags_drops_a_filtered_note(session: Session) -> None:
    good, bad = make_note(session, "good"), make_note(session, "bad")
    set_row(session, bad, "product:acme", -1.0, neg=5)
    with_tags = [
        n.id for n in relevant_notes(session=session, language="en", tags=["product:acme"], use_cache=False)
    ]
    without = [n.id for n in relevant_notes(session=session, language="en", use_cache=False)]
    assert (with_tags, sorted(without)) == ([good], sorted([good, bad]))


def test_a_pinned_note_outside_the_newest_is_included_first(session: Session) -> None:
    now = utcnow()
    old = make_note(session, "old but pinned", timestamp=now - timedelta(days=30))
    newer = [make_note(session, f"new {i}", timestamp=now - timedelta(minutes=i)) for i in range(8)]
    set_manual_pin(session=session, note_id=old, pinned=True, reviewer="ayse")
    shown = [
        n.id
        for n in relevant_notes(session=session, language="en", limit=2, tags=["lang:en"], use_cache=False)
    ]
    assert shown == [old, newer[0]]


@pytest.mark.pg_repeats("statements and lines of test_a_pinned_note_outside_the_newest_is_included_first")
def test_a_pinned_note_that_fails_the_check_is_not_shown(session: Session) -> None:
    pinned = make_note(session, "pinned but misleading here")
    make_note(session, "plain")
    set_manual_pin(session=session, note_id=pinned, pinned=True, reviewer="ayse")
    set_row(session, pinned, "lang:en", -2.0, neg=10)
    shown = [n.id for n in relevant_notes(session=session, language="en", tags=["lang:en"], use_cache=False)]
    assert pinned not in shown


@pytest.mark.pg_repeats("statements and lines of test_a_pinned_note_outside_the_newest_is_included_first")
def test_a_pinned_note_of_another_language_stays_out(session: Session) -> None:
    pinned = make_note(session, "Turkish only", language="tr")
    set_manual_pin(session=session, note_id=pinned, pinned=True, reviewer="ayse")
    shown = [n.id for n in relevant_notes(session=session, language="en", tags=["lang:en"], use_cache=False)]
    assert pinned not in shown


# --------------------------------------------------------------------------------------------
# The judge records its audit; the CLI runs the evaluator


def judge_input() -> EvaluationInput:
    return EvaluationInput(
        question="What is the capital of France?",
        model_answer="Paris is the capital of France.",
        product="acme",
        language="en",
        model_name="mistral-nemo",
        category="geography",
        primary_metric="clarity",
    )


STAGE1 = {
    "independent_scores": {
        "clarity": {"score": 4, "rationale": "Clear and well structured.", "confidence": 0.8}
    },
    "evidence": {},
}


def test_a_judge_run_that_showed_notes_records_its_audit(engine: Engine, llm_server: LLMServer) -> None:
    with session_scope(engine) as session:
        note_id = make_note(session, "NOTE-FOR-THE-JUDGE")
    llm_server.script(json_reply(STAGE1))
    snapshot_id = judge_evaluation(engine=engine, evaluation=judge_input(), reviewer="ayse")
    with Session(engine) as session:
        audit = session.exec(select(SessionAudit)).one()
        matches = session.exec(select(LessonMatchStat.times_matched)).all()
    assert (audit.session_id, audit.snapshot_id, audit.repo, audit.shown_lesson_ids) == (
        snapshot_id,
        snapshot_id,
        "acme",
        [note_id],
    )
    assert audit.env_tags == [
        "category:geography",
        "lang:en",
        "metric:clarity",
        "model:mistral-nemo",
        "product:acme",
    ]
    assert audit.transcript is not None
    assert "NOTE-FOR-THE-JUDGE" in audit.transcript[1]["content"]
    assert json.loads(audit.transcript[-1]["content"])["independent_scores"]["clarity"]["score"] == 4
    assert matches == [1]


@pytest.mark.pg_repeats("statements and lines of test_a_judge_run_that_showed_notes_records_its_audit")
def test_a_judge_run_without_notes_records_no_audit(engine: Engine, llm_server: LLMServer) -> None:
    llm_server.script(json_reply(STAGE1))
    judge_evaluation(engine=engine, evaluation=judge_input(), reviewer="ayse")
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(SessionAudit)).one() == 0


def test_cli_evaluate_processes_pending_audits(
    engine: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OVERRULE_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    reset_settings()
    (note_id,) = audited(engine, "A note")
    llm_server.script(json_reply({"scores": {str(note_id): 1.0}}))
    assert main(["evaluate", "--limit", "3"]) == 0
    assert "evaluated 1 audits: 1 completed, 0 failed, 0 skipped" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"), [(["evaluate", "--limit", "0"], "--limit"), (["evaluate"], "No LLM")]
)
def test_cli_evaluate_errors_go_to_stderr(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Frames and charts


def test_scores_frame_keeps_the_most_evaluated_notes(session: Session) -> None:
    busy, quiet = make_note(session, "busy"), make_note(session, "quiet")
    set_row(session, busy, "a", 1.0, pos=9)
    set_row(session, quiet, "a", 1.0, pos=1)
    frame = relevance.scores_frame(session=session, limit_notes=1)
    assert list(frame["note_id"]) == [busy]
    assert len(relevance.scores_frame(session=session, limit_notes=None)) == 2


def test_history_frame_lists_a_notes_scores_oldest_first(session: Session) -> None:
    note_id = make_note(session)
    now = utcnow()
    apply_score(session=session, note_id=note_id, tags=["a"], raw=1.0, at=now)
    apply_score(session=session, note_id=note_id, tags=["a"], raw=-1.0, at=now - timedelta(hours=1))
    assert list(relevance.history_frame(session=session, note_id=note_id)["raw_score"]) == [-1.0, 1.0]


def test_heatmap_is_centred_at_zero_with_counts_in_the_hover_and_literal_labels(session: Session) -> None:
    note_id = make_note(session, "<b>bold</b> claim")
    set_row(session, note_id, "lang:<i>en</i>", -0.5, pos=2, neg=7)
    trace = tag_heatmap_figure(relevance.scores_frame(session=session)).data[0]
    assert trace.zmid == 0 and trace.zmin == -trace.zmax
    assert "+%{customdata[0]} / −%{customdata[1]}" in trace.hovertemplate
    assert list(trace.customdata[0][0]) == [2, 7]
    assert trace.x == ("lang:&lt;i&gt;en&lt;/i&gt;",)
    assert "&lt;b&gt;bold&lt;/b&gt;" in trace.y[0]


@pytest.mark.pg_repeats(
    "statements and lines of test_apply_score_reports_the_auto_pin_it_caused, test_history_frame_lists_a_notes_scores_oldest_first"
)
def test_ema_history_chart_draws_one_line_per_tag(session: Session) -> None:
    note_id = make_note(session)
    for raw in (1.0, -1.0):
        apply_score(session=session, note_id=note_id, tags=["a", "b"], raw=raw)
    figure = ema_history_figure(relevance.history_frame(session=session, note_id=note_id))
    assert [(t.name, len(t.y)) for t in figure.data] == [("a", 2), ("b", 2)]


def test_scores_csv_holds_every_row_with_formulas_neutralised(session: Session) -> None:
    from lib.export import frame_to_csv_bytes

    note_id = make_note(session, "=HYPERLINK(1)")
    for tag in ("a", "b", "c"):
        set_row(session, note_id, tag, -0.5, neg=2)
    text = frame_to_csv_bytes(relevance.scores_frame(session=session, limit_notes=None)).decode()
    lines = text.strip().splitlines()
    assert lines[0].startswith("note_id,note_type,language,content,pinned,pin,tag,score")
    assert len(lines) == 4
    assert all("'=HYPERLINK(1)" in line and ",-0.5," in line for line in lines[1:])


def test_note_labels_are_short_and_unique_per_note() -> None:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "note_id": [3, 3, 9],
            "note_type": ["TIP", "TIP", "PATTERN"],
            "content": ["x" * 60, "x" * 60, "short"],
        }
    )
    labels = relevance.note_labels(frame)
    assert labels == {3: "#3 💭 TIP: " + "x" * 39 + "…", 9: "#9 🔍 PATTERN: short"}


def test_decision_counts_name_every_decision() -> None:
    import pandas as pd

    counts = relevance.decision_counts(pd.DataFrame({"decision": ["filtered", "boosted", "filtered"]}))
    assert counts == {"filtered": 2, "boosted": 1, "penalized": 0, "neutral": 0}
