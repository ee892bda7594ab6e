"""What the OTLP receiver (lib.otlp) keeps waiting for its other half, why, and what it forgot.

A GenAI span waits in `otlp_spans` for its evaluation events, and verdicts wait for their call
(under the span they were emitted in, or `response:<id>`), for lib.otlp.PENDING_DAYS; then
`lib.otlp._sweep` forgets them. Some cases wait the whole week with nothing in any answer (a verdict
emitted in a span Overrule never receives, one naming a response id no span records, ...): this
reader is where a lead sees them, on the Admin page ("OpenTelemetry: waiting") and from
`python -m lib otlp waiting`. Each row says, in words, what the sender should change.

The sweep records what it forgot as an audit row (`SWEPT_ACTION`, written by `record_sweep`), so
the count outlives the rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlmodel import Session, col

from lib.bulk import among_value
from lib.models import AuditEvent, utcnow
from lib.otlp import _SPANS, PENDING_DAYS, _aware, _in_traces, _Stored, _stored_by

SWEPT_ACTION = "otlp_swept"
SWEPT_BY = "otlp receiver"  # the audit row's identity: no one's request, the receiver's clean-up

# Why a row waits, in the order the summary lists them, with what the summary calls them.
WHY = {
    "no_verdict": "calls no verdict has come for",
    "span_not_received": "verdicts whose span has not arrived (no call in its trace)",
    "call_came_later": "verdicts whose span has not arrived (their trace's one call came later)",
    "several_calls": "verdicts in a span of a trace with several calls",
    "id_in_other_trace": "verdicts naming another trace's call, emitted in a span not received",
    "id_unrecorded": "verdicts naming a response id no call records",
}
# The whole list's columns (CSV, CLI): each row a line a lead can act on.
COLUMNS = (
    "waiting_since",
    "what",
    "why",
    "trace_id",
    "span_id",
    "response_id",
    "span_name",
    "product",
    "evaluations",
    "advice",
)


@dataclass(frozen=True, slots=True)
class WaitingRow:
    """One `otlp_spans` row that waits: a call (`what` "call") or the verdicts of one key."""

    since: datetime
    what: str  # "call" | "verdicts"
    why: str  # a key of WHY
    trace_id: str  # "" under `response:<id>`
    span_id: str
    response_id: str | None
    span_name: str  # a call's span name ("" for verdicts)
    product: str  # a call's product ("" for verdicts)
    evaluations: tuple[str, ...]  # the waiting verdicts' evaluation names
    advice: str  # why it waits and what the sender should change, in words

    def values(self) -> tuple[Any, ...]:
        """The row as `COLUMNS` name its cells."""
        return (
            self.since,
            self.what,
            self.why,
            self.trace_id,
            self.span_id,
            self.response_id or "",
            self.span_name,
            self.product,
            ", ".join(self.evaluations),
            self.advice,
        )


@dataclass(frozen=True, slots=True)
class WhyCount:
    """How many rows wait for one reason (verdicts: how many events they hold), and the oldest."""

    why: str
    rows: int
    verdicts: int
    oldest: datetime

    @property
    def title(self) -> str:
        return WHY[self.why]


@dataclass(frozen=True, slots=True)
class Swept:
    """What the sweep forgot so far (its audit rows): calls no verdict came for, verdicts whose
    call never came."""

    sweeps: int
    calls: int
    verdicts: int
    last_at: datetime | None

    def describe(self) -> str:
        """One line for the page and the CLI (numbers and dates only)."""
        if self.last_at is None:
            return f"Nothing forgotten yet (what waits longer than {PENDING_DAYS} days is)."
        return (
            f"Forgotten after {PENDING_DAYS} days so far: {self.calls:,} call(s) no verdict came for and "
            f"{self.verdicts:,} verdict(s) whose call never came, in {self.sweeps:,} sweep(s); the last "
            f"{_aware(self.last_at):%Y-%m-%d %H:%M} UTC."
        )


@dataclass(frozen=True)
class Waiting:
    """What waits (oldest first), counted by why, and what was forgotten."""

    rows: list[WaitingRow]
    counts: list[WhyCount]
    swept: Swept

    @property
    def total(self) -> int:
        return sum(c.rows for c in self.counts)


def read(session: Session, *, limit: int | None = None) -> Waiting:
    """Everything that waits in `otlp_spans`, counted by why; `rows` the oldest `limit` (None: all).

    Why: a lead sees what waits, for which reason, and what the sender should change, instead of
    verdicts that wait out the week without a word anywhere."""
    rows = sorted(_rows(session), key=lambda r: _aware(r.since))
    counts: dict[str, WhyCount] = {}
    for row in rows:
        known = counts.get(row.why)
        verdicts = len(row.evaluations) if row.what == "verdicts" else 0
        counts[row.why] = (
            WhyCount(row.why, 1, verdicts, row.since)
            if known is None
            else WhyCount(row.why, known.rows + 1, known.verdicts + verdicts, known.oldest)
        )
    ordered = [counts[why] for why in WHY if why in counts]
    return Waiting(rows[:limit] if limit is not None else rows, ordered, swept(session))


def csv_rows(waiting: Waiting) -> Iterator[tuple[Any, ...]]:
    """The rows as the whole list's CSV writes them (`COLUMNS`)."""
    return (row.values() for row in waiting.rows)


