"""The OTLP/HTTP receiver (issue 29.1): GenAI spans and evaluation events sent by the OpenTelemetry
SDK's own exporters and encoders become evaluations, over real HTTP (uvicorn; the Streamlit server
for the end-to-end test with the instrumented `openai` client)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import Engine
from sqlmodel import Session, select
from starlette.applications import Starlette
from starlette.routing import Mount

from lib import otlp, otlp_table
from lib.api import API_PREFIX, create_app, otlp_root_routes
from lib.auth import system_actor
from lib.db import session_scope
from lib.importer import import_metrics
from lib.judge_versions import AUDIT_ACTION
from lib.models import AuditEvent, EvaluationSnapshot, Judgment, MetricDefinition, OtlpSpan
from lib.tokens import create_token
from tests.pages.conftest import APPTEST_TIMEOUT
from tests.test_api import count, serving

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON_TYPE = {"Content-Type": "application/json"}
EVAL = "gen_ai.evaluation.result"


class Receiver:
    """The API (with OTLP's root paths, as serve.py mounts them) on uvicorn, and a lead's token."""

    def __init__(self, base: str, engine: Engine, secrets: dict[str, str]) -> None:
        self.base, self.engine, self.secrets = base, engine, secrets

    def post(self, path: str, body: bytes, role: str = "lead", **headers: str) -> httpx.Response:
        sent = {"Authorization": f"Bearer {self.secrets[role]}", **PROTOBUF, **headers}
        return httpx.post(self.base + path, content=body, headers=sent, timeout=30)


@contextmanager
def _receiving(engine: Engine) -> Iterator[Receiver]:
    secrets = {}
    with Session(engine) as session:
        for role in ("viewer", "lead"):
            _, secrets[role] = create_token(
                session=session, actor=system_actor(), name=f"o-{role}", role=role
            )
        session.commit()
    api = create_app(engine, max_json_mb=1)
    with serving(Starlette(routes=[Mount(API_PREFIX, app=api), *otlp_root_routes(api)])) as port:
        yield Receiver(f"http://127.0.0.1:{port}", engine, secrets)


@pytest.fixture
def receiver(sqlite_engine: Engine) -> Iterator[Receiver]:
    with _receiving(sqlite_engine) as running:
        yield running


@pytest.fixture
def any_receiver(engine: Engine) -> Iterator[Receiver]:
    """On SQLite and PostgreSQL: the join's reads and writes under the import lock."""
    with _receiving(engine) as running:
        yield running


def _chat_attributes(question: str, answer: str | None, **attrs: Any) -> dict[str, Any]:
    """A chat span's attributes as GenAI instrumentation records them."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m1",
        "gen_ai.input.messages": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": question}]}]
        ),
        **attrs,
    }
    if answer is not None:
        attributes["gen_ai.output.messages"] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}]
        )
    return attributes


class Telemetry:
    """An SDK tracer and logger whose spans and log records are kept to be encoded as OTLP."""

    def __init__(self, service: str = "support-bot") -> None:
        resource = Resource.create({"service.name": service})
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.tracer = self.tracer_provider.get_tracer("test")
        self.logger = self.logger_provider.get_logger("judge")

    def call(
        self, question: str, answer: str | None, *, events: dict[str, float] | None = None, **attrs: Any
    ) -> Any:
        """A chat span as GenAI instrumentation records it, with evaluation span events."""
        with self.tracer.start_as_current_span(
            "chat m1", attributes=_chat_attributes(question, answer, **attrs)
        ) as span:
            for name, score in (events or {}).items():
                span.add_event(EVAL, {"gen_ai.evaluation.name": name, "gen_ai.evaluation.score.value": score})
        return span.get_span_context()

    def labelled(self, question: str, name: str, label: str, score: float | None = None) -> None:
        """A chat span with one evaluation event that has a label and no score (or `score` too)."""
        with self.tracer.start_as_current_span(
            "chat m1", attributes=_chat_attributes(question, "A.")
        ) as span:
            attributes: dict[str, Any] = {
                "gen_ai.evaluation.name": name,
                "gen_ai.evaluation.score.label": label,
            }
            if score is not None:
                attributes["gen_ai.evaluation.score.value"] = score
            span.add_event(EVAL, attributes)

    def verdict(self, name: str, score: float, context: Any = None, **attrs: Any) -> None:
        """A `gen_ai.evaluation.result` event as a log record, in the judged span's context (None:
        the current span's, as the SDK stamps a record emitted inside a span)."""
        ctx = trace.set_span_in_context(trace.NonRecordingSpan(context)) if context is not None else None
        self.logger.emit(
            event_name=EVAL,
            context=ctx,
            attributes={"gen_ai.evaluation.name": name, "gen_ai.evaluation.score.value": score, **attrs},
        )

    def traces(self) -> bytes:
        body = encode_spans(self.spans.get_finished_spans()).SerializeToString()
        self.spans.clear()
        return body

    def log_body(self) -> bytes:
        body = encode_logs(self.logs.get_finished_logs()).SerializeToString()
        self.logs.clear()
        return body


def scored(engine: Engine) -> set[tuple[str, str]]:
    """(question, metric) of every judge score stored: which call each verdict went to."""
    with Session(engine) as session:
        return {
            (s.question, m) for s in session.exec(select(EvaluationSnapshot)) for m in s.judge_scores_json
        }


def judgments(engine: Engine) -> dict[str, tuple[str, str | None]]:
    with Session(engine) as session:
        return {j.metric: (j.decision, j.reasoning) for j in session.exec(select(Judgment))}


def test_span_events_and_late_log_events_join_their_span_and_resends_add_nothing(
    any_receiver: Receiver,
) -> None:
    receiver = any_receiver
    t = Telemetry()
    ctx = t.call("Capital of France?", "Paris.", events={"truthfulness": 5, "clarity": 4})
    waiting = t.call("Capital of Spain?", "Madrid.")  # judged later, by log records
    r = receiver.post("/v1/traces", t.traces())
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-protobuf"
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    assert count(receiver.engine, EvaluationSnapshot) == 1
    assert judgments(receiver.engine) == {"truthfulness": ("5", None), "clarity": ("4", None)}

    t.verdict("helpfulness", 3, ctx, **{"gen_ai.evaluation.explanation": "terse"})  # after its span
    t.verdict("safety", 5, waiting)
    logs = t.log_body()
    r = receiver.post(f"{API_PREFIX}/otlp/v1/logs", logs)
    assert r.status_code == 200, r.text
    assert not ExportLogsServiceResponse.FromString(r.content).HasField("partial_success")
    with Session(receiver.engine) as session:
        snapshots = {s.question: s for s in session.exec(select(EvaluationSnapshot))}
        assert set(snapshots["Capital of France?"].judge_scores_json) == {
            "truthfulness",
            "clarity",
            "helpfulness",
        }
        assert snapshots["Capital of France?"].judge_scores_json["helpfulness"]["reason"] == "terse"
        assert snapshots["Capital of Spain?"].model_answer == "Madrid."
        assert snapshots["Capital of Spain?"].product == "support-bot"
        assert snapshots["Capital of Spain?"].model_name == "m1"
    assert count(receiver.engine, Judgment) == 4

    # The same export again (both signals), gzip this time: nothing new.
    t.call("Capital of France?", "Paris.", events={"truthfulness": 5, "clarity": 4})
    assert (
        receiver.post("/v1/traces", gzip.compress(t.traces()), **{"Content-Encoding": "gzip"}).status_code
        == 200
    )
    assert receiver.post("/v1/logs", logs).status_code == 200
    assert count(receiver.engine, EvaluationSnapshot) == 2
    assert count(receiver.engine, Judgment) == 4


def test_a_span_sent_again_with_other_content_is_answered_with_a_warning(
    any_receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """review14 F7: a span already an evaluation, sent again with the same trace and span ids but
    another product and score, answered `{}` and changed nothing, in silence. A span is still
    taken once (an exporter's retry re-sends it and must add nothing), but what this copy carries
    that was not stored is said: OTLP's partial success with 0 rejected (the proto allows a warning
    in a fully accepted request) and the server's log line. An exact re-send says nothing; a late
    log record with another score for a metric the evaluation has is said the same way."""
    receiver = any_receiver
    t = Telemetry("shop-bot")
    span_context = t.call("Capital of Chile?", "Santiago.", events={"truthfulness": 5})
    request = encode_spans(t.spans.get_finished_spans())
    for _ in range(2):  # the export, then the SDK's retry of the same body
        r = receiver.post("/v1/traces", request.SerializeToString())
        assert r.status_code == 200 and not r.content, r.content
    resource = request.resource_spans[0]
    [product] = [kv for kv in resource.resource.attributes if kv.key == "service.name"]
    product.value.string_value = "other-bot"
    [score] = [
        kv for kv in resource.scope_spans[0].spans[0].events[0].attributes
        if kv.key == "gen_ai.evaluation.score.value"
    ]  # fmt: skip
    score.value.double_value = 1
    with caplog.at_level("WARNING", logger="lib.api"):
        r = receiver.post("/v1/traces", request.SerializeToString())
    assert r.status_code == 200
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 0
    with Session(receiver.engine) as session:
        [stored] = session.exec(select(EvaluationSnapshot)).all()
    assert (stored.product, stored.judge_scores_json["truthfulness"]["score"]) == ("shop-bot", 5.0)
    assert f"is evaluation {stored.id} (product 'shop-bot') already" in partial.error_message
    assert "this copy's other product 'other-bot' was not stored" in partial.error_message
    assert f"'truthfulness' 1 was not taken: evaluation {stored.id} keeps its 5" in partial.error_message
    assert any("0 rejected" in m and "was not taken" in m for m in caplog.messages), caplog.messages
    # the same for a log record naming the span: another score of a metric it has is said, a new one added
    t.verdict("truthfulness", 2, span_context)
    t.verdict("clarity", 4, span_context)
    r = receiver.post("/v1/logs", t.log_body())
    partial = ExportLogsServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_log_records == 0
    assert partial.error_message.endswith(
        f"'truthfulness' 2 was not taken: evaluation {stored.id} keeps its 5 (a metric's verdict is taken "
        "once; re-judge it in Overrule)"
    )
    assert judgments(receiver.engine) == {"truthfulness": ("5", None), "clarity": ("4", None)}


@pytest.mark.parametrize("one_request", [False, True], ids=["two requests", "one request"])
def test_a_second_call_of_the_same_content_says_its_other_score_on_the_first_send_as_on_a_retry(
    any_receiver: Receiver, one_request: bool
) -> None:
    """review16 M1: two calls with the same product, question, answer and model are one evaluation;
    the second's other judge score was dropped in silence on its first send, and the exporter's
    byte-identical retry of that request was then answered "… was not taken". A retry must say what
    the first send said: both say it now. The same score from the second call says nothing."""
    receiver = any_receiver
    t = Telemetry("shop-bot")
    t.call("Capital of Chile?", "Santiago.", events={"truthfulness": 5})
    if not one_request:
        assert not receiver.post("/v1/traces", t.traces()).content
    t.call("Capital of Chile?", "Santiago.", events={"truthfulness": 3})
    t.call("Capital of Chile?", "Santiago.", events={"truthfulness": 5})  # the same score: nothing to say
    second = t.traces()
    answers = [receiver.post("/v1/traces", second).content for _ in range(2)]  # the send, the retry
    assert answers[0] == answers[1]
    partial = ExportTraceServiceResponse.FromString(answers[0]).partial_success
    with Session(receiver.engine) as session:
        [stored] = session.exec(select(EvaluationSnapshot)).all()
    assert partial.rejected_spans == 0
    assert partial.error_message.count("was not taken") == 1, partial.error_message
    assert f"'truthfulness' 3 was not taken: evaluation {stored.id} keeps its 5" in partial.error_message
    assert judgments(receiver.engine) == {"truthfulness": ("5", None)}


def test_events_before_their_span_wait_and_join_it_by_response_id(receiver: Receiver) -> None:
    t = Telemetry()
    t.verdict("truthfulness", 2, None, **{"gen_ai.response.id": "chatcmpl-42"})
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    assert count(receiver.engine, EvaluationSnapshot) == 0
    with Session(receiver.engine) as session:
        waiting = session.exec(select(OtlpSpan)).one()
        assert waiting.key == "response:chatcmpl-42" and waiting.pending_json[0]["metric"] == "truthfulness"
    t.call("What is 2+2?", "5", **{"gen_ai.response.id": "chatcmpl-42"})
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    assert judgments(receiver.engine) == {"truthfulness": ("2", None)}
    with Session(receiver.engine) as session:
        assert [row.snapshot_id is not None for row in session.exec(select(OtlpSpan))] == [True]


@pytest.mark.parametrize("logs_first", [False, True], ids=["spans first", "logs first"])
def test_a_judge_inside_a_request_span_joins_by_the_response_id_it_names(
    any_receiver: Receiver, logs_first: bool
) -> None:
    """The judge runs inside a web handler's span, after the chat span ended: the SDK stamps the
    handler's ids on its log records. The response id the record names wins over that context
    (before, the verdicts waited under the handler span, which is no GenAI call, and were lost)."""
    receiver = any_receiver
    t = Telemetry()
    with t.tracer.start_as_current_span("POST /ask"):
        t.call("Capital of Italy?", "Rome.", **{"gen_ai.response.id": "chatcmpl-7"})
        t.verdict(
            "truthfulness", 5, None, **{"gen_ai.response.id": "chatcmpl-7"}
        )  # no context given: the current span's, the handler's
    assert t.logs.get_finished_logs()[0].log_record.span_id != 0  # stamped with the handler span
    posts = [("/v1/traces", t.traces()), ("/v1/logs", t.log_body())]
    for path, body in reversed(posts) if logs_first else posts:
        r = receiver.post(path, body)
        assert r.status_code == 200 and not r.content, r.content  # no partial success
    assert judgments(receiver.engine) == {"truthfulness": ("5", None)}
    with Session(receiver.engine) as session:
        assert [row.snapshot_id is not None for row in session.exec(select(OtlpSpan))] == [True]


@pytest.mark.parametrize("logs_first", [False, True], ids=["spans first", "logs first"])
def test_a_call_that_waited_is_linked_like_one_joined_at_once(
    any_receiver: Receiver, logs_first: bool
) -> None:
    """A call's waiting row (its span's, or its verdicts') becomes its link row in place
    (lib.otlp._relink): the call's response id and evaluation, no span or verdicts kept, received
    when linked, as the row of a span sent with its events."""
    receiver = any_receiver
    t = Telemetry()
    t.call("Capital of Peru?", "Lima.", events={"truthfulness": 4}, **{"gen_ai.response.id": "chatcmpl-1"})
    waited = t.call("Capital of Chile?", "Santiago.", **{"gen_ai.response.id": "chatcmpl-2"})
    t.verdict("truthfulness", 3, waited)
    posts = [("/v1/traces", t.traces()), ("/v1/logs", t.log_body())]
    first, second = reversed(posts) if logs_first else posts
    key = f"{waited.trace_id:032x}:{waited.span_id:016x}"
    assert receiver.post(*first).status_code == 200
    with Session(receiver.engine) as session:
        waiting = session.get(OtlpSpan, key)
        assert waiting is not None and waiting.snapshot_id is None
        waited_since = waiting.received_at
    assert receiver.post(*second).status_code == 200
    with Session(receiver.engine) as session:
        ids = {s.question: s.id for s in session.exec(select(EvaluationSnapshot))}
        rows = {row.response_id: row for row in session.exec(select(OtlpSpan))}
        assert sorted(rows) == ["chatcmpl-1", "chatcmpl-2"]
        linked = {rid: (row.snapshot_id, row.span_json, row.pending_json) for rid, row in rows.items()}
        assert linked == {
            "chatcmpl-1": (ids["Capital of Peru?"], None, []),
            "chatcmpl-2": (ids["Capital of Chile?"], None, []),
        }
        assert rows["chatcmpl-2"].key == key and rows["chatcmpl-2"].received_at > waited_since
        # SQL NULL, not JSON null: both read back as None
        nulls = select(OtlpSpan.key).where(OtlpSpan.span_json.is_(None))  # type: ignore[union-attr]
        assert len(session.exec(nulls).all()) == 2
    assert count(receiver.engine, Judgment) == 2


def test_a_waiting_row_that_holds_another_response_id_is_linked_with_the_calls(
    any_receiver: Receiver,
) -> None:
    """A verdict sent before its call, in the call's span context, waits under the span with the
    gen_ai.response.id it names (so a call recording that id finds it). The call's link row holds
    the call's own id, as a span sent with its events would: none when the span records none, the
    span's when the verdict named none. `_relink` sets `response_id` only for rows that hold another
    (SQLite rewrites an indexed column's entry whenever it is set); this fails if the waiting row's
    id were kept."""
    receiver = any_receiver
    t = Telemetry()
    none = t.call("Capital of Peru?", "Lima.")  # records no response id
    same = t.call("Capital of Chile?", "Santiago.", **{"gen_ai.response.id": "chatcmpl-8"})
    other = t.call("Capital of Kenya?", "Nairobi.", **{"gen_ai.response.id": "chatcmpl-9"})
    t.verdict("truthfulness", 4, none, **{"gen_ai.response.id": "chatcmpl-7"})
    t.verdict("truthfulness", 5, same, **{"gen_ai.response.id": "chatcmpl-8"})
    t.verdict("truthfulness", 3, other)  # names no response id
    keys = {
        f"{c.trace_id:032x}:{c.span_id:016x}": name
        for c, name in ((none, "none"), (same, "same"), (other, "other"))
    }
    spans = t.traces()
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    with Session(receiver.engine) as session:
        waiting = {
            keys[row.key]: (row.response_id, row.snapshot_id) for row in session.exec(select(OtlpSpan))
        }
    assert waiting == {"none": ("chatcmpl-7", None), "same": ("chatcmpl-8", None), "other": (None, None)}
    assert receiver.post("/v1/traces", spans).status_code == 200
    with Session(receiver.engine) as session:
        ids = {s.question: s.id for s in session.exec(select(EvaluationSnapshot))}
        linked = {
            keys[row.key]: (row.response_id, row.snapshot_id, row.span_json, row.pending_json)
            for row in session.exec(select(OtlpSpan))
        }
    assert linked == {
        "none": (None, ids["Capital of Peru?"], None, []),
        "same": ("chatcmpl-8", ids["Capital of Chile?"], None, []),
        "other": ("chatcmpl-9", ids["Capital of Kenya?"], None, []),
    }


@pytest.mark.parametrize("days", [0, otlp_table.PENDING_DAYS + 1], ids=["linked now", "linked long ago"])
def test_a_verdict_naming_a_response_id_joins_only_a_call_linked_in_the_last_week(
    any_receiver: Receiver, days: int
) -> None:
    """A verdict that names a gen_ai.response.id outside any span joins the call that records it
    when that call was stored in the last PENDING_DAYS (lib.otlp `_Join._named`); an older call's
    id may be another's by now (ids repeat with some servers), so the verdict waits under the id.
    The rows' time is read as the driver hands it back (text on SQLite) and parsed only here."""
    from datetime import timedelta

    from sqlalchemy import update

    from lib.models import utcnow

    receiver = any_receiver
    t = Telemetry()
    t.call("Capital of Peru?", "Lima.", events={"truthfulness": 4}, **{"gen_ai.response.id": "chatcmpl-5"})
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    with session_scope(receiver.engine) as session:
        then = utcnow() - timedelta(days=days)
        session.execute(update(OtlpSpan).values(received_at=then))  # type: ignore[arg-type]
    t.verdict("clarity", 2, None, **{"gen_ai.response.id": "chatcmpl-5"})
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    with Session(receiver.engine) as session:
        keys = sorted(row.key for row in session.exec(select(OtlpSpan)))
    assert count(receiver.engine, Judgment) == (2 if days == 0 else 1)
    assert ("response:chatcmpl-5" in keys) == (days > 0)


def _handler_trace(t: Telemetry, question: str, calls: int = 1, **verdict_attrs: Any) -> None:
    """A web handler's span around `calls` chat calls and a judge's verdict emitted in the
    handler's context (the SDK stamps the current span), naming what `verdict_attrs` add."""
    with t.tracer.start_as_current_span("POST /ask"):
        for i in range(calls):
            t.call(f"{question} ({i})" if calls > 1 else question, "Santiago.")
        t.verdict("truthfulness", 5, None, **verdict_attrs)


@pytest.mark.parametrize("order", ["logs, chat, handler", "chat and handler, logs"])
def test_a_verdict_in_a_handler_span_joins_the_one_call_of_its_trace(
    any_receiver: Receiver, order: str
) -> None:
    """A judge inside a handler's span that names no response id: its record points at the handler
    span, which is no call. It joins the one call of that trace, whichever arrives first."""
    receiver = any_receiver
    t = Telemetry()
    _handler_trace(t, "Capital of Chile?")
    chat, handler = t.spans.get_finished_spans()
    t.spans.clear()
    logs = t.log_body()
    posts = (
        [("/v1/logs", logs), ("/v1/traces", [chat]), ("/v1/traces", [handler])]
        if order.startswith("logs")
        else [("/v1/traces", [chat, handler]), ("/v1/logs", logs)]
    )
    for path, body in posts:
        sent = body if isinstance(body, bytes) else encode_spans(body).SerializeToString()
        r = receiver.post(path, sent)
        assert r.status_code == 200 and not r.content, r.content
    assert judgments(receiver.engine) == {"truthfulness": ("5", None)}
    with Session(receiver.engine) as session:
        assert [row.snapshot_id is not None for row in session.exec(select(OtlpSpan))] == [True]


def _call_a(t: Telemetry) -> None:
    """Call A, judged on truthfulness, with response id chatcmpl-4 (call B's too in the tests)."""
    t.call(
        "Call A: capital of Peru?",
        "Lima.",
        events={"truthfulness": 5},
        **{"gen_ai.response.id": "chatcmpl-4"},
    )


@pytest.mark.parametrize("emitted_in", ["its call's span", "a handler's span"])
def test_a_shared_response_id_with_logs_first_joins_the_verdicts_own_call(
    any_receiver: Receiver, emitted_in: str
) -> None:
    """Logs before spans (the SDK's default timing) and an id another trace's call already has: the
    verdict waits for its own call instead of joining the other one (Ollama draws ids from 999)."""
    receiver = any_receiver
    t = Telemetry()
    _call_a(t)  # judged, with the id call B will share
    assert receiver.post("/v1/traces", t.traces()).content == b""
    attrs = _chat_attributes(
        "Call B: capital of Chile?", "Buenos Aires.", **{"gen_ai.response.id": "chatcmpl-4"}
    )
    if emitted_in == "its call's span":
        with t.tracer.start_as_current_span("chat m1", attributes=attrs):
            t.verdict("helpfulness", 1, None, **{"gen_ai.response.id": "chatcmpl-4"})
    else:
        with t.tracer.start_as_current_span("POST /ask"):
            with t.tracer.start_as_current_span("chat m1", attributes=attrs):
                pass
            t.verdict("helpfulness", 1, None, **{"gen_ai.response.id": "chatcmpl-4"})
    assert receiver.post("/v1/logs", t.log_body()).content == b""
    r = receiver.post("/v1/traces", t.traces())
    assert r.status_code == 200 and not r.content, r.content
    assert scored(receiver.engine) == {
        ("Call A: capital of Peru?", "truthfulness"),
        ("Call B: capital of Chile?", "helpfulness"),
    }


def test_a_judge_in_another_trace_joins_the_call_its_response_id_names_once_its_span_shows_it_is_no_call(
    any_receiver: Receiver,
) -> None:
    """A judge in another process, in a span of its own, naming the call's response id: its verdict
    arrives first, then the call (another trace), then the judge's span, which is no call."""
    receiver = any_receiver
    app, judge = Telemetry(), Telemetry("judge-job")
    app.call("Capital of Kenya?", "Nairobi.", **{"gen_ai.response.id": "resp-k"})
    with judge.tracer.start_as_current_span("judge batch"):
        judge.verdict("truthfulness", 5, None, **{"gen_ai.response.id": "resp-k"})
    for body, path in (
        (judge.log_body(), "/v1/logs"),
        (app.traces(), "/v1/traces"),
        (judge.traces(), "/v1/traces"),
    ):
        r = receiver.post(path, body)
        assert r.status_code == 200 and not r.content, r.content
    assert judgments(receiver.engine) == {"truthfulness": ("5", None)}
    with Session(receiver.engine) as session:
        assert [row.snapshot_id is not None for row in session.exec(select(OtlpSpan))] == [True]


def test_a_verdict_naming_an_id_never_joins_its_traces_call_that_records_another(
    any_receiver: Receiver,
) -> None:
    """review10 F0: a handler's span around two calls (ids Y-7 and X-7), the verdict in the handler's
    context naming X-7; the call recording Y-7 and the handler arrive first. The verdict waits for
    X-7's call instead of joining the trace's only call so far."""
    receiver = any_receiver
    t = Telemetry()
    with t.tracer.start_as_current_span("POST /ask"):
        t.call("First question?", "First.", **{"gen_ai.response.id": "Y-7"})
        t.call("Second question?", "Second.", **{"gen_ai.response.id": "X-7"})
        t.verdict("truthfulness", 1, None, **{"gen_ai.response.id": "X-7"})
    logs = t.log_body()
    first, second, handler = t.spans.get_finished_spans()
    t.spans.clear()
    for path, body in (("/v1/logs", logs), ("/v1/traces", [first, handler]), ("/v1/traces", [second])):
        sent = body if isinstance(body, bytes) else encode_spans(body).SerializeToString()
        r = receiver.post(path, sent)
        assert r.status_code == 200 and not r.content, r.content
    assert scored(receiver.engine) == {("Second question?", "truthfulness")}


@pytest.mark.parametrize(
    "order", ["spans, then verdict", "verdict, then spans", "verdict, judge's span, judged span"]
)
@pytest.mark.parametrize("judge_in", ["another trace", "the judged call's trace"])
def test_a_verdict_in_a_judges_own_call_naming_another_id_joins_the_call_of_that_id(
    any_receiver: Receiver, order: str, judge_in: str
) -> None:
    """review10 L2: a judge whose own LLM call is a GenAI span (recording id resp-J) emits, in that
    span's context, a verdict naming the judged call's id resp-X. It joins the call recording resp-X,
    never the judge's call, whichever arrives first (before the judged call: it waits for its id)."""
    receiver = any_receiver
    t = Telemetry()
    with t.tracer.start_as_current_span("POST /ask") if judge_in != "another trace" else nullcontext():
        t.call("Judged: capital of Peru?", "Lima.", **{"gen_ai.response.id": "resp-X"})
        judge = t.call("Is 'Lima.' right for Peru?", "Yes: 5.", **{"gen_ai.response.id": "resp-J"})
    t.verdict("truthfulness", 5, judge, **{"gen_ai.response.id": "resp-X"})
    finished = t.spans.get_finished_spans()
    judged = [s for s in finished if (s.attributes or {}).get("gen_ai.response.id") == "resp-X"]
    spans = {
        "judged": judged,
        "judge": [s for s in finished if s not in judged],  # its call (and the handler)
        "both": finished,
    }
    logs = ("/v1/logs", t.log_body())
    by = {name: ("/v1/traces", encode_spans(body).SerializeToString()) for name, body in spans.items()}
    sent = {
        "spans, then verdict": [by["both"], logs],
        "verdict, then spans": [logs, by["both"]],
        "verdict, judge's span, judged span": [logs, by["judge"], by["judged"]],
    }[order]
    for path, body in sent:
        r = receiver.post(path, body)
        assert r.status_code == 200 and not r.content, r.content
    assert scored(receiver.engine) == {("Judged: capital of Peru?", "truthfulness")}
    with Session(receiver.engine) as session:
        rows = {row.response_id: row for row in session.exec(select(OtlpSpan))}
    assert rows["resp-J"].span_json is not None and not rows["resp-J"].pending_json  # waits unjudged
    assert rows["resp-X"].snapshot_id is not None and len(rows) == 2


@pytest.mark.parametrize(
    "order", ["logs, the call, the other id's call", "logs, the other id's call, the call"]
)
def test_a_calls_own_verdicts_stay_with_it_beside_a_verdict_naming_another_id(
    any_receiver: Receiver, order: str
) -> None:
    """review11 F3: in call S's context (S records resp-S) a verdict naming no id (S's own) and a
    judge's verdict naming resp-X, the logs first (the SDK's timing). Each goes by the id it names:
    clarity to S, truthfulness to resp-X's call, whichever of the two calls comes first. Before,
    the row's one response id took both to resp-X's call."""
    receiver = any_receiver
    t = Telemetry()
    with t.tracer.start_as_current_span("POST /ask"):
        own = t.call("Own: capital of Peru?", "Lima.", **{"gen_ai.response.id": "resp-S"})
        t.call("Other: capital of Chile?", "Santiago.", **{"gen_ai.response.id": "resp-X"})
    t.verdict("clarity", 4, own)
    t.verdict("truthfulness", 5, own, **{"gen_ai.response.id": "resp-X"})
    calls = {
        (s.attributes or {}).get("gen_ai.response.id"): encode_spans([s]).SerializeToString()
        for s in t.spans.get_finished_spans()
    }
    t.spans.clear()
    later = ["resp-S", "resp-X"] if order.endswith("other id's call") else ["resp-X", "resp-S"]
    for path, body in [("/v1/logs", t.log_body()), *(("/v1/traces", calls[rid]) for rid in later)]:
        r = receiver.post(path, body)
        assert r.status_code == 200 and not r.content, r.content
    assert scored(receiver.engine) == {
        ("Own: capital of Peru?", "clarity"),
        ("Other: capital of Chile?", "truthfulness"),
    }
    with Session(receiver.engine) as session:
        assert not any(row.pending_json for row in session.exec(select(OtlpSpan)))


@pytest.mark.parametrize("order", ["span first", "verdict first"])
def test_a_verdict_in_a_calls_own_context_naming_an_id_it_does_not_record_waits_for_that_id(
    any_receiver: Receiver, order: str
) -> None:
    """review11 F2, the other side of review10 L2: a verdict emitted in a call that records resp-A,
    naming resp-B. The receiver cannot tell the judged call with a mismatched id from a judge's own
    LLM call, so it goes by the id it names: it waits for resp-B's call (the waiting list says where
    it was emitted, lib.otlp_waiting "in_call_recording_another"), and joins it when it comes."""
    receiver = any_receiver
    t = Telemetry()
    ctx = t.call("Capital of Peru?", "Lima.", **{"gen_ai.response.id": "resp-A"})
    t.verdict("clarity", 4, ctx, **{"gen_ai.response.id": "resp-B"})
    sent = [("/v1/traces", t.traces()), ("/v1/logs", t.log_body())]
    for path, body in sent if order == "span first" else sent[::-1]:
        r = receiver.post(path, body)
        assert r.status_code == 200 and not r.content, r.content
    assert judgments(receiver.engine) == {}  # not put on the call it was emitted in
    with Session(receiver.engine) as session:
        [waiting] = [row for row in session.exec(select(OtlpSpan)) if row.pending_json]
    assert waiting.key == "response:resp-B"
    assert waiting.pending_json[0]["context"] == f"{ctx.trace_id:032x}:{ctx.span_id:016x}"
    t.call("Capital of Chile?", "Santiago.", **{"gen_ai.response.id": "resp-B"})
    assert receiver.post("/v1/traces", t.traces()).content == b""
    assert scored(receiver.engine) == {("Capital of Chile?", "clarity")}


@pytest.mark.parametrize(
    "order", ["judged call first", "judge's call first", "verdict, judge's call, judged call"]
)
def test_a_judges_verdict_with_a_repeated_id_joins_another_traces_call_if_its_own_comes_last(
    any_receiver: Receiver, order: str
) -> None:
    """review11 F1, asserted as the receiver behaves (docs/opentelemetry.md, "A judge's own LLM
    call"): response ids repeat (Ollama draws them from 999), trace T2 already holds a call recording
    chatcmpl-4. In trace T1 the judged call C (chatcmpl-4) and the judge's own call J (chatcmpl-9);
    the verdict naming chatcmpl-4 is emitted in J's context. Once J has arrived, the verdict goes to
    T1's call recording the id, else to the one call anywhere that does: when C comes before or
    with J (one SDK exports spans in the order they end, and C ends before the judge runs) it
    joins C; when C comes after J (another process exports it, or it ends later), T2's call gets
    the judgment, and nothing says so. No receiver rule tells the cases apart; the sender avoids it
    by emitting the verdict in C's span context, or by unique response ids."""
    receiver = any_receiver
    t = Telemetry()
    t.call("Other trace: capital of Peru?", "Lima.", **{"gen_ai.response.id": "chatcmpl-4"})
    assert receiver.post("/v1/traces", t.traces()).content == b""
    with t.tracer.start_as_current_span("POST /ask"):
        t.call("Judged: capital of Chile?", "Santiago.", **{"gen_ai.response.id": "chatcmpl-4"})
        judge = t.call("Is it right?", "Yes: 5.", **{"gen_ai.response.id": "chatcmpl-9"})
    t.verdict("truthfulness", 5, judge, **{"gen_ai.response.id": "chatcmpl-4"})
    finished = t.spans.get_finished_spans()
    t.spans.clear()
    judged = [s for s in finished if (s.attributes or {}).get("gen_ai.response.id") == "chatcmpl-4"]
    c = ("/v1/traces", encode_spans(judged).SerializeToString())
    j = ("/v1/traces", encode_spans([s for s in finished if s not in judged]).SerializeToString())
    logs = ("/v1/logs", t.log_body())
    sent = {
        "judged call first": [c, j, logs],
        "judge's call first": [j, logs, c],
        "verdict, judge's call, judged call": [logs, j, c],
    }[order]
    for path, body in sent:
        r = receiver.post(path, body)
        assert r.status_code == 200 and not r.content, r.content
    joined = "Judged: capital of Chile?" if order == "judged call first" else "Other trace: capital of Peru?"
    assert scored(receiver.engine) == {(joined, "truthfulness")}


def test_a_verdict_in_a_judges_own_call_naming_an_id_two_calls_share_is_named_and_dropped(
    any_receiver: Receiver,
) -> None:
    """review10 L2, when the id names two calls of other traces (Ollama's ids repeat): the verdict
    waited under the judge's span; once that span shows it is a call recording another id, the
    answer names the verdict and drops it rather than guess."""
    receiver = any_receiver
    t = Telemetry()
    for question in ("One?", "Two?"):
        t.call(question, "Yes.", **{"gen_ai.response.id": "resp-X"})
    assert receiver.post("/v1/traces", t.traces()).content == b""
    judge = t.call("Is it right?", "Yes: 5.", **{"gen_ai.response.id": "resp-J"})
    t.verdict("truthfulness", 5, judge, **{"gen_ai.response.id": "resp-X"})
    assert receiver.post("/v1/logs", t.log_body()).content == b""
    r = receiver.post("/v1/traces", t.traces())
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert "span 'chat m1' (trace " in partial.error_message
    assert "records gen_ai.response.id 'resp-J', but evaluations (truthfulness)" in partial.error_message
    assert "gen_ai.response.id 'resp-X' names 2 calls: they are dropped" in partial.error_message
    assert count(receiver.engine, Judgment) == 0
    with Session(receiver.engine) as session:
        assert not any(row.pending_json for row in session.exec(select(OtlpSpan)))


def test_a_trace_is_found_whatever_order_the_database_sorts_text_in(any_receiver: Receiver) -> None:
    """PostgreSQL's default collation outside C locales (ICU, glibc's en_US) sorts ';' before ':':
    the trace's key range `<trace>:` .. `<trace>;` came back empty there, and a verdict in a
    handler's span never found the call of its trace. The test databases are C: the column is
    given an ICU collation for the test."""
    receiver = any_receiver
    if receiver.engine.dialect.name != "postgresql":
        pytest.skip("the collation is PostgreSQL's")
    with receiver.engine.begin() as conn:
        conn.exec_driver_sql(
            'ALTER TABLE otlp_spans ALTER COLUMN key TYPE varchar(300) COLLATE "en-US-x-icu"'
        )
    try:
        t = Telemetry()
        _handler_trace(t, "Capital of Chile?")
        assert receiver.post("/v1/traces", t.traces()).content == b""
        r = receiver.post("/v1/logs", t.log_body())
        assert r.status_code == 200 and not r.content, r.content
        assert judgments(receiver.engine) == {"truthfulness": ("5", None)}
    finally:
        with receiver.engine.begin() as conn:
            conn.exec_driver_sql(
                'ALTER TABLE otlp_spans ALTER COLUMN key TYPE varchar(300) COLLATE "default"'
            )


def test_a_verdict_in_a_handler_span_of_two_calls_is_named_and_dropped(any_receiver: Receiver) -> None:
    """Two calls in the handler's trace and a verdict naming neither: it cannot be placed, so the
    answer (and the server's log) names it when the handler span shows it is no call."""
    receiver = any_receiver
    t = Telemetry()
    _handler_trace(t, "Capital of Chile?", calls=2)
    r = receiver.post("/v1/logs", t.log_body())
    assert r.status_code == 200 and not r.content, r.content  # it waits: its span may still come
    *chats, handler = t.spans.get_finished_spans()
    t.spans.clear()
    assert receiver.post("/v1/traces", encode_spans(chats).SerializeToString()).content == b""
    r = receiver.post("/v1/traces", encode_spans([handler]).SerializeToString())  # no GenAI span in it
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert r.status_code == 200 and partial.rejected_spans == 0
    assert "span 'POST /ask' (trace " in partial.error_message
    assert "is no GenAI call" in partial.error_message and "(truthfulness)" in partial.error_message
    assert "its trace holds 2 calls" in partial.error_message
    with Session(receiver.engine) as session:
        left = session.exec(select(OtlpSpan)).all()
    assert len(left) == 2 and all(row.span_json is not None and not row.pending_json for row in left)


@pytest.mark.parametrize("span_names_it", [False, True], ids=["span records no id", "span records it"])
def test_a_verdict_in_its_calls_context_naming_its_response_id_joins_it_when_logs_come_first(
    any_receiver: Receiver, span_names_it: bool
) -> None:
    """The SDK's default timing (logs every 1 s, spans every 5 s): the verdict, emitted in its
    call's own span and naming the response id, arrives before the span; the span may or may not
    record that id (hand-made or streaming call spans do not)."""
    receiver = any_receiver
    t = Telemetry()
    ids = {"gen_ai.response.id": "resp-9"} if span_names_it else {}
    with t.tracer.start_as_current_span(
        "chat m1", attributes=_chat_attributes("Capital of Chad?", "N'Djamena.", **ids)
    ):
        t.verdict("clarity", 4, None, **{"gen_ai.response.id": "resp-9"})
    assert receiver.post("/v1/logs", t.log_body()).content == b""
    r = receiver.post("/v1/traces", t.traces())
    assert r.status_code == 200 and not r.content, r.content
    assert judgments(receiver.engine) == {"clarity": ("4", None)}
    assert count(receiver.engine, OtlpSpan) == 1


def test_a_response_id_two_calls_share_joins_the_call_of_the_verdicts_trace_or_is_refused(
    any_receiver: Receiver,
) -> None:
    """Ollama's OpenAI endpoint draws response ids from 999: two calls may share one. A verdict in
    the second call's trace joins it; one with no trace is refused, not put on a guessed call."""
    receiver = any_receiver
    t = Telemetry()
    _call_a(t)  # judged, with the id call B will share
    with t.tracer.start_as_current_span("POST /ask"):
        t.call("Call B: capital of Chile?", "Buenos Aires.", **{"gen_ai.response.id": "chatcmpl-4"})
        t.verdict("helpfulness", 1, None, **{"gen_ai.response.id": "chatcmpl-4"})
    assert receiver.post("/v1/traces", t.traces()).content == b""
    assert receiver.post("/v1/logs", t.log_body()).content == b""
    assert scored(receiver.engine) == {
        ("Call A: capital of Peru?", "truthfulness"),
        ("Call B: capital of Chile?", "helpfulness"),
    }
    # No trace: which call? Several refused for one id: one message names each of them (review14
    # F2: only the first was).
    for names, told in (
        (
            ["clarity"],
            "evaluation 'clarity' names gen_ai.response.id 'chatcmpl-4', which 2 calls share: emit it",
        ),
        (
            ["truthfulness", "clarity", "clarity"],
            "evaluations 'truthfulness', 'clarity' name gen_ai.response.id 'chatcmpl-4' (3 records), which "
            "2 calls share: emit them",
        ),
    ):
        for name in names:
            t.verdict(name, 2, None, **{"gen_ai.response.id": "chatcmpl-4"})
        r = receiver.post("/v1/logs", t.log_body())
        partial = ExportLogsServiceResponse.FromString(r.content).partial_success
        assert partial.rejected_log_records == len(names)
        assert partial.error_message.startswith(
            f"{told} in the judged call's span context, or in one span with the call"
        )
        assert "chatcmpl-4" not in partial.error_message.partition("chatcmpl-4")[2]  # one message
    assert count(receiver.engine, Judgment) == 2


def test_a_log_naming_an_unknown_response_id_in_its_calls_context_joins_that_call(
    any_receiver: Receiver,
) -> None:
    """A chat span that records no gen_ai.response.id, judged by a log record in its context that
    names one: the context is the call (in the same request or already stored)."""
    receiver = any_receiver
    t = Telemetry()
    ctx = t.call("Capital of Peru?", "Lima.")
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    t.verdict("clarity", 4, ctx, **{"gen_ai.response.id": "resp-unrecorded"})
    r = receiver.post("/v1/logs", t.log_body())
    assert r.status_code == 200 and not r.content, r.content
    assert judgments(receiver.engine) == {"clarity": ("4", None)}
    assert count(receiver.engine, OtlpSpan) == 1


def test_the_logged_messages_are_as_written_one_line_each_cut_at_a_word() -> None:
    """review14 F7: the WARNING line quoted messages with repr and cut them mid-word ("or its label on")."""
    long = "span 'chat m' (trace 1): give the evaluation a numeric score, or its label one " + "word " * 80
    messages = [long, "span 'two\nlines' (trace 2): no gen_ai.output.messages", *[f"m{i}" for i in range(6)]]
    logged = otlp.logged_messages(messages)
    first, second, *rest = logged.split("; ")
    assert first.startswith("span 'chat m' (trace 1): give the evaluation") and first.endswith(" word…")
    assert len(first) <= otlp.LOGGED_CHARS + 1
    assert second == "span 'two\\nlines' (trace 2): no gen_ai.output.messages"  # one line
    assert rest == ["m0", "m1", "m2 (and 3 more)"]
    assert otlp.logged_messages(["as is"]) == "as is"


def test_a_refusals_reason_and_fix_survive_the_cuts_the_quoted_names_shrink(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """review18 H1: the WARNING line's 300 characters ended before the two variables a misconfigured
    app must set, and a 505-character span name with 12 evaluations cut the reason off the answer."""
    fix = "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental"
    t = Telemetry()
    t.call("No answer recorded?", None, events={"truthfulness": 4, "clarity": 3})
    with caplog.at_level("WARNING", logger="lib.api"):
        r = receiver.post("/v1/traces", t.traces())
    (warning,) = [rec.getMessage() for rec in caplog.records if rec.name == "lib.api"]
    assert fix in warning and "which Overrule does not read): it cannot become an evaluation" in warning
    assert "span 'chat m1' (trace " in warning and "has evaluations (truthfulness" in warning
    long_name = "chat " + "word " * 100
    metrics = {f"metric-{i}-" + "m" * 40: 3 for i in range(12)}
    t = Telemetry()
    with t.tracer.start_as_current_span(long_name, attributes=_chat_attributes("Q?", None)) as span:
        for name, score in metrics.items():
            span.add_event(EVAL, {"gen_ai.evaluation.name": name, "gen_ai.evaluation.score.value": score})
    caplog.clear()
    with caplog.at_level("WARNING", logger="lib.api"):
        r = receiver.post("/v1/traces", t.traces())
    answer = ExportTraceServiceResponse.FromString(r.content).partial_success.error_message
    (warning,) = [rec.getMessage() for rec in caplog.records if rec.name == "lib.api"]
    for said, chars in (
        (answer, otlp.ANSWER_CHARS),
        (warning.partition(" rejected: ")[2], otlp.LOGGED_CHARS),
    ):
        assert said.startswith("span 'chat word word") and "…' (trace " in said, said
        assert "but no gen_ai.output.messages (the instrumentation" in said and fix in said, said
        assert said.endswith("which Overrule does not read): it cannot become an evaluation"), said
        assert "metric-0-" in said and len(said) < 2 * chars
    assert len(warning.partition(" rejected: ")[2]) < len(answer)  # the log's names are shorter
    assert otlp.cut_message("x" * 500, 300) == "x" * 300 + "…"  # a plain message: cut at a word


def test_what_cannot_be_mapped_is_named_in_the_partial_success(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    t = Telemetry()
    t.call("No answer recorded?", None, events={"truthfulness": 4})
    t.call("Off the scale?", "Yes.", events={"truthfulness": 9})
    t.call("Mapped?", "Yes.", events={"clarity": 3})
    with caplog.at_level("WARNING", logger="lib.api"):
        r = receiver.post("/v1/traces", t.traces())
    # The SDK's exporters ignore a partial success: the server's log says it too, on one line.
    (warning,) = [rec.getMessage() for rec in caplog.records if rec.name == "lib.api"]
    assert warning.startswith("OTLP traces from o-lead: 2 rejected: span 'chat m1' (trace ")
    assert "\n" not in warning and "\\'" not in warning  # as written, not repr (review14 F7)
    assert "no gen_ai.output.messages" in warning and "outside its scale 1–5" in warning
    assert r.status_code == 200
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_spans == 2
    assert "span 'chat m1' (trace " in partial.error_message
    assert "no gen_ai.output.messages" in partial.error_message
    assert "score 9 for 'truthfulness' is outside its scale 1–5" in partial.error_message
    assert judgments(receiver.engine) == {"clarity": ("3", None)}
    t.verdict("truthfulness", 3)  # no span context, no response id
    answer = receiver.post("/v1/logs", t.log_body(), **{"Content-Type": "application/json"})
    # A protobuf body declared as JSON is malformed JSON: refused whole, nothing stored.
    assert answer.status_code == 400 and answer.json()["message"].startswith("malformed JSON")


def _partial(r: httpx.Response, signal: str = "logs") -> tuple[int, str]:
    """(rejected items, message) of a 200's partial success in protobuf."""
    assert r.status_code == 200, r.content
    if signal == "logs":
        logs = ExportLogsServiceResponse.FromString(r.content).partial_success
        return logs.rejected_log_records, logs.error_message
    spans = ExportTraceServiceResponse.FromString(r.content).partial_success
    return spans.rejected_spans, spans.error_message


def test_a_score_that_is_no_finite_number_is_rejected_whether_it_joins_or_would_wait(
    any_receiver: Receiver,
) -> None:
    """review17 H1: a NaN verdict waiting for its call was stored raw; SQLite's JSON functions then
    failed every read of the waiting list for a week, and PostgreSQL's JSON column refused the row,
    so the whole request (its good verdict too) was lost to a 500. Now it is rejected as decoded."""
    import httpx

    t = Telemetry()
    t.call("Stored?", "Yes.", **{"gen_ai.response.id": "resp-ok"})
    assert any_receiver.post("/v1/traces", t.traces()).status_code == 200
    t.verdict("helpfulness", 4.0, **{"gen_ai.response.id": "resp-ok"})
    t.verdict("faithfulness", float("nan"), **{"gen_ai.response.id": "resp-later"})
    t.verdict("relevance", float("-inf"))  # outside any span
    rejected, message = _partial(any_receiver.post("/v1/logs", t.log_body()))
    assert rejected == 2, message
    assert "evaluation 'faithfulness': score must be a finite number, got nan; it is not stored" in message
    assert "a log record: evaluation 'relevance': score must be a finite number, got -inf" in message
    assert judgments(any_receiver.engine) == {"helpfulness": ("4", None)}
    # In a span: its verdicts would join at once (before: refused by the importer) or wait.
    t.call("Also stored?", "Yes.", events={"clarity": float("inf"), "tone": 3})
    with t.tracer.start_as_current_span("judge") as judge:
        judge.add_event(EVAL, {"gen_ai.evaluation.name": "depth", "gen_ai.evaluation.score.value": float("nan"),
                               "gen_ai.response.id": "resp-later"})  # fmt: skip
    rejected, message = _partial(any_receiver.post("/v1/traces", t.traces()), "traces")
    assert rejected == 2, message
    assert (
        "span 'chat m1' (trace " in message
        and "evaluation 'clarity': score must be a finite number, got inf" in message
    )
    assert (
        "span 'judge' (trace " in message
        and "evaluation 'depth': score must be a finite number, got nan" in message
    )
    # OTLP/JSON's doubleValue in words, and a score sent as text.
    for value in ({"doubleValue": "NaN"}, {"doubleValue": "Infinity"}, {"stringValue": "nan"}):
        event = {"name": EVAL, "attributes": [
            {"key": "gen_ai.evaluation.name", "value": {"stringValue": "depth"}},
            {"key": "gen_ai.evaluation.score.value", "value": value},
            {"key": "gen_ai.response.id", "value": {"stringValue": "resp-later"}},
        ]}  # fmt: skip
        span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "judge", "events": [event]}
        body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
        r = any_receiver.post("/v1/traces", body, **{"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["partialSuccess"]["rejectedSpans"] == "1", r.text
    with Session(any_receiver.engine) as session:
        stored = [
            json.dumps(row.pending_json) + json.dumps(row.span_json) for row in session.exec(select(OtlpSpan))
        ]
    assert not any(word in text for text in stored for word in ("NaN", "Infinity")), stored
    lead = {"Authorization": f"Bearer {any_receiver.secrets['lead']}"}
    assert httpx.get(f"{any_receiver.base}/api/v1/otlp/waiting", headers=lead).status_code == 200


def test_a_malformed_span_is_rejected_with_why_and_the_rest_of_the_request_stored(
    any_receiver: Receiver,
) -> None:
    """review17 M1: a start no datetime holds, output messages nested 5,000 deep, ids longer than
    OTLP's (PostgreSQL's key column overflowed) and a response id over its column's 256 characters
    each answered 500, and the request's good spans were lost with it."""

    def attr(key: str, value: str) -> dict[str, Any]:
        return {"key": key, "value": {"stringValue": value}}

    def span(span_id: str, time: Any = "1700000000000000000", **attrs: str) -> dict[str, Any]:
        chat = {"gen_ai.operation.name": "chat", "gen_ai.input.messages": '[{"role":"user","content":"Q?"}]',
                "gen_ai.output.messages": '[{"role":"assistant","content":"A."}]', "service.name": "bot", **attrs}  # fmt: skip
        event = {"name": EVAL, "attributes": [attr("gen_ai.evaluation.name", "clarity"),
                                              {"key": "gen_ai.evaluation.score.value", "value": {"intValue": "4"}}]}  # fmt: skip
        return {"traceId": "ab" * 16, "spanId": span_id, "name": "chat", "startTimeUnixNano": time,
                "attributes": [attr(k, v) for k, v in chat.items()], "events": [event]}  # fmt: skip

    def post(*spans: dict[str, Any]) -> tuple[int, str]:
        body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": list(spans)}]}]}).encode()
        r = any_receiver.post("/v1/traces", body, **{"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        partial = r.json().get("partialSuccess", {})
        return int(partial.get("rejectedSpans", 0)), partial.get("errorMessage", "")

    long_id = "r" * (otlp.MAX_RESPONSE_ID + 1)
    own_id = span("00000000000000a7")
    own_id["events"][0]["attributes"].append(attr("gen_ai.response.id", long_id))
    rejected, message = post(
        span("00000000000000a1"),  # the good one
        span("00000000000000a2", time=10**30),
        span("00000000000000a3", time=-(10**30)),
        span("00000000000000a4", **{"gen_ai.output.messages": "[" * 5000}),
        span("ab" * 5000),
        span("00000000000000a6", **{"gen_ai.response.id": long_id}),
        own_id,
    )
    assert rejected == 6, message
    assert f"its time {10**30} is not unsigned 64-bit nanoseconds" in message
    assert "a value is nested too deeply to read" in message
    assert (
        "trace ids are 16 bytes and span ids 8 (32 and 16 hex digits in OTLP/JSON), got 32 and 10000"
        in message
    )
    assert message.count(f"gen_ai.response.id is 257 characters, over the {otlp.MAX_RESPONSE_ID}") == 2
    assert count(any_receiver.engine, EvaluationSnapshot) == 1 and judgments(any_receiver.engine) == {
        "clarity": ("4", None)
    }
    with Session(any_receiver.engine) as session:
        keys = set(session.exec(select(OtlpSpan.key)))
    assert keys == {f"{'ab' * 16}:00000000000000a1"}, keys
    # A time of Infinity is no integer: the body is malformed OTLP/JSON (400, not 500).
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span("00000000000000a8", time=0)]}]}]})
    r = any_receiver.post(
        "/v1/traces", body.replace('"startTimeUnixNano": 0', '"startTimeUnixNano": Infinity').encode(),
        **{"Content-Type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 400 and "infinity" in r.json()["message"], r.text
    # Protobuf ids are bytes: 9 bytes of span id, and a log record naming a response id too long.
    t = Telemetry()
    t.call("Proto?", "Yes.", events={"clarity": 3})
    request = otlp_proto_spans(t)
    request.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x01" * 9
    rejected, message = _partial(any_receiver.post("/v1/traces", request.SerializeToString()), "traces")
    assert rejected == 1 and "got 32 and 18 hex digits" in message, message
    t.verdict("clarity", 3, **{"gen_ai.response.id": long_id})
    rejected, message = _partial(any_receiver.post("/v1/logs", t.log_body()))
    assert rejected == 1 and "gen_ai.response.id is 257 characters" in message, message


def otlp_proto_spans(t: Telemetry) -> Any:
    """The telemetry's finished spans as an ExportTraceServiceRequest, to be changed before it is sent."""
    request = encode_spans(t.spans.get_finished_spans())
    t.spans.clear()
    return request


def test_answers_quote_the_senders_names_and_values_cut_to_a_bound(receiver: Receiver) -> None:
    """review17 L1: a 4 MB evaluation name came back whole in the partial success, 3,000 rejected
    spans made 7 MB of it, and a 10 MB doubleValue string came back whole in a 400."""
    big = "E" * 300_000
    t = Telemetry()
    t.call("No answer?", None, events={big: 4, **{f"m{i}": 3 for i in range(12)}})
    with t.tracer.start_as_current_span(big, attributes=_chat_attributes("Q?", None)) as span:
        span.add_event(EVAL, {"gen_ai.evaluation.name": "clarity", "gen_ai.evaluation.score.value": 3})
    for i in range(otlp.ANSWER_MESSAGES + 5):
        t.call(f"Unanswered {i}?", None, events={"clarity": 3})
    r = receiver.post("/v1/traces", t.traces())
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert r.status_code == 200 and partial.rejected_spans == otlp.ANSWER_MESSAGES + 7, r.content
    messages = partial.error_message
    assert len(r.content) < (otlp.ANSWER_MESSAGES + 1) * (otlp.ANSWER_CHARS + 2), len(r.content)
    assert messages.endswith(" (and 7 more)")
    assert f"({'E' * (otlp.METRIC_CHARS)}…, m0, " in messages and ", m8 and 3 more)" in messages
    assert f"span '{'E' * otlp.NAME_CHARS}…'" in messages and "E" * (otlp.NAME_CHARS + 1) not in messages
    value = {"key": "gen_ai.evaluation.score.value", "value": {"doubleValue": "x" * 500_000}}
    body = {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab" * 16, "spanId": "cd" * 8,
        "events": [{"name": EVAL, "attributes": [value]}]}]}]}]}  # fmt: skip
    r = receiver.post("/v1/traces", json.dumps(body).encode(), **{"Content-Type": "application/json"})
    assert r.status_code == 400 and len(r.content) < otlp.ANSWER_CHARS + 100, r.content[:200]


