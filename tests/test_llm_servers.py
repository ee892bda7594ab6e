"""Issue 18: the failures seen with a small model on llama.cpp, each replayed by the scripted server.

Every case runs the product's own path (judge, evaluator, second opinion) through the real openai
client over HTTP against `tests/llm_server.py`, switched to behave as the real server did.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from lib import judge, llm, relevance
from lib.__main__ import main
from lib.config import Settings, get_settings, load_settings, reset_settings
from lib.db import session_scope
from lib.judge import JudgeFailed, judge_evaluation
from lib.models import (
    EvaluationSnapshot,
    Judgment,
    ProcessedRelevanceSession,
    SessionAudit,
    SessionNote,
    utcnow,
)
from lib.second_opinion import request_second_opinion
from tests.llm_server import LLMServer, http_error, json_reply, server_error, text
from tests.test_judge import SPECS, STAGE2_PAYLOAD, counts, evaluation, rubric, stage1_payload  # noqa: F401
from tests.test_relevance import audited, scores_and_mark
from tests.test_second_opinion import judged, judgment_id  # noqa: F401

pytestmark = pytest.mark.timeout(60)

GOOD = stage1_payload()


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reset_settings()
    llm.close_clients()
    return get_settings()


@pytest.fixture(autouse=True)
def _forget_negotiations() -> Any:
    """Each test meets its server fresh: negotiated modes are per process, keyed by URL and model."""
    llm.close_clients()
    yield
    llm.close_clients()


def stage1_requests(server: LLMServer) -> list[dict[str, Any]]:
    return [r for r in server.chat_requests if "Stage 1" in r["messages"][0]["content"]]


def last_user_message(body: dict[str, Any]) -> str:
    return str(body["messages"][-1]["content"])


# -- weak-but-well-shaped output gets one repair turn, then a clean failure -------------------------


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_a_reason_copied_from_the_notes_gets_a_repair_turn_and_the_repaired_reply_is_saved(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
) -> None:
    copied = json.loads(json.dumps(GOOD))
    copied["independent_scores"]["coherence"]["rationale"] = (
        "🔁 PATTERN (2d ago): Check every number against a source. [SESSION: 1a2b3c4d]"
    )
    llm_server.script(json_reply(copied), json_reply(GOOD), json_reply(STAGE2_PAYLOAD))
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    _first, repair = stage1_requests(llm_server)
    assert "copies a cross-session note line" in last_user_message(repair)
    assert repair["messages"][-2] == {"role": "assistant", "content": json.dumps(copied)}
    with Session(rubric) as session:
        snap = session.get(EvaluationSnapshot, snapshot_id)
        assert snap is not None and snap.judge_scores_json["coherence"]["reason"] == "Clear line of thought."


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_an_echoed_template_is_refused_after_its_repair_turn_and_nothing_is_saved(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
) -> None:
    echo = {
        "independent_scores": {
            slug: {"score": 3 if slug != "groundedness" else 0.5, "confidence": 0.5, "rationale": "<text>"}
            for slug in ("coherence", "groundedness", "fluency")
        },
        "evidence": {
            "coherence": [{"quote": "<verbatim>", "start": 0, "end": 5, "why": "<text>", "better": "<text>"}]
        },
    }
    llm_server.script(json_reply(echo), json_reply(echo))
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert (failure.value.stage, failure.value.kind) == ("stage1", "invalid_reply")
    assert "placeholder '<text>'" in str(failure.value) and "after a repair turn" in str(failure.value)
    assert "quotes the placeholder '<verbatim>'" in last_user_message(stage1_requests(llm_server)[1])
    assert counts(rubric) == (0, 0) and llm_server.pending == 0


@pytest.mark.parametrize("reason", ["Good.", "...", "<text>", "ok fine"])
def test_weak_reasons_are_named_for_the_repair(reason: str) -> None:
    payload = json.loads(json.dumps(GOOD))
    payload["independent_scores"]["fluency"]["rationale"] = reason
    with pytest.raises(ValueError, match="rationale for 'fluency'"):
        judge.check_stage1_reply(payload, SPECS)
    judge.check_stage1_reply(GOOD, SPECS)  # the good reply passes the same check


# -- token caps and cut-off replies ------------------------------------------------------------------


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_a_runaway_reply_stops_at_the_cap_and_is_reported_as_cut_off(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(monkeypatch, OVERRULE_MAX_TOKENS_JUDGE="64")
    llm_server.responder = lambda body: text("The answer is good. " * 2000)  # runs to the context limit
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert failure.value.kind == "truncated"
    assert "cut off at the token limit of 64 tokens" in str(failure.value)
    assert "OVERRULE_MAX_TOKENS_JUDGE" in str(failure.value)
    [request] = stage1_requests(llm_server)  # a cut-off reply is not repaired: it would stop again
    assert request["max_tokens"] == 64
    assert counts(rubric) == (0, 0)


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_a_cut_off_reply_with_a_complete_inner_object_is_cut_off_not_shapeless(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
) -> None:
    cut = '{"independent_scores": {"coherence": {"score": 3, "confidence": 0.8, "rationale": "Clear"}, "flu'
    llm_server.script(text(cut, finish_reason="length"))
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert "cut off at the token limit" in str(failure.value)
    assert "independent_scores" not in str(failure.value)


@pytest.mark.parametrize(
    ("name", "purpose"),
    [("OVERRULE_MAX_TOKENS_EVALUATOR", "evaluator"), ("OVERRULE_MAX_TOKENS_COACH", "coach")],
)
def test_caps_are_settings(monkeypatch: pytest.MonkeyPatch, name: str, purpose: str) -> None:
    settings = configure(monkeypatch, **{name: "321"})
    assert llm.max_tokens_for(purpose, settings) == 321
    assert llm.max_tokens_for(None, settings) is None


# -- structured output negotiation -------------------------------------------------------------------


def test_http_500_on_json_schema_falls_back_to_json_object_with_schema_and_is_remembered(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, OVERRULE_LLM_MAX_RETRIES="0")
    llm_server.json_schema_status = 500  # llama.cpp: "response_format type must be one of ..."
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    llm_server.script(json_reply({"ok": True}), json_reply({"ok": False}))
    user = [{"role": "user", "content": "Is it fine? Answer in JSON."}]
    assert llm.chat_json(user, model="m", schema=schema) == {"ok": True}
    assert llm.chat_json(user, model="m", schema=schema) == {"ok": False}
    formats = [r["response_format"] for r in llm_server.chat_requests]
    assert [f["type"] for f in formats] == ["json_schema", "json_object", "json_object"]
    assert formats[1]["schema"] == schema == formats[2]["schema"]
    assert llm.json_mode_of("m") == "json_object_schema"


def test_a_500_that_does_not_name_response_format_is_a_server_failure(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, OVERRULE_LLM_MAX_RETRIES="0")
    llm_server.script(server_error())
    with pytest.raises(llm.LLMError) as failure:
        llm.chat_json([{"role": "user", "content": "json?"}], model="m", schema={"type": "object"})
    assert failure.value.kind == "server" and len(llm_server.chat_requests) == 1


def test_a_reply_breaking_the_schema_gets_the_schema_error_in_its_repair_turn(llm_server: LLMServer) -> None:
    schema = {"type": "object", "properties": {"pass": {"type": "boolean"}}, "required": ["pass"]}
    llm_server.script(json_reply({"pass": "yes"}), json_reply({"pass": True}))
    assert llm.chat_json([{"role": "user", "content": "json?"}], model="m", schema=schema) == {"pass": True}
    assert "pass: 'yes' is not of type 'boolean'" in last_user_message(llm_server.chat_requests[1])


# -- tools only for servers that call them --------------------------------------------------------------


def test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
) -> None:
    llm_server.ignore_tools = True
    reply = stage1_payload(note_commands=["ADD_NOTE:PATTERN,Population figures need a cited source."])
    llm_server.script(json_reply(reply), json_reply(STAGE2_PAYLOAD))
    snapshot_id = judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    [request] = stage1_requests(llm_server)
    assert "tools" not in request and len(llm_server.probes) == 1
    assert "ADD_NOTE:<TYPE>" in request["messages"][0]["content"]
    assert "note_commands" in request["response_format"]["json_schema"]["schema"]["properties"]
    with Session(rubric) as session:
        [note] = session.exec(select(SessionNote)).all()
    assert (note.note_type, note.session_id) == ("PATTERN", snapshot_id)
    # The probe is sent once per server and model, not once per run.
    llm_server.script(json_reply(stage1_payload()), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(question="Another question?"), reviewer="ayse")
    assert len(llm_server.probes) == 1


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_a_server_that_calls_tools_is_offered_them(rubric: Engine, llm_server: LLMServer) -> None:  # noqa: F811
    llm_server.script(json_reply(GOOD), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    [request] = stage1_requests(llm_server)
    assert [t["function"]["name"] for t in request["tools"]] == ["add_note", "search_notes", "clear_notes"]
    assert llm_server.probes[0]["tool_choice"]["function"]["name"] == "overrule_probe"


# -- second opinion: an echoed format line is no answer ------------------------------------------------------


def test_an_echoed_valid_yes_or_no_does_not_raise_the_confidence(
    judged: Engine,  # noqa: F811
    llm_server: LLMServer,
) -> None:
    llm_server.script(
        text(
            "VALID: YES or NO (is the judge's decision correct?)\nCONFIDENCE_APPROPRIATE: YES or NO\n"
            "IMPROVED_CODE: NONE\nEVALUATION: The decision matches the rubric for this claim."
        )
    )
    opinion = request_second_opinion(engine=judged, judgment_id=judgment_id(judged), reviewer="lead")
    assert opinion.ok, opinion.error
    assert opinion.valid is None and opinion.action == "unchanged"
    assert opinion.confidence == pytest.approx(0.8)  # not 0.8 + 0.10
    assert llm_server.chat_requests[0]["max_tokens"] == get_settings().max_tokens_second_opinion


# -- the relevance evaluator --------------------------------------------------------------------------


def test_a_malformed_evaluator_reply_spends_no_retry_and_a_lead_can_reset_retries(
    engine: Engine, llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    configure(monkeypatch, OVERRULE_LLM_MAX_RETRIES="0")
    [note_id] = audited(engine, "A note")
    llm_server.script(text("The note helped."), text("Still no JSON."))
    relevance.evaluate_pending(engine)
    assert scores_and_mark(engine) == ({}, ("malformed", 0))
    request = llm_server.chat_requests[0]
    assert request["response_format"]["json_schema"]["schema"] == relevance.evaluator_schema([note_id])
    for _ in range(relevance.MAX_EVALUATION_RETRIES):
        llm_server.script(server_error())
        relevance.evaluate_pending(engine)
    assert scores_and_mark(engine)[1] == ("failed", relevance.MAX_EVALUATION_RETRIES)
    with Session(engine) as session:
        assert relevance.unprocessed_audits(session=session) == []  # left alone after three server failures
    monkeypatch.setenv("OVERRULE_DATABASE_URL", str(engine.url.render_as_string(hide_password=False)))
    reset_settings()
    assert main(["evaluate", "--reset-retries", "run-1"]) == 0
    assert "retries reset" in capsys.readouterr().out
    assert scores_and_mark(engine)[1] == ("pending", 0)
    with session_scope(engine) as session, pytest.raises(ValueError, match="no audit"):
        relevance.reset_retries(session=session, audit_session_id="nope")


def test_failed_audits_go_to_the_back_of_the_queue(engine: Engine) -> None:
    audited(engine, "A note")
    with session_scope(engine) as session:
        relevance.mark_failed(session=session, audit_session_id="run-1", spends_retry=False)
        session.add(
            SessionAudit(
                session_id="run-2",
                timestamp=utcnow() + timedelta(hours=1),
                shown_lesson_ids=[],
                env_tags=["lang:en"],
                repo="acme",
            )
        )
    with Session(engine) as session:
        assert [a.session_id for a in relevance.unprocessed_audits(session=session)] == ["run-2", "run-1"]
    with Session(engine) as session:
        mark = session.get(ProcessedRelevanceSession, "run-1")
        assert mark is not None and mark.retry_count == 0


# -- prompt budget and context errors -------------------------------------------------------------------


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_the_prompt_is_shrunk_to_the_context_window_and_says_what_was_left_out(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(monkeypatch, OVERRULE_CONTEXT_TOKENS="3000", OVERRULE_MAX_TOKENS_JUDGE="1024")
    with session_scope(rubric) as session:
        for n in range(20):
            session.add(
                Judgment(
                    change_id=f"old{n}:coherence",
                    product="acme",
                    metric="coherence",
                    decision="3",
                    reasoning=f"HISTORY-{n:02d} " + "a long reason " * 40,
                    timestamp=utcnow() - timedelta(hours=n + 1),
                )
            )
    said: list[str] = []
    llm_server.script(json_reply(GOOD), json_reply(STAGE2_PAYLOAD))
    judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse", progress=said.append)
    [request] = stage1_requests(llm_server)
    prompt = request["messages"][1]["content"]
    assert "HISTORY-00" in prompt and "HISTORY-19" not in prompt  # the oldest went first
    kept = sum(f"HISTORY-{n:02d}" in prompt for n in range(20))
    assert f"left out {20 - kept} of 20 history entries (the oldest)" in " ".join(said)
    assert "OVERRULE_CONTEXT_TOKENS=3000" in " ".join(said)
    assert llm.estimate_messages_tokens(request["messages"]) <= 3000 - 1024


def test_an_answer_too_long_for_the_window_fails_before_any_call(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    configure(monkeypatch, OVERRULE_CONTEXT_TOKENS="2048", OVERRULE_MAX_TOKENS_JUDGE="1024")
    long_answer = "Paris is the capital of France. " * 400
    with pytest.raises(JudgeFailed, match="OVERRULE_CONTEXT_TOKENS=2048"):
        judge_evaluation(engine=rubric, evaluation=evaluation(model_answer=long_answer), reviewer="ayse")
    assert llm_server.chat_requests == []


@pytest.mark.pg_repeats(
    "statements and lines of test_a_server_that_ignores_tools_gets_note_commands_in_the_schema_and_the_note_is_saved"
)
def test_a_servers_context_error_names_the_setting_to_change(
    rubric: Engine,  # noqa: F811
    llm_server: LLMServer,
) -> None:
    llm_server.context_words = 50  # llama.cpp started with a tiny -c
    with pytest.raises(JudgeFailed) as failure:
        judge_evaluation(engine=rubric, evaluation=evaluation(), reviewer="ayse")
    assert failure.value.kind == "context"
    assert "OVERRULE_CONTEXT_TOKENS" in str(failure.value) and "-c 8192" in str(failure.value)


def test_an_unrelated_400_is_not_called_a_context_error(llm_server: LLMServer) -> None:
    llm_server.script(http_error(400, "temperature must be at most 2", headers=()))
    with pytest.raises(llm.LLMError) as failure:
        llm.chat([{"role": "user", "content": "hi"}], model="m")
    assert failure.value.kind == "request"


# -- the local profile ------------------------------------------------------------------------------


def test_the_local_profile_waits_long_never_retries_and_streams(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = configure(monkeypatch, OVERRULE_LLM_PROFILE="local", OVERRULE_LLM_TIMEOUT="30")
    assert (settings.llm_timeout, settings.llm_max_retries) == (600.0, 0)
    assert (
        load_settings({"OVERRULE_LLM_PROFILE": "local", "OVERRULE_LLM_TIMEOUT": "900"}).llm_timeout == 900.0
    )
    llm_server.script(json_reply({"ok": True}))
    assert llm.chat_json([{"role": "user", "content": "json?"}], model="m", purpose="compare") == {"ok": True}
    [request] = llm_server.chat_requests
    assert request["stream"] is True and request["max_tokens"] == settings.max_tokens_compare


def test_a_streamed_reply_cut_at_the_cap_is_reported_as_cut_off(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, OVERRULE_LLM_PROFILE="local", OVERRULE_MAX_TOKENS_COMPARE="16")
    llm_server.script(text('{"pass": true, "reason": "' + "very " * 50 + '"}'))
    with pytest.raises(llm.LLMError, match="cut off at the token limit of 16 tokens"):
        llm.chat_json([{"role": "user", "content": "json?"}], model="m", purpose="compare")


def test_an_unknown_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="OVERRULE_LLM_PROFILE"):
        load_settings({"OVERRULE_LLM_PROFILE": "turbo"})
