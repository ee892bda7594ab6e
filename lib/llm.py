"""LLM access (SPEC §7): the only module that builds an OpenAI client.

Any OpenAI-compatible server works (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM), so nothing here
assumes more than `/chat/completions` and `/embeddings`, and every client failure becomes an
`LLMError` whose message a reviewer can act on. Without a key or base URL, calls raise
`LLMNotConfigured` and the UI shows its message instead of a traceback.

What servers differ in is negotiated once per server and model, and remembered in-process:
- structured output (`chat_json`): `json_schema` → `json_object` with `schema` (llama.cpp) →
  `json_object` → the prompt only; a 400, 422 or 500 that names `response_format` is a refusal.
  Whatever the server enforced, the reply is validated here against the same schema.
- tools (`uses_tools`): one tiny probe with a forced function call; a server that answers it
  without a tool call ignores `tools` (llama.cpp with an ordinary chat template), and callers
  then use the seed's text commands instead.
Every JSON call has a reply cap (`OVERRULE_MAX_TOKENS_<purpose>`); a reply that stopped at the cap
is reported as cut off before anything is parsed. A reply that is not valid JSON, or fails the
schema or the caller's check, gets one repair turn that shows the model its error; a second
failure is a clean `LLMError`. Under `OVERRULE_LLM_PROFILE=local` long calls stream, so a request
the client abandons (timeout, closed tab) is cancelled by the server instead of running on.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import jsonschema

from lib.config import LLM_SETUP_HINT, Settings, env_name, get_settings

if TYPE_CHECKING:
    # Imported where a call is made, not here: importing openai costs about 0.8 CPU s (its
    # hundreds of typed models), and every process that imports lib pays for it, the CLI's
    # commands and a Streamlit server whose pages never call an LLM included.
    import openai

log = logging.getLogger(__name__)

NOT_CONFIGURED_MESSAGE = (
    "No LLM is configured, so LLM actions are disabled (reviewing, corrections and notes still work). "
    + LLM_SETUP_HINT
)
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Local servers ignore the key, but the client refuses to start without one.
PLACEHOLDER_API_KEY = "not-needed"
JSON_INSTRUCTION = "Reply with a single JSON object and nothing else."
_MAX_CACHED_CLIENTS = 8
# The structured-output ladder, most to least enforced by the server.
JSON_MODES = ("json_schema", "json_object_schema", "json_object", "prompt")
REPAIR_INSTRUCTION = (
    "Your previous reply could not be used: {error}. Reply again with only the corrected JSON object, "
    "in exactly the shape asked for, with real text in place of every placeholder."
)
PROBE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "overrule_probe",
        "description": "Call this function to show that you can call functions.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}
# Messages servers use for a prompt longer than their context window (OpenAI, vLLM, llama.cpp, Ollama).
_CONTEXT_ERROR_RE = re.compile(
    r"context[ _](length|size|window)|maximum context|exceeds the available context|n_ctx|too many tokens"
    r"|prompt is too long",
    re.IGNORECASE,
)


class LLMNotConfigured(RuntimeError):
    """Raised instead of calling a model when no LLM is configured; the message is for the reviewer."""

    def __init__(self, message: str = NOT_CONFIGURED_MESSAGE) -> None:
        super().__init__(message)


class LLMError(RuntimeError):
    """An LLM call failed; `kind` lets callers branch, the message is shown to the reviewer."""

    def __init__(self, message: str, *, kind: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


@dataclass(frozen=True)
class ToolCall:
    """One function call requested by the model, arguments already decoded."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ChatResult:
    """What a chat completion produced, reduced to what Overrule uses."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens, for cost displays."""
        return self.prompt_tokens + self.completion_tokens


_ClientKey = tuple[str, str, float, int]
_clients: dict[_ClientKey, openai.OpenAI] = {}
# Per (base URL, model): the index in JSON_MODES of the most enforcing mode not refused so far.
_json_modes: dict[tuple[str, str], int] = {}
# Per (base URL, model): whether the server really calls tools (see `uses_tools`).
_tool_support: dict[tuple[str, str], bool] = {}
_lock = threading.Lock()