def test_a_request_of_more_records_than_it_takes_is_refused_before_they_are_read(
    receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten megabytes of empty spans are millions of them: counted before any is read, refused whole."""
    from lib import otlp

    monkeypatch.setattr(otlp, "MAX_RECORDS", 3)
    t = Telemetry()
    for i in range(4):
        t.call(f"Question {i}?", "Answer.", events={"clarity": 4})
    spans = t.spans.get_finished_spans()
    body = encode_spans(spans).SerializeToString()
    as_json = json.dumps(
        {
            "resourceSpans": [
                {"scopeSpans": [{"spans": [{"traceId": "ab" * 16, "spanId": f"{i:016x}"} for i in range(4)]}]}
            ]
        }
    ).encode()
    for sent, headers in ((body, {}), (as_json, {"Content-Type": "application/json"})):
        r = receiver.post("/v1/traces", sent, **headers)
        assert r.status_code == 413, r.text
        assert "4 spans in one request, over the 3 a request takes" in (
            r.json()["message"] if headers else r.content.decode(errors="replace")
        )
    assert count(receiver.engine, EvaluationSnapshot) == 0
    assert receiver.post("/v1/traces", encode_spans(spans[:3]).SerializeToString()).status_code == 200
    assert count(receiver.engine, EvaluationSnapshot) == 3


def test_a_request_holding_more_than_an_exporter_sends_is_refused_before_its_items_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """review17 H2: 10 KB of gzipped empty resources (5 million of them) cost 13 CPU s and 1.3 GB
    before any cap applied: resources, scopes, span events and attributes were not counted. Now
    each is, from the lists' lengths, before anything per item is built."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    from lib.config import get_settings

    settings = get_settings()
    built: list[int] = []
    real = otlp._proto_attrs
    monkeypatch.setattr(otlp, "_proto_attrs", lambda attributes: built.append(1) or real(attributes))

    def refused(body: bytes, kind: str = otlp.PROTOBUF) -> str:
        with pytest.raises(otlp.OtlpError) as caught:
            otlp.decode("traces", body, kind, settings)
        assert caught.value.status == 413
        return caught.value.message

    body = otlp.read_body(gzip.compress(b"\x0a\x00" * 5_000_000), "gzip", 10 * 1024 * 1024)
    assert refused(body).startswith("5,000,000 resources and scopes in one request, over the 100,000")
    assert "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in refused(
        b'{"resourceSpans":[' + b"{}," * 100_000 + b"{}]}", otlp.JSON
    )
    assert not built  # no resource's attributes were read
    monkeypatch.setattr(otlp, "MAX_GROUPS", 3)
    scopes = json.dumps({"resourceSpans": [{"scopeSpans": [{}, {}, {}]}]}).encode()
    assert refused(scopes, otlp.JSON).startswith("4 resources and scopes in one request, over the 3")
    t = Telemetry()
    t.call("Q?", "A.", events={f"m{i}": 3 for i in range(3)})
    t.call("Q2?", "A.", events={f"m{i}": 3 for i in range(3)})
    request = otlp_proto_spans(t)
    assert isinstance(request, ExportTraceServiceRequest)
    monkeypatch.setattr(otlp, "MAX_SPAN_EVENTS", 2)
    message = refused(request.SerializeToString())
    assert message.startswith(
        "a span with 3 events, over the 2 a span may carry: keep OTEL_SPAN_EVENT_COUNT_LIMIT"
    )
    monkeypatch.setattr(otlp, "MAX_SPAN_EVENTS", 3)
    monkeypatch.setattr(otlp, "MAX_EVENTS", 5)
    assert refused(request.SerializeToString()).startswith("6 span events in one request, over the 5")
    monkeypatch.setattr(otlp, "MAX_EVENTS", 6)
    monkeypatch.setattr(otlp, "MAX_ATTRIBUTES", 2)
    message = refused(request.SerializeToString())
    assert message.startswith("an item with ") and "OTEL_ATTRIBUTE_COUNT_LIMIT" in message
    monkeypatch.setattr(otlp, "MAX_ATTRIBUTES", 100)
    assert len(otlp.decode("traces", request.SerializeToString(), otlp.PROTOBUF, settings).calls) == 2


