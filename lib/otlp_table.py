"""The `otlp_spans` table's shared facts: the receiver (lib.otlp) writes and joins its rows, the
waiting list (lib.otlp_waiting) reads them and records the sweep. Both import them from here, so
neither imports the other's module back (tests/test_import_layers.py)."""

from __future__ import annotations

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