def _client_key(settings: Settings) -> _ClientKey:
    if not settings.llm_configured:
        raise LLMNotConfigured()
    return (
        settings.openai_api_key or PLACEHOLDER_API_KEY,
        settings.openai_base_url or OPENAI_DEFAULT_BASE_URL,
        settings.llm_timeout,
        settings.llm_max_retries,
    )


def get_client(settings: Settings | None = None) -> openai.OpenAI:
    """The shared client for these settings, created on first use with explicit timeout and retries."""
    import openai

    settings = settings or get_settings()
    key = _client_key(settings)
    with _lock:
        client = _clients.get(key)
        if client is None:
            api_key, base_url, timeout, retries = key
            client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout, max_retries=retries)
            if len(_clients) >= _MAX_CACHED_CLIENTS:
                # Drop the oldest without closing it: another thread may still be using it.
                _clients.pop(next(iter(_clients)))
            _clients[key] = client
    return client


def close_clients() -> None:
    """Close and forget every cached client (tests and shutdown; not while calls are in flight)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
        _json_modes.clear()
        _tool_support.clear()
    for client in clients:
        client.close()


def _describe(exc: Exception, settings: Settings) -> LLMError:
    """Turn an openai/transport failure into a message that says what happened and what to do."""
    import openai

    where = settings.openai_base_url or OPENAI_DEFAULT_BASE_URL
    retries = settings.llm_max_retries
    if isinstance(exc, openai.APITimeoutError):
        return LLMError(
            f"The LLM server at {where} did not answer within {settings.llm_timeout:g} s "
            f"(retried {retries} times). Try again, or raise {env_name('llm_timeout')}.",
            kind="timeout",
        )
    if isinstance(exc, openai.APIConnectionError):
        return LLMError(
            f"Could not connect to the LLM server at {where}. Check OPENAI_BASE_URL and that the server is running.",
            kind="connection",
        )
    if isinstance(exc, openai.RateLimitError):
        return LLMError(
            f"The LLM server is rate-limiting requests (HTTP 429), still after {retries} retries. "
            "Wait a moment and try again.",
            kind="rate_limit",
            status=429,
        )
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return LLMError(
            f"The LLM server at {where} rejected the API key (HTTP {exc.status_code}). Check OPENAI_API_KEY.",
            kind="auth",
            status=exc.status_code,
        )
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code >= 500:
            return LLMError(
                f"The LLM server at {where} failed (HTTP {exc.status_code}) after {retries} retries: "
                f"{exc.message}",
                kind="server",
                status=exc.status_code,
            )
        if _CONTEXT_ERROR_RE.search(f"{exc.message} {json.dumps(exc.body, default=str)}"):
            return LLMError(
                f"The prompt does not fit the LLM server's context window (HTTP {exc.status_code}: "
                f"{exc.message}). Set {env_name('context_tokens')} to the server's context size so prompts "
                "are shortened to fit, or start the server with a larger context (llama.cpp: -c 8192; "
                "Ollama: OLLAMA_CONTEXT_LENGTH=8192 or the num_ctx option).",
                kind="context",
                status=exc.status_code,
            )
        return LLMError(
            f"The LLM server at {where} refused the request (HTTP {exc.status_code}): {exc.message}",
            kind="request",
            status=exc.status_code,
        )
    if isinstance(exc, openai.APIError):
        # Status-less API errors arrive as `{"error": ...}` events inside a stream.
        return LLMError(f"The LLM server reported an error: {exc.message}", kind="server")
    return LLMError(
        f"The LLM server at {where} sent a response that is not an OpenAI-style completion ({exc}).",
        kind="bad_response",
    )


@contextmanager
def _translated_errors(settings: Settings) -> Iterator[None]:
    import openai

    try:
        yield
    except LLMError:
        raise
    except (openai.OpenAIError, ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        # ValueError covers non-JSON bodies; the others, JSON that is not shaped like a completion.
        raise _describe(exc, settings) from exc


def _as_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [dict(m) for m in messages]


def _to_result(completion: object) -> ChatResult:
    from openai.types.chat import ChatCompletion

    if not isinstance(completion, ChatCompletion):
        raise LLMError(
            f"The LLM server sent a response that is not a chat completion: {str(completion)[:200]!r}",
            kind="bad_response",
        )
    if not completion.choices:
        raise LLMError("The LLM server sent a chat completion without any choices.", kind="bad_response")
    choice = completion.choices[0]
    message = choice.message
    calls = tuple(
        ToolCall(
            id=call.id,
            name=call.function.name,
            arguments=parse_json_loose(call.function.arguments) if call.function.arguments.strip() else {},
        )
        for call in (message.tool_calls or [])
        if call.type == "function"
    )
    usage = completion.usage
    return ChatResult(
        text=message.content or "",
        tool_calls=calls,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        finish_reason=choice.finish_reason,
    )


# The judge's calls (scoring and mentoring) take the judge's temperature (a judge version's field);
# every other call is deterministic.
_JUDGE_PURPOSES = ("judge", "mentor")


def temperature_for(purpose: str | None, settings: Settings) -> float:
    """The sampling temperature of a call kind: `OVERRULE_JUDGE_TEMPERATURE` for the judge's, else 0."""
    return float(settings.judge_temperature) if purpose in _JUDGE_PURPOSES else 0.0