def test_array_and_kvlist_attribute_values_are_read_only_when_the_receiver_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """review19 M1: a 10 KB gzipped span whose attribute held an array of 5 million empty values
    cost 1.1 CPU s and 300 MB to convert, though no cap counted its elements. An attribute the
    receiver does not read is no longer converted; one it reads (the GenAI messages) may hold at
    most MAX_VALUE_ELEMENTS elements, nested ones included: more is a 413, as too many attributes are."""
    from lib.config import get_settings

    settings = get_settings()
    converted: list[int] = []
    real = otlp._proto_nested
    monkeypatch.setattr(otlp, "_proto_nested", lambda value, left: converted.append(1) or real(value, left))
    t = Telemetry()
    t.call("Q?", "A.", events={"clarity": 3})
    request = otlp_proto_spans(t)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.add(key="x").value.array_value.MergeFromString(b"\x0a\x00" * 5_000_000)
    batch = otlp.decode("traces", request.SerializeToString(), otlp.PROTOBUF, settings)
    assert len(batch.calls) == 1 and batch.calls[0].answer == "A." and len(batch.verdicts) == 1
    assert not converted  # the unread array of 5 million values
    read = span.attributes.add(key="gen_ai.input.messages").value.array_value
    read.MergeFromString(b"\x0a\x00" * (otlp.MAX_VALUE_ELEMENTS + 1))
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decode("traces", request.SerializeToString(), otlp.PROTOBUF, settings)
    assert caught.value.status == 413
    assert caught.value.message.startswith("an attribute value with over 100,000 elements (its arrays and ")
    # Nested elements count too, and OTLP/JSON reads the same way.
    message = {"kvlistValue": {"values": [{"key": "role", "value": {"stringValue": "user"}}]}}
    parts = {"arrayValue": {"values": [{"stringValue": "p"}] * otlp.MAX_VALUE_ELEMENTS}}
    message["kvlistValue"]["values"].append({"key": "parts", "value": parts})
    json_span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "chat",
        "attributes": [
            {"key": "output.value", "value": {"stringValue": "Hello."}},
            {"key": "x", "value": {"arrayValue": {"values": [{}] * 100_000}}},
            {"key": "gen_ai.input.messages", "value": {"arrayValue": {"values": [message]}}},
        ],
    }
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [json_span]}]}]}).encode()
    with pytest.raises(otlp.OtlpError) as caught:
        otlp.decode("traces", body, otlp.JSON, settings)
    assert caught.value.status == 413 and "over 100,000 elements" in caught.value.message
    text = [
        {"key": "type", "value": {"stringValue": "text"}},
        {"key": "content", "value": {"stringValue": "Hi?"}},
    ]
    parts["arrayValue"]["values"] = [{"kvlistValue": {"values": text}}]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [json_span]}]}]}).encode()
    (call,) = otlp.decode("traces", body, otlp.JSON, settings).calls
    assert (call.question, call.answer) == ("Hi?", "Hello.")  # a structured message, read
    # A long agent conversation sent as structured messages (~6 elements each) is read, not a 413
    # for the whole batch: 300 messages were 1,800 elements, over the first cap of 1,280.
    json_span["attributes"][2]["value"]["arrayValue"]["values"] = [message] * 300
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [json_span]}]}]}).encode()
    (call,) = otlp.decode("traces", body, otlp.JSON, settings).calls
    assert call.answer == "Hello." and call.question is not None and "Hi?" in call.question


