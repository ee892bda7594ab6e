"""Precedents page (and the Import page for interactions) under AppTest: what a user sees, what a click writes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from streamlit.testing.v1 import AppTest

from lib import importer, precedent_view, precedents
from lib.db import session_scope
from lib.models import AutoEval, ExpertFeedback, Interaction
from lib.safe_markdown import escape_markdown

PAGE = "pages/precedents.py"
CITE = "https://help.acme.test/reset-password"
QUESTION = "How do I reset my password?"
S1 = "Open Settings and choose Reset password."
S2 = "We email you a link that works for one hour."
EXPERT = {
    "sentence_scores": [{"sentence": S1, "score": 80}, {"sentence": S2, "score": 60}],
    "citation_score": 20,
}
HOSTILE = "**Bold** <script>alert(1)</script> [x](javascript:alert(1))"


def _line(**fields: Any) -> dict[str, Any]:
    return {"product": "acme", "question": QUESTION, "answer": f"{S1} {S2}", "citation_url": CITE, **fields}


def _import(engine: Engine, tmp_path: Path, lines: list[dict[str, Any]], name: str = "i.jsonl") -> None:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    importer.import_path(engine=engine, path=path, kind="interactions", reviewer="tester")


def _corpus(engine: Engine, tmp_path: Path) -> None:
    _import(
        engine,
        tmp_path,
        [
            _line(id="prec", expert=EXPERT, created_at="2026-01-01T10:00:00Z"),
            _line(id="same", created_at="2026-01-02T10:00:00Z"),
            _line(id="cite", citation_url="https://help.acme.test/other", created_at="2026-01-03T10:00:00Z"),
            _line(id="other", question=HOSTILE, answer=f"{HOSTILE} Unrelated.", language="tr",
                  created_at="2026-01-04T10:00:00Z"),
        ],
    )  # fmt: skip


def _frame(at: AppTest, n: int) -> Any:
    """The n-th table on the page: 0 the list, 1 the QA neighbours, 2 the sentences."""
    return at.dataframe[n].value


def _texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [t.value for t in at.text]
    return "\n".join(str(p) for p in parts)


def test_without_interactions_the_page_says_how_to_get_some(app_engine: Engine, open_page: Any) -> None:
    at = open_page(PAGE)
    assert not at.exception
    assert "No interactions yet" in at.info[0].value


def test_list_chart_filters_and_csv(app_engine: Engine, open_page: Any, tmp_path: Path) -> None:
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE)
    assert not at.exception
    table = _frame(at, 0)
    assert list(table["id"]) == ["other", "cite", "same", "prec"]  # newest first
    assert dict(zip(table["id"], table["outcome"], strict=True)) == {
        "other": "no_qa_match",
        "cite": "no_citation_match",
        "same": "matched",
        "prec": "expert-reviewed",
    }
    assert at.get("plotly_chart")  # the no-match reasons chart
    assert at.get("download_button")
    at.selectbox(key="prec_outcome").set_value("matched").run()
    assert list(_frame(at, 0)["id"]) == ["same"]
    at.selectbox(key="prec_outcome").set_value("Any").run()
    at.selectbox(key="prec_language").set_value("tr").run()
    assert list(_frame(at, 0)["id"]) == ["other"]


def test_paging_is_server_side(app_engine: Engine, open_page: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("OVERRULE_PAGE_SIZE", "2")
    from lib.config import reset_settings

    reset_settings()
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE)
    assert list(_frame(at, 0)["id"]) == ["other", "cite"]
    at.number_input(key="prec_page").set_value(2).run()
    assert list(_frame(at, 0)["id"]) == ["same", "prec"]


def test_detail_shows_the_match_trace(app_engine: Engine, open_page: Any, tmp_path: Path) -> None:
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE, query={"interaction": "same"})
    assert not at.exception
    qa = _frame(at, 1)
    assert list(qa["interaction_id"]) == ["prec"] and qa["similarity"][0] >= 0.85
    sentences = _frame(at, 2)
    assert list(sentences["best expert sentence"]) == [S1, S2]
    assert list(sentences["copied score"]) == [80, 60]
    assert "**Citation** ✅ matches — expected: " + escape_markdown(CITE) in _texts(at)
    assert at.metric[0].value == str(precedents.total_score([80, 60], 20))


def test_detail_shows_the_fallback_verdict_and_explanation(
    app_engine: Engine, open_page: Any, tmp_path: Path
) -> None:
    _corpus(app_engine, tmp_path)
    with session_scope(app_engine) as session:
        row = session.execute(select(AutoEval).where(AutoEval.interaction_id == "cite")).scalar_one()
        row.sentence_match_trace = {
            **row.sentence_match_trace,
            "fallback": {"candidates": ["prec"], "llm_pass": False, "llm_reason": "Says **another** thing."},
        }
        session.add(row)
    at = open_page(PAGE, query={"interaction": "cite"})
    texts = _texts(at)
    assert "**Citation** ❌ differs" in texts
    assert "the LLM comparison did not pass" in texts
    assert escape_markdown("Says **another** thing.") in texts  # the LLM's words shown literally


def test_untrusted_text_is_escaped(app_engine: Engine, open_page: Any, tmp_path: Path) -> None:
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE, query={"interaction": "other"}, reviewer="ayse")
    assert not at.exception
    assert HOSTILE in [t.value for t in at.text]  # st.text: never interpreted
    assert f"{HOSTILE} Unrelated." in [t.value for t in at.text]  # the sentence above its score box
    assert all("<script>" not in str(m.value) for m in at.markdown)


def test_expert_review_click_writes_a_precedent_with_the_reviewer(
    app_engine: Engine, open_page: Any, tmp_path: Path
) -> None:
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE, query={"interaction": "same"}, reviewer="ayse")
    at.number_input(key="prec_score_0").set_value(40)
    at.number_input(key="prec_score_1").set_value(50)
    at.number_input(key="prec_citation_score").set_value(10)
    at.button(key="prec_review_save").click().run()
    assert not at.exception
    assert "this interaction is now a precedent" in at.success[0].value
    with session_scope(app_engine, read_only=True) as session:
        [review] = session.execute(
            select(ExpertFeedback).where(
                ExpertFeedback.interaction_id == "same", ExpertFeedback.type == "expert"
            )
        ).scalars()
        assert (review.reviewer, review.citation_score, review.citation_url) == ("ayse", 10, CITE)
        assert [s["score"] for s in review.sentence_scores] == [40, 50]
        assert review.total_score == precedents.total_score([40, 50], 10)
    # Copied 72.5 vs expert 43.75: the page shows how far the copy was off.
    assert "Distance between the copied and the expert total: 28.75 points." in at.info[0].value


def test_review_needs_a_reviewer(app_engine: Engine, open_page: Any, tmp_path: Path) -> None:
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE, query={"interaction": "same"})
    assert at.button(key="prec_review_save").disabled
    assert "Enter your name in the sidebar to add an expert review." in at.warning[0].value


def test_import_page_imports_and_auto_evaluates_interactions(app_engine: Engine, open_page: Any) -> None:
    data = "".join(json.dumps(line) + "\n" for line in [_line(id="prec", expert=EXPERT), _line(id="new")])
    at = open_page("pages/import_data.py", reviewer="ayse")
    at.file_uploader(key="import_file").set_value(("interactions.jsonl", data.encode(), "application/json"))
    at.selectbox(key="import_kind").set_value("interactions")
    at.run()
    at.button(key="import_run").click().run()
    assert not at.exception
    assert escape_markdown("interactions: 2 inserted") in at.success[0].value
    assert escape_markdown("auto-evaluated 1: 1 matched") in at.success[0].value
    with session_scope(app_engine, read_only=True) as session:
        [row] = session.execute(select(AutoEval)).scalars()
        assert (row.interaction_id, row.matched_interaction_id) == ("new", "prec")


def _blank_interaction(engine: Engine) -> None:
    """A turn logged without its text, newer than the corpus: the page's first row."""
    with session_scope(engine) as session:
        session.add(Interaction(id="blank", product="acme", question="", answer="", citation_url=CITE,
                                created_at=datetime(2026, 2, 1, tzinfo=UTC)))  # fmt: skip
        session.flush()
        precedents.evaluate_interaction(session, "blank")


