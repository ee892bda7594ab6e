"""The New evaluation page (/new) under AppTest, against the local OpenAI-compatible server."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from lib.db import session_scope
from lib.metrics import upsert_metric_definitions
from lib.models import EvaluationSnapshot, Judgment
from lib.safe_markdown import escape_markdown
from tests.llm_server import LLMServer, json_reply, server_error, text
from tests.test_judge import ANSWER, RUBRIC, STAGE2_PAYLOAD, stage1_payload

pytestmark = pytest.mark.timeout(120)

PAGE = "pages/new_evaluation.py"


@pytest.fixture
def acme(app_engine: Engine) -> Engine:
    """The app database with the test product's rubric, so the page offers it."""
    with session_scope(app_engine) as session:
        upsert_metric_definitions(session=session, definitions=RUBRIC)
    return app_engine


def fill(at: AppTest, *, question: str = "Tell me about Paris.", answer: str = ANSWER,
         scores: dict[str, Any] | None = None) -> AppTest:  # fmt: skip
    at.text_area(key="new_question").input(question)
    at.text_area(key="new_answer").input(answer)
    at.text_input(key="new_model_name").input("mistral-nemo")
    for slug, value in (scores if scores is not None else {"coherence": 2, "fluency": 4}).items():
        at.number_input(key=f"new_score_acme_{slug}").set_value(value)
    at.text_input(key="new_reason_acme_coherence").input("<b>too</b> [terse](javascript:alert(1))")
    return at


def submit(at: AppTest) -> AppTest:
    return at.button(key="new_submit").click().run()


def counts(engine: Engine) -> tuple[int, int]:
    with Session(engine) as session:
        return (
            session.exec(select(func.count()).select_from(EvaluationSnapshot)).one(),
            session.exec(select(func.count()).select_from(Judgment)).one(),
        )