def test_an_int_value_past_int64_is_said_plainly_and_only_refusals_reject_an_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """review19 L2: a JSON intValue score of 400 digits rejected its span as "int too large to
    convert to float", one of 5,000 digits was a 400 advising sys.set_int_max_str_digits. OTLP's
    intValue is int64: past it the request is malformed, said so. L2b: `_Reader.span`/`log` caught
    every ValueError, so a bug in the receiver's own code became a rejected item (a partial success);
    now only what a conversion refuses is, and a key no int() reads no longer raises."""
    from lib.config import get_settings

    settings = get_settings()

    def body(signal: str, score: Any, extra: tuple[str, ...] = ()) -> bytes:
        verdict = [
            {"key": "gen_ai.evaluation.name", "value": {"stringValue": "rel"}},
            {"key": "gen_ai.evaluation.score.value", "value": score},
        ]
        ids = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1"}
        if signal == "logs":
            record = {"eventName": EVAL, **ids, "attributes": verdict}
            return json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]}).encode()
        attributes = [{"key": "output.value", "value": {"stringValue": "A."}}]
        attributes += [{"key": key, "value": {"stringValue": "user"}} for key in extra]
        span = {
            **ids,
            "name": "chat",
            "attributes": attributes,
            "events": [{"name": EVAL, "attributes": verdict}],
        }
        return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()

    for signal in ("traces", "logs"):
        for digits in (400, 5_000):
            with pytest.raises(otlp.OtlpError) as caught:
                otlp.decode(signal, body(signal, {"intValue": "9" * digits}), otlp.JSON, settings)
            assert caught.value.status == 400
            assert caught.value.message.endswith(
                f"OTLP/JSON {signal} request: an intValue must be a 64-bit integer"
            )
        with pytest.raises(otlp.OtlpError):
            otlp.decode(signal, body(signal, {"intValue": str(2**63)}), otlp.JSON, settings)
        batch = otlp.decode(signal, body(signal, {"intValue": str(2**63 - 1)}), otlp.JSON, settings)
        assert [v.score for v in batch.verdicts] == [float(2**63 - 1)] and not batch.refused
    odd = ("llm.input_messages.\u00b2.message.role", f"llm.input_messages.{'9' * 5_000}.message.role")
    batch = otlp.decode("traces", body("traces", {"intValue": "3"}, odd), otlp.JSON, settings)
    assert len(batch.calls) == 1 and not batch.refused  # "²" is a digit to isdigit(), not to int()

    def bug(attrs: Any) -> None:
        raise ValueError("a bug of the join's")

    monkeypatch.setattr(otlp, "_answer", bug)
    with pytest.raises(ValueError, match="a bug of the join's"):
        otlp.decode("traces", body("traces", {"intValue": "3"}), otlp.JSON, settings)