def test_an_interaction_without_text_opens_as_an_empty_state_not_an_error(
    app_engine: Engine, open_page: Any, tmp_path: Path
) -> None:
    """Issue 25: the page opened on a blank question and answer under a red error."""
    _corpus(app_engine, tmp_path)
    _blank_interaction(app_engine)
    at = open_page(PAGE)
    assert at.selectbox(key="prec_pick").value == "blank"
    assert not at.error
    assert [c.value for c in at.caption if c.value.startswith("(no ")] == [
        "(no question text)",
        "(no answer text)",
    ]
    assert any(escape_markdown(precedent_view.NO_TEXT_MESSAGE) in i.value for i in at.info)
    assert not at.exception


def test_a_failed_evaluation_is_still_an_error(app_engine: Engine, open_page: Any, tmp_path: Path) -> None:
    _corpus(app_engine, tmp_path)
    with session_scope(app_engine) as session:
        row = session.execute(select(AutoEval).where(AutoEval.interaction_id == "other")).scalar_one()
        row.no_match_reason, row.has_matches = precedents.NO_EMBEDDINGS, False
        row.sentence_match_trace = {"error": "embedding failed: the server answered 503"}
    at = open_page(PAGE, query={"interaction": "other"})
    assert [e.value for e in at.error] == [
        escape_markdown("The evaluation failed: embedding failed: the server answered 503")
    ]
    assert not at.exception


def test_the_interaction_picker_reads_as_questions_and_outcomes(
    app_engine: Engine, open_page: Any, tmp_path: Path
) -> None:
    _corpus(app_engine, tmp_path)
    at = open_page(PAGE)
    picker = at.selectbox(key="prec_pick")
    assert picker.options[1:4] == [f"{QUESTION} · no_citation_match", f"{QUESTION} · matched",
                                   f"{QUESTION} · expert-reviewed"]  # fmt: skip
    assert not at.exception