def test_without_an_llm_the_page_says_why_and_the_button_is_disabled(acme: Engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    assert any("No LLM is configured" in w.value for w in at.warning)
    assert at.button(key="new_submit").disabled
    assert (at.button(key="new_submit").help or "").startswith(
        "The judge needs an LLM, and none is configured."
    )
    assert not at.exception


def test_the_form_offers_the_products_metrics_on_their_scales(acme: Engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    assert at.selectbox(key="new_product").value == "acme"
    coherence = at.number_input(key="new_score_acme_coherence")
    groundedness = at.number_input(key="new_score_acme_groundedness")
    assert (coherence.min, coherence.max, coherence.step) == (1, 3, 1)
    assert (groundedness.min, groundedness.max, groundedness.step) == (0.0, 1.0, 0.01)
    assert coherence.label == escape_markdown("Coherence (1–3)") and coherence.value is None
    assert at.selectbox(key="new_primary_acme").options == ["Coherence", "Groundedness", "Fluency"]
    assert not at.exception


def test_a_successful_run_saves_the_snapshot_and_links_to_it(
    acme: Engine, llm_server: LLMServer, open_page
) -> None:
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    at = submit(fill(open_page(PAGE, reviewer="ayse")))
    assert not at.exception
    assert llm_server.pending == 0
    with Session(acme) as session:
        snap = session.exec(select(EvaluationSnapshot)).one()
    assert snap.created_by == "ayse" and snap.model_name == "mistral-nemo"
    assert snap.user_scores_json == {
        "coherence": {"score": 2, "reason": "<b>too</b> [terse](javascript:alert(1))"},
        "fluency": {"score": 4, "reason": None},
    }
    assert counts(acme) == (1, 3)
    assert [s.value for s in at.success] == [f"Saved as evaluation {snap.id.replace('_', chr(92) + '_')}."]
    assert any(f"(/evaluations?snapshot={snap.id})" in m.value for m in at.markdown)
    assert at.status[0].label == "Judged and saved"


def test_a_failed_stage_shows_the_error_and_writes_nothing(
    acme: Engine, llm_server: LLMServer, open_page
) -> None:
    llm_server.script(json_reply(stage1_payload()), server_error(), server_error())
    at = submit(fill(open_page(PAGE, reviewer="ayse")))
    assert not at.exception
    assert len(at.error) == 1
    assert "Mentor feedback failed" in at.error[0].value
    assert "Nothing was saved\\." in at.error[0].value
    assert not at.success
    assert counts(acme) == (0, 0)


def test_untrusted_reply_text_in_an_error_is_escaped(acme: Engine, llm_server: LLMServer, open_page) -> None:
    # The same reply twice: the first and the repair turn.
    llm_server.script(*[text("[click](javascript:alert(1)) <img src=x onerror=alert(1)>")] * 2)
    at = submit(fill(open_page(PAGE, reviewer="ayse")))
    error = at.error[0].value
    assert escape_markdown("[click](javascript:alert(1))") in error and "\\<img" in error
    assert counts(acme) == (0, 0)
    assert not at.exception


def test_judging_the_same_answer_twice_links_to_the_first_evaluation(
    acme: Engine, llm_server: LLMServer, open_page
) -> None:
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    at = submit(fill(open_page(PAGE, reviewer="ayse")))
    with Session(acme) as session:
        first = session.exec(select(EvaluationSnapshot.id)).one()
    at = submit(fill(at))
    assert not at.exception
    assert any("already evaluation" in w.value for w in at.warning)
    assert any(f"(/evaluations?snapshot={first})" in m.value for m in at.markdown)
    assert len(llm_server.chat_requests) == 2 and counts(acme) == (1, 3)


@pytest.mark.parametrize(
    ("reviewer", "scores", "message"),
    [
        (None, {"coherence": 2}, "Enter your name in the sidebar to run the judge."),
        ("ayse", {}, "Give at least one score"),
    ],
)
def test_nothing_is_sent_without_a_reviewer_or_without_scores(
    acme: Engine, llm_server: LLMServer, open_page, reviewer: str | None, scores: dict, message: str
) -> None:
    at = submit(fill(open_page(PAGE, reviewer=reviewer), scores=scores))
    assert any(message in e.value for e in [*at.warning, *at.error])
    assert llm_server.chat_requests == [] and counts(acme) == (0, 0)
    assert not at.exception


def test_an_empty_question_is_refused_before_any_llm_call(
    acme: Engine, llm_server: LLMServer, open_page
) -> None:
    at = submit(fill(open_page(PAGE, reviewer="ayse"), question="   "))
    assert "the question is empty" in at.error[0].value
    assert llm_server.chat_requests == []
    assert not at.exception


def test_an_empty_database_asks_for_a_product(app_engine: Engine, open_page) -> None:
    at = open_page(PAGE, reviewer="ayse")
    assert any("Pick a product" in i.value for i in at.info)
    assert len(at.number_input) == 0
    assert not at.exception


def test_a_product_without_a_rubric_is_scored_on_the_default_set(app_engine: Engine, open_page) -> None:
    with session_scope(app_engine) as session:
        session.add(EvaluationSnapshot(id="snap_p", question="q", model_answer="a", product="plain"))
    at = open_page(PAGE, reviewer="ayse")
    assert at.selectbox(key="new_product").value == "plain"
    assert at.number_input(key="new_score_plain_truthfulness").label == escape_markdown("Truthfulness (1–5)")
    assert len(at.number_input) == 8
    assert not at.exception


def test_metric_names_and_rubrics_are_plain_text_in_labels_and_tooltips(
    app_engine: Engine, open_page
) -> None:
    """Issue 24.6: a display name `![t](http://evil.example/x.png) Img` became an image in the label."""
    name, rubric = "![t](http://evil.example/x.png) Img", "See [docs](http://evil.example/d)"
    with session_scope(app_engine) as session:
        upsert_metric_definitions(
            session=session,
            definitions=[
                {
                    "product": "acme",
                    "slug": "tone",
                    "display_name": name,
                    "min": 1,
                    "max": 5,
                    "description": rubric,
                }
            ],
        )
    at = open_page(PAGE, reviewer="ayse")
    score = at.number_input(key="new_score_acme_tone")
    assert score.label == escape_markdown(f"{name} (1–5)")
    assert score.help == escape_markdown(rubric)
    assert at.text_input(key="new_reason_acme_tone").label == escape_markdown(f"Why {name}?")
    assert not at.exception