def test_otlp_json_bodies_and_refusals(receiver: Receiver) -> None:
    span = {
        "traceId": "5b8efff798038103d269b633813fc60c",
        "spanId": "eee19b7ec3c1b174",
        "name": "chat",
        "startTimeUnixNano": "1700000000000000000",
        "attributes": [
            {"key": "gen_ai.input.messages", "value": {"stringValue": '[{"role":"user","content":"Hi?"}]'}},
            {"key": "output.value", "value": {"stringValue": "Hello."}},
            {"key": "service.name", "value": {"stringValue": "json-bot"}},
        ],
        "events": [
            {
                "name": "gen_ai.evaluation.result",
                "attributes": [
                    {"key": "gen_ai.evaluation.name", "value": {"stringValue": "clarity"}},
                    {"key": "gen_ai.evaluation.score.value", "value": {"intValue": "4"}},
                    {"key": "gen_ai.evaluation.score.label", "value": {"stringValue": "clear"}},
                ],
            }
        ],
    }
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()
    json_type = {"Content-Type": "application/json"}
    assert receiver.post("/v1/traces", body, role="viewer", **json_type).status_code == 403
    assert receiver.post("/v1/traces", body, **{"Content-Type": "text/plain"}).status_code == 415
    refused = receiver.post("/v1/traces", b"x" * (1024 * 1024 + 1), **json_type)
    assert refused.status_code == 413
    bomb = gzip.compress(b" " * (3 * 1024 * 1024))
    assert receiver.post("/v1/traces", bomb, **json_type, **{"Content-Encoding": "gzip"}).status_code == 413
    # A cut or padded gzip body inflates to a prefix of the request: refused whole, not half stored.
    whole = gzip.compress(body, compresslevel=0)
    for broken in (whole[: len(whole) * 3 // 4], whole + b"JUNKJUNK", b"\x1f\x8b\x08\x00garbage"):
        r = receiver.post("/v1/traces", broken, **json_type, **{"Content-Encoding": "gzip"})
        assert r.status_code == 400 and "gzip body" in r.json()["message"], r.text
    assert count(receiver.engine, EvaluationSnapshot) == 0
    # Two gzip members (RFC 1952; a proxy may send them) are one body.
    half = len(body) // 2
    members = gzip.compress(body[:half]) + gzip.compress(body[half:])
    r = receiver.post("/v1/traces", members, **json_type, **{"Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json() == {}, r.text
    assert count(receiver.engine, EvaluationSnapshot) == 1
    # Many tiny members cost the square of the body's size in zlib's copies: refused past a few.
    from lib.otlp import GZIP_MEMBERS

    tiny = b"".join(gzip.compress(body[i : i + 1]) for i in range(GZIP_MEMBERS + 1))
    r = receiver.post("/v1/traces", tiny, **json_type, **{"Content-Encoding": "gzip"})
    assert r.status_code == 400 and f"more than {GZIP_MEMBERS} members" in r.json()["message"], r.text
    r = receiver.post("/v1/traces", body, **json_type)
    assert r.status_code == 200 and r.json() == {}
    with Session(receiver.engine) as session:
        snapshot = session.exec(select(EvaluationSnapshot)).one()
    assert (snapshot.product, snapshot.question, snapshot.model_answer) == ("json-bot", "Hi?", "Hello.")
    assert judgments(receiver.engine) == {"clarity": ("4", "clear")}
    with Session(receiver.engine) as session:  # gen_ai.evaluation.score.label, structured (0032)
        assert session.exec(select(Judgment.label)).one() == "clear"


def test_metrics_are_answered_with_what_to_change_after_the_token_is_checked(receiver: Receiver) -> None:
    """review14 F7: an SDK left exporting metrics got 405 text/plain every 60 s; now 501 (no exporter
    retries it) with a google.rpc.Status in the request's encoding saying what to set. The token
    first, as on every route."""
    from google.rpc import status_pb2

    said = "Overrule takes traces and logs only: set OTEL_METRICS_EXPORTER=none"
    r = receiver.post("/v1/metrics", b"\x0a\x00")
    assert (r.status_code, r.headers["content-type"]) == (501, "application/x-protobuf"), r.text
    status = status_pb2.Status.FromString(r.content)
    assert (status.code, status.message) == (12, said)  # UNIMPLEMENTED
    for path, kind in (("/api/v1/otlp/v1/metrics", "application/json"), ("/v1/metrics", "text/plain")):
        r = receiver.post(path, b"{}", **{"Content-Type": kind})
        assert r.status_code == 501 and r.json() == {"code": 12, "message": said}, (path, r.text)
    assert httpx.post(receiver.base + "/v1/metrics", content=b"{}", headers=JSON_TYPE).status_code == 401
    assert receiver.post("/v1/metrics", b"{}", role="viewer", **JSON_TYPE).status_code == 403


def test_a_label_without_a_score_is_refused_with_the_receivers_own_advice(receiver: Receiver) -> None:
    """The receiver has no --label-scores: a label no rule scores is told to send the score
    (review14 F3: its partial success named the command line's flag)."""
    t = Telemetry()
    t.labelled("Hi?", "tone", "warm")
    message = _one_span_rejected(receiver, t.traces())
    assert "label 'warm' has no score" in message
    assert "send gen_ai.evaluation.score.value with the label" in message
    assert "--label-scores" not in message
    assert count(receiver.engine, EvaluationSnapshot) == 0


def _one_span_rejected(receiver: Receiver, body: bytes) -> str:
    """The partial success's message for a request of which one span was refused."""
    r = receiver.post("/v1/traces", body)
    partial = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert r.status_code == 200 and partial.rejected_spans == 1, r.content
    return partial.error_message


def test_a_known_label_without_a_score_counts_1_or_0_only_on_a_0_1_metric(any_receiver: Receiver) -> None:
    """review14 F8: `pass` with no score was stored as 1 on the 1–5 truthfulness, its worst score.
    On a 0–1 metric (new, or stored) pass and fail still count 1 and 0."""
    t = Telemetry()
    t.labelled("Q1?", "truthfulness", "pass")
    t.labelled("Q2?", "verdict", "pass")
    t.labelled("Q3?", "verdict", "fail")
    message = _one_span_rejected(any_receiver, t.traces())
    assert "label 'pass' has no score, and 'Truthfulness' is scored 1–5" in message
    assert "send gen_ai.evaluation.score.value with the label" in message
    t.labelled("Q4?", "verdict", "PASS")
    # A new metric this request scores 0–4: its label-only pass is refused, the scored span kept.
    t.call("Q5?", "A.", events={"stars": 4})
    t.labelled("Q6?", "stars", "pass")
    message = _one_span_rejected(any_receiver, t.traces())
    assert "label 'pass' has no score, and 'stars' is scored 0–4" in message
    with Session(any_receiver.engine) as session:
        stored = {s.question: s.judge_scores_json for s in session.exec(select(EvaluationSnapshot))}
    assert {q: v["verdict"]["score"] for q, v in stored.items() if "verdict" in v} == {
        "Q2?": 1.0,
        "Q3?": 0.0,
        "Q4?": 1.0,
    }
    assert stored["Q5?"]["stars"]["score"] == 4.0
    assert "Q1?" not in stored and "Q6?" not in stored


def test_a_label_without_a_score_gets_the_number_the_product_stores_for_it(any_receiver: Receiver) -> None:
    """review14 F3: a label-only `pass` over OTLP became 1 where the product already stored `pass`
    as 0.6. The receiver scores it as the file importers do: the request's own scored verdicts of
    the metric, then the product's stored labels, then the known labels (docs/importing.md)."""
    t = Telemetry()
    t.labelled("Q1?", "verdict", "pass", score=0.6)
    assert any_receiver.post("/v1/traces", t.traces()).status_code == 200
    t.labelled("Q2?", "verdict", "pass")  # stored as 0.6 before this request
    t.labelled("Q3?", "mood", "calm", score=0.25)  # this request scores `calm`...
    t.labelled("Q4?", "mood", "calm")  # ...so its label-only `calm` gets the same
    late = t.call("Q5?", "A.", events={"clarity": 4})
    assert any_receiver.post("/v1/traces", t.traces()).status_code == 200, "nothing is refused"
    # A label-only verdict after its span was imported (a late verdict) reads the stored label too.
    t.logger.emit(
        event_name=EVAL,
        context=trace.set_span_in_context(trace.NonRecordingSpan(late)),
        attributes={"gen_ai.evaluation.name": "verdict", "gen_ai.evaluation.score.label": "pass"},
    )
    assert any_receiver.post("/v1/logs", t.log_body()).status_code == 200
    # A late label none of the steps scores is refused with the receiver's advice, not the CLI's.
    t.logger.emit(
        event_name=EVAL,
        context=trace.set_span_in_context(trace.NonRecordingSpan(late)),
        attributes={"gen_ai.evaluation.name": "tone", "gen_ai.evaluation.score.label": "so-so"},
    )
    r = any_receiver.post("/v1/logs", t.log_body())
    partial = ExportLogsServiceResponse.FromString(r.content).partial_success
    assert partial.rejected_log_records == 1, r.content
    assert "label 'so-so' has no score" in partial.error_message
    assert "send gen_ai.evaluation.score.value with the label" in partial.error_message
    # Another product stores no `pass`: the known label's 1 (its metric is new, so 0–1).
    other = Telemetry(service="other-bot")
    other.labelled("Q6?", "verdict", "pass")
    assert any_receiver.post("/v1/traces", other.traces()).status_code == 200
    with Session(any_receiver.engine) as session:
        stored = {s.question: s.judge_scores_json for s in session.exec(select(EvaluationSnapshot))}
    assert {q: {m: v["score"] for m, v in s.items() if m != "clarity"} for q, s in stored.items()} == {
        "Q1?": {"verdict": 0.6},
        "Q2?": {"verdict": 0.6},
        "Q3?": {"mood": 0.25},
        "Q4?": {"mood": 0.25},
        "Q5?": {"verdict": 0.6},
        "Q6?": {"verdict": 1.0},
    }


def test_log_records_are_verdicts_by_their_event_name_or_evaluation_name_in_both_encodings(
    receiver: Receiver,
) -> None:
    """A log record is a verdict when its event name says so, or the `event.name` attribute older
    SDKs set does, or it names an evaluation (OpenInference's attributes too); any other log line is
    passed over. Read alike from protobuf and OTLP/JSON."""
    t = Telemetry()
    by_json = t.call("Capital of Norway?", "Oslo.")
    by_protobuf = t.call("Capital of Sweden?", "Stockholm.")
    unnamed = t.call("Capital of Finland?", "Helsinki.")
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    verdicts = [  # (event name, attributes)
        (EVAL, {"gen_ai.evaluation.name": "clarity", "gen_ai.evaluation.score.value": 4}),
        (None, {"event.name": EVAL, "gen_ai.evaluation.name": "safety", "gen_ai.evaluation.score.value": 5}),
        (None, {"evaluation.name": "tone", "evaluation.score": 3}),
        (None, {"http.request.method": "GET"}),  # an ordinary log line
    ]
    for event, attributes in verdicts:
        context = trace.set_span_in_context(trace.NonRecordingSpan(by_protobuf))
        t.logger.emit(event_name=event, context=context, attributes=attributes, body="a line")
    # Ours by the `event.name` attribute alone, naming no evaluation: refused, not passed over.
    context = trace.set_span_in_context(trace.NonRecordingSpan(unnamed))
    t.logger.emit(context=context, attributes={"event.name": EVAL, "gen_ai.evaluation.score.value": 1})
    r = receiver.post("/v1/logs", t.log_body())
    partial = ExportLogsServiceResponse.FromString(r.content).partial_success
    assert r.status_code == 200 and partial.rejected_log_records == 1, r.content
    assert "no gen_ai.evaluation.name" in partial.error_message

    def value(v: Any) -> dict[str, Any]:
        return {"stringValue": v} if isinstance(v, str) else {"intValue": str(v)}

    records = [
        {
            "traceId": f"{by_json.trace_id:032x}",
            "spanId": f"{by_json.span_id:016x}",
            **({"eventName": event} if event else {}),
            "body": {"stringValue": "a line"},
            "attributes": [{"key": k, "value": value(v)} for k, v in attributes.items()],
        }
        for event, attributes in verdicts
    ]
    body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}).encode()
    r = receiver.post("/v1/logs", body, **{"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json() == {}, r.text
    expected = {"clarity", "safety", "tone"}
    assert scored(receiver.engine) == {
        (q, m) for q in ("Capital of Norway?", "Capital of Sweden?") for m in expected
    }


def test_an_instrumented_openai_call_reaches_the_running_app_and_its_evaluations_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str, sqlite_engine: Engine
) -> None:
    """Issue 29's done-when: the real `openai` client instrumented by opentelemetry-instrumentation-openai-v2
    against the scripted server; the SDK's OTLP/HTTP exporters post to the Streamlit server's /v1/..."""
    import openai
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from streamlit.testing.v1 import AppTest

    from lib.config import reset_settings
    from lib.scripted_llm import running_llm_server, text
    from tests.browser.conftest import ROOT, StreamlitServer
    from tests.test_server import _server_env

    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    env = {**_server_env(tmp_path), "OVERRULE_DATABASE_URL": sqlite_url}
    server = StreamlitServer(env, tmp_path / "server.log")
    engine = sqlite_engine
    try:
        with Session(engine) as session:
            _, secret = create_token(session=session, actor=system_actor(), name="pipeline", role="lead")
            session.commit()
        auth = {"Authorization": f"Bearer {secret}"}
        span_exporter = OTLPSpanExporter(endpoint=f"{server.base_url}/v1/traces", headers=auth)
        log_exporter = OTLPLogExporter(endpoint=f"{server.base_url}/v1/logs", headers=auth)
        t = Telemetry("travel-bot")  # keeps a copy of what is exported, to export it again below
        t.tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        t.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=t.tracer_provider)
        tracer = t.tracer_provider.get_tracer("my-app")

        def run_the_docs_example(question: str, answer: str) -> None:
            """docs/opentelemetry.md's example: the call and its judge inside one span."""
            llm.script(text(answer))
            client = openai.OpenAI(base_url=llm.base_url, api_key="test", max_retries=0)
            with tracer.start_as_current_span("request"):
                reply = client.chat.completions.create(
                    model="test-model", messages=[{"role": "user", "content": question}]
                )
                for name, score, why in (("truthfulness", 5, "correct"), ("clarity", 4, "one sentence")):
                    t.verdict(
                        name,
                        score,
                        None,
                        **{"gen_ai.response.id": reply.id, "gen_ai.evaluation.explanation": why},
                    )

        try:
            with running_llm_server() as llm:
                run_the_docs_example("Capital of Portugal?", "Lisbon is the capital of Portugal.")
                assert judgments(engine) == {
                    "truthfulness": ("5", "correct"),
                    "clarity": ("4", "one sentence"),
                }
                # Run again: the scripted server's ids repeat (as Ollama's do), and the verdicts
                # still find their call, the one of that id in their trace (review14 F1: emitted
                # outside any span, they were refused as naming an id two calls share).
                run_the_docs_example("Capital of Spain?", "Madrid.")
        finally:
            instrumentor.uninstrument()
        assert scored(engine) == {
            (question, metric)
            for question in ("Capital of Portugal?", "Capital of Spain?")
            for metric in ("truthfulness", "clarity")
        }
        with Session(engine) as session:
            snapshot, spain = session.exec(
                select(EvaluationSnapshot).order_by(EvaluationSnapshot.question)
            ).all()
            assert {row.response_id for row in session.exec(select(OtlpSpan))} == {"chatcmpl-test"}
        assert (snapshot.product, snapshot.question) == ("travel-bot", "Capital of Portugal?")
        assert (snapshot.model_answer, snapshot.model_name) == (
            "Lisbon is the capital of Portugal.",
            "test-model",
        )

        # The same data exported again by the same exporters adds nothing.
        assert span_exporter.export(t.spans.get_finished_spans()).name == "SUCCESS"
        assert log_exporter.export(t.logs.get_finished_logs()).name == "SUCCESS"
        assert (count(engine, EvaluationSnapshot), count(engine, Judgment)) == (2, 4)

        # A span with an evaluation but no answer: the partial success names it and what it lacks.
        t.spans.clear()
        lost = t.call("Capital of Peru?", None, events={"truthfulness": 1})
        r = httpx.post(f"{server.base_url}/v1/traces", content=t.traces(), headers={**auth, **PROTOBUF})
        partial = ExportTraceServiceResponse.FromString(r.content).partial_success
        assert r.status_code == 200 and partial.rejected_spans == 1
        assert (
            f"span 'chat m1' (trace {lost.trace_id:032x}, span {lost.span_id:016x})" in partial.error_message
        )
        assert "no gen_ai.output.messages" in partial.error_message
        # and why a span most often lacks them (review14 F7): capture off, or on without the opt-in
        assert "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental" in partial.error_message
        assert count(engine, EvaluationSnapshot) == 2

        monkeypatch.setenv("OVERRULE_DATABASE_URL", sqlite_url)
        reset_settings()
        page = str(ROOT / "pages/evaluations.py")
        listed = AppTest.from_file(page, default_timeout=APPTEST_TIMEOUT).run()
        assert not listed.exception
        assert set(listed.dataframe[0].value["id"]) == {snapshot.id, spain.id}
        detail = AppTest.from_file(page, default_timeout=APPTEST_TIMEOUT)
        detail.query_params["snapshot"] = snapshot.id
        shown = " ".join(m.value for m in detail.run().markdown)
        assert "Lisbon is the capital of Portugal." in shown and "one sentence" in shown
    finally:
        server.stop()
        reset_settings()


def test_what_waits_longer_than_a_week_is_forgotten(sqlite_engine: Engine) -> None:
    """A span no judge looked at (an app exporting every call) does not stay in otlp_spans forever."""
    from datetime import timedelta

    from lib import otlp, otlp_table
    from lib.models import utcnow

    with Session(sqlite_engine) as session:
        old = utcnow() - timedelta(days=otlp_table.PENDING_DAYS, hours=1)
        session.add(OtlpSpan(key="a:1", span_json={"name": "chat"}, received_at=old))
        session.add(OtlpSpan(key="a:2", span_json={"name": "chat"}, received_at=utcnow()))
        session.add(OtlpSpan(key="a:3", snapshot_id="s1", received_at=old))  # an evaluation's link stays
        session.commit()
        assert otlp._sweep(session, force=True) == 1
        session.commit()
        assert sorted(row.key for row in session.exec(select(OtlpSpan))) == ["a:2", "a:3"]


def test_openinference_spans_and_their_evaluator_child_span(receiver: Receiver) -> None:
    """OpenInference: messages flattened as llm.input_messages.<i>.message.*, the verdict as
    evaluation.* attributes on a child span (which judges its parent)."""
    t = Telemetry("oi-bot")
    attributes = {
        "llm.model_name": "oi-model",
        "llm.input_messages.0.message.role": "system",
        "llm.input_messages.0.message.content": "Be brief.",
        "llm.input_messages.1.message.role": "user",
        "llm.input_messages.1.message.content": "Largest planet?",
        "output.value": "Jupiter.",
    }
    with t.tracer.start_as_current_span("llm", attributes=attributes):
        evaluator = {"evaluation.name": "Truthfulness", "evaluation.score": 5, "evaluation.label": "correct"}
        with t.tracer.start_as_current_span("evaluate", attributes=evaluator):
            pass
    r = receiver.post("/v1/traces", t.traces())
    assert r.status_code == 200 and not ExportTraceServiceResponse.FromString(r.content).HasField(
        "partial_success"
    )
    with Session(receiver.engine) as session:
        snapshot = session.exec(select(EvaluationSnapshot)).one()
    assert (snapshot.product, snapshot.question, snapshot.model_answer) == (
        "oi-bot",
        "Largest planet?",
        "Jupiter.",
    )
    assert snapshot.model_name == "oi-model"
    assert judgments(receiver.engine) == {"truthfulness": ("5", "correct")}


def test_two_spans_of_one_answer_in_one_request_keep_both_spans_metrics(sqlite_engine: Engine) -> None:
    """The importer stores one evaluation for the two same-content spans; the metric only the second
    span has still becomes its judgment, and both spans link to it (lib.otlp._link)."""
    from lib import otlp
    from lib.config import get_settings

    t = Telemetry()
    t.call("What is 2+2?", "5", events={"truthfulness": 1})
    t.call("What is 2+2?", "5", events={"truthfulness": 1, "helpfulness": 2})
    batch = otlp.decode("traces", t.traces(), otlp.PROTOBUF, get_settings())
    outcome = otlp.ingest(engine=sqlite_engine, batch=batch, actor=system_actor())
    assert (outcome.evaluations, outcome.judgments, outcome.messages) == (1, 2, [])
    assert set(judgments(sqlite_engine)) == {"truthfulness", "helpfulness"}
    with Session(sqlite_engine) as session:
        snapshot_id = session.exec(select(EvaluationSnapshot.id)).one()
        assert [row.snapshot_id for row in session.exec(select(OtlpSpan))] == [snapshot_id, snapshot_id]


def test_late_verdicts_of_a_request_are_added_together_as_one_by_one_with_the_same_messages(
    engine: Engine,
) -> None:
    """issue 29: a request's late verdicts (log records after their span's evaluation, and spans of
    an answer stored before) are added in one bulk call. What each call gets, the partial-success
    messages in their order, and every counter (equal to a recount) are what adding each call's
    verdicts alone gave: a refused group is refused alone and defines nothing, a re-sent metric is
    left as it is (another score said as a warning, in its group's place: review14 F7), two spans
    of one stored answer in one request add their metrics in order."""
    from lib import counters, otlp
    from lib.config import get_settings
    from tests.test_source_import import _late_state

    def ingest(signal: str, body: bytes) -> Any:
        batch = otlp.decode(signal, body, otlp.PROTOBUF, get_settings())
        return otlp.ingest(engine=engine, batch=batch, actor=system_actor())

    t = Telemetry("late-bot")
    spans = {q: t.call(q, "A.", events={"truthfulness": 4}) for q in ("QA?", "QB?", "QC?", "QD?")}
    assert ingest("traces", t.traces()).evaluations == 4
    t.verdict("clarity", 4, spans["QA?"])
    t.verdict("tone", 2.5, spans["QA?"])  # a metric the rubric lacks: defined
    t.verdict("warmth", 2, spans["QB?"])  # ... but not from a refused group
    t.verdict("helpfulness", 9, spans["QB?"])
    t.verdict("  ", 4, spans["QC?"])  # no name: named, the call's other verdict still added
    t.verdict("safety", 4, spans["QC?"])
    t.verdict("truthfulness", 1, spans["QD?"])  # re-sent: left as it is, said (another score)
    t.verdict("helpfulness", 3, spans["QD?"])
    outcome = ingest("logs", t.log_body())
    assert (outcome.evaluations, outcome.judgments, outcome.rejected) == (0, 4, 4)
    assert len(outcome.messages) == 3
    assert (
        outcome.messages[0].startswith("span (trace ")
        and "score 9 for 'helpfulness' is outside its scale 1–5" in outcome.messages[0]
    )
    assert outcome.messages[1].endswith(": an evaluation event has no gen_ai.evaluation.name")
    assert "'truthfulness' 1 was not taken: evaluation " in outcome.messages[2]
    assert outcome.messages[2].endswith(
        "keeps its 4 (a metric's verdict is taken once; re-judge it in Overrule)"
    )

    # Spans of an answer stored before: their metrics it lacks are added, in order; one refused.
    t.call("QA?", "A.", events={"truthfulness": 4, "consistency": 5})
    t.call("QA?", "A.", events={"consistency": 2, "efficiency": 3})
    t.call("QA?", "A.", events={"robustness": 7})
    t.call("QE?", "A.", events={"truthfulness": 2})
    outcome = ingest("traces", t.traces())
    assert (outcome.evaluations, outcome.judgments, outcome.rejected) == (1, 3, 1)
    assert len(outcome.messages) == 2
    [refused] = [m for m in outcome.messages if "robustness" in m]
    [kept] = [m for m in outcome.messages if "'consistency' 2 was not taken" in m]
    assert "score 7 for 'robustness' is outside its scale 1–5" in refused and "keeps its 5" in kept

    with Session(engine) as session:
        stored = {s.question: s.judge_scores_json for s in session.exec(select(EvaluationSnapshot))}
    scored_by = {q: {m: v["score"] for m, v in scores.items()} for q, scores in stored.items()}
    assert scored_by == {
        "QA?": {"truthfulness": 4, "clarity": 4, "tone": 2.5, "consistency": 5, "efficiency": 3},
        "QB?": {"truthfulness": 4},
        "QC?": {"truthfulness": 4, "safety": 4},
        "QD?": {"truthfulness": 4, "helpfulness": 3},
        "QE?": {"truthfulness": 2},
    }
    assert _scales(engine, "late-bot")["tone"] == (0.0, 3.0, False, True)
    assert "warmth" not in _scales(engine, "late-bot")
    with Session(engine) as session:
        kept = _late_state(session)
        counters.recount(session=session)
        assert _late_state(session) == kept


def test_an_event_reads_as_a_verdict_whatever_types_its_attributes_hold() -> None:
    """`_verdict` reads what SDKs send (text name and explanation, float or int score) without a call
    each; every other value still goes through `_text` / `_number`, so the verdict is the same."""
    from lib.otlp import _VERDICT_ATTRIBUTES, _number, _text, _verdict

    def fields(**given: Any) -> list[Any]:
        return [given.get(keys[0].rsplit(".", 1)[-1]) for keys in _VERDICT_ATTRIBUTES]

    cases = {
        ("  Truth  ", 4, "  terse "): ("Truth", 4.0, "  terse "),
        ("x", 2.5, "   "): ("x", 2.5, None),
        ("   ", True, 7): (None, None, "7"),
        (5, "3", None): ("5", 3.0, None),
        (None, None, ""): (None, None, None),
    }
    for (name, score, explanation), (metric, number, reason) in cases.items():
        v = _verdict(fields(name=name, value=score, explanation=explanation), "t:s", "r1")
        assert (v.name, v.score, v.reason, v.key, v.response_id) == (metric, number, reason, "t:s", "r1")
        assert v.score == (None if score is None else _number(score))
        assert v.reason == (None if explanation is None else _text(explanation))
        assert v.field == f"{EVAL} {metric!r}"


def _scales(engine: Engine, product: str) -> dict[str, tuple[float, float, bool, bool]]:
    with Session(engine) as session:
        rows = session.exec(select(MetricDefinition).where(MetricDefinition.product == product))
        return {m.slug: (m.min_value, m.max_value, m.integer_scale, m.scale_inferred) for m in rows}


def _audited(engine: Engine) -> list[str]:
    with Session(engine) as session:
        rows = session.exec(
            select(AuditEvent).where(AuditEvent.action == AUDIT_ACTION).order_by(AuditEvent.id)
        )
        return [row.detail for row in rows]


def test_a_scale_inferred_from_one_request_grows_with_later_ones_and_a_defined_one_refuses(
    any_receiver: Receiver,
) -> None:
    """review7 F2: a metric the rubric lacks got 0 .. ceil(the first request's highest score), and the
    same judge's later 4s and 5s were refused. An inferred scale now widens with each request's
    scores (span events and late log events alike), audited; a scale a user defined (`--kind
    metrics`) still refuses a score outside it, naming the span and attribute."""
    receiver = any_receiver
    t = Telemetry()
    t.call("Q1?", "A1.", events={"truthfulness": 4, "tone": 3})  # the product keeps the defaults too
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    assert _scales(receiver.engine, "support-bot")["tone"] == (0.0, 3.0, True, True)

    t.call("Q2?", "A2.", events={"tone": 5})
    r = receiver.post("/v1/traces", t.traces())
    assert r.status_code == 200, r.text
    assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    scales = _scales(receiver.engine, "support-bot")
    assert scales["tone"] == (0.0, 5.0, True, True)
    assert scales["truthfulness"] == (1.0, 5.0, True, False)  # a default metric's scale is fixed
    assert _audited(receiver.engine) == ["support-bot: 'tone' widened from 0–3 to 0–5 by an import"]

    # A fractional score makes it continuous; a late log event widens it as a span event does.
    waiting = t.call("Q3?", "A3.", events={"tone": 4.5})
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    t.verdict("tone", 7, waiting)  # the span stored has tone already: this one is a re-sent metric
    t.verdict("warmth", 2, waiting)
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    t.verdict("warmth", 6, t.call("Q4?", "A4."))
    r = receiver.post("/v1/traces", t.traces())
    assert r.status_code == 200 and receiver.post("/v1/logs", t.log_body()).status_code == 200
    scales = _scales(receiver.engine, "support-bot")
    assert scales["tone"] == (0.0, 5.0, False, True)
    assert scales["warmth"] == (0.0, 6.0, True, True)
    with Session(receiver.engine) as session:
        stored = {s.question: s.judge_scores_json for s in session.exec(select(EvaluationSnapshot))}
    assert stored["Q2?"]["tone"]["score"] == 5.0 and stored["Q3?"]["tone"]["score"] == 4.5
    assert stored["Q4?"]["warmth"]["score"] == 6.0
    assert _audited(receiver.engine)[1:] == [
        "support-bot: 'tone' widened from 0–5 to 0–5 (continuous) by an import",
        "support-bot: 'warmth' widened from 0–2 to 0–6 by an import",
    ]

    # A metric a user defined keeps its scale: the span is refused, named, as before.
    with session_scope(receiver.engine) as session:
        import_metrics(
            session=session,
            data=[{"product": "support-bot", "slug": "style", "display_name": "Style", "min": 0, "max": 3}],
        )
    t.call("Q5?", "A5.", events={"style": 4})
    partial = ExportTraceServiceResponse.FromString(receiver.post("/v1/traces", t.traces()).content)
    assert partial.partial_success.rejected_spans == 1
    message = partial.partial_success.error_message
    assert message.startswith("span 'chat m1' (trace ")
    assert f"field \"{EVAL} 'style'\": score 4 for 'style' is outside its scale 0–3" in message
    assert _scales(receiver.engine, "support-bot")["style"] == (0.0, 3.0, True, False)
    assert len(_audited(receiver.engine)) == 3


def test_a_refused_span_or_late_verdict_writes_nothing_of_its_products_rubric(any_receiver: Receiver) -> None:
    """review7 F7: a span refused for one score (truthfulness 9 on the default 1–5) still wrote its
    product's rubric: the eight defaults became the product's own and `warmth` got 0–3 from the
    refused score, fixed before any accepted evaluation scored it. Definitions now come only from
    what is accepted, in a request of spans and in a late log event alike."""
    receiver = any_receiver
    t = Telemetry("fresh-bot")
    t.call("Refused span?", "Yes.", events={"warmth": 3, "truthfulness": 9})
    t.call("Accepted span?", "Yes.", events={"warmth": 1})
    partial = ExportTraceServiceResponse.FromString(receiver.post("/v1/traces", t.traces()).content)
    assert partial.partial_success.rejected_spans == 1
    assert "score 9 for 'truthfulness' is outside its scale 1–5" in partial.partial_success.error_message
    # Only the accepted span's score: warmth 0–1, and no defaults written (it scored none of them).
    assert _scales(receiver.engine, "fresh-bot") == {"warmth": (0.0, 1.0, True, True)}
    assert _audited(receiver.engine) == []
    with Session(receiver.engine) as session:
        stored = [s.question for s in session.exec(select(EvaluationSnapshot))]
    assert stored == ["Accepted span?"]

    # Every span refused: nothing at all.
    t = Telemetry("other-bot")
    t.call("Refused span?", "Yes.", events={"warmth": 3, "truthfulness": 9})
    partial = ExportTraceServiceResponse.FromString(receiver.post("/v1/traces", t.traces()).content)
    assert partial.partial_success.rejected_spans == 1
    assert _scales(receiver.engine, "other-bot") == {}

    # A late log event group refused for one score takes its new metric back with it.
    t = Telemetry("late-bot")
    span = t.call("Judged span?", "Yes.", events={"truthfulness": 4})
    assert receiver.post("/v1/traces", t.traces()).status_code == 200
    t.verdict("helpfulness", 9, span)
    t.verdict("tone", 3, span)
    r = receiver.post("/v1/logs", t.log_body())
    assert r.status_code == 200
    message = ExportLogsServiceResponse.FromString(r.content).partial_success.error_message
    assert "score 9 for 'helpfulness' is outside its scale 1–5" in message
    assert _scales(receiver.engine, "late-bot") == {}
    t.verdict("tone", 5, span)
    assert receiver.post("/v1/logs", t.log_body()).status_code == 200
    assert _scales(receiver.engine, "late-bot")["tone"] == (0.0, 5.0, True, True)
    with Session(receiver.engine) as session:
        late = session.exec(select(Judgment).where(Judgment.product == "late-bot"))
        assert sorted((j.metric, j.decision) for j in late) == [("tone", "5"), ("truthfulness", "4")]