# ---------------------------------------------------------------------------------------------
# Reading and explaining the rows


_JSON = _SPANS.c.span_json


def _rows(session: Session) -> list[WaitingRow]:
    """Every waiting row, explained: calls from their span's name, product and what it lacks (not
    its question and answer); verdicts from where they wait and what their trace and id hold."""
    statement = select(
        _SPANS.c.key,
        _SPANS.c.response_id,
        _SPANS.c.received_at,
        _SPANS.c.pending_json,
        _JSON["name"].as_string(),  # None: no span (SQL NULL or a JSON null), verdicts
        _JSON["product"].as_string(),
        _JSON["missing"].as_json(),
    ).where(_SPANS.c.snapshot_id.is_(None))
    out: list[WaitingRow] = []
    verdicts: list[tuple[str, str | None, datetime, list[Any]]] = []
    for key, response_id, received_at, pending, name, product, missing in session.execute(statement):
        if name is not None:
            out.append(_call_row(key, response_id, received_at, name, product, missing or []))
        elif pending:
            verdicts.append((key, response_id, received_at, pending))
    out.extend(_verdict_rows(session, verdicts))
    return out


def _split(key: str) -> tuple[str, str]:
    if key.startswith("response:"):
        return "", ""
    trace, _, span = key.partition(":")
    return trace, span


def _call_row(
    key: str, response_id: str | None, since: datetime, name: str, product: str | None, missing: list[Any]
) -> WaitingRow:
    named = f" or naming its gen_ai.response.id {response_id!r}" if response_id else ""
    advice = (
        f"No verdict has come for this call. If a judge scored it, emit the verdicts in this span's "
        f"context{named}; a call no judge looks at is forgotten after {PENDING_DAYS} days."
    )
    if missing:
        advice += f" Its verdicts will be refused when they come: the span has no {' and no '.join(map(str, missing))}."
    trace, span = _split(key)
    return WaitingRow(since, "call", "no_verdict", trace, span, response_id, name, product or "", (), advice)


def _verdict_rows(
    session: Session, waiting: Sequence[tuple[str, str | None, datetime, list[Any]]]
) -> Iterator[WaitingRow]:
    """Verdict rows, each with why it waits: what its trace holds (under a span) and which calls
    record the response id it names, read once for all of them."""
    if not waiting:
        return
    traces = {key.partition(":")[0] for key, *_ in waiting if not key.startswith("response:")}
    in_trace = _trace_calls(session, traces)
    named = _calls_naming(session, {rid for _, rid, *_ in waiting if rid})
    for key, rid, since, pending in waiting:
        trace, span = _split(key)
        evaluations = tuple(dict.fromkeys(str(v.get("metric")) for v in pending if isinstance(v, dict)))
        recorded = [k for k in named.get(rid, []) if k != key] if rid else []
        where = f"span {span} (trace {trace}), which Overrule has not received"
        if rid is None:
            calls = in_trace.get(trace, [])
            if not calls:
                why = "span_not_received"
                advice = (
                    f"Emitted in {where}, and its trace holds no call yet. If that span is sampled out "
                    "or exported elsewhere it never will be: emit the verdicts in the judged call's "
                    "span context, or name the call's gen_ai.response.id."
                )
            elif len(calls) == 1:
                why = "call_came_later"
                advice = (
                    f"Emitted in {where}; its trace's one call (span {calls[0].partition(':')[2]}) came "
                    f"after the verdicts. They join it when span {span} arrives; if that span came before "
                    "them (a span that is no call is passed over) or never comes, they wait in vain: emit "
                    "the verdicts in the judged call's span context, or name its gen_ai.response.id."
                )
            else:
                why = "several_calls"
                advice = (
                    f"Emitted in {where}, in a trace of {len(calls)} calls: Overrule cannot tell which "
                    f"one they judge (when span {span} arrives they are named in the answer and "
                    "dropped; if it came before them they wait in vain). Emit the verdicts in the judged "
                    "call's span context, or name its gen_ai.response.id."
                )
        elif recorded and span:
            why = "id_in_other_trace"
            advice = (
                f"Names gen_ai.response.id {rid!r}, which {len(recorded)} call(s) of another trace record, "
                f"but was emitted in {where}: it waits for that span, since some servers repeat ids. "
                "If the span is sampled out or exported elsewhere, emit the verdicts outside any span "
                "(with the response id) or in the judged call's span context."
            )
        elif recorded:  # under `response:<id>`, yet calls record it: they came with it in no request
            why = "id_unrecorded"
            advice = (
                f"Names gen_ai.response.id {rid!r}, which {len(recorded)} stored call(s) record, but "
                "it waits for a call that names it to arrive: emit the verdicts in the judged call's "
                "span context."
            )
        else:
            why = "id_unrecorded"
            emitted = f", emitted in {where}" if span else ""
            advice = (
                f"Names gen_ai.response.id {rid!r}, which no call Overrule holds records{emitted}. The "
                "call's span has not arrived, or it records no gen_ai.response.id (streaming or "
                "hand-made spans: emit the verdicts in that span's context), or the id is not the "
                "judged call's."
            )
        yield WaitingRow(since, "verdicts", why, trace, span, rid, "", "", evaluations, advice)