def max_tokens_for(purpose: str | None, settings: Settings) -> int | None:
    """The reply cap of a call kind (`OVERRULE_MAX_TOKENS_<PURPOSE>`); None for an uncapped call."""
    if purpose is None:
        return None
    return int(getattr(settings, f"max_tokens_{purpose}"))


def estimate_tokens(text: str) -> int:
    """Tokens of a text without a tokenizer: UTF-8 bytes / 3.5, rounded up.

    BPE tokenizers average about 4 bytes per token on English and fewer on Turkish or emoji; 3.5
    over-counts slightly on purpose, so a prompt cut to this estimate fits the real window.
    """
    return math.ceil(len(text.encode("utf-8")) / 3.5)


def estimate_messages_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """`estimate_tokens` over a conversation, plus 4 tokens per message for the chat template."""
    return sum(estimate_tokens(str(m.get("content") or "")) + 4 for m in messages)


def _server_key(settings: Settings, model: str) -> tuple[str, str]:
    return _client_key(settings)[1], model


def _response_format(mode: str, schema: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    if mode == "json_schema" and schema is not None:
        return {"type": "json_schema", "json_schema": {"name": name, "schema": dict(schema), "strict": False}}
    if mode == "json_object_schema" and schema is not None:
        return {"type": "json_object", "schema": dict(schema)}
    if mode in ("json_schema", "json_object_schema", "json_object"):
        return {"type": "json_object"}
    return None


def _first_mode(key: tuple[str, str], schema: Mapping[str, Any] | None) -> int:
    known = _json_modes.get(key, 0)
    # Without a schema the two schema modes mean nothing; plain JSON mode is the most to ask for.
    return known if schema is not None else max(known, JSON_MODES.index("json_object"))


def json_mode_of(model: str, settings: Settings | None = None) -> str:
    """The structured-output mode negotiated with this server and model so far (for status lines)."""
    settings = settings or get_settings()
    return JSON_MODES[_json_modes.get(_server_key(settings, model), 0)]


def _refuses_response_format(exc: openai.APIStatusError) -> bool:
    # llama.cpp answers an unknown response_format type with HTTP 500, not 400.
    if exc.status_code not in (400, 422, 500):
        return False
    return "response_format" in f"{exc.message} {json.dumps(exc.body, default=str)}"


@dataclass
class Usage:
    """Completions and tokens spent by the calls of one thread inside `metered()` (cost reports)."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


_meter = threading.local()


@contextmanager
def metered() -> Iterator[Usage]:
    """Count every completion this thread makes inside the block (repair turns included)."""
    usage = Usage()
    outer = getattr(_meter, "usage", None)
    _meter.usage = usage
    try:
        yield usage
    finally:
        _meter.usage = outer


def _count(result: ChatResult) -> ChatResult:
    usage: Usage | None = getattr(_meter, "usage", None)
    if usage is not None:
        usage.calls += 1
        usage.prompt_tokens += result.prompt_tokens
        usage.completion_tokens += result.completion_tokens
    return result


def _create(client: openai.OpenAI, params: dict[str, Any], settings: Settings, *, stream: bool) -> ChatResult:
    if not stream:
        return _count(_to_result(client.chat.completions.create(**params)))
    response = client.chat.completions.create(**params, stream=True)
    parts: list[str] = []
    outcome: dict[str, Any] = {}
    for delta in _stream_deltas(response, settings, outcome):
        parts.append(delta)
    return _count(ChatResult(text="".join(parts), finish_reason=outcome.get("finish_reason")))


def chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    temperature: float | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    settings: Settings | None = None,
    purpose: str | None = None,
    schema: Mapping[str, Any] | None = None,
    json_mode: bool = False,
    schema_name: str = "reply",
) -> ChatResult:
    """One chat completion; failures surface as `LLMError`, never as openai exceptions.

    `purpose` caps the reply (`max_tokens_for`) and sets the temperature unless one is given
    (`temperature_for`); `schema` or `json_mode` asks for structured output in the best mode this
    server accepts (see the module docstring). Calls without tools stream under the local profile.
    """
    import openai

    settings = settings or get_settings()
    client = get_client(settings)
    key = _server_key(settings, model)
    params: dict[str, Any] = {
        "model": model,
        "messages": cast(Any, _as_messages(messages)),
        "temperature": temperature_for(purpose, settings) if temperature is None else temperature,
    }
    cap = max_tokens_for(purpose, settings)
    if cap is not None:
        params["max_tokens"] = cap
    if tools:
        params["tools"] = [dict(t) for t in tools]
    structured = schema is not None or json_mode
    mode = _first_mode(key, schema) if structured else len(JSON_MODES) - 1
    stream = settings.streams_long_calls and not tools
    with _translated_errors(settings):
        while True:
            fmt = _response_format(JSON_MODES[mode], schema, schema_name)
            try:
                return _create(
                    client, params | ({"response_format": fmt} if fmt else {}), settings, stream=stream
                )
            except openai.APIStatusError as exc:
                if fmt is None or not _refuses_response_format(exc):
                    raise
                log.info("%s refused response_format %s; trying %s", key[0], fmt, JSON_MODES[mode + 1])
                mode += 1
                with _lock:
                    _json_modes[key] = max(_json_modes.get(key, 0), mode)


def uses_tools(*, model: str, settings: Settings | None = None) -> bool:
    """Whether this server really calls tools: a forced call to a probe function, once per server and model.

    llama.cpp with an ordinary chat template accepts `tools` and ignores them (no error, no call),
    so a refusal cannot be waited for; a server that refuses the probe or answers it in words
    does not use tools. Connection failures raise and are not remembered.
    """
    import openai

    settings = settings or get_settings()
    key = _server_key(settings, model)
    known = _tool_support.get(key)
    if known is not None:
        return known
    client = get_client(settings)
    with _translated_errors(settings):
        try:
            completion = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "Call the function overrule_probe."}],
                tools=cast(Any, [PROBE_TOOL]),
                tool_choice={"type": "function", "function": {"name": "overrule_probe"}},
                temperature=0.0,
                max_tokens=64,
            )
            supported = any(call.name == "overrule_probe" for call in _to_result(completion).tool_calls)
        except openai.APIStatusError as exc:
            if exc.status_code not in (400, 404, 422, 500, 501):
                raise
            supported = False
        except LLMError as exc:
            if exc.kind != "invalid_json":  # unreadable tool arguments: its tool use is broken
                raise
            supported = False
    log.info("%s %s tools", key[0], "calls" if supported else "ignores")
    with _lock:
        _tool_support[key] = supported
    return supported


def _with_json_instruction(
    messages: Sequence[Mapping[str, Any]], schema_hint: str | None
) -> list[dict[str, Any]]:
    """Ask for JSON in words too: OpenAI's JSON mode demands it, and servers without JSON mode need it."""
    sent = _as_messages(messages)
    mentions_json = any("json" in str(m.get("content") or "").lower() for m in sent)
    if mentions_json and not schema_hint:
        return sent
    instruction = JSON_INSTRUCTION + (f" Expected shape: {schema_hint}" if schema_hint else "")
    # Extend the leading system message: some chat templates reject a second system message.
    if sent and sent[0].get("role") == "system" and isinstance(sent[0].get("content"), str):
        sent[0]["content"] = f"{sent[0]['content']}\n\n{instruction}"
    else:
        sent.insert(0, {"role": "system", "content": instruction})
    return sent


def schema_errors(value: Any, schema: Mapping[str, Any], *, limit: int = 3) -> list[str]:
    """What makes `value` break the JSON schema, as short lines for a reviewer and for a repair turn."""
    validator = jsonschema.Draft202012Validator(schema)
    out = []
    for error in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))[:limit]:
        where = ".".join(str(p) for p in error.absolute_path) or "the reply"
        message = error.message if len(error.message) <= 160 else error.message[:157] + "..."
        out.append(f"{where}: {message}")
    return out


