"""The `otlp_spans` table's shared facts: the receiver (lib.otlp) writes and joins its rows, the
waiting list (lib.otlp_waiting) reads them and records the sweep. Both import them from here, so
neither imports the other's module back (tests/test_import_layers.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import Table

from lib.models import OtlpSpan

SPANS: Table = OtlpSpan.__table__  # type: ignore[attr-defined]

# A span nobody judged, or a verdict whose span never came, waits this long, then is forgotten: an
# app exporting every call would otherwise fill `otlp_spans` with calls no judge will look at.
PENDING_DAYS = 7

# The end of a trace's key range: `<trace>:` then the highest span id. Not `<trace>;`: a database
# sorting text by a language's rules (ICU, glibc's en_US: PostgreSQL's default outside C locales)
# puts ';' before ':' or ignores both, and that range came back empty. Between two keys of the same
# length made of hex digits and ':', every collation agrees; callers keep only `<trace>:` keys.
TRACE_END = ":" + "f" * 64


def aware(moment: datetime) -> datetime:
    """A stored time as aware UTC (SQLite hands it back naive)."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


# An evaluation name the receiver quotes (its answers, lib.otlp) or records (the sweep's audit row,
# lib.otlp_waiting) is cut at a word to this many characters (review17 L1).
METRIC_CHARS = 64

# Where a GenAI span holds its question and answer (OpenTelemetry's GenAI conventions).
ANSWER_ATTRIBUTE = "gen_ai.output.messages"
QUESTION_ATTRIBUTE = "gen_ai.input.messages"


def lacking(missing: Sequence[str]) -> str:
    """What a span lacks, in words ("no A and no B"), and when its messages are among it, why they
    most often are: content capture off, or on without the conventions' opt-in, when the
    instrumentation puts the messages in log events Overrule does not read. Why here: the refusal
    (lib.otlp) and a waiting call's advice (lib.otlp_waiting) say it alike (review14 F7: the refusal
    named the missing attributes and nothing of why)."""
    said = " and no ".join(missing)
    if ANSWER_ATTRIBUTE in missing or QUESTION_ATTRIBUTE in missing:
        said += (
            " (the instrumentation records messages on the span with OTEL_INSTRUMENTATION_GENAI_CAPTURE_"
            "MESSAGE_CONTENT=SPAN_ONLY and OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental; "
            "capture on without the opt-in sends them as log events, which Overrule does not read)"
        )
    return said
