"""A small real OpenAI-compatible HTTP server, scripted per test, so LLM tests run the real client.

It lives in `lib` because the demo data set runs its alignment experiment against it too (a
deterministic scripted judge, `lib.demo.experiment`), and the demo must not import from tests/.
It binds 127.0.0.1 only and answers nothing unless scripted.

It speaks `POST /v1/chat/completions` (JSON and SSE streaming), `POST /v1/embeddings` and
`GET /v1/models` on 127.0.0.1 with an ephemeral port. Each chat request takes the next scripted
reply from a queue; when the queue is empty, `responder(request_json)` decides (if set), else
`default_reply`. Replies can also fail the way real servers do: 429/500 with headers, a stall
longer than the client timeout, a 200 with a body that is not a completion, a stream cut short.

    with running_llm_server() as server:
        server.script(text("hello"), rate_limited(), json_reply({"ok": True}))
        ... point OPENAI_BASE_URL at server.base_url ...
        assert server.requests[0]["messages"] == [...]

Server behaviours that real servers have, switched on per test (issue 18):
- `lib.llm.uses_tools`' probe (a forced call to `overrule_probe`) is answered by the server itself,
  with the call, or in words when `ignore_tools` (llama.cpp with an ordinary chat template); probes
  are recorded in `probes`, not in `requests`, so scripts and request indexes stay as they were.
- `json_schema_status=500` answers `response_format: json_schema` as llama.cpp does;
  `reject_response_format` refuses every `response_format` with a 400.
- `max_tokens` is honoured: a longer reply is cut to that many words with `finish_reason: length`.
- `context_words`: a prompt longer than this many words gets llama.cpp's context-size 400.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class TextReply:
    """An assistant message; served as SSE (split on spaces) when the request asks to stream."""

    content: str
    finish_reason: str = "stop"


@dataclass(frozen=True)
class ToolCallReply:
    """An assistant message that calls functions; `arguments` may be a dict or raw (possibly bad) text."""

    calls: tuple[tuple[str, dict[str, Any] | str], ...]


@dataclass(frozen=True)
class StreamReply:
    """SSE chunks in order; `abort_after` cuts the connection after that many chunks, without [DONE]."""

    chunks: tuple[str, ...]
    delay: float = 0.0
    abort_after: int | None = None
    finish_reason: str | None = "stop"


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error status with an OpenAI-shaped (or any) body and extra headers."""

    status: int
    body: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class StallReply:
    """Accept the request, then say nothing for `seconds` (longer than the client timeout)."""

    seconds: float = 5.0


@dataclass(frozen=True)
class MalformedReply:
    """A 200 whose body is not a chat completion."""

    body: str
    content_type: str = "application/json"


Reply = TextReply | ToolCallReply | StreamReply | ErrorReply | StallReply | MalformedReply

# Retry quickly: the openai client honours retry-after-ms before its own exponential backoff.
FAST_RETRY = (("retry-after-ms", "1"),)


def text(content: str, finish_reason: str = "stop") -> TextReply:
    """A plain text reply."""
    return TextReply(content, finish_reason)


def json_reply(obj: Any) -> TextReply:
    """A reply whose content is `obj` serialized as JSON, as a model in JSON mode would answer."""
    return TextReply(json.dumps(obj))


def tool_call(name: str, arguments: dict[str, Any] | str) -> ToolCallReply:
    """A reply calling one function."""
    return ToolCallReply(((name, arguments),))


def stream(
    chunks: Sequence[str],
    *,
    delay: float = 0.0,
    abort_after: int | None = None,
    finish_reason: str | None = "stop",
) -> StreamReply:
    """A streamed reply; `finish_reason=None` ends the stream cleanly but without a finish reason."""
    return StreamReply(tuple(chunks), delay, abort_after, finish_reason)


def http_error(
    status: int,
    message: str = "scripted failure",
    *,
    headers: Sequence[tuple[str, str]] = FAST_RETRY,
    param: str | None = None,
) -> ErrorReply:
    """An HTTP error with an OpenAI-style error body."""
    body = {"error": {"message": message, "type": "scripted_error", "param": param, "code": None}}
    return ErrorReply(status, json.dumps(body), tuple(headers))


def rate_limited() -> ErrorReply:
    """A 429 telling the client to retry almost immediately."""
    return http_error(429, "Rate limit reached", headers=(("retry-after-ms", "1"), ("retry-after", "0")))


def server_error() -> ErrorReply:
    """A 500 the client will retry."""
    return http_error(500, "The server had an error while processing your request")