Check = Callable[[dict[str, Any]], object]


def cut_off_error(result: ChatResult, purpose: str | None, settings: Settings) -> LLMError | None:
    """An error for a reply that stopped at the token cap, before any parsing (an inner object is no answer)."""
    if result.finish_reason != "length":
        return None
    cap = max_tokens_for(purpose, settings)
    where = (
        f" of {cap} tokens; raise {env_name(f'max_tokens_{purpose}')} if the model needs more"
        if cap is not None and purpose is not None
        else " (the server's limit)"
    )
    return LLMError(f"The model's reply was cut off at the token limit{where}.", kind="truncated")


def _checked(
    result: ChatResult, schema: Mapping[str, Any] | None, check: Check | None, validate_schema: bool
) -> dict[str, Any]:
    """The reply's JSON object, or LLMError (invalid_json / invalid_reply) saying what is wrong with it."""
    data = parse_json_loose(result.text)
    if schema is not None and validate_schema:
        problems = schema_errors(data, schema)
        if problems:
            raise LLMError(
                "the reply does not match the schema: " + "; ".join(problems), kind="invalid_reply"
            )
    if check is not None:
        try:
            check(data)
        except ValueError as exc:
            raise LLMError(str(exc), kind="invalid_reply") from exc
    return data


def finish_json(
    conversation: Sequence[Mapping[str, Any]],
    result: ChatResult,
    *,
    model: str,
    schema: Mapping[str, Any] | None = None,
    check: Check | None = None,
    purpose: str | None = None,
    settings: Settings | None = None,
    repair: bool = True,
    schema_name: str = "reply",
    validate_schema: bool = True,
) -> dict[str, Any]:
    """The checked JSON object of a reply already received, with one repair turn when it is unusable.

    `conversation` is what produced `result`; the repair turn appends the reply and the error.
    A reply cut off at the token cap is not repaired: a second try would stop at the same cap.
    """
    settings = settings or get_settings()
    for attempt in range(2):
        cut = cut_off_error(result, purpose, settings)
        if cut is not None:
            raise cut
        try:
            return _checked(result, schema, check, validate_schema)
        except LLMError as exc:
            if not repair or attempt:
                raise LLMError(
                    f"{exc} (after a repair turn)" if attempt else str(exc), kind=exc.kind
                ) from exc
            log.info("asking %s to repair its reply: %s", model, exc)
            conversation = [
                *_as_messages(conversation),
                {"role": "assistant", "content": result.text},
                {"role": "user", "content": REPAIR_INSTRUCTION.format(error=str(exc).rstrip("."))},
            ]
        result = chat(
            conversation,
            model=model,
            settings=settings,
            purpose=purpose,
            schema=schema,
            json_mode=True,
            schema_name=schema_name,
        )
    raise AssertionError("unreachable")


