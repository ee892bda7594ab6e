"""Coach page under AppTest, in each state, against the local OpenAI-compatible server."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from lib import coach
from lib.config import reset_settings
from lib.db import session_scope
from lib.llm import LLMError
from lib.models import ChatMessage, EvaluationSnapshot
from lib.safe_markdown import escape_markdown
from tests import llm_server as fake

PAGE = "pages/coach.py"


def _snapshot(engine, *, turns_used: int = 0, max_turns: int = 15, language: str = "en") -> str:
    with session_scope(engine) as s:
        s.add(
            EvaluationSnapshot(
                id="snap_page",
                question="What is 2+2?",
                model_answer="It is <b>5</b>.",
                product="acme",
                language=language,
                chat_turn_count=turns_used,
                max_chat_turns=max_turns,
                user_scores_json={"truthfulness": {"score": 1}, "clarity": {"score": 4}},
                judge_scores_json={"truthfulness": {"score": 3}, "clarity": {"score": 4}},
                evidence_json={
                    "truthfulness": {
                        "evidence": [
                            {
                                "quote": "It is <b>5</b>.",
                                "why": "wrong sum",
                                "better": "It is 4.",
                                "verified": True,
                            }
                        ]
                    }
                },
            )
        )
    return "snap_page"


def _start(engine, server, metrics=("truthfulness",), text="Hello <script>alert(1)</script>") -> None:
    server.script(fake.stream([text]))
    "".join(coach.start_chat(engine, "snap_page", list(metrics)).stream())


def _use_turns(engine, used: int) -> None:
    """The evaluation's turn counter as if `used` messages were sent (its chats were started before)."""
    with session_scope(engine) as s:
        snap = s.get(EvaluationSnapshot, "snap_page")
        snap.chat_turn_count = used
        s.add(snap)


def test_without_snapshot_the_page_offers_recent_evaluations(app_engine, open_page) -> None:
    _snapshot(app_engine)
    at = open_page(PAGE)
    assert not at.exception
    assert any("Open a chat from an evaluation" in i.value for i in at.info)
    assert at.selectbox(key="coach_pick").options == ["What is 2+2?"]  # titled by the question, not the id


def test_unknown_snapshot_is_reported(app_engine, open_page) -> None:
    at = open_page(PAGE, query={"snapshot": "snap_nope"})
    assert not at.exception
    assert "does not exist" in at.error[0].value


def test_without_llm_no_chat_can_be_started_and_the_page_says_which_variable_to_set(
    app_engine, open_page
) -> None:
    _snapshot(app_engine)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    assert any(
        w.value.startswith("The coach needs an LLM") and "OPENAI\\_API\\_KEY" in w.value for w in at.warning
    )
    assert "coach_start" not in [b.key for b in at.button]
    assert "coach_metrics" not in [m.key for m in at.multiselect]
    assert at.subheader[0].value == escape_markdown("What is 2+2?")  # titled by the question


def test_without_llm_earlier_chats_stay_readable_but_no_new_one_is_offered(
    app_engine, open_page, llm_server, monkeypatch
) -> None:
    _snapshot(app_engine)
    _start(app_engine, llm_server, text="Let us look at truthfulness.")
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    reset_settings()
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    assert not any("New chat" in o for o in at.radio[0].options)
    assert any("Let us look at truthfulness." in m.value for m in at.markdown)
    assert at.chat_input(key="coach_input").disabled


def test_starting_a_chat_streams_the_greeting_and_stores_it(app_engine, open_page, llm_server) -> None:
    _snapshot(app_engine)
    llm_server.script(fake.stream(["Let us look ", "at truthfulness."]))
    at = open_page(PAGE, query={"snapshot": "snap_page"}, reviewer="ayse")
    at.multiselect(key="coach_metrics").set_value(["truthfulness"]).run()
    at.button(key="coach_start").click().run()
    assert not at.exception
    with Session(app_engine) as s:
        rows = s.exec(select(ChatMessage)).all()
    assert [(r.client_message_id, r.content, r.is_complete, r.reviewer) for r in rows] == [
        ("init_snap_page", "Let us look at truthfulness.", True, "ayse")
    ]
    assert any("Let us look at truthfulness." in m.value for m in at.markdown)