def stall(seconds: float = 5.0) -> StallReply:
    """No answer for longer than the client waits."""
    return StallReply(seconds)


def malformed(
    body: str = "<html>502 Bad Gateway</html>", content_type: str = "application/json"
) -> MalformedReply:
    """A 200 whose body is not a completion."""
    return MalformedReply(body, content_type)


RESPONSE_FORMAT_REJECTION = http_error(
    400,
    "Invalid parameter: 'response_format' of type 'json_object' is not supported with this model.",
    headers=(),
    param="response_format",
)


def fake_embedding(text_value: str, dim: int) -> list[float]:
    """A deterministic unit-free vector for a text, so equal texts embed equally."""
    out: list[float] = []
    counter = 0
    while len(out) < dim:
        digest = hashlib.sha256(f"{counter}:{text_value}".encode()).digest()
        out.extend(b / 255.0 - 0.5 for b in digest)
        counter += 1
    return out[:dim]


def _word_count(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content") or "").split()) for m in messages if isinstance(m, dict))


def _capped(reply: Reply, max_tokens: Any) -> Reply:
    """A text reply cut to `max_tokens` words (one word per token), as a server stops at the cap."""
    if not isinstance(max_tokens, int) or not isinstance(reply, TextReply):
        return reply
    words = reply.content.split(" ")
    if len(reply.content.split()) <= max_tokens:
        return reply
    return TextReply(" ".join(words[:max_tokens]), "length")


@dataclass
class LLMServer:
    """The running server and its script; tests read `requests` to see exactly what was sent."""

    default_reply: Reply = field(default_factory=lambda: TextReply("ok"))
    responder: Callable[[dict[str, Any]], Reply | str | dict[str, Any]] | None = None
    reject_response_format: bool = False
    json_schema_status: int | None = None
    ignore_tools: bool = False
    context_words: int | None = None
    embedding_dim: int = 8
    model_ids: tuple[str, ...] = ("test-model",)
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()

    @property
    def base_url(self) -> str:
        """The URL to give OPENAI_BASE_URL."""
        if self._httpd is None:
            raise RuntimeError("server is not running")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Bodies of the chat-completion requests only, in arrival order."""
        with self._lock:
            return [
                r for r, p in zip(self.requests, self.paths, strict=True) if p.endswith("/chat/completions")
            ]

    def script(self, *replies: Reply) -> None:
        """Queue replies for the next chat requests, in order."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet used; tests assert 0 to prove every scripted step happened."""
        with self._lock:
            return len(self._queue)

    def start(self) -> LLMServer:
        """Bind 127.0.0.1 on a free port and serve in a daemon thread."""
        handler = type("_BoundHandler", (_Handler,), {"llm": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        # A short poll interval keeps stop() (and so every test teardown) quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="llm-test-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Wake stalled handlers and shut the listener down."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # Keep-alive connections outlive the listener; cut them so a stopped server really is gone.
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> LLMServer:
        return self if self._httpd is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _record(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        with self._lock:
            self.requests.append(body)
            self.paths.append(path)
            self.headers.append(headers)

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            produced = self.responder(body)
            if isinstance(produced, str):
                return TextReply(produced)
            if isinstance(produced, dict):
                return json_reply(produced)
            return produced
        return self.default_reply

    def next_reply_for(self, body: dict[str, Any]) -> Reply:
        """The reply for a chat request; JSON-mode rejection wins over the script, like a real server."""
        if self.reject_response_format and "response_format" in body:
            return RESPONSE_FORMAT_REJECTION
        fmt = body.get("response_format")
        if self.json_schema_status and isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            return http_error(
                self.json_schema_status,
                'response_format type must be one of "text" or "json_object", but got: json_schema',
                headers=(),
            )
        if self.context_words is not None and _word_count(body.get("messages")) > self.context_words:
            return http_error(
                400,
                "the request exceeds the available context size, try increasing it",
                headers=(),
            )
        return self._next_reply(body)

    def probe_reply(self, body: dict[str, Any]) -> Reply | None:
        """The answer to `lib.llm.uses_tools`' probe, or None when the request is no probe."""
        names = [t.get("function", {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        if "overrule_probe" not in names:
            return None
        with self._lock:
            self.probes.append(body)
        return text("I would call overrule_probe.") if self.ignore_tools else tool_call("overrule_probe", {})


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 gives chunked streaming, so a cut stream is visible to the client as an error.
    protocol_version = "HTTP/1.1"
    llm: LLMServer

    def setup(self) -> None:
        super().setup()
        with self.llm._lock:
            self.llm._connections.add(self.connection)

    def finish(self) -> None:
        with self.llm._lock:
            self.llm._connections.discard(self.connection)
        with suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep pytest output clean."""

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "test"} for m in self.llm.model_ids
            ]
            self._send_json(200, {"object": "list", "data": data})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsable": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in self.headers.items()}
        probe = self.llm.probe_reply(body) if self.path == "/v1/chat/completions" else None
        if probe is not None:
            self._send_json(200, self._completion(body, probe))
            return
        self.llm._record(self.path, body, headers)
        try:
            if self.path == "/v1/chat/completions":
                self._chat(body)
            elif self.path == "/v1/embeddings":
                self._embeddings(body)
            else:
                self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (timeout) before we answered; that is the scripted point.
            self.close_connection = True

    # -- chat -------------------------------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        reply = self.llm.next_reply_for(body)
        reply = _capped(reply, body.get("max_tokens"))
        wants_stream = bool(body.get("stream"))
        if isinstance(reply, StallReply):
            self.llm._stopping.wait(reply.seconds)
            self.close_connection = True
            return
        if isinstance(reply, ErrorReply):
            self._send_raw(reply.status, reply.body.encode(), "application/json", reply.headers)
            return
        if isinstance(reply, MalformedReply):
            self._send_raw(200, reply.body.encode(), reply.content_type)
            return
        if wants_stream:
            if isinstance(reply, TextReply):
                words = reply.content.split(" ")
                pieces = [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]
                reply = StreamReply(tuple(pieces), finish_reason=reply.finish_reason)
            if isinstance(reply, StreamReply):
                self._stream(body, reply)
                return
            self._send_json(500, {"error": {"message": "test server cannot stream tool calls"}})
            return
        self._send_json(200, self._completion(body, reply))

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message: dict[str, Any]
        if isinstance(reply, ToolCallReply):
            calls = [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": name,
                        "arguments": args if isinstance(args, str) else json.dumps(args),
                    },
                }
                for i, (name, args) in enumerate(reply.calls)
            ]
            message, finish, content = (
                {"role": "assistant", "content": None, "tool_calls": calls},
                "tool_calls",
                "",
            )
        elif isinstance(reply, StreamReply):
            content = "".join(reply.chunks)
            message, finish = {"role": "assistant", "content": content}, reply.finish_reason or "stop"
        else:
            assert isinstance(reply, TextReply)
            content = reply.content
            message, finish = {"role": "assistant", "content": content}, reply.finish_reason
        prompt_tokens, completion_tokens = _word_count(body.get("messages")), len(content.split())
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "test-model"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _stream(self, body: dict[str, Any], reply: StreamReply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        model = body.get("model", "test-model")

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        for i, piece in enumerate(reply.chunks):
            if reply.abort_after is not None and i >= reply.abort_after:
                self._abort()
                return
            if i and reply.delay:
                self.llm._stopping.wait(reply.delay)
            delta = {"role": "assistant", "content": piece} if i == 0 else {"content": piece}
            self._write_event(chunk(delta, None))
        if reply.abort_after is not None:
            self._abort()
            return
        if reply.finish_reason is not None:
            self._write_event(chunk({}, reply.finish_reason))
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _write_event(self, payload: dict[str, Any]) -> None:
        self._write_chunk(f"data: {json.dumps(payload)}\n\n".encode())

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _abort(self) -> None:
        # No terminating zero-length chunk: the client sees an incomplete chunked body.
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    # -- embeddings -------------------------------------------------------------------------------

    def _embeddings(self, body: dict[str, Any]) -> None:
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        data = []
        for i, t in enumerate(texts):
            vector = fake_embedding(str(t), self.llm.embedding_dim)
            encoded: Any = vector
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(len(str(t).split()) for t in texts)
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model"),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def _send_json(self, status: int, payload: dict[str, Any]) -> None:
        self._send_raw(status, json.dumps(payload).encode(), "application/json")

    def _send_raw(
        self, status: int, data: bytes, content_type: str, headers: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


def start_llm_server(**options: Any) -> LLMServer:
    """Start a server (options are `LLMServer` fields); the caller must `stop()` it."""
    return LLMServer(**options).start()


@contextmanager
def running_llm_server(**options: Any) -> Iterator[LLMServer]:
    """A server that stops when the block ends."""
    server = start_llm_server(**options)
    try:
        yield server
    finally:
        server.stop()