def chat_json(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    schema_hint: str | None = None,
    settings: Settings | None = None,
    schema: Mapping[str, Any] | None = None,
    check: Check | None = None,
    purpose: str | None = None,
    repair: bool = True,
    schema_name: str = "reply",
    validate_schema: bool = True,
) -> dict[str, Any]:
    """A chat completion whose reply must be one JSON object matching `schema` and passing `check`.

    Structured output is negotiated per server (`chat`); the reply is checked here whatever the
    server enforced, and gets one repair turn (`finish_json`). `check` raises ValueError with a
    message the model can act on; `validate_schema=False` leaves the decision to `check` alone, for
    callers whose parser accepts more than the schema describes.
    """
    settings = settings or get_settings()
    sent = _with_json_instruction(messages, schema_hint)
    result = chat(
        sent,
        model=model,
        settings=settings,
        purpose=purpose,
        schema=schema,
        json_mode=True,
        schema_name=schema_name,
    )
    return finish_json(
        sent,
        result,
        model=model,
        schema=schema,
        check=check,
        purpose=purpose,
        settings=settings,
        repair=repair,
        schema_name=schema_name,
        validate_schema=validate_schema,
    )


def parse_json_loose(text: str) -> dict[str, Any]:
    """The first JSON object in a model reply, ignoring code fences and prose around it."""
    stripped = text.strip()
    try:
        value = json.loads(stripped)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    decoder = json.JSONDecoder()
    start = stripped.find("{")
    while start != -1:
        # raw_decode parses one value and ignores what follows, and it knows braces inside strings.
        try:
            value, _end = decoder.raw_decode(stripped, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = stripped.find("{", start + 1)
    excerpt = stripped[:200] + ("…" if len(stripped) > 200 else "")
    raise LLMError(
        f"The model's reply is not valid JSON (no JSON object found): {excerpt!r}", kind="invalid_json"
    )


def stream_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    settings: Settings | None = None,
    purpose: str | None = None,
) -> Iterator[str]:
    """Text deltas of a streamed reply (for `st.write_stream`); the request is sent before returning."""
    settings = settings or get_settings()
    client = get_client(settings)
    cap = max_tokens_for(purpose, settings)
    extra: dict[str, Any] = {"max_tokens": cap} if cap is not None else {}
    # Sending eagerly means configuration, HTTP and retry failures raise here, before any output.
    with _translated_errors(settings):
        response = client.chat.completions.create(
            model=model, messages=cast(Any, _as_messages(messages)), stream=True, **extra
        )
    return _stream_deltas(response, settings)