def _trace_calls(session: Session, traces: set[str]) -> dict[str, list[str]]:
    """The stored calls of each trace (lib.otlp's indexed key-range read)."""
    found: dict[str, list[str]] = {}
    if not traces:
        return found
    for values in session.execute(_in_traces(session), {"traces": among_value(session, traces)}):
        row = _Stored(*values)
        trace = row.key.partition(":")[0]
        if trace in traces and row.is_call:
            found.setdefault(trace, []).append(row.key)
    return {trace: sorted(calls) for trace, calls in found.items()}


def _calls_naming(session: Session, response_ids: set[str]) -> dict[str, list[str]]:
    """The calls received in the last PENDING_DAYS that record each response id (those the
    receiver would join a verdict to)."""
    found: dict[str, list[str]] = {}
    if not response_ids:
        return found
    recent = utcnow() - timedelta(days=PENDING_DAYS)
    rows = session.execute(_stored_by(session, "response_id"), {"keys": among_value(session, response_ids)})
    for values in rows:
        row = _Stored(*values)
        if row.response_id and row.is_call and _aware(row.received_at) >= recent:
            found.setdefault(row.response_id, []).append(row.key)
    return found


# ---------------------------------------------------------------------------------------------
# What the sweep forgot


_SWEPT = re.compile(r"^forgot (\d+) call\(s\) .*? and (\d+) verdict\(s\)")


def record_sweep(session: Session, cutoff: datetime) -> None:
    """Before lib.otlp._sweep deletes what waited since before `cutoff`: one audit row saying how many
    calls and verdicts it forgets and which evaluations (none when nothing waited that long)."""
    from lib.auth import record_event

    j = _SPANS.c.span_json
    statement = select(_SPANS.c.received_at, _SPANS.c.pending_json, j["name"].as_string()).where(
        _SPANS.c.snapshot_id.is_(None), _SPANS.c.received_at < cutoff
    )
    calls = verdicts = 0
    names: dict[str, None] = {}
    oldest: datetime | None = None
    for received_at, pending, name in session.execute(statement):
        oldest = received_at if oldest is None or received_at < oldest else oldest
        if name is not None:
            calls += 1
            continue
        for verdict in pending or []:
            verdicts += 1
            if isinstance(verdict, dict):
                names[str(verdict.get("metric"))] = None
    if oldest is None:
        return
    evaluations = f" ({', '.join(list(names)[:20])})" if names else ""
    record_event(
        session=session,
        identity=SWEPT_BY,
        action=SWEPT_ACTION,
        detail=(
            f"forgot {calls} call(s) no verdict came for and {verdicts} verdict(s) whose call never "
            f"came{evaluations}, after {PENDING_DAYS} days; the oldest waited since "
            f"{_aware(oldest):%Y-%m-%d %H:%M} UTC"
        ),
    )


def swept(session: Session) -> Swept:
    """The sweep's audit rows summed: what the receiver forgot so far."""
    statement = select(AuditEvent.at, AuditEvent.detail).where(col(AuditEvent.action) == SWEPT_ACTION)
    sweeps = calls = verdicts = 0
    last: datetime | None = None
    for at, detail in session.execute(statement):
        match = _SWEPT.match(detail)
        if match is None:  # not ours (the audit trail is append-only, but anyone may read it)
            continue
        sweeps += 1
        calls += int(match.group(1))
        verdicts += int(match.group(2))
        last = at if last is None or _aware(at) > _aware(last) else last
    return Swept(sweeps, calls, verdicts, last)


def summary_lines(waiting: Waiting) -> Iterable[str]:
    """The counts as the CLI prints them (our words and numbers only)."""
    if not waiting.counts:
        yield "Nothing waits: every span and verdict received has met its other half."
    for count in waiting.counts:
        held = f" ({count.verdicts} verdict(s))" if count.verdicts else ""
        yield f"{count.rows:,} {count.title}{held}; the oldest since {_aware(count.oldest):%Y-%m-%d %H:%M} UTC"
    yield waiting.swept.describe()
