"""lib.llm against a real local OpenAI-compatible server, through the real openai client."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib import llm
from lib.config import Settings, reset_settings
from lib.llm import ChatResult, LLMError, LLMNotConfigured, ToolCall, parse_json_loose
from tests.llm_server import (
    LLMServer,
    http_error,
    json_reply,
    malformed,
    rate_limited,
    running_llm_server,
    server_error,
    stall,
    start_llm_server,
    stream,
    text,
    tool_call,
)

pytestmark = pytest.mark.timeout(30)

MODEL = "test-model"
USER = [{"role": "user", "content": "Is the answer correct?"}]


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMServer]:
    """A scripted server that the settings point at, with retries. The timeout is long: a reply that
    a loaded machine delays past it is retried, and a test counting requests would fail by chance;
    the tests of timeouts set a short one with a reply that never comes."""
    server = start_llm_server()
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    monkeypatch.setenv("OVERRULE_LLM_TIMEOUT", "30")
    monkeypatch.setenv("OVERRULE_LLM_MAX_RETRIES", "2")
    monkeypatch.delenv("OVERRULE_EMBEDDING_MODEL", raising=False)
    reset_settings()
    yield server
    server.stop()
    llm.close_clients()
    reset_settings()


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Change settings for one test through the environment, as a deployment would."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reset_settings()


# -- chat ------------------------------------------------------------------------------------------


def test_chat_returns_text_usage_and_finish_reason(llm_server: LLMServer) -> None:
    llm_server.script(text("The answer is correct."))
    result = llm.chat(USER, model=MODEL)
    assert result == ChatResult(
        text="The answer is correct.", prompt_tokens=4, completion_tokens=4, finish_reason="stop"
    )
    assert result.total_tokens == 8


def test_chat_sends_exactly_the_given_messages_model_and_temperature(llm_server: LLMServer) -> None:
    messages = [
        {"role": "system", "content": "You are a judge. <b>not html</b>"},
        {"role": "user", "content": 'Türkçe cevap: "quoted" {braces}'},
        {"role": "assistant", "content": "earlier turn"},
        {"role": "user", "content": "follow-up"},
    ]
    llm.chat(messages, model="judge-x", temperature=0.7)
    (body,) = llm_server.requests
    assert body["messages"] == messages
    assert body["model"] == "judge-x"
    assert body["temperature"] == 0.7
    assert "response_format" not in body


def test_chat_parses_tool_calls_and_sends_tools(llm_server: LLMServer) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "record_verdict",
                "parameters": {"type": "object", "properties": {"verdict": {"type": "string"}}},
            },
        }
    ]
    llm_server.script(tool_call("record_verdict", {"verdict": "correct", "quotes": ["a {b}"]}))
    result = llm.chat(USER, model=MODEL, tools=tools)
    assert result.tool_calls == (
        ToolCall(id="call_0", name="record_verdict", arguments={"verdict": "correct", "quotes": ["a {b}"]}),
    )
    assert result.text == ""
    assert result.finish_reason == "tool_calls"
    assert llm_server.requests[0]["tools"] == tools


def test_chat_tool_call_with_empty_arguments_decodes_to_empty_dict(llm_server: LLMServer) -> None:
    llm_server.script(tool_call("list_notes", ""))
    assert llm.chat(USER, model=MODEL).tool_calls[0].arguments == {}


def test_chat_tool_call_with_unparsable_arguments_raises(llm_server: LLMServer) -> None:
    llm_server.script(tool_call("record_verdict", '{"verdict": '))
    with pytest.raises(LLMError, match="not valid JSON") as info:
        llm.chat(USER, model=MODEL)
    assert info.value.kind == "invalid_json"


def test_responder_computes_reply_from_the_prompt(llm_server: LLMServer) -> None:
    llm_server.responder = lambda body: body["messages"][-1]["content"].upper()
    assert llm.chat([{"role": "user", "content": "echo me"}], model=MODEL).text == "ECHO ME"


# -- retries and failures --------------------------------------------------------------------------


def test_rate_limit_is_retried_then_succeeds(llm_server: LLMServer) -> None:
    llm_server.script(rate_limited(), text("after retry"))
    assert llm.chat(USER, model=MODEL).text == "after retry"
    assert len(llm_server.requests) == 2
    assert llm_server.requests[0] == llm_server.requests[1]


@pytest.mark.parametrize(
    ("reply", "kind", "phrase"),
    [
        (rate_limited(), "rate_limit", "rate-limiting"),
        (server_error(), "server", "HTTP 500"),
        (http_error(503, "overloaded"), "server", "overloaded"),
    ],
)
def test_retryable_failure_exhausting_retries_raises_llm_error(
    llm_server: LLMServer, reply: Any, kind: str, phrase: str
) -> None:
    llm_server.script(reply, reply, reply)
    with pytest.raises(LLMError, match=phrase) as info:
        llm.chat(USER, model=MODEL)
    assert info.value.kind == kind
    assert len(llm_server.requests) == 3  # first try plus OVERRULE_LLM_MAX_RETRIES=2
    assert llm_server.pending == 0


@pytest.mark.parametrize(
    ("status", "kind", "phrase"),
    [
        (400, "request", "refused the request"),
        (401, "auth", "OPENAI_API_KEY"),
        (403, "auth", "OPENAI_API_KEY"),
        (404, "request", "HTTP 404"),
    ],
)
def test_client_error_is_not_retried_and_names_the_cause(
    llm_server: LLMServer, status: int, kind: str, phrase: str
) -> None:
    llm_server.script(http_error(status, "scripted", headers=()))
    with pytest.raises(LLMError, match=phrase) as info:
        llm.chat(USER, model=MODEL)
    assert (info.value.kind, info.value.status) == (kind, status)
    assert len(llm_server.requests) == 1


def test_timeout_raises_llm_error_naming_the_setting(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, OVERRULE_LLM_TIMEOUT="0.3", OVERRULE_LLM_MAX_RETRIES="0")
    llm_server.script(stall())
    with pytest.raises(LLMError, match="OVERRULE_LLM_TIMEOUT") as info:
        llm.chat(USER, model=MODEL)
    assert info.value.kind == "timeout"


def test_timeout_is_retried_then_succeeds(llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # The retry's reply must come within the timeout: 2 s, not 0.3, for a loaded machine (the stall
    # lasts until the server stops).
    configure(monkeypatch, OVERRULE_LLM_TIMEOUT="2", OVERRULE_LLM_MAX_RETRIES="1")
    llm_server.script(stall(600), text("second try"))
    assert llm.chat(USER, model=MODEL).text == "second try"
    assert len(llm_server.requests) == 2


@pytest.mark.parametrize(
    "reply",
    [
        malformed("<html>502 Bad Gateway</html>"),
        malformed("plain words", content_type="text/plain"),
        malformed('{"unexpected": "shape"}'),
        malformed('{"id": "x", "object": "chat.completion", "choices": []}'),
    ],
    ids=["not-json", "text-plain", "wrong-shape", "no-choices"],
)
def test_malformed_body_raises_bad_response(llm_server: LLMServer, reply: Any) -> None:
    llm_server.script(reply)
    with pytest.raises(LLMError) as info:
        llm.chat(USER, model=MODEL)
    assert info.value.kind == "bad_response"


def test_unreachable_server_raises_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(openai_base_url=f"http://127.0.0.1:{port}/v1", llm_timeout=1.0, llm_max_retries=0)
    with pytest.raises(LLMError, match="OPENAI_BASE_URL") as info:
        llm.chat(USER, model=MODEL, settings=settings)
    assert info.value.kind == "connection"
    llm.close_clients()


# -- JSON mode -------------------------------------------------------------------------------------


def test_chat_json_requests_json_mode_and_returns_the_object(llm_server: LLMServer) -> None:
    llm_server.script(json_reply({"verdict": "incorrect", "score": 2}))
    assert llm.chat_json(USER, model=MODEL) == {"verdict": "incorrect", "score": 2}
    (body,) = llm_server.requests
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0.0


@pytest.mark.parametrize(
    ("messages", "schema_hint", "sent"),
    [
        (
            [{"role": "user", "content": "Return JSON with a verdict."}],
            None,
            [{"role": "user", "content": "Return JSON with a verdict."}],
        ),
        (
            USER,
            None,
            [{"role": "system", "content": llm.JSON_INSTRUCTION}, *USER],
        ),
        (
            [{"role": "system", "content": "You judge answers."}, *USER],
            '{"verdict": str}',
            [
                {
                    "role": "system",
                    "content": f'You judge answers.\n\n{llm.JSON_INSTRUCTION} Expected shape: {{"verdict": str}}',
                },
                *USER,
            ],
        ),
    ],
    ids=["mentions-json", "adds-system", "extends-system-with-hint"],
)
def test_chat_json_asks_for_json_in_the_prompt(
    llm_server: LLMServer, messages: list[dict[str, str]], schema_hint: str | None, sent: list[dict[str, str]]
) -> None:
    original = json.loads(json.dumps(messages))
    llm_server.script(json_reply({}))
    llm.chat_json(messages, model=MODEL, schema_hint=schema_hint)
    assert llm_server.requests[0]["messages"] == sent
    assert messages == original  # the caller's messages are not mutated


def test_chat_json_falls_back_when_server_rejects_response_format(llm_server: LLMServer) -> None:
    llm_server.reject_response_format = True
    llm_server.script(text('```json\n{"verdict": "correct"}\n```'))
    assert llm.chat_json(USER, model=MODEL) == {"verdict": "correct"}
    first, second = llm_server.requests
    assert "response_format" in first
    assert "response_format" not in second
    assert first["messages"] == second["messages"]


def test_chat_json_remembers_a_server_without_json_mode(llm_server: LLMServer) -> None:
    llm_server.reject_response_format = True
    llm_server.script(json_reply({"n": 1}), json_reply({"n": 2}))
    assert llm.chat_json(USER, model=MODEL) == {"n": 1}
    assert llm.chat_json(USER, model=MODEL) == {"n": 2}
    assert len(llm_server.requests) == 3  # rejected, fallback, then straight to the prompt-only call


def test_chat_json_does_not_retry_an_unrelated_bad_request(llm_server: LLMServer) -> None:
    llm_server.script(http_error(400, "context length exceeded", headers=()))
    with pytest.raises(LLMError, match="context length exceeded"):
        llm.chat_json(USER, model=MODEL)
    assert len(llm_server.requests) == 1


def test_chat_json_tolerates_prose_from_a_server_ignoring_json_mode(llm_server: LLMServer) -> None:
    llm_server.script(text('Sure! Here is the result:\n{"verdict": "partial", "why": "{x}"}\nHope it helps.'))
    assert llm.chat_json(USER, model=MODEL) == {"verdict": "partial", "why": "{x}"}


def test_chat_json_reply_without_json_raises_invalid_json(llm_server: LLMServer) -> None:
    llm_server.script(text("I cannot answer that."))
    with pytest.raises(LLMError, match="not valid JSON") as info:
        llm.chat_json(USER, model=MODEL)
    assert info.value.kind == "invalid_json"


def test_chat_json_truncated_reply_says_it_was_cut_off(llm_server: LLMServer) -> None:
    llm_server.script(text('{"verdict": "correct", "reason": "because', finish_reason="length"))
    with pytest.raises(LLMError, match="cut off"):
        llm.chat_json(USER, model=MODEL)


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('  \n{"a": 1}\n ', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('```\n{"a": 1}\n```', {"a": 1}),
        ('Here you go:\n```json\n{"a": 1}\n```\nAnything else?', {"a": 1}),
        ('The verdict: {"a": 1} -- done.', {"a": 1}),
        ('{"outer": {"inner": {"deep": [1, {"x": 2}]}}}', {"outer": {"inner": {"deep": [1, {"x": 2}]}}}),
        ('{"quote": "a } brace { inside", "n": 1}', {"quote": "a } brace { inside", "n": 1}),
        ('{"quote": "escaped \\" quote }"}', {"quote": 'escaped " quote }'}),
        ('Use {curly} placeholders. {"a": 1}', {"a": 1}),
        ('[1, 2] then {"a": 1}', {"a": 1}),
        ('{"a": 1} {"b": 2}', {"a": 1}),
        ('{"türkçe": "çok güzel"}', {"türkçe": "çok güzel"}),
    ],
    ids=[
        "plain",
        "whitespace",
        "json-fence",
        "bare-fence",
        "fence-in-prose",
        "inline-prose",
        "nested",
        "braces-in-string",
        "escaped-quote",
        "stray-braces-before",
        "array-before",
        "first-of-two",
        "unicode",
    ],
)
def test_parse_json_loose_finds_the_object(reply: str, expected: dict[str, Any]) -> None:
    assert parse_json_loose(reply) == expected


@pytest.mark.parametrize(
    "reply",
    ["", "no json here", '{"a": 1', "[1, 2, 3]", '"just a string"', "```json\n{'a': 1}\n```", "{oops}"],
    ids=["empty", "prose", "unterminated", "array", "string", "single-quotes", "not-json-braces"],
)
def test_parse_json_loose_rejects_replies_without_an_object(reply: str) -> None:
    with pytest.raises(LLMError, match="not valid JSON") as info:
        parse_json_loose(reply)
    assert info.value.kind == "invalid_json"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
prose = st.text(alphabet=st.characters(blacklist_characters="{"), max_size=40)


@given(obj=st.dictionaries(st.text(), json_values, max_size=4), before=prose, after=st.text(max_size=40))
def test_parse_json_loose_round_trips_an_object_wrapped_in_prose_and_fences(
    obj: dict[str, Any], before: str, after: str
) -> None:
    reply = f"{before}\n```json\n{json.dumps(obj, ensure_ascii=False)}\n```\n{after}"
    assert parse_json_loose(reply) == obj


# -- streaming -------------------------------------------------------------------------------------


def test_stream_chat_yields_chunks_in_order(llm_server: LLMServer) -> None:
    chunks = ["The ", "answer ", "cites ", "<script>", " nothing."]
    llm_server.script(stream(chunks, delay=0.01))
    assert list(llm.stream_chat(USER, model="coach-x")) == chunks
    (body,) = llm_server.requests
    assert body["stream"] is True
    assert body["model"] == "coach-x"
    assert body["messages"] == USER


def test_stream_chat_aborted_mid_stream_raises_after_partial_output(llm_server: LLMServer) -> None:
    llm_server.script(stream(["one ", "two ", "three"], abort_after=2))
    received: list[str] = []
    with pytest.raises(LLMError, match="incomplete") as info:
        received.extend(llm.stream_chat(USER, model=MODEL))
    assert received == ["one ", "two "]
    assert info.value.kind == "connection"


def test_stream_chat_ending_without_finish_reason_raises(llm_server: LLMServer) -> None:
    llm_server.script(stream(["half an"], finish_reason=None))
    with pytest.raises(LLMError, match="incomplete") as info:
        list(llm.stream_chat(USER, model=MODEL))
    assert info.value.kind == "bad_response"


def test_stream_chat_stalled_mid_stream_raises_timeout(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, OVERRULE_LLM_TIMEOUT="0.3", OVERRULE_LLM_MAX_RETRIES="0")
    llm_server.script(stream(["fast ", "then slow"], delay=2.0))
    with pytest.raises(LLMError) as info:
        list(llm.stream_chat(USER, model=MODEL))
    assert info.value.kind == "timeout"


def test_stream_chat_http_error_raises_before_any_output(llm_server: LLMServer) -> None:
    llm_server.script(server_error(), server_error(), server_error())
    with pytest.raises(LLMError) as info:
        llm.stream_chat(USER, model=MODEL)  # not iterated: the failure is raised on the call
    assert info.value.kind == "server"


def test_stream_chat_retries_rate_limit_before_streaming(llm_server: LLMServer) -> None:
    llm_server.script(rate_limited(), stream(["ok"]))
    assert list(llm.stream_chat(USER, model=MODEL)) == ["ok"]
    assert len(llm_server.requests) == 2


# -- configuration ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda s: llm.get_client(s),
        lambda s: llm.chat(USER, model=MODEL, settings=s),
        lambda s: llm.chat_json(USER, model=MODEL, settings=s),
        lambda s: llm.stream_chat(USER, model=MODEL, settings=s),
        lambda s: llm.embed(["x"], settings=Settings(embedding_model="emb")),
    ],
    ids=["get_client", "chat", "chat_json", "stream_chat", "embed"],
)
def test_unconfigured_llm_raises_a_message_naming_the_variables(call: Any) -> None:
    with pytest.raises(LLMNotConfigured) as info:
        call(Settings())
    message = str(info.value)
    assert "OPENAI_API_KEY" in message
    assert "OPENAI_BASE_URL" in message


def test_local_server_without_key_gets_a_placeholder_key(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    configure(monkeypatch)
    llm.chat(USER, model=MODEL)
    assert llm_server.headers[0]["authorization"] == f"Bearer {llm.PLACEHOLDER_API_KEY}"


def test_configured_key_is_sent(llm_server: LLMServer) -> None:
    llm.chat(USER, model=MODEL)
    assert llm_server.headers[0]["authorization"] == "Bearer test"


def test_client_is_cached_per_settings_and_carries_timeout_and_retries() -> None:
    settings = Settings(openai_base_url="http://127.0.0.1:9/v1", llm_timeout=7.0, llm_max_retries=3)
    client = llm.get_client(settings)
    assert llm.get_client(settings) is client
    assert (client.timeout, client.max_retries, str(client.base_url)) == (7.0, 3, "http://127.0.0.1:9/v1/")
    assert llm.get_client(Settings(openai_base_url="http://127.0.0.1:9/v1", llm_timeout=8.0)) is not client
    llm.close_clients()


def test_test_server_lists_models_to_the_real_client(llm_server: LLMServer) -> None:
    assert [m.id for m in llm.get_client().models.list()] == ["test-model"]


# -- embeddings ------------------------------------------------------------------------------------


def test_embed_returns_one_deterministic_vector_per_text(
    llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, OVERRULE_EMBEDDING_MODEL="emb-small")
    first = llm.embed(["alpha", "beta", "alpha"])
    assert len(first) == 3
    assert all(len(v) == llm_server.embedding_dim for v in first)
    assert first[0] == first[2] != first[1]
    assert llm.embed(["beta"]) == [first[1]]
    assert llm_server.requests[0] == {
        "model": "emb-small",
        "input": ["alpha", "beta", "alpha"],
        "encoding_format": "float",
    }


def test_embed_without_embedding_model_raises_not_configured(llm_server: LLMServer) -> None:
    with pytest.raises(LLMNotConfigured, match="OVERRULE_EMBEDDING_MODEL"):
        llm.embed(["alpha"])
    assert llm_server.requests == []


def test_embed_of_nothing_sends_nothing(llm_server: LLMServer, monkeypatch: pytest.MonkeyPatch) -> None:
    configure(monkeypatch, OVERRULE_EMBEDDING_MODEL="emb-small")
    assert llm.embed([]) == []
    assert llm_server.requests == []


def test_context_manager_stops_the_server() -> None:
    with running_llm_server() as server:
        base_url = server.base_url
        settings = Settings(openai_base_url=base_url, llm_timeout=30.0, llm_max_retries=0)
        assert llm.chat(USER, model=MODEL, settings=settings).text == "ok"
    with pytest.raises(LLMError) as info:
        llm.chat(USER, model=MODEL, settings=settings)
    assert info.value.kind == "connection"
    llm.close_clients()
