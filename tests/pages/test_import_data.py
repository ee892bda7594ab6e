"""Import page under AppTest: uploads of every kind go through the importer, bad files write nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from lib.db import session_scope
from lib.models import EvaluationSnapshot, Judgment, MetricDefinition, SessionNote
from lib.safe_markdown import escape_markdown

PAGE = "pages/import_data.py"
FIXTURES = Path(__file__).resolve().parents[1] / "data" / "import"
DETECT = "Detect automatically"


def evaluation(**overrides: Any) -> dict[str, Any]:
    """A valid evaluation on the default 1–5 metric set."""
    base: dict[str, Any] = {
        "question": "Who received the 1921 Nobel Prize in Physics?",
        "model_answer": "Einstein, for the photoelectric effect.",
        "product": "tutor",
        "user_scores": {"truthfulness": 5, "clarity": 4},
        "judge_scores": {"truthfulness": {"score": 4, "reason": "thin"}, "clarity": 3},
    }
    return base | overrides


def jsonl(*records: dict[str, Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def count(engine: Engine, model: type) -> int:
    with session_scope(engine, read_only=True) as s:
        return s.exec(select(func.count()).select_from(model)).one()


def upload(at: AppTest, name: str, data: bytes, *, kind: str = DETECT) -> AppTest:
    """Choose a file (and kind), let the page redraw, then press Import."""
    at.file_uploader(key="import_file").set_value((name, data, "application/json"))
    at.selectbox(key="import_kind").set_value(kind)
    at.run()
    at.button(key="import_run").click()
    return at.run()


@pytest.mark.parametrize(
    ("reviewer", "with_file"),
    [(None, False), ("ayse", False), (None, True)],
    ids=["nothing", "reviewer-only", "file-only"],
)
def test_import_is_disabled_until_a_file_and_a_reviewer_are_given(
    app_engine, open_page, reviewer, with_file
) -> None:
    at = open_page(PAGE, reviewer=reviewer)
    if with_file:
        at.file_uploader(key="import_file").set_value(("e.jsonl", jsonl(evaluation()), "application/json"))
        at.run()
    assert at.button(key="import_run").disabled
    assert not at.exception


def test_import_is_enabled_with_a_file_and_a_reviewer(app_engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    at.file_uploader(key="import_file").set_value(("e.jsonl", jsonl(evaluation()), "application/json")).run()
    assert not at.button(key="import_run").disabled
    assert not at.exception


def test_without_a_reviewer_the_page_asks_for_a_name(app_engine, open_page) -> None:
    at = open_page(PAGE)
    assert any("Enter your name in the sidebar to import data" in w.value for w in at.warning)


@pytest.mark.parametrize(
    "phrase",
    [
        "`question`, `model_answer`, `product`",
        "`timestamp, language, note_type, content, code, confidence, session_id`",
        "`{product, slug, display_name, min, max, description}`",
        '"cache_version": "1.0"',
        'docs/data.md, "Data in and out"',
        "limited to 200 MB",
        "`python -m lib import FILE` on the server",
    ],
)
def test_the_page_explains_formats_and_the_upload_limit(app_engine, open_page, phrase) -> None:
    at = open_page(PAGE)
    text = " ".join([*(c.value for c in at.caption), *(m.value for m in at.markdown)])
    assert phrase in text


def test_the_uploader_accepts_json_jsonl_and_the_other_tools_parquet_and_csv(app_engine, open_page) -> None:
    at = open_page(PAGE)
    assert sorted(at.file_uploader(key="import_file").allowed_type) == [".csv", ".json", ".jsonl", ".parquet"]


@pytest.mark.parametrize("kind", [DETECT, "evaluations"])
def test_a_good_evaluations_upload_creates_snapshots_and_judgments(app_engine, open_page, kind) -> None:
    at = upload(open_page(PAGE, reviewer="ayse"), "evals.jsonl", jsonl(evaluation()), kind=kind)
    assert not at.exception
    assert [s.value for s in at.success] == [
        escape_markdown("evaluations: 1 inserted, 0 already present (skipped), 2 judgments")
    ]
    assert count(app_engine, EvaluationSnapshot) == 1
    assert count(app_engine, Judgment) == 2


def test_uploading_the_same_file_twice_reports_it_as_already_present(app_engine, open_page) -> None:
    at = upload(open_page(PAGE, reviewer="ayse"), "evals.jsonl", jsonl(evaluation()))
    at.button(key="import_run").click()
    at.run()
    assert "1 already present" in at.success[0].value
    assert count(app_engine, EvaluationSnapshot) == 1


@pytest.mark.parametrize(
    ("fixture", "kind", "model", "rows"),
    [
        ("notes.jsonl", "notes", SessionNote, 3),
        ("judgments_cache.json", "judgments", Judgment, 3),
        ("metrics.json", "metrics", MetricDefinition, 2),
    ],
)
@pytest.mark.parametrize("chosen", [True, False], ids=["kind-chosen", "kind-detected"])
def test_every_kind_can_be_uploaded(app_engine, open_page, fixture, kind, model, rows, chosen) -> None:
    before = count(app_engine, model)
    at = upload(
        open_page(PAGE, reviewer="ayse"),
        fixture,
        (FIXTURES / fixture).read_bytes(),
        kind=kind if chosen else DETECT,
    )
    assert not at.exception
    assert at.success[0].value.startswith(kind)
    assert count(app_engine, model) - before == rows


def test_a_score_outside_its_scale_is_refused_and_nothing_is_written(app_engine, open_page) -> None:
    good = evaluation(question="Fine?")
    bad = evaluation(user_scores={"truthfulness": 5, "clarity": 7})
    at = upload(open_page(PAGE, reviewer="ayse"), "evals.jsonl", jsonl(good, bad))
    assert not at.exception
    assert not at.success
    message = at.error[0].value
    assert "nothing was written" in message
    assert escape_markdown("evals.jsonl line 2, field 'user_scores.clarity'") in message
    assert count(app_engine, EvaluationSnapshot) == 0
    assert count(app_engine, Judgment) == 0


def test_a_file_of_another_kind_than_chosen_is_refused(app_engine, open_page) -> None:
    at = upload(
        open_page(PAGE, reviewer="ayse"),
        "notes.jsonl",
        (FIXTURES / "notes.jsonl").read_bytes(),
        kind="evaluations",
    )
    assert "nothing was written" in at.error[0].value
    assert count(app_engine, SessionNote) == 0
    assert count(app_engine, EvaluationSnapshot) == 0


def test_markup_in_an_error_message_is_escaped(app_engine, open_page) -> None:
    hostile = "[click](javascript:alert(1))"
    at = upload(open_page(PAGE, reviewer="ayse"), "evals.jsonl", jsonl(evaluation(user_scores={hostile: 3})))
    message = at.error[0].value
    assert hostile not in message
    assert escape_markdown(hostile) in message
    assert count(app_engine, EvaluationSnapshot) == 0


def test_an_empty_file_is_refused(app_engine, open_page) -> None:
    at = upload(open_page(PAGE, reviewer="ayse"), "empty.jsonl", b"")
    assert escape_markdown("empty.jsonl: the file is empty") in at.error[0].value
    assert not at.exception


def test_a_phoenix_upload_takes_the_spans_file_and_product(app_engine, open_page) -> None:
    """Issue 29.2: a source kind asks for the product (and Phoenix for its spans file) and imports."""
    sources = Path(__file__).resolve().parents[1] / "fixtures" / "sources"
    at = open_page(PAGE, reviewer="ayse")
    at.selectbox(key="import_kind").set_value("phoenix")
    at.run()
    at.file_uploader(key="import_file").set_value(
        ("evals.parquet", (sources / "phoenix_evaluations.parquet").read_bytes(), "application/octet-stream")
    )
    at.file_uploader(key="import_spans").set_value(
        ("spans.parquet", (sources / "phoenix_spans.parquet").read_bytes(), "application/octet-stream")
    )
    at.text_input(key="import_product").set_value("library-qa")
    at.run()
    at.button(key="import_run").click()
    at.run()
    assert [s.value for s in at.success] == [
        escape_markdown("phoenix: 3 inserted, 0 already present (skipped), 3 judgments")
    ]
    with session_scope(app_engine, read_only=True) as s:
        assert set(s.exec(select(EvaluationSnapshot.product)).all()) == {"library-qa"}
    assert not at.exception


def test_the_page_passes_label_scores_for_labels_sent_without_a_number(app_engine, open_page) -> None:
    """review7 F9: Phoenix's frustration rails (`frustrated`/`ok`) have no known score; the page's
    field gives them one, as `--label-scores` does."""
    sources = Path(__file__).resolve().parents[1] / "fixtures" / "sources"
    evals = b"context.span_id,eval_name,label,explanation\na1b2c3d4e5f60718,Frustration,ok,Calm.\n"
    at = open_page(PAGE, reviewer="ayse")
    at.selectbox(key="import_kind").set_value("phoenix")
    at.run()
    at.file_uploader(key="import_file").set_value(("frus.csv", evals, "text/csv"))
    at.file_uploader(key="import_spans").set_value(
        ("spans.csv", (sources / "phoenix_spans.csv").read_bytes(), "text/csv")
    )
    at.run()
    at.button(key="import_run").click()
    at.run()
    assert escape_markdown("label 'ok' has no score") in at.error[0].value
    # The advice is the page's field, and the field's help lists the docs' steps (review14 F3).
    assert "--label-scores" not in at.error[0].value and escape_markdown("ok=N") in at.error[0].value
    field = at.text_input(key="import_label_scores")
    assert "stored judgments of that metric and label" in field.help and "partner" in field.help
    field.set_value("frustrated=1,ok=0")
    at.run()
    at.button(key="import_run").click()
    at.run()
    assert [s.value for s in at.success] == [
        escape_markdown(
            "phoenix: 1 inserted, 0 already present (skipped), 1 judgment, 2 other spans in the spans file (not judged in this file)"
        )
    ]
    with session_scope(app_engine, read_only=True) as s:
        (snapshot,) = s.exec(select(EvaluationSnapshot)).all()
    assert snapshot.judge_scores_json["frustration"] == {"score": 0.0, "reason": "ok: Calm.", "label": "ok"}
    assert not at.exception


def test_detect_automatically_says_where_the_label_scores_field_is(app_engine, open_page) -> None:
    """review18 L2: under "Detect automatically" the label advice named a field the page hides until
    a kind is chosen; the page says how to show it."""
    sources = Path(__file__).resolve().parents[1] / "fixtures" / "sources"
    lines = (sources / "langfuse_export_v3.jsonl").read_text(encoding="utf-8").splitlines()
    unconfigured = "\n".join(line for line in lines if '"id": "config-tone"' not in line) + "\n"
    at = upload(open_page(PAGE, reviewer="ayse"), "export.jsonl", unconfigured.encode())
    assert "the field for scores of labels sent without a number" in at.error[0].value
    assert [i.value for i in at.info] == [
        'Choose the file\'s kind under "What the file holds" to show the field for scores of labels sent '
        "without a number (and the Product field)."
    ]
    assert count(app_engine, EvaluationSnapshot) == 0 and not at.exception


def test_detect_automatically_imports_promptfoo_and_names_what_phoenix_needs(app_engine, open_page) -> None:
    """review14 F9: the page's default answered "line 1: not valid UTF-8 text (byte 121)" for the
    Parquet file Phoenix's SpanEvaluations.save() writes, "cannot tell" for promptfoo's results."""
    sources = Path(__file__).resolve().parents[1] / "fixtures" / "sources"
    at = upload(
        open_page(PAGE, reviewer="ayse"),
        "evals.parquet",
        (sources / "phoenix_evaluations.parquet").read_bytes(),
    )
    assert (
        escape_markdown(
            'evals.parquet: Phoenix span evaluations, which need the spans file they judged: choose phoenix under "What '
            'the file holds" and give its spans file; nothing was imported'
        )
        in at.error[0].value
    )
    at = upload(at, "results.json", (sources / "promptfoo_results.json").read_bytes())
    assert [s.value for s in at.success] == [
        escape_markdown("promptfoo: 3 inserted, 0 already present (skipped), 6 judgments")
    ]
    assert count(app_engine, EvaluationSnapshot) == 3
    assert not at.exception
