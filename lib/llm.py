"""LLM access (SPEC §7): the only module that builds an OpenAI client.

Any OpenAI-compatible server works (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM), so nothing here
assumes more than `/chat/completions` and `/embeddings`: JSON mode is requested but not relied on,
replies are parsed tolerantly, and every client failure becomes an `LLMError` whose message a
reviewer can act on. Without a key or base URL, calls raise `LLMNotConfigured` and the UI shows
its message instead of a traceback.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import openai
from openai.types.chat import ChatCompletion

from lib.config import Settings, env_name, get_settings

log = logging.getLogger(__name__)

NOT_CONFIGURED_MESSAGE = (
    "No LLM is configured, so LLM actions are disabled (reviewing, corrections and notes still work). "
    "Set OPENAI_API_KEY to use OpenAI, or OPENAI_BASE_URL to use an OpenAI-compatible server such as "
    "vLLM, Ollama or llama.cpp, in the environment or in .streamlit/secrets.toml, then restart."
)
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
# Local servers ignore the key, but the client refuses to start without one.
PLACEHOLDER_API_KEY = "not-needed"
JSON_INSTRUCTION = "Reply with a single JSON object and nothing else."
_MAX_CACHED_CLIENTS = 8


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
_no_json_mode: set[str] = set()
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
        _no_json_mode.clear()
    for client in clients:
        client.close()


def _describe(exc: Exception, settings: Settings) -> LLMError:
    """Turn an openai/transport failure into a message that says what happened and what to do."""
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


def chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    temperature: float = 0.0,
    tools: Sequence[Mapping[str, Any]] | None = None,
    settings: Settings | None = None,
) -> ChatResult:
    """One chat completion; failures surface as `LLMError`, never as openai exceptions."""
    settings = settings or get_settings()
    client = get_client(settings)
    extra: dict[str, Any] = {"tools": [dict(t) for t in tools]} if tools else {}
    with _translated_errors(settings):
        completion = client.chat.completions.create(
            model=model, messages=cast(Any, _as_messages(messages)), temperature=temperature, **extra
        )
        return _to_result(completion)


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


def _rejects_response_format(exc: openai.APIStatusError) -> bool:
    if exc.status_code not in (400, 422):
        return False
    return "response_format" in f"{exc.message} {json.dumps(exc.body, default=str)}"


def chat_json(
    messages: Sequence[Mapping[str, Any]],
    *,
    model: str,
    schema_hint: str | None = None,
    settings: Settings | None = None,
) -> dict[str, Any]:
    """A chat completion whose reply must be one JSON object; JSON mode where the server has it."""
    settings = settings or get_settings()
    client = get_client(settings)
    base_url = _client_key(settings)[1]
    sent = cast(Any, _with_json_instruction(messages, schema_hint))
    with _translated_errors(settings):
        completion: object
        if base_url in _no_json_mode:
            completion = client.chat.completions.create(model=model, messages=sent, temperature=0.0)
        else:
            try:
                completion = client.chat.completions.create(
                    model=model, messages=sent, temperature=0.0, response_format={"type": "json_object"}
                )
            except openai.APIStatusError as exc:
                if not _rejects_response_format(exc):
                    raise
                log.info("%s has no JSON mode; asking for JSON in the prompt only", base_url)
                with _lock:
                    _no_json_mode.add(base_url)
                completion = client.chat.completions.create(model=model, messages=sent, temperature=0.0)
        result = _to_result(completion)
    try:
        return parse_json_loose(result.text)
    except LLMError as exc:
        if result.finish_reason == "length":
            raise LLMError(
                "The model's reply was cut off at its token limit before the JSON was complete.",
                kind="invalid_json",
            ) from exc
        raise


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
) -> Iterator[str]:
    """Text deltas of a streamed reply (for `st.write_stream`); the request is sent before returning."""
    settings = settings or get_settings()
    client = get_client(settings)
    # Sending eagerly means configuration, HTTP and retry failures raise here, before any output.
    with _translated_errors(settings):
        response = client.chat.completions.create(
            model=model, messages=cast(Any, _as_messages(messages)), stream=True
        )
    return _stream_deltas(response, settings)


def _stream_deltas(response: Any, settings: Settings) -> Iterator[str]:
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