def _stream_deltas(response: Any, settings: Settings, outcome: dict[str, Any] | None = None) -> Iterator[str]:
    import openai

    finish_reason: str | None = None
    with _translated_errors(settings), response:
        try:
            for chunk in response:
                for choice in chunk.choices or []:
                    if choice.delta is not None and choice.delta.content:
                        yield choice.delta.content
                    finish_reason = choice.finish_reason or finish_reason
        except openai.APIConnectionError as exc:
            if isinstance(exc, openai.APITimeoutError):
                raise
            raise LLMError(
                "The connection to the LLM server broke in the middle of the reply; the answer is incomplete.",
                kind="connection",
            ) from exc
    if finish_reason is None:
        # OpenAI-compatible servers end every completed stream with a finish reason.
        raise LLMError(
            "The LLM server ended the reply before the model finished; the answer is incomplete.",
            kind="bad_response",
        )
    if outcome is not None:
        outcome["finish_reason"] = finish_reason


def embed(texts: Sequence[str], *, settings: Settings | None = None) -> list[list[float]]:
    """Embedding vectors from the configured server, one per text, in order."""
    settings = settings or get_settings()
    if not settings.embedding_model:
        raise LLMNotConfigured(
            f"No embedding model is configured; set {env_name('embedding_model')} to use server embeddings."
        )
    client = get_client(settings)
    if not texts:
        return []
    with _translated_errors(settings):
        response = client.embeddings.create(
            model=settings.embedding_model, input=list(texts), encoding_format="float"
        )
        rows = sorted(response.data, key=lambda item: item.index)
        vectors = [list(map(float, row.embedding)) for row in rows]
    if len(vectors) != len(texts):
        raise LLMError(
            f"The LLM server returned {len(vectors)} embeddings for {len(texts)} texts.", kind="bad_response"
        )
    return vectors
