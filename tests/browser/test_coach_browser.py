"""Coach chat in a real browser: start a chat, send two messages, see both streamed replies."""

from __future__ import annotations

import pytest

from lib.db import init_db, session_scope
from lib.models import EvaluationSnapshot
from tests import llm_server as fake

pytestmark = pytest.mark.browser


def _reply(body: dict) -> fake.StreamReply:
    last = body["messages"][-1]["content"]
    if last.startswith("Open the conversation"):
        return fake.stream(["Welcome! ", "Truthfulness differs by 2."], delay=0.05)
    return fake.stream(["You asked: ", last, ". ", "Evidence says otherwise."], delay=0.05)


def test_two_messages_get_two_streamed_replies(streamlit_app, page, tmp_path, llm_server) -> None:
    url = f"sqlite:///{tmp_path / 'coach.db'}"
    engine = init_db(url)
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_browser",
                question="What is 2+2?",
                model_answer="It is 5.",
                product="acme",
                language="en",
                user_scores_json={"truthfulness": {"score": 1}},
                judge_scores_json={"truthfulness": {"score": 3}},
            )
        )
    engine.dispose()
    llm_server.responder = _reply
    server = streamlit_app(url, OPENAI_BASE_URL=llm_server.base_url, OPENAI_API_KEY="test")

    page.goto(f"{server.base_url}/coach?snapshot=snap_browser")
    try:
        _chat(page)
    except Exception:
        page.screenshot(path="/tmp/coach_fail.png", full_page=True)
        print("log:", server.log_path.read_text()[-2000:])
        raise


def _chat(page) -> None:
    page.get_by_text("Start a chat").wait_for(timeout=30_000)
    page.get_by_test_id("stMultiSelect").click()
    page.get_by_role("option", name="Truthfulness").click()
    page.keyboard.press("Escape")
    page.get_by_role("button", name="Start chat").click()
    page.get_by_text("Truthfulness differs by 2.").wait_for(timeout=30_000)

    for question in ("Why a 3?", "And how to fix it?"):
        box = page.get_by_test_id("stChatInputTextArea")
        box.wait_for(timeout=30_000)
        box.fill(question)
        box.press("Enter")
        page.get_by_text(f"You asked: {question}. Evidence says otherwise.").wait_for(timeout=30_000)

    assert page.get_by_text("Evidence says otherwise.").count() == 2
    page.get_by_text("2 of 15 messages used").wait_for(timeout=15_000)
    assert page.dialogs == []
