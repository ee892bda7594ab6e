"""Decoding OTLP requests (lib.otlp.decode): every kind of attribute value an evaluation event or a
log record can hold reads as the same verdict from protobuf and from OTLP/JSON, and what is
malformed is refused whole. No database: these are the decoder's own rules."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from lib import otlp
from lib.config import get_settings

EVAL = "gen_ai.evaluation.result"
TRACE = "5b8efff798038103d269b633813fc60c"
SPAN = "eee19b7ec3c1b174"
KEY = f"{TRACE}:{SPAN}"
EMPTY = object()  # an AnyValue that holds no value at all (its oneof unset)


def _any(value: Any) -> AnyValue:
    if value is EMPTY:
        return AnyValue()
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        any_value = AnyValue()
        any_value.array_value.values.extend(_any(v) for v in value)
        return any_value
    any_value = AnyValue()
    any_value.kvlist_value.values.extend(KeyValue(key=k, value=_any(v)) for k, v in value.items())
    return any_value


def _json_any(value: Any) -> dict[str, Any]:
    """The OTLP/JSON form of `_any(value)` (ints as strings, bytes in base64, as the spec says)."""
    if value is EMPTY:
        return {}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, bytes):
        return {"bytesValue": base64.b64encode(value).decode()}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_json_any(v) for v in value]}}
    return {"kvlistValue": {"values": [{"key": k, "value": _json_any(v)} for k, v in value.items()]}}


# (an event's attributes as (key, value) pairs in the order sent, the verdict it reads as:
# (metric, score, label, reason, response id)). Keys repeat where a sender repeated them.
CASES: list[tuple[list[tuple[str, Any]], tuple[Any, ...]]] = [
    (
        [("gen_ai.evaluation.name", "truth"), ("gen_ai.evaluation.score.value", 3)],
        ("truth", 3.0, None, None, None),
    ),
    (
        [
            ("gen_ai.evaluation.name", "  padded "),
            ("gen_ai.evaluation.score.value", 0.25),
            ("gen_ai.evaluation.score.label", "pass"),
            ("gen_ai.evaluation.explanation", "why"),
        ],
        ("padded", 0.25, "pass", "why", None),
    ),
    # Every value kind as the explanation: text, or the value's Python text (`_text`).
    ([("gen_ai.evaluation.name", "k"), ("gen_ai.evaluation.explanation", 7)], ("k", None, None, "7", None)),
    (
        [("gen_ai.evaluation.name", "k"), ("gen_ai.evaluation.explanation", 2.5)],
        ("k", None, None, "2.5", None),
    ),
    (
        [("gen_ai.evaluation.name", "k"), ("gen_ai.evaluation.explanation", True)],
        ("k", None, None, "True", None),
    ),
    (
        [("gen_ai.evaluation.name", "k"), ("gen_ai.evaluation.explanation", ["a", 1, 1.5, False])],
        ("k", None, None, "['a', 1, 1.5, False]", None),
    ),
    (
        [("gen_ai.evaluation.name", "k"), ("gen_ai.evaluation.explanation", {"why": "x", "n": [2]})],
        ("k", None, None, "{'why': 'x', 'n': [2]}", None),
    ),
    (
        [("gen_ai.evaluation.name", "k"), ("gen_ai.evaluation.explanation", b"\x00ab")],
        ("k", None, None, "b'\\x00ab'", None),
    ),
    # Scores of every kind: numbers and numeric text are scores; a bool, a list, other text are not.
    ([("gen_ai.evaluation.name", "s"), ("gen_ai.evaluation.score.value", "4")], ("s", 4.0, None, None, None)),
    (
        [("gen_ai.evaluation.name", "s"), ("gen_ai.evaluation.score.value", True)],
        ("s", None, None, None, None),
    ),
    (
        [("gen_ai.evaluation.name", "s"), ("gen_ai.evaluation.score.value", [1])],
        ("s", None, None, None, None),
    ),
    (
        [("gen_ai.evaluation.name", "s"), ("gen_ai.evaluation.score.value", "high")],
        ("s", None, None, None, None),
    ),
    ([("gen_ai.evaluation.name", 5), ("gen_ai.evaluation.score.label", 1)], ("5", None, "1", None, None)),
    # An empty value is no value: the OpenInference twin is read; empty text is a value (no twin).
    (
        [
            ("gen_ai.evaluation.name", EMPTY),
            ("evaluation.name", "oi"),
            ("gen_ai.evaluation.score.value", EMPTY),
            ("evaluation.score", 2),
            ("gen_ai.evaluation.explanation", ""),
            ("evaluation.explanation", "twin"),
            ("gen_ai.evaluation.score.label", "   "),
        ],
        ("oi", 2.0, None, None, None),
    ),
    # OpenInference attributes alone; the GenAI ones win when both are there, whatever the order.
    (
        [("evaluation.label", "good"), ("evaluation.name", "tone"), ("evaluation.explanation", "ok")],
        ("tone", None, "good", "ok", None),
    ),
    (
        [
            ("evaluation.name", "oi"),
            ("evaluation.score", 1),
            ("gen_ai.evaluation.name", "g"),
            ("gen_ai.evaluation.score.value", 4),
        ],
        ("g", 4.0, None, None, None),
    ),
    # A repeated key: the last pair sent wins. Other attributes are passed over.
    (
        [
            ("gen_ai.evaluation.name", "first"),
            ("judge.model", "m2"),
            ("gen_ai.evaluation.name", "last"),
            ("gen_ai.evaluation.score.value", 1),
            ("gen_ai.evaluation.score.value", 5),
        ],
        ("last", 5.0, None, None, None),
    ),
    # The event's own response id (any kind, as text); an empty value is none.
    ([("gen_ai.evaluation.name", "r"), ("gen_ai.response.id", "chat-7")], ("r", None, None, None, "chat-7")),
    ([("gen_ai.evaluation.name", "r"), ("gen_ai.response.id", 123)], ("r", None, None, None, "123")),
    ([("gen_ai.evaluation.name", "r"), ("gen_ai.response.id", EMPTY)], ("r", None, None, None, None)),
    # An evaluation event naming no evaluation is still a verdict (refused later, by its name).
    ([("gen_ai.evaluation.score.value", 2)], (None, 2.0, None, None, None)),
]


def _kvs(pairs: list[tuple[str, Any]]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any(v)) for k, v in pairs]


def _json_kvs(pairs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _json_any(v)} for k, v in pairs]


def _span_request() -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    span = spans.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN), name="chat m1")
    span.attributes.extend(_kvs([("output.value", "A."), ("input.value", "Q?"), ("service.name", "bot")]))
    for pairs, _ in CASES:
        span.events.add(name=EVAL).attributes.extend(_kvs(pairs))
    span.events.add(name="exception").attributes.extend(_kvs([("exception.message", "boom")]))
    return request


def _log_request() -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    for pairs, _ in CASES:
        record = records.add(event_name=EVAL, trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN))
        record.attributes.extend(_kvs(pairs))
    return request


def _as_json(request: Any) -> bytes:
    """The request in OTLP/JSON as the spec writes it: lowerCamelCase, ids in hex."""
    from google.protobuf.json_format import MessageToDict

    def hex_ids(node: Any) -> Any:
        if isinstance(node, list):
            return [hex_ids(n) for n in node]
        if not isinstance(node, dict):
            return node
        return {
            k: base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hex_ids(v)
            for k, v in node.items()
        }

    return json.dumps(hex_ids(MessageToDict(request))).encode()


def _read(verdict: otlp.Verdict) -> tuple[Any, ...]:
    return (verdict.name, verdict.score, verdict.label, verdict.reason, verdict.response_id)


@pytest.mark.parametrize("kind", [otlp.PROTOBUF, otlp.JSON])
def test_every_kind_of_event_attribute_reads_as_the_same_verdict_in_both_encodings(kind: str) -> None:
    """Span events and log records hold a verdict's attributes as any AnyValue kind (string, int,
    double, bool, array, kvlist, bytes, or none), repeated keys, empty values, OpenInference twins:
    each reads as its stated verdict, from protobuf (the attributes looked up by key) and OTLP/JSON
    alike, a span event keyed by its span and a log record by its context or its response id."""
    expected = [verdict for _, verdict in CASES]
    spans, logs = _span_request(), _log_request()
    encode = (lambda r: r.SerializeToString()) if kind == otlp.PROTOBUF else _as_json
    batch = otlp.decode("traces", encode(spans), kind, get_settings())
    assert [_read(v) for v in batch.verdicts] == expected
    assert {v.key for v in batch.verdicts} == {KEY}
    assert [c.key for c in batch.calls] == [KEY] and batch.calls[0].answer == "A."

    batch = otlp.decode("logs", encode(logs), kind, get_settings())
    assert [_read(v) for v in batch.verdicts] == expected
    # A record naming a response id is keyed by it; its context is only where the judge ran.
    for verdict in batch.verdicts:
        named = verdict.response_id is not None
        assert (verdict.key, verdict.context) == ((None, KEY) if named else (KEY, None))
    named = sum(v.response_id is not None for v in batch.verdicts)
    assert batch.items == {KEY: len(CASES) - named, "response:chat-7": 1, "response:123": 1}
    assert batch.unkeyed_items == []


@pytest.mark.parametrize("kind", [otlp.PROTOBUF, otlp.JSON])
def test_log_records_without_ids_or_not_ours_in_both_encodings(kind: str) -> None:
    """A log record with no span context (missing or all-zero ids) and no response id names no
    span: counted as unkeyed, not dropped; with a response id it is keyed by that. An ordinary log
    line is passed over; the `event.name` attribute older SDKs set makes a record ours."""
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    named = [("gen_ai.evaluation.name", "clarity"), ("gen_ai.evaluation.score.value", 4)]
    records.add(event_name=EVAL).attributes.extend(_kvs(named))
    zero = records.add(event_name=EVAL, trace_id=bytes(16), span_id=bytes(8))
    zero.attributes.extend(_kvs([*named, ("gen_ai.response.id", "r1")]))
    records.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN)).attributes.extend(
        _kvs([("http.request.method", "GET"), ("gen_ai.evaluation.score.value", 1)])
    )
    older = records.add(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN))
    older.attributes.extend(_kvs([("event.name", EVAL), ("gen_ai.evaluation.score.value", 1)]))
    body = request.SerializeToString() if kind == otlp.PROTOBUF else _as_json(request)
    batch = otlp.decode("logs", body, kind, get_settings())
    assert [(_read(v), v.key) for v in batch.verdicts] == [
        (("clarity", 4.0, None, None, None), None),
        (("clarity", 4.0, None, None, "r1"), None),
        ((None, 1.0, None, None, None), KEY),
    ]
    assert batch.unkeyed_items == ["clarity"]
    assert batch.items == {"response:r1": 1, KEY: 1}


def test_a_span_without_ids_is_passed_over_and_malformed_protobuf_is_refused_whole() -> None:
    """A span with no span id is no call. Text that is not UTF-8, in an event's or a log record's
    attribute key or value (read by key or not), makes the request malformed: 400, nothing read."""
    request = _span_request()
    request.resource_spans[0].scope_spans[0].spans[0].span_id = b""
    batch = otlp.decode("traces", request.SerializeToString(), otlp.PROTOBUF, get_settings())
    assert (batch.calls, batch.verdicts, dict(batch.items)) == ([], [], {})

    for signal, request in (("traces", _span_request()), ("logs", _log_request())):
        body = request.SerializeToString()
        for text in (b"gen_ai.evaluation.name", b"truth", b"judge.model"):
            assert text in body
            broken = body.replace(text, b"\xff" * len(text), 1)
            with pytest.raises(otlp.OtlpError) as refused:
                otlp.decode(signal, broken, otlp.PROTOBUF, get_settings())
            assert refused.value.status == 400 and f"not an OTLP {signal} protobuf" in refused.value.message
        with pytest.raises(otlp.OtlpError) as refused:
            otlp.decode(signal, body[:-3], otlp.PROTOBUF, get_settings())
        assert refused.value.status == 400


def test_otlp_json_ids_are_hex_and_base64_ids_are_refused() -> None:
    """OTLP/JSON sends trace and span ids in hex (upper case too), not protobuf JSON's base64:
    a base64 id is refused whole with the reason, in a span and in a log record alike."""
    request = _span_request()
    body = json.loads(_as_json(request))
    span = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["traceId"] = span["traceId"].upper()
    batch = otlp.decode("traces", json.dumps(body).encode(), otlp.JSON, get_settings())
    assert [c.key for c in batch.calls] == [KEY]
    span["spanId"] = base64.b64encode(bytes.fromhex(SPAN)).decode()
    with pytest.raises(otlp.OtlpError) as refused:
        otlp.decode("traces", json.dumps(body).encode(), otlp.JSON, get_settings())
    assert refused.value.status == 400 and "is not hex" in refused.value.message

    body = json.loads(_as_json(_log_request()))
    body["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["traceId"] = base64.b64encode(
        bytes.fromhex(TRACE)
    ).decode()
    with pytest.raises(otlp.OtlpError) as refused:
        otlp.decode("logs", json.dumps(body).encode(), otlp.JSON, get_settings())
    assert refused.value.status == 400 and "is not hex" in refused.value.message
