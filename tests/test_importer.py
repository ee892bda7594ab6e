"""Tests for lib.importer: evaluations JSONL, seed-004 caches, notes and metric sets, all or nothing."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
import time
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from lib import bulk, importer
from lib.db import init_db, session_scope
from lib.importer import (
    ImportFailed,
    ImportReport,
    detect_kind,
    import_evaluations,
    import_judgments_cache,
    import_metrics,
    import_notes,
    import_path,
    import_source_evaluations,
)
from lib.json_files import MAX_LINE_BYTES
from lib.metrics import DEFAULT_METRICS
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, MetricDefinition, SessionNote
from lib.snapshots import build_snapshot_rows, source_key_of
from lib.source_records import SourceEvaluation, SourceVerdict
from tests import cli
from tests.cli import CliResult
from tests.conftest import sqlite_only

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "import"

ANSWER = (
    "Einstein received the Nobel Prize in Physics in 1921 for his work on the photoelectric effect. "
    "In short, to sum it up, the explanation   is clear and the dates are right."
)
QUOTE = "Nobel Prize in Physics"
# A 50+ character quote whose first and last 25 characters are in the answer but whose middle is not.
ANCHOR_HEAD = ANSWER[:25]
ANCHOR_TAIL = ANSWER[: ANSWER.index(". In short")][-25:]
ANCHOR_QUOTE = ANCHOR_HEAD + " [the judge paraphrased this part] " + ANCHOR_TAIL
RAG_METRICS = [
    {"product": "rag", "slug": "groundedness", "display_name": "Groundedness", "min": 0, "max": 1,
     "description": "Supported by the context?"},
    {"product": "rag", "slug": "coherence", "display_name": "Coherence", "min": 1, "max": 3,
     "description": "Reads as one argument?"},
]  # fmt: skip


def record(**overrides: Any) -> dict[str, Any]:
    """A valid evaluation record on the default 1–5 metric set; overrides replace or (None) drop keys."""
    base: dict[str, Any] = {
        "question": "Who received the 1921 Nobel Prize in Physics?",
        "model_answer": ANSWER,
        "product": "tutor",
        "model_name": "mistral-nemo",
        "judge_model": "gpt-4o",
        "user_scores": {"truthfulness": {"score": 5, "reason": "right"}, "clarity": 4},
        "judge_scores": {
            "truthfulness": {"score": 4, "reason": "thin"},
            "clarity": {"score": 2.5, "reason": "wordy"},
        },
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def numbered(n: int, **overrides: Any) -> list[dict[str, Any]]:
    return [record(question=f"Question {i}?", **overrides) for i in range(n)]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(_json_line(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _json_line(row: Any) -> str:
    """UTF-8 JSON, except a lone surrogate, which only a JSON escape (`\\ud800`) can carry."""
    text = json.dumps(row, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(row)
    return text


def run_import(engine: Engine, path: Path, kind: str | None = None) -> ImportReport:
    return import_path(engine=engine, path=path, kind=kind, reviewer="rita")


def count(engine: Engine, model: type) -> int:
    with Session(engine) as s:
        return s.exec(select(func.count()).select_from(model)).one()


def snapshots(engine: Engine) -> list[EvaluationSnapshot]:
    with Session(engine) as s:
        return list(s.exec(select(EvaluationSnapshot).order_by(EvaluationSnapshot.created_at)).all())


def judgments(engine: Engine) -> dict[str, Judgment]:
    with Session(engine) as s:
        return {j.change_id: j for j in s.exec(select(Judgment)).all()}


def assert_nothing_written(engine: Engine) -> None:
    assert [count(engine, m) for m in (EvaluationSnapshot, Judgment, SessionNote)] == [0, 0, 0]


def import_rag_metrics(engine: Engine) -> None:
    with session_scope(engine) as s:
        import_metrics(session=s, data=RAG_METRICS, source="metrics.json")


# ---------------------------------------------------------------------------------------------
# Evaluations: what a good file becomes


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_good_file_stores_snapshot_with_scores_keyed_by_slug(engine: Engine, tmp_path: Path) -> None:
    report = run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [record()]))
    assert (report.kind, report.inserted, report.skipped, report.judgments) == ("evaluations", 1, 0, 2)
    (snap,) = snapshots(engine)
    assert snap.user_scores_json == {
        "truthfulness": {"score": 5, "reason": "right"},
        "clarity": {"score": 4, "reason": None},
    }
    assert snap.judge_scores_json == {
        "truthfulness": {"score": 4, "reason": "thin"},
        "clarity": {"score": 2.5, "reason": "wordy"},
    }
    assert (snap.product, snap.language, snap.model_name, snap.judge_model) == (
        "tutor",
        "en",
        "mistral-nemo",
        "gpt-4o",
    )
    assert (snap.primary_metric, snap.bonus_metrics, snap.status, snap.created_by) == (
        "truthfulness",
        [],
        "active",
        "rita",
    )
    assert snap.deleted_at is None


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_rationale_is_accepted_as_the_reason(engine: Engine, tmp_path: Path) -> None:
    rec = record(judge_scores={"clarity": {"score": 3, "rationale": "long-winded"}})
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    assert snapshots(engine)[0].judge_scores_json == {"clarity": {"score": 3, "reason": "long-winded"}}


@pytest.mark.parametrize(
    ("user_key", "judge_key"),
    [("Truthfulness", "truthfulness"), ("truthfulness", "Truthfulness"), ("Truthfulness", "Truthfulness")],
)
@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_display_names_and_slugs_both_resolve_to_the_slug(
    engine: Engine, tmp_path: Path, user_key: str, judge_key: str
) -> None:
    rec = record(
        user_scores={user_key: 5},
        judge_scores={judge_key: 3},
        evidence={judge_key: [{"quote": QUOTE}]},
        primary_metric=user_key,
        bonus_metrics=[judge_key],
    )
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    assert (
        list(snap.user_scores_json)
        == list(snap.judge_scores_json)
        == list(snap.evidence_json or {})
        == ["truthfulness"]
    )
    assert (snap.primary_metric, snap.bonus_metrics) == ("truthfulness", ["truthfulness"])
    assert set(judgments(engine)) == {f"{snap.id}:truthfulness"}


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_evidence_is_verified_with_stages_and_corrected_positions(engine: Engine, tmp_path: Path) -> None:
    at = ANSWER.index(QUOTE)
    rec = record(
        evidence={
            "truthfulness": [
                {"quote": QUOTE, "start": at, "end": at + len(QUOTE), "why": "the prize", "better": "same"},
                {"quote": "photoelectric effect", "start": 0, "end": 0},
                {"quote": ANCHOR_QUOTE, "start": None, "end": None},
            ],
            "Clarity": {
                "user_score": 1,  # the seed shape's own score fields are recomputed from the scores
                "evidence": [
                    {"quote": "the explanation is clear", "start": 3, "end": 9},
                    {"quote": "Marie Curie won it twice", "start": None, "end": None},
                ],
            },
        }
    )
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    evidence = snap.evidence_json or {}
    truth = evidence["truthfulness"]["evidence"]
    clarity = evidence["clarity"]["evidence"]
    assert [i["stage"] for i in truth + clarity] == [
        "exact",
        "substring",
        "anchor",
        "whitespace",
        "unverified",
    ]
    assert (truth[1]["start"], truth[1]["end"]) == (
        ANSWER.index("photoelectric effect"),
        ANSWER.index("photoelectric effect") + 20,
    )
    head = ANSWER.index(ANCHOR_HEAD)
    assert (truth[2]["start"], truth[2]["end"]) == (head, ANSWER.index(ANCHOR_TAIL) + 25)
    assert [(i["verified"], i["highlight_available"]) for i in truth + clarity] == [
        (True, True), (True, True), (True, True), (True, False), (False, False),
    ]  # fmt: skip
    assert (truth[0]["why"], truth[0]["better"]) == ("the prize", "same")
    assert (
        snap.evidence_count,
        snap.evidence_highlighted,
        snap.evidence_unlocated,
        snap.evidence_unverified,
    ) == (5, 3, 1, 1)


def test_evidence_json_takes_the_seed_shape_with_scores_reasons_and_gaps(
    engine: Engine, tmp_path: Path
) -> None:
    rec = record(
        user_scores={"clarity": {"score": 2.67, "reason": "mean of three"}, "safety": 5},
        judge_scores={"clarity": {"score": 4, "reason": "fine"}, "truthfulness": 3},
        evidence={"clarity": [{"quote": QUOTE}]},
    )
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    evidence = snapshots(engine)[0].evidence_json or {}
    assert list(evidence) == ["truthfulness", "safety", "clarity"]  # the rubric's order
    assert {k: v for k, v in evidence["clarity"].items() if k != "evidence"} == {
        "user_score": 2.67, "judge_score": 4, "metric_gap": 1.33, "user_reason": "mean of three", "judge_reason": "fine",
    }  # fmt: skip
    assert evidence["safety"]["metric_gap"] is None and evidence["safety"]["evidence"] == []
    assert evidence["truthfulness"]["user_score"] is None


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_each_judged_metric_becomes_an_unreviewed_judgment(engine: Engine, tmp_path: Path) -> None:
    rec = record(
        created_at="2025-03-04T05:06:07Z",
        user_scores={"clarity": 3},
        judge_scores={
            "truthfulness": {"score": 4.0, "reason": "mostly right"},
            "clarity": 2.67,
            "safety": 2.5,
            "bias": {"score": None, "reason": "not judged"},
        },
    )
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    rows = judgments(engine)
    assert {c: j.decision for c, j in rows.items()} == {
        f"{snap.id}:truthfulness": "4", f"{snap.id}:clarity": "2.67", f"{snap.id}:safety": "2.5",
    }  # fmt: skip
    truth = rows[f"{snap.id}:truthfulness"]
    assert (truth.product, truth.metric, truth.snapshot_id, truth.reasoning, truth.judge_model) == (
        "tutor", "truthfulness", snap.id, "mostly right", "gpt-4o",
    )  # fmt: skip
    assert truth.timestamp == snap.created_at == datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
    assert all(
        j.user_decision is None and j.reviewed_at is None and not j.was_corrected for j in rows.values()
    )


def test_record_id_and_created_at_set_the_snapshot_identity_and_time(engine: Engine, tmp_path: Path) -> None:
    rec = record(id="snap_given_1", created_at="2025-01-02T03:04:05+02:00")
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    assert snap.id == "snap_given_1"
    assert snap.created_at == datetime(2025, 1, 2, 1, 4, 5, tzinfo=UTC)


def test_generated_snapshot_id_is_time_and_source_key_prefix(engine: Engine, tmp_path: Path) -> None:
    rec = record(created_at="2025-01-02T03:04:05")  # no offset: taken as UTC
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    payload = json.dumps([rec["product"], rec["question"], ANSWER, rec["model_name"]], ensure_ascii=False)
    key = hashlib.sha256(payload.encode()).hexdigest()
    assert snap.source_key == key == source_key_of("tutor", rec["question"], ANSWER, "mistral-nemo")
    assert snap.id == f"snap_20250102_030405_{key[:8]}"


@cache
def colliding_questions() -> tuple[str, str]:
    """Two questions whose source keys share the first 8 hex digits (a deterministic birthday search)."""
    seen: dict[str, str] = {}
    i = 0
    while True:
        question = f"q{i}"
        prefix = source_key_of("tutor", question, ANSWER, "mistral-nemo")[:8]
        if prefix in seen:
            return seen[prefix], question
        seen[prefix] = question
        i += 1


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_snapshot_ids_colliding_in_one_file_are_lengthened(engine: Engine, tmp_path: Path) -> None:
    first, second = colliding_questions()
    rows = [record(question=q, created_at="2025-01-01T00:00:00Z") for q in (first, second)]
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", rows))
    ids = sorted(s.id for s in snapshots(engine))
    key2 = source_key_of("tutor", second, ANSWER, "mistral-nemo")
    assert len(set(ids)) == 2
    assert f"snap_20250101_000000_{key2[:12]}" in ids


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_snapshot_id_colliding_with_a_stored_one_is_lengthened(engine: Engine, tmp_path: Path) -> None:
    first, second = colliding_questions()
    run_import(
        engine, write_jsonl(tmp_path / "a.jsonl", [record(question=first, created_at="2025-01-01T00:00:00Z")])
    )
    report = run_import(
        engine,
        write_jsonl(tmp_path / "b.jsonl", [record(question=second, created_at="2025-01-01T00:00:00Z")]),
    )
    key2 = source_key_of("tutor", second, ANSWER, "mistral-nemo")
    assert report.inserted == 1
    assert {s.id for s in snapshots(engine)} >= {f"snap_20250101_000000_{key2[:12]}"}
    assert len(judgments(engine)) == 4


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_weighted_gap_and_meta_score_are_computed_when_absent(engine: Engine, tmp_path: Path) -> None:
    # truthfulness is primary (gap 1), clarity bonus (gap 2), safety other (gap 3).
    rec = record(
        user_scores={"truthfulness": 5, "clarity": 5, "safety": 5},
        judge_scores={"truthfulness": 4, "clarity": 3, "safety": 2},
        bonus_metrics=["clarity"],
    )
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    assert snap.weighted_gap == round(0.7 * 1 + 0.2 * 2 + 0.1 * 3, 2) == 1.4
    assert snap.judge_meta_score == 3
    assert snap.max_metric_gap == 3


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_given_weighted_gap_and_meta_score_are_kept(engine: Engine, tmp_path: Path) -> None:
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [record(weighted_gap=0.25, judge_meta_score=2)]))
    (snap,) = snapshots(engine)
    assert (snap.weighted_gap, snap.judge_meta_score) == (0.25, 2)


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_only_one_side_scored_leaves_gaps_empty(engine: Engine, tmp_path: Path) -> None:
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [record(user_scores=None)]))
    (snap,) = snapshots(engine)
    assert (snap.weighted_gap, snap.judge_meta_score, snap.max_metric_gap) == (None, None, None)
    assert len(judgments(engine)) == 2


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_custom_scale_gap_is_rescaled_to_the_1_to_5_span(engine: Engine, tmp_path: Path) -> None:
    import_rag_metrics(engine)
    rec = record(
        product="rag",
        user_scores={"Groundedness": 1, "coherence": 3},
        judge_scores={"groundedness": 0.5, "coherence": 2},
    )
    run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [rec]))
    (snap,) = snapshots(engine)
    assert snap.primary_metric == "groundedness"  # the first metric of the product's set
    assert snap.max_metric_gap == 2.0  # 0.5 on 0–1 → 2.0; 1 on 1–3 → 2.0
    assert {j.decision for j in judgments(engine).values()} == {"0.5", "2"}


# ---------------------------------------------------------------------------------------------
# Evaluations: identity


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_reimporting_the_same_file_adds_nothing(engine: Engine, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "evals.jsonl", [*numbered(3), record(id="snap_fixed")])
    first = run_import(engine, path)
    again = run_import(engine, path)
    assert (first.inserted, first.skipped, first.judgments) == (4, 0, 8)
    assert (again.inserted, again.skipped, again.judgments) == (0, 4, 0)
    assert (count(engine, EvaluationSnapshot), count(engine, Judgment)) == (4, 8)


def test_a_stored_id_is_skipped_even_with_different_content(engine: Engine, tmp_path: Path) -> None:
    run_import(engine, write_jsonl(tmp_path / "a.jsonl", [record(id="snap_x")]))
    report = run_import(engine, write_jsonl(tmp_path / "b.jsonl", [record(id="snap_x", question="Another?")]))
    assert (report.inserted, report.skipped) == (0, 1)
    assert snapshots(engine)[0].question == record()["question"]


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_duplicates_within_one_file_keep_the_first(engine: Engine, tmp_path: Path) -> None:
    rows = [
        record(overall_feedback="first"),
        record(overall_feedback="second"),  # same product, question, answer and model
        record(id="snap_a", question="Other?"),
        record(question="Other?", id="snap_a"),  # the very same record again (key order aside)
    ]
    report = run_import(engine, write_jsonl(tmp_path / "evals.jsonl", rows))
    assert (report.inserted, report.skipped) == (2, 2)
    stored = {s.question: s for s in snapshots(engine)}
    assert set(stored) == {record()["question"], "Other?"}
    assert stored[record()["question"]].overall_feedback == "first"


@pytest.mark.pg_repeats("statements and lines of test_invalid_utf8_is_refused_with_its_line")
def test_one_id_for_two_different_records_in_a_file_is_refused_with_both_lines(
    engine: Engine, tmp_path: Path
) -> None:
    rows = [record(id="snap_a"), record(id="snap_b", question="B?"), record(id="snap_a", question="Third?")]
    with pytest.raises(ImportFailed) as caught:
        run_import(engine, write_jsonl(tmp_path / "evals.jsonl", rows))
    assert str(caught.value) == (
        "evals.jsonl line 3, field 'id': 'snap_a' is also the id of a different record at evals.jsonl "
        "line 1; give each evaluation its own id; nothing was imported"
    )
    assert_nothing_written(engine)


def test_jsonl_whose_first_line_is_cut_short_reports_that_line(engine: Engine, tmp_path: Path) -> None:
    """Not "line 2, column 1" of the file read as one document (kind detection tries that)."""
    path = tmp_path / "evals.jsonl"
    path.write_text('{"question": "q", "model_answer":\n' + json.dumps(record()) + "\n")
    with pytest.raises(ImportFailed) as caught:
        run_import(engine, path)
    assert str(caught.value).startswith(
        "evals.jsonl line 1: invalid JSON (truncated: the text stops after column 33 before the JSON value is complete"
    )
    assert_nothing_written(engine)


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_import_evaluations_takes_parsed_records(engine: Engine) -> None:
    with session_scope(engine) as s:
        report = import_evaluations(session=s, records=iter(numbered(2)), source="demo", reviewer="builder")
    assert report.summary() == "evaluations: 2 inserted, 0 already present (skipped), 4 judgments"
    assert {s.created_by for s in snapshots(engine)} == {"builder"}


def test_an_import_asks_the_database_to_spell_a_set_of_metrics_once(engine: Engine) -> None:
    """An evaluation's `judged_metrics` is spelled by the database (`counters.metrics_spelled`), once
    per set of metrics and engine (`counters._spelled`): an import of sets seen before sends no
    spelling statement, a new set sends one, and every stored spelling is what a recount writes."""
    from sqlalchemy import event

    from lib import counters

    spellings: list[str] = []

    def spelling(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("SELECT COALESCE(") and statement.endswith(") AS judged"):  # _spell_statement
            spellings.append(statement)

    two, one, other = {"truthfulness": 4, "clarity": 3}, {"safety": 2}, {"clarity": 1, "safety": 5}

    def run(batch: str, *sets: dict[str, int]) -> None:
        rows = [record(question=f"{batch} {i}?", judge_scores=scores) for i, scores in enumerate(sets)]
        with session_scope(engine) as s:
            import_evaluations(session=s, records=rows)

    event.listen(engine, "before_cursor_execute", spelling)
    try:
        run("first", two, one, two)
        assert len(spellings) == 2
        run("again", one, two, one)
        assert len(spellings) == 2
        run("new", other, two)
        assert len(spellings) == 3
    finally:
        event.remove(engine, "before_cursor_execute", spelling)
    stored = {snap.question: snap.judged_metrics for snap in snapshots(engine)}
    assert stored["first 0?"] == stored["again 1?"] == ",clarity,truthfulness,"
    assert stored["new 0?"] == ",clarity,safety,"
    with session_scope(engine) as s:
        counters.refresh_snapshots(session=s, where=col(EvaluationSnapshot.id).is_not(None))
    assert {snap.question: snap.judged_metrics for snap in snapshots(engine)} == stored


@sqlite_only
def test_an_import_puts_the_connections_page_cache_back_reading_its_size_once(engine: Engine) -> None:
    """An import writes with a roomy SQLite page cache (`importer._roomy_sqlite_cache`) and gives
    the connection its own size back after; that size is read once per connection, not per import."""
    from sqlalchemy import event

    pragmas: list[str] = []

    def pragma(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("PRAGMA cache_size"):
            pragmas.append(statement)

    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA cache_size=-3000")  # the pool's one connection: its own size
    event.listen(engine, "before_cursor_execute", pragma)
    try:
        for batch in ("first", "second"):
            with session_scope(engine) as s:
                import_evaluations(session=s, records=[record(question=f"{batch} {i}?") for i in range(2)])
    finally:
        event.remove(engine, "before_cursor_execute", pragma)
    roomy, own = f"PRAGMA cache_size=-{importer.SQLITE_IMPORT_CACHE_KIB}", "PRAGMA cache_size=-3000"
    assert pragmas == ["PRAGMA cache_size", roomy, own, roomy, own]
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA cache_size").scalar() == -3000


@pytest.mark.pg_repeats("statements and lines of test_invalid_utf8_is_refused_with_its_line")
def test_import_evaluations_names_the_record_at_fault(engine: Engine) -> None:
    with pytest.raises(ImportFailed, match=r"demo record 3, field 'product'"), session_scope(engine) as s:
        import_evaluations(session=s, records=[*numbered(2), record(product=None)], source="demo")
    assert_nothing_written(engine)


@sqlite_only
def test_import_notes_names_the_record_at_fault_as_evaluations_do(engine: Engine) -> None:
    with pytest.raises(ImportFailed, match=r"demo record 2, field 'note_type'"), session_scope(engine) as s:
        import_notes(session=s, records=[note(), note(note_type="IDEA")], source="demo")
    assert_nothing_written(engine)


def test_parsed_records_are_checked_for_lone_surrogates_too(engine: Engine) -> None:
    """The API path (parsed records, no JSON text) gets the same refusal as a file (issue #17)."""
    bad = record(evidence={"clarity": [{"quote": QUOTE, "why": "\ud800"}]})
    with (
        pytest.raises(
            ImportFailed, match=r"api record 2, field 'evidence.clarity\[0\].why': contains invalid Unicode"
        ),
        session_scope(engine) as s,
    ):
        import_evaluations(session=s, records=[*numbered(1), bad], source="api")
    assert_nothing_written(engine)


def test_build_snapshot_rows_gives_model_rows_for_one_evaluation(engine: Engine) -> None:
    row, judgment_rows = build_snapshot_rows(record(id="snap_judge_1"), DEFAULT_METRICS, reviewer="judge")
    assert row["judge_scores_json"]["clarity"] == {"score": 2.5, "reason": "wordy"}
    assert row["evidence_json"]["truthfulness"]["user_score"] == 5
    with session_scope(engine) as s:
        s.add(EvaluationSnapshot(**row))
        s.flush()
        s.add_all(Judgment(**j) for j in judgment_rows)
    assert set(judgments(engine)) == {"snap_judge_1:truthfulness", "snap_judge_1:clarity"}
    assert snapshots(engine)[0].created_by == "judge"


@pytest.mark.parametrize(
    ("rec", "message"),
    [
        (record(), "evaluation, field 'id': is required"),
        (record(id="s1", user_scores={"clarity": 9}), "evaluation, field 'user_scores.clarity': score 9"),
    ],
)
def test_build_snapshot_rows_refuses_what_an_import_would(rec: dict[str, Any], message: str) -> None:
    with pytest.raises(ImportFailed, match=re.escape(message)):
        build_snapshot_rows(rec, DEFAULT_METRICS, reviewer="judge")


# ---------------------------------------------------------------------------------------------
# Evaluations: a bad file is refused whole


BAD_LINES: list[tuple[str, Any, str, str]] = [
    # (id, line 2 of the file, field named in the message, words of the reason)
    ("invalid-json", '{"question": "x", ', "", "invalid JSON"),
    ("not-an-object", [1, 2], "", "expected a JSON object"),
    ("missing-question", record(question=None), "question", "is required"),
    ("missing-answer", record(model_answer=None), "model_answer", "is required"),
    ("missing-product", record(product=None), "product", "is required"),
    ("empty-product", record(product="  "), "product", "must not be empty"),
    ("no-scores", record(user_scores=None, judge_scores=None), "user_scores", "is required"),
    ("empty-scores", record(user_scores={}, judge_scores={}), "user_scores", "both empty"),
    ("question-number", record(question=42), "question", "must be a string"),
    ("scores-list", record(user_scores=[4, 5]), "user_scores", "must be an object"),
    ("score-string", record(user_scores={"clarity": "4"}), "user_scores.clarity", "must be a number"),
    ("score-bool", record(judge_scores={"clarity": True}), "judge_scores.clarity", "must be a number"),
    ("score-object-without-score", record(judge_scores={"clarity": {"reason": "x"}}), "judge_scores.clarity.score", "is required"),
    ("reason-number", record(judge_scores={"clarity": {"score": 3, "reason": 7}}), "judge_scores.clarity.reason", "must be a string"),
    ("unknown-metric", record(user_scores={"Vibes": 3}), "user_scores.Vibes", "not defined for product 'tutor'"),
    ("lower-cased-display-name", record(judge_scores={"CLARITY": 3}), "judge_scores.CLARITY", "not defined"),
    ("metric-twice", record(user_scores={"clarity": 3, "Clarity": 4}), "user_scores.Clarity", "given twice"),
    ("score-above-scale", record(user_scores={"clarity": 7}), "user_scores.clarity", "score 7 for 'clarity' is outside its scale 1–5"),
    ("score-below-scale", record(judge_scores={"clarity": 0.5}), "judge_scores.clarity", "outside its scale 1–5"),
    ("evidence-list", record(evidence=[{"quote": QUOTE}]), "evidence", "must be an object"),
    ("evidence-unknown-metric", record(evidence={"vibes": []}), "evidence.vibes", "not defined"),
    ("evidence-items-string", record(evidence={"clarity": "quote"}), "evidence.clarity", "must be a list"),
    ("evidence-item-string", record(evidence={"clarity": ["quote"]}), "evidence.clarity[0]", "must be an object"),
    ("evidence-no-quote", record(evidence={"clarity": [{"start": 1}]}), "evidence.clarity[0].quote", "is required"),
    ("evidence-start-text", record(evidence={"clarity": {"evidence": [{"quote": QUOTE, "start": "ten"}]}}),
     "evidence.clarity.evidence[0].start", "must be an integer or null"),
    ("bonus-string", record(bonus_metrics="clarity"), "bonus_metrics", "must be a list"),
    ("bonus-unknown", record(bonus_metrics=["clarity", "vibes"]), "bonus_metrics[1]", "not defined"),
    ("primary-unknown", record(primary_metric="vibes"), "primary_metric", "not defined"),
    ("created-at-garbage", record(created_at="yesterday"), "created_at", "not an ISO 8601 time"),
    ("created-at-number", record(created_at=1700000000), "created_at", "must be an ISO 8601 time string"),
    ("language-too-long", record(language="x" * 17), "language", "at most 16 allowed"),
    ("id-too-long", record(id="s" * 65), "id", "at most 64 allowed"),
    ("meta-score-six", record(judge_meta_score=6), "judge_meta_score", "from 1 to 5"),
    ("weighted-gap-text", record(weighted_gap="1.2"), "weighted_gap", "must be a number"),
    ("nul-in-answer", record(model_answer="bad\x00answer"), "model_answer", "NUL"),
    ("surrogate-in-question", record(question="bad \ud800 text"), "question", "unpaired surrogate"),
    # Issue #17: every text of the record, also the ones the importer only stores (evidence why/better).
    ("surrogate-in-evidence-why", record(evidence={"clarity": [{"quote": QUOTE, "why": "x\ud800"}]}),
     "evidence.clarity[0].why", "unpaired surrogate"),
    ("surrogate-in-evidence-better", record(evidence={"clarity": [{"quote": QUOTE, "better": "\udc00"}]}),
     "evidence.clarity[0].better", "unpaired surrogate"),
    ("surrogate-in-a-score-reason", record(judge_scores={"clarity": {"score": 3, "reason": "\udfff"}}),
     "judge_scores.clarity.reason", "unpaired surrogate"),
    ("surrogate-in-an-extra-field", record(extra={"k": ["ok", "\ud83d"]}), "extra.k[1]", "unpaired surrogate"),
    ("created-at-before-year-1-in-utc", record(created_at="0001-01-01T00:00:00+01:00"), "created_at",
     "'0001-01-01T00:00:00+01:00' is out of range"),
    ("truncated-in-a-string", json.dumps(record())[:50], "", "truncated: the text stops after column 50"),
    ("truncated-after-a-comma", '{"question": "x", ', "", "truncated: the text stops after column 17"),
    ("huge-integer-score", record(user_scores={"clarity": 10**400}), "user_scores.clarity", "too large"),
    ("huge-integer-gap", record(weighted_gap=10**400), "weighted_gap", "too large"),
    ("infinite-score", '{"question": "q", "model_answer": "a", "product": "p", "user_scores": {"clarity": Infinity}}',
     "user_scores.clarity", "finite"),
    ("integer-over-digit-limit", '{"question": "q", "model_answer": "a", "user_scores": {"clarity": ' + "9" * 5000 + "}}",
     "", "invalid JSON"),
]  # fmt: skip


@sqlite_only
@pytest.mark.parametrize(
    ("line", "field", "reason"), [b[1:] for b in BAD_LINES], ids=[b[0] for b in BAD_LINES]
)
def test_bad_line_refuses_the_whole_file_naming_file_line_and_field(
    engine: Engine, tmp_path: Path, line: Any, field: str, reason: str
) -> None:
    path = tmp_path / "evals.jsonl"
    bad = line if isinstance(line, str) else json.dumps(line)
    path.write_text(json.dumps(record()) + "\n" + bad + "\n" + json.dumps(record(question="Later?")) + "\n")
    with pytest.raises(ImportFailed) as caught:
        run_import(engine, path, kind="evaluations")
    message = str(caught.value)
    assert message.startswith("evals.jsonl line 2")
    if field:
        assert f"field {field!r}" in message
    assert reason in message
    assert message.endswith("nothing was imported")
    assert_nothing_written(engine)


def test_unknown_metric_message_says_how_to_define_it(engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(ImportFailed, match=r"--kind metrics"):
        run_import(engine, write_jsonl(tmp_path / "evals.jsonl", [record(user_scores={"vibes": 3})]))


@pytest.mark.parametrize(
    ("scores", "field", "reason"),
    [
        ({"groundedness": 1.5}, "user_scores.groundedness", "outside its scale 0–1"),
        ({"Groundedness": -0.1}, "user_scores.Groundedness", "outside its scale 0–1"),
        ({"coherence": 4}, "user_scores.coherence", "outside its scale 1–3"),
        ({"coherence": 0}, "user_scores.coherence", "outside its scale 1–3"),
        ({"clarity": 3}, "user_scores.clarity", "not defined for product 'rag'"),
    ],
)
@pytest.mark.pg_repeats("statements and lines of test_five_thousand_records_go_through_the_bulk_path")
def test_custom_product_scales_are_enforced(
    engine: Engine, tmp_path: Path, scores: dict[str, Any], field: str, reason: str
) -> None:
    import_rag_metrics(engine)
    path = write_jsonl(
        tmp_path / "evals.jsonl", [record(product="rag", user_scores=scores, judge_scores=None)]
    )
    with pytest.raises(ImportFailed, match=rf"evals.jsonl line 1, field '{field}': .*{reason}"):
        run_import(engine, path)
    assert_nothing_written(engine)


@pytest.mark.parametrize(
    "scores", [{"groundedness": 0}, {"groundedness": 1}, {"coherence": 2.67}, {"Coherence": 1}]
)
@pytest.mark.pg_repeats("statements and lines of test_five_thousand_records_go_through_the_bulk_path")
def test_custom_product_scales_accept_scores_inside_them(
    engine: Engine, tmp_path: Path, scores: dict[str, Any]
) -> None:
    import_rag_metrics(engine)
    run_import(
        engine,
        write_jsonl(
            tmp_path / "evals.jsonl", [record(product="rag", user_scores=scores, judge_scores=scores)]
        ),
    )
    assert count(engine, EvaluationSnapshot) == 1


def test_overlong_line_is_refused_without_writing(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "evals.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(record()) + "\n")
        fh.write(json.dumps(record(model_answer="x" * (MAX_LINE_BYTES + MAX_LINE_BYTES // 10))) + "\n")
    assert path.stat().st_size > 11 * 1024 * 1024
    with pytest.raises(ImportFailed, match=r"evals.jsonl line 2: the line is longer than the 10 MB limit"):
        run_import(engine, path)
    assert_nothing_written(engine)


def test_invalid_utf8_is_refused_with_its_line(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "evals.jsonl"
    path.write_bytes(json.dumps(record()).encode() + b"\n" + b'{"question": "\xff"}\n')
    with pytest.raises(ImportFailed, match=r"evals.jsonl line 2: not valid UTF-8"):
        run_import(engine, path, kind="evaluations")
    assert_nothing_written(engine)


def test_blank_lines_and_a_byte_order_mark_are_tolerated(engine: Engine, tmp_path: Path) -> None:
    path = tmp_path / "evals.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf"
        + json.dumps(record()).encode()
        + b"\r\n\r\n  \n"
        + json.dumps(record(question="B?")).encode()
    )
    assert run_import(engine, path).inserted == 2


@pytest.mark.slow  # 5,000 evaluations and 10,000 judgments
def test_five_thousand_records_go_through_the_bulk_path(engine: Engine, tmp_path: Path) -> None:
    rows = [
        record(question=f"Question {i}?", evidence={"truthfulness": [{"quote": QUOTE, "start": 0, "end": 0}]})
        for i in range(5000)
    ]
    report = run_import(engine, write_jsonl(tmp_path / "evals.jsonl", rows))
    assert (report.inserted, report.judgments) == (5000, 10000)
    assert (count(engine, EvaluationSnapshot), count(engine, Judgment)) == (5000, 10000)
    with Session(engine) as s:
        assert s.exec(select(func.sum(EvaluationSnapshot.evidence_highlighted))).one() == 5000


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_long_load_refreshes_postgresql_statistics_inside_its_transaction(
    engine: Engine, tmp_path: Path
) -> None:
    """Planner statistics that say "no judgments" (a new or emptied database) made each batch's
    counter updates scan everything loaded so far: a 5,000-evaluation import took minutes. The
    import refreshes them in its own transaction (lib.db.LoadStatistics); autovacuum cannot, as it
    sees no uncommitted rows."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE judgments")
    rows = [record(question=f"Question {i}?") for i in range(1500)]
    report = run_import(engine, write_jsonl(tmp_path / "evals.jsonl", rows))
    assert report.judgments == 3000
    with engine.connect() as conn:
        believed = conn.exec_driver_sql("SELECT reltuples FROM pg_class WHERE relname = 'judgments'").scalar()
    assert believed >= 2000  # refreshed after the first batch's 2,000 judgments (0 before the fix)


# ---------------------------------------------------------------------------------------------
# Judgments: the seed-004 cache


@pytest.mark.pg_repeats("statements and lines of test_seed_cache_import_leaves_an_audit_trail")
def test_seed_cache_imports_decisions_corrections_and_optional_fields(engine: Engine) -> None:
    report = run_import(engine, FIXTURES / "judgments_cache.json")
    assert (report.kind, report.inserted, report.skipped) == ("judgments", 3, 0)
    rows = judgments(engine)
    corrected = rows["github.com/acme/fungear#123"]
    assert (corrected.decision, corrected.user_decision, corrected.was_corrected) == (
        "INCLUDE",
        "EXCLUDE",
        True,
    )
    assert (corrected.url, corrected.description, corrected.ai_provider) == (
        "https://github.com/acme/fungear/pull/123", "Add widget", "openai",
    )  # fmt: skip
    assert (corrected.reviewer, corrected.reviewed_at) == ("rita", datetime(2024, 11, 15, 10, 30, tzinfo=UTC))
    open_one = rows["github.com/acme/fungear#124"]
    assert (open_one.decision, open_one.user_decision, open_one.was_corrected, open_one.reviewed_at) == (
        "UNCERTAIN",
        None,
        False,
        None,
    )
    confirmed = rows["github.com/acme/fungear#125"]
    assert (confirmed.was_corrected, confirmed.timestamp) == (
        False,
        datetime(2024, 11, 17, 6, 15, tzinfo=UTC),
    )
    assert {j.product for j in rows.values()} == {"Acme Fungear"}


def test_seed_cache_reimport_skips_and_never_overwrites(engine: Engine) -> None:
    run_import(engine, FIXTURES / "judgments_cache.json")
    with session_scope(engine) as s:
        j = s.exec(select(Judgment).where(Judgment.change_id == "github.com/acme/fungear#124")).one()
        j.user_decision = "INCLUDE"
        s.add(j)
    report = run_import(engine, FIXTURES / "judgments_cache.json")
    assert (report.inserted, report.skipped) == (0, 3)
    assert judgments(engine)["github.com/acme/fungear#124"].user_decision == "INCLUDE"


def test_seed_cache_import_leaves_an_audit_trail(engine: Engine) -> None:
    run_import(engine, FIXTURES / "judgments_cache.json")
    with Session(engine) as s:
        events = s.exec(select(JudgmentEvent).order_by(JudgmentEvent.change_id, JudgmentEvent.version)).all()
        trail = [
            (e.change_id[-3:], e.action, e.from_decision, e.to_decision, e.reviewer, e.version)
            for e in events
        ]
        versions = {j.change_id[-3:]: j.version for j in s.exec(select(Judgment)).all()}
    assert trail == [
        ("123", "imported", None, "INCLUDE", "rita", 1),
        ("123", "overruled", "INCLUDE", "EXCLUDE", "rita", 2),
        ("124", "imported", None, "UNCERTAIN", "rita", 1),
        ("125", "imported", None, "EXCLUDE", "rita", 1),
        ("125", "confirmed", "EXCLUDE", "EXCLUDE", "rita", 2),
    ]
    assert versions == {"123": 2, "124": 1, "125": 2}


def cache_with(**entry_overrides: Any) -> dict[str, Any]:
    """A cache whose first entry is valid and whose second ('c1') carries the overrides."""
    good = {"change_id": "c0", "decision": "INCLUDE", "product": "P", "timestamp": "2024-11-15T10:30:00Z"}
    entry = {**good, "change_id": "c1", **entry_overrides}
    return {
        "cache_version": "1.0",
        "judgments": {"c0": good, "c1": {k: v for k, v in entry.items() if v is not None}},
    }


BAD_CACHES: list[tuple[str, Any, str]] = [
    ("not-an-object", ["x"], "expected a JSON object"),
    ("version-missing", {"judgments": {}}, "field 'cache_version': is missing"),
    ("version-newer", {"cache_version": "2.0", "judgments": {}}, "unsupported version '2.0'"),
    ("version-number", {"cache_version": 1.0, "judgments": {}}, "unsupported version 1.0"),
    ("judgments-list", {"cache_version": "1.0", "judgments": []}, "field 'judgments': must be an object"),
    ("entry-string", {"cache_version": "1.0", "judgments": {"c1": "INCLUDE"}}, "judgment 'c1': expected a JSON object"),
    ("decision-unknown", cache_with(decision="MAYBE"), "judgment 'c1', field 'decision': 'MAYBE' is not one of"),
    ("decision-missing", cache_with(decision=None), "judgment 'c1', field 'decision': is required"),
    ("user-decision-unknown", cache_with(user_decision="yes"), "field 'user_decision'"),
    ("product-missing", cache_with(product=None), "judgment 'c1', field 'product': is required"),
    ("timestamp-missing", cache_with(timestamp=None), "judgment 'c1', field 'timestamp': is required"),
    ("timestamp-garbage", cache_with(timestamp="soon"), "field 'timestamp': 'soon' is not an ISO 8601 time"),
    ("change-id-mismatch", cache_with(change_id="other"), "field 'change_id': 'other' differs from its key"),
    ("change-id-too-long", {"cache_version": "1.0", "judgments": {"x" * 301: cache_with()["judgments"]["c0"] | {"change_id": "x" * 301}}},
     "field 'change_id': is 301 characters long"),
    ("reasoning-number", cache_with(reasoning=3), "field 'reasoning': must be a string"),
    ("surrogate-in-reasoning", cache_with(reasoning="\ud800"), "judgment 'c1', field 'reasoning': contains invalid Unicode"),
    ("surrogate-in-an-extra-field", cache_with(extra={"x": "\udc00"}), "judgment 'c1', field 'extra.x': contains invalid"),
    ("timestamp-before-year-1-in-utc", cache_with(timestamp="0001-01-01T00:30:00+01:00"), "field 'timestamp': "
     "'0001-01-01T00:30:00+01:00' is out of range"),
]  # fmt: skip


@sqlite_only
@pytest.mark.parametrize(("data", "reason"), [b[1:] for b in BAD_CACHES], ids=[b[0] for b in BAD_CACHES])
def test_bad_seed_cache_is_refused_whole(engine: Engine, tmp_path: Path, data: Any, reason: str) -> None:
    path = tmp_path / "cache.json"
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(ImportFailed, match="nothing was imported") as caught:
        run_import(engine, path, kind="judgments")
    assert str(caught.value).startswith("cache.json")
    assert reason in str(caught.value)
    assert count(engine, Judgment) == 0


def test_corrupted_cache_json_is_refused_with_its_line(engine: Engine, tmp_path: Path) -> None:
    text = (FIXTURES / "judgments_cache.json").read_text()
    path = tmp_path / "cache.json"
    path.write_text(text[: len(text) // 2])
    with pytest.raises(
        ImportFailed, match=r"cache.json: invalid JSON \(truncated: the text stops after line \d+, column \d+"
    ):
        run_import(engine, path)
    assert count(engine, Judgment) == 0


@pytest.mark.pg_repeats("statements and lines of test_seed_cache_import_leaves_an_audit_trail")
def test_cache_import_from_parsed_data(engine: Engine) -> None:
    with session_scope(engine) as s:
        report = import_judgments_cache(session=s, data=cache_with(), source="upload.json", reviewer="rita")
    assert report.summary() == "judgments: 2 inserted, 0 already present (skipped)"


# ---------------------------------------------------------------------------------------------
# Notes and metric sets


@pytest.mark.pg_repeats(
    "statements and lines of test_a_notes_code_is_read_from_code_or_its_seed_name_phelps_code"
)
def test_notes_import_with_seed_columns(engine: Engine) -> None:
    report = run_import(engine, FIXTURES / "notes.jsonl")
    assert (report.kind, report.inserted, report.skipped) == ("notes", 3, 0)
    with Session(engine) as s:
        rows = {n.note_type: n for n in s.exec(select(SessionNote)).all()}
    success = rows["SUCCESS"]
    assert (success.language, success.phelps_code, success.confidence, success.session_id) == (
        "en", "PH0042", 0.9, "20250201_100000_4242_123456",
    )  # fmt: skip
    assert success.timestamp == datetime(2025, 2, 1, 10, 0, tzinfo=UTC)
    assert (rows["STRATEGY"].language, rows["STRATEGY"].phelps_code, rows["STRATEGY"].confidence) == (
        "",
        None,
        None,
    )
    assert {n.created_by for n in rows.values()} == {"rita"}


def test_notes_reimport_and_in_file_duplicates_are_skipped(engine: Engine, tmp_path: Path) -> None:
    lines = (FIXTURES / "notes.jsonl").read_text().splitlines()
    path = tmp_path / "notes.jsonl"
    path.write_text("\n".join([*lines, lines[0]]) + "\n")
    first = run_import(engine, path)
    again = run_import(engine, path)
    assert (first.inserted, first.skipped, again.inserted, again.skipped) == (3, 1, 0, 4)
    assert count(engine, SessionNote) == 3


def note(**overrides: Any) -> dict[str, Any]:
    base = {
        "timestamp": "2025-02-01T10:00:00Z",
        "language": "en",
        "note_type": "TIP",
        "content": "c",
        "session_id": "s1",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


@sqlite_only
@pytest.mark.parametrize(
    ("bad", "field", "reason"),
    [
        (note(note_type="IDEA"), "note_type", "is not one of"),
        (note(timestamp=None), "timestamp", "is required"),
        (note(session_id=None), "session_id", "is required"),
        (note(content=" "), "content", "must not be empty"),
        (note(confidence=1.5), "confidence", "outside 0–1"),
        (note(phelps_code="PH1"), "phelps_code", "only SUCCESS notes carry a code"),
        (note(code="PH1"), "code", "only SUCCESS notes carry a code"),
        (note(note_type="SUCCESS", code="A", phelps_code="B"), "code", "differs from 'phelps_code'"),
        (note(language="english language"), "language", "at most 10"),
        (note(content="tip \ud800"), "content", "unpaired surrogate"),
        (note(session_id="s\udc00"), "session_id", "unpaired surrogate"),
        (note(timestamp="0001-01-01T00:00:00+05:00"), "timestamp", "out of range"),
    ],
)
def test_bad_note_refuses_the_whole_file(
    engine: Engine, tmp_path: Path, bad: dict[str, Any], field: str, reason: str
) -> None:
    path = write_jsonl(tmp_path / "notes.jsonl", [note(content="ok"), bad])
    with pytest.raises(ImportFailed, match=rf"notes.jsonl line 2, field '{field}': .*{reason}"):
        run_import(engine, path, kind="notes")
    assert_nothing_written(engine)


def test_a_notes_code_is_read_from_code_or_its_seed_name_phelps_code(engine: Engine) -> None:
    """`code` is the documented name (issue 25: no seed jargon on the Import page); files written
    with seed 000's column name keep importing."""
    records = [
        note(note_type="SUCCESS", content="a", code="C1", confidence=0.8),
        note(note_type="SUCCESS", content="b", phelps_code="C2", confidence=0.8),
        note(note_type="SUCCESS", content="c", code="C3", phelps_code="C3", confidence=0.8),
    ]
    with session_scope(engine) as s:
        import_notes(session=s, records=records, source="api", reviewer="bot")
    with Session(engine) as s:
        assert {n.content: n.phelps_code for n in s.exec(select(SessionNote)).all()} == {
            "a": "C1", "b": "C2", "c": "C3"
        }  # fmt: skip


@pytest.mark.pg_repeats(
    "statements and lines of test_a_notes_code_is_read_from_code_or_its_seed_name_phelps_code"
)
def test_import_notes_takes_parsed_records(engine: Engine) -> None:
    with session_scope(engine) as s:
        report = import_notes(
            session=s, records=[note(), note(content="other")], source="api", reviewer="bot"
        )
    assert (report.inserted, count(engine, SessionNote)) == (2, 2)


def test_metrics_import_inserts_then_updates(engine: Engine, tmp_path: Path) -> None:
    first = run_import(engine, FIXTURES / "metrics.json")
    assert (first.kind, first.inserted, first.updated) == ("metrics", 2, 0)
    changed = json.loads((FIXTURES / "metrics.json").read_text())
    changed[1]["max"] = 4
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(changed))
    again = run_import(engine, path)
    assert again.summary() == "metrics: 0 inserted, 2 updated"
    with Session(engine) as s:
        rows = {m.slug: m for m in s.exec(select(MetricDefinition)).all()}
    assert (rows["coherence"].min_value, rows["coherence"].max_value) == (1, 4)


@sqlite_only
@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (
            {"product": "rag", "slug": "x", "display_name": "X", "min": 3, "max": 1},
            "field 'max' must be greater",
        ),
        ({"product": "rag", "slug": "x", "display_name": "X", "min": 0}, "field 'max' is required"),
        ({"product": "rag", "slug": "Bad Slug", "display_name": "X", "min": 0, "max": 1}, "field 'slug'"),
        ({**RAG_METRICS[0], "display_name": "Again"}, "field 'slug': 'groundedness' is defined twice"),
        ("groundedness", "must be a JSON object"),
        (
            {"product": "rag", "slug": "x", "display_name": ["X"], "min": 0, "max": 1},
            "field 'display_name': must be a string",
        ),
        (
            {"product": 7, "slug": "x", "display_name": "X", "min": 0, "max": 1},
            "field 'product': must be a string",
        ),
        (
            {"product": "rag", "slug": "x", "display_name": "X", "min": 0, "max": 1, "description": {}},
            "field 'description'",
        ),
        (
            {"product": "rag", "slug": "x", "display_name": "X", "min": 0, "max": 1, "description": "\ud800"},
            "field 'description': contains invalid Unicode (an unpaired surrogate)",
        ),
        # Issue #17: absurd scales broke every page of the product.
        *(
            (
                {"product": "rag", "slug": "x", "display_name": "X", "min": lo, "max": hi},
                f"field {field!r}: {shown} is not a usable scale bound; min and max must be finite numbers "
                "from -1,000,000 to 1,000,000",
            )
            for lo, hi, field, shown in [
                (0, math.inf, "max", "inf"),
                (-math.inf, 1, "min", "-inf"),
                (math.nan, 1, "min", "nan"),
                (0, 1e308, "max", "1e+308"),
                (-1e308, 0, "min", "-1e+308"),
                (0, 10**400, "max", repr(10**400)[:27] + "..."),
                (0, 1_000_001, "max", "1000001"),
            ]
        ),
    ],
)
def test_bad_metric_entry_refuses_the_whole_list(
    engine: Engine, tmp_path: Path, bad: Any, reason: str
) -> None:
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps([*RAG_METRICS, bad]))
    with pytest.raises(ImportFailed, match=r"metrics.json item 3") as caught:
        run_import(engine, path, kind="metrics")
    assert reason in str(caught.value)
    assert count(engine, MetricDefinition) == 0


# ---------------------------------------------------------------------------------------------
# Kind detection


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("evaluations.jsonl", "evaluations"),
        ("notes.jsonl", "notes"),
        ("judgments_cache.json", "judgments"),
        ("metrics.json", "metrics"),
    ],
)
def test_kind_is_detected_from_content(name: str, kind: str) -> None:
    assert detect_kind(FIXTURES / name)[0] == kind


@pytest.mark.parametrize(
    "text",
    [
        '{"judgments": {}, "cache_version": "1.0"}',  # one line, judgments first
        '{\n  "note": "x",\n  "cache_version": "1.0",\n  "judgments": {}\n}',  # pretty, other key first
        '{"note": "x", "cache_version": "1.0", "judgments": {}}',  # one line, other key first
    ],
)
def test_cache_is_detected_in_any_layout(tmp_path: Path, text: str) -> None:
    path = tmp_path / "cache.json"
    path.write_text(text)
    assert detect_kind(path)[0] == "judgments"


@sqlite_only
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "the file is empty"),
        ("\n  \n", "the file is empty"),
        ('{"question": "q", "answer": "a"}\n', "cannot tell what this file holds"),
        ("[1, 2, 3]", "cannot tell what this file holds"),
        ("{'single': 'quotes'}\n", "line 1: invalid JSON"),
    ],
)
def test_undetectable_file_is_refused(engine: Engine, tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(text)
    with pytest.raises(ImportFailed, match=reason):
        run_import(engine, path)
    assert_nothing_written(engine)


def test_missing_file_is_refused(engine: Engine, tmp_path: Path) -> None:
    with pytest.raises(ImportFailed, match="no such file"):
        run_import(engine, tmp_path / "nope.jsonl")


@pytest.mark.pg_repeats("statements and lines of test_a_stored_id_is_skipped_even_with_different_content")
def test_fixture_evaluations_import_end_to_end(engine: Engine) -> None:
    report = run_import(engine, FIXTURES / "evaluations.jsonl")
    assert (report.inserted, report.judgments) == (2, 3)
    by_lang = {s.language: s for s in snapshots(engine)}
    assert by_lang["en"].id == "snap_20250101_120000_fixture1"
    assert by_lang["tr"].evidence_json["clarity"]["evidence"][0]["stage"] == "substring"  # type: ignore[index]


# ---------------------------------------------------------------------------------------------
# CLI


def run_cli(db: Path, *args: str) -> CliResult:
    return cli.run_cli("import", *args, env={"OVERRULE_DATABASE_URL": f"sqlite:///{db}"})


def test_cli_imports_and_reports_on_stdout(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    done = run_cli(db, str(FIXTURES / "evaluations.jsonl"), "--reviewer", "ops")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "evaluations: 2 inserted, 0 already present (skipped), 3 judgments"
    again = run_cli(db, str(FIXTURES / "evaluations.jsonl"))
    assert again.stdout.strip() == "evaluations: 0 inserted, 2 already present (skipped), 0 judgments"
    engine = init_db(f"sqlite:///{db}")
    assert {s.created_by for s in snapshots(engine)} == {"ops"}
    engine.dispose()


def test_cli_honours_kind(tmp_path: Path) -> None:
    done = run_cli(tmp_path / "cli.db", str(FIXTURES / "metrics.json"), "--kind", "metrics")
    assert (done.returncode, done.stdout.strip()) == (0, "metrics: 2 inserted, 0 updated")


def test_cli_refuses_a_bad_file_with_nonzero_exit_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    path = write_jsonl(tmp_path / "evals.jsonl", [record(), record(user_scores={"clarity": 7})])
    done = run_cli(db, str(path))
    assert done.returncode == 1
    assert done.stdout == ""
    assert "error: evals.jsonl line 2, field 'user_scores.clarity': score 7" in done.stderr
    assert "Traceback" not in done.stderr
    engine = init_db(f"sqlite:///{db}")
    assert_nothing_written(engine)
    engine.dispose()


def test_cli_refuses_a_missing_file(tmp_path: Path) -> None:
    done = run_cli(tmp_path / "cli.db", str(tmp_path / "absent.jsonl"))
    assert done.returncode == 1
    assert "no such file" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("IMPORT_BENCH_LINES"), reason="set IMPORT_BENCH_LINES=100000 to measure"
)
def test_measure_large_import(sqlite_engine: Engine, tmp_path: Path) -> None:
    """Prints how long N generated lines take (no timing assert: machines differ)."""
    n = int(os.environ["IMPORT_BENCH_LINES"])
    rows = (
        record(
            question=f"Question {i}?",
            user_scores={slug: (i + k) % 5 + 1 for k, slug in enumerate(SLUGS)},
            judge_scores={
                slug: {"score": (i + 2 * k) % 5 + 1, "reason": "judge reason"} for k, slug in enumerate(SLUGS)
            },
            evidence={
                "truthfulness": [{"quote": QUOTE, "start": 0, "end": 0}],
                "clarity": [{"quote": "In short"}],
            },
        )
        for i in range(n)
    )
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    started = time.perf_counter()
    report = run_import(sqlite_engine, path)
    print(
        f"\n{n} lines ({path.stat().st_size / 1e6:.0f} MB): {time.perf_counter() - started:.1f} s; {report.summary()}"
    )
    assert report.inserted == n


SLUGS = (
    "truthfulness",
    "helpfulness",
    "safety",
    "bias",
    "clarity",
    "consistency",
    "efficiency",
    "robustness",
)


# ---------------------------------------------------------------------------------------------
# Every row import's one shape (`importer._bulk_load`)

SOURCES = ROOT / "tests" / "fixtures" / "sources"


def _load_through(entry: str, engine: Engine) -> ImportReport:
    """One row import through `entry`: each way in that validates, spools and writes rows."""
    if entry.startswith("file "):
        kind = entry.removeprefix("file ")
        path = SOURCES / "promptfoo_results.json" if kind == "promptfoo" else FIXTURES / f"{kind}.jsonl"
        return import_path(engine=engine, path=path, kind=kind, reviewer="rita")
    with session_scope(engine) as session:
        if entry == "records":
            return import_evaluations(session=session, records=numbered(3), reviewer="rita")
        if entry == "notes":
            return import_notes(session=session, records=[note(content=c) for c in "ab"], reviewer="rita")
        evaluations = [
            SourceEvaluation(where=f"span {i}", product="p", question=f"q{i}?", answer="a.",
                             verdicts=[SourceVerdict("Helpfulness", score=4)])
            for i in range(3)
        ]  # fmt: skip
        return import_source_evaluations(
            session=session, evaluations=evaluations, source="otlp", reviewer="rita"
        )


LOAD_ENTRIES = ["records", "notes", "source", "file evaluations", "file notes", "file promptfoo"]


@pytest.fixture
def spool_events(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """Each spooled row, each write's read of the spool and each close, with whether this thread's
    load was inside `bulk.frozen_heap` then (its depth is kept even where conftest's own freeze
    makes the block skip `gc.freeze`)."""
    events: list[tuple[str, bool]] = []
    add, chunks, close = importer._Spool.add, importer._Spool.chunks, importer._Spool.close

    def inside() -> bool:
        return bulk._loads.get(threading.get_ident(), 0) > 0

    def watched_add(self: importer._Spool, item: Any) -> None:
        events.append(("spool", inside()))
        add(self, item)

    def watched_chunks(self: importer._Spool) -> Any:
        events.append(("write", inside()))
        return chunks(self)

    def watched_close(self: importer._Spool) -> None:
        events.append(("close", inside()))
        close(self)

    monkeypatch.setattr(importer._Spool, "add", watched_add)
    monkeypatch.setattr(importer._Spool, "chunks", watched_chunks)
    monkeypatch.setattr(importer._Spool, "close", watched_close)
    return events


@sqlite_only
@pytest.mark.parametrize("entry", LOAD_ENTRIES)
def test_every_row_import_spools_and_writes_inside_a_frozen_heap_and_closes_its_spool(
    engine: Engine, entry: str, spool_events: list[tuple[str, bool]]
) -> None:
    """The rule had three homes, and a fourth entry (notes from records, as the demo loads them)
    spooled and wrote outside the freeze every other import takes (lib.bulk.frozen_heap)."""
    report = _load_through(entry, engine)
    assert report.inserted > 0
    phases = [phase for phase, _ in spool_events]
    assert phases.count("close") == 1 and phases[-1] == "close"
    assert "spool" in phases and "write" in phases
    assert phases.index("write") > max(i for i, phase in enumerate(phases) if phase == "spool")
    assert all(frozen for _, frozen in spool_events), spool_events
    assert threading.get_ident() not in bulk._loads


@sqlite_only
@pytest.mark.parametrize("entry", LOAD_ENTRIES)
def test_a_row_import_whose_write_fails_still_closes_its_spool_and_leaves_the_freeze(
    engine: Engine, entry: str, spool_events: list[tuple[str, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the database went away")

    monkeypatch.setattr(importer, "_write_rows", refused)
    with pytest.raises(RuntimeError, match="went away"):
        _load_through(entry, engine)
    assert [phase for phase, _ in spool_events][-1] == "close"
    assert threading.get_ident() not in bulk._loads
    assert_nothing_written(engine)