def test_sending_a_message_shows_and_stores_the_reply(app_engine, open_page, llm_server) -> None:
    _snapshot(app_engine)
    _start(app_engine, llm_server)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    llm_server.script(fake.stream(["Because 2+2 ", "is 4."]))
    at.chat_input(key="coach_input").set_value("Why 3?").run()
    assert not at.exception
    assert any("Because 2+2 is 4." in m.value for m in at.markdown)
    with Session(app_engine) as s:
        assert s.get(EvaluationSnapshot, "snap_page").chat_turn_count == 1
        roles = [
            r.role
            for r in s.exec(select(ChatMessage).where(ChatMessage.client_message_id != "init_snap_page"))
        ]
    assert sorted(roles) == ["assistant", "user"]


def test_chat_content_is_escaped(app_engine, open_page, llm_server) -> None:
    _snapshot(app_engine)
    _start(app_engine, llm_server, text="[click](javascript:alert(1)) <img src=x onerror=alert(1)>")
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    shown = " ".join(m.value for m in at.markdown)
    assert "](javascript:" not in shown
    assert "<img" not in shown


def test_limit_reached_makes_the_chat_read_only_with_guidance(app_engine, open_page, llm_server) -> None:
    _snapshot(app_engine)
    _start(app_engine, llm_server)
    _use_turns(app_engine, 15)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    assert any("talked enough" in i.value for i in at.info)
    assert at.chat_input(key="coach_input").disabled
    assert at.button(key="coach_new_eval").label == "Start a new evaluation"


def test_at_the_limit_no_new_chat_is_offered_and_nothing_calls_the_llm(
    app_engine, open_page, llm_server
) -> None:
    """Issue 25: "New chat" plus a metric used to enable "Start chat" again, and each greeting called the LLM."""
    _snapshot(app_engine)
    _start(app_engine, llm_server, text="Let us look at truthfulness.")
    _use_turns(app_engine, 15)
    calls = len(llm_server.chat_requests)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    assert not any("New chat" in o for o in at.radio[0].options)
    assert "coach_start" not in [b.key for b in at.button]
    assert any("talked enough" in i.value for i in at.info)
    assert any("Let us look at truthfulness." in m.value for m in at.markdown)  # still readable
    assert len(llm_server.chat_requests) == calls


def test_at_the_limit_without_a_chat_the_page_only_shows_the_guidance(
    app_engine, open_page, llm_server
) -> None:
    _snapshot(app_engine, turns_used=15)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    assert any("talked enough" in i.value for i in at.info)
    assert at.button(key="coach_new_eval").label == "Start a new evaluation"
    assert "coach_start" not in [b.key for b in at.button] and not at.radio
    assert llm_server.chat_requests == []


def test_a_turkish_evaluation_gets_its_guidance_button_in_turkish(app_engine, open_page, llm_server) -> None:
    _snapshot(app_engine, language="tr")
    _start(app_engine, llm_server)
    _use_turns(app_engine, 15)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    assert any("yeterince konuştuk" in i.value for i in at.info)
    assert at.button(key="coach_new_eval").label == "Yeni bir değerlendirme başlat"


def test_the_message_using_the_last_turn_makes_the_chat_read_only_at_once(
    app_engine, open_page, llm_server
) -> None:
    _snapshot(app_engine, turns_used=14)
    _start(app_engine, llm_server)
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.chat_input(key="coach_input").disabled
    llm_server.script(fake.stream(["The last answer."]))
    at.chat_input(key="coach_input").set_value("Last question").run()
    assert not at.exception
    assert at.chat_input(key="coach_input").disabled
    assert any("talked enough" in i.value for i in at.info)
    with Session(app_engine) as s:
        assert s.get(EvaluationSnapshot, "snap_page").status == "completed"


def test_interrupted_reply_is_regenerated_on_the_next_visit(app_engine, open_page, llm_server) -> None:
    _snapshot(app_engine)
    _start(app_engine, llm_server)
    llm_server.script(fake.stream(["half"], abort_after=1))
    with pytest.raises(LLMError):  # the interruption is the point
        "".join(coach.send_message(app_engine, "snap_page", "question", "turn-1").stream())
    llm_server.script(fake.stream(["the whole answer"]))
    at = open_page(PAGE, query={"snapshot": "snap_page"})
    assert not at.exception
    with Session(app_engine) as s:
        replies = s.exec(
            select(ChatMessage).where(
                ChatMessage.client_message_id == "turn-1", ChatMessage.role == "assistant"
            )
        ).all()
    assert [(r.content, r.is_complete) for r in replies] == [("the whole answer", True)]


def test_hostile_snapshot_parameter_is_shown_as_text(app_engine, open_page) -> None:
    at = open_page(PAGE, query={"snapshot": "[click](https://evil.example) ![x](https://evil.example/p.png)"})
    assert not at.exception
    message = at.error[0].value
    assert "does not exist" in message
    assert "](https://evil" not in message
