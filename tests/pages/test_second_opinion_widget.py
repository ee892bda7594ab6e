"""The second-opinion button in the evaluation detail's metric cards, under AppTest."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from lib.config import reset_settings
from lib.db import session_scope
from lib.models import EvaluationSnapshot, Judgment, JudgmentEvent, utcnow
from lib.safe_markdown import escape_markdown
from tests.llm_server import LLMServer, server_error, text

pytestmark = pytest.mark.timeout(120)

PAGE = "pages/evaluations.py"
ANSWER = "The answer explains the capital, the population and the history of the city in some detail. " * 2


@pytest.fixture
def judged(app_engine: Engine) -> int:
    """An evaluation with one judged metric; returns the judgment's id."""
    with session_scope(app_engine) as session:
        session.add(EvaluationSnapshot(
            id="snap_w", question="Tell me about Paris.", model_answer=ANSWER, product="acme",
            judge_scores_json={"clarity": {"score": 4, "reason": "clear"}},
            user_scores_json={"clarity": {"score": 2, "reason": "wordy"}},
        ))  # fmt: skip
        session.flush()
        judgment = Judgment(change_id="snap_w:clarity", product="acme", metric="clarity", snapshot_id="snap_w",
                            decision="4", confidence=0.8, reasoning="clear")  # fmt: skip
        session.add(judgment)
        session.flush()
        assert judgment.id is not None
        return judgment.id


def button_key(judgment_id: int) -> str:
    return f"second_opinion_{judgment_id}"


def stored(engine: Engine) -> Judgment:
    with Session(engine) as session:
        return session.exec(select(Judgment)).one()


def test_without_an_llm_there_is_no_button_and_one_caption_says_why(judged: int, open_page) -> None:
    at = open_page(PAGE, query={"snapshot": "snap_w"}, reviewer="ayse")
    assert button_key(judged) not in [b.key for b in at.button]
    assert [c.value for c in at.caption if c.value.startswith("🧐")] == [
        "🧐 " + escape_markdown("No second-opinion buttons: no LLM is configured.")
    ]
    assert any(
        "second opinions need an LLM" in c.value and "OPENAI\\_BASE\\_URL" in c.value for c in at.caption
    )
    assert not at.exception


def test_asking_shows_the_verdict_and_stores_it(judged: int, app_engine: Engine, llm_server: LLMServer,
                                                open_page) -> None:  # fmt: skip
    llm_server.script(text("VALID: NO\nEVALUATION: The answer repeats itself; 4 is generous."))
    at = open_page(PAGE, query={"snapshot": "snap_w"}, reviewer="ayse")
    at = at.button(key=button_key(judged)).click().run()
    assert not at.exception
    shown = [m.value for m in at.markdown]
    summary = escape_markdown("questioned, decision 4, confidence 56%, by gpt-4o")
    assert f"⚠️ **Second opinion:** {summary}" in shown
    assert escape_markdown("The answer repeats itself; 4 is generous.") in shown
    row = stored(app_engine)
    assert (row.second_opinion_action, row.second_opinion_decision) == ("questioned", "4")
    with Session(app_engine) as session:
        assert session.exec(select(JudgmentEvent.reviewer)).all() == ["ayse"]


def test_a_failing_evaluation_model_is_shown_and_changes_nothing(
    judged: int, app_engine: Engine, llm_server: LLMServer, open_page
) -> None:
    llm_server.script(server_error(), server_error())
    at = open_page(PAGE, query={"snapshot": "snap_w"}, reviewer="ayse")
    at = at.button(key=button_key(judged)).click().run()
    assert not at.exception
    assert any(
        escape_markdown("The evaluation model failed; the judgment is unchanged.") in e.value
        for e in at.error
    )
    assert stored(app_engine).second_opinion_at is None


def test_asking_without_a_name_asks_for_it_first(judged: int, llm_server: LLMServer, open_page) -> None:
    at = open_page(PAGE, query={"snapshot": "snap_w"})
    at = at.button(key=button_key(judged)).click().run()
    assert any("Enter your name in the sidebar to ask for a second opinion" in w.value for w in at.warning)
    assert llm_server.chat_requests == []
    assert not at.exception


def test_a_stored_opinion_is_shown_escaped(
    judged: int, app_engine: Engine, open_page, monkeypatch: pytest.MonkeyPatch
) -> None:
    with session_scope(app_engine) as session:
        row = session.get(Judgment, judged)
        assert row is not None
        row.second_opinion_action, row.second_opinion_decision = "improved", "2"
        row.second_opinion_confidence, row.second_opinion_model = 0.9, "eval-x"
        row.second_opinion_text = "[x](javascript:alert(1)) <script>alert(1)</script>"
        row.second_opinion_at = utcnow()
    at: AppTest = open_page(PAGE, query={"snapshot": "snap_w"}, reviewer="ayse")
    shown = [m.value for m in at.markdown]
    assert f"🔁 **Second opinion:** {escape_markdown('improved, → 2, confidence 90%, by eval-x')}" in shown
    assert escape_markdown("[x](javascript:alert(1)) <script>alert(1)</script>") in shown
    assert not any("<script>" in v or "](javascript" in v for v in shown)  # shown without an LLM too
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # configured; never called here
    reset_settings()
    at = open_page(PAGE, query={"snapshot": "snap_w"}, reviewer="ayse")
    assert at.button(key=button_key(judged)).label == "Ask for a new second opinion"
    assert not at.exception
