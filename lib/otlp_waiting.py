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
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Text, and_, cast, func, not_, select
from sqlmodel import Session, col

from lib.bulk import among_value
from lib.models import AuditEvent, utcnow
from lib.otlp import _SPANS, PENDING_DAYS, _aware, _in_traces, _Stored, _stored_by

if TYPE_CHECKING:
    import pandas as pd

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

    def record(self) -> dict[str, Any]:
        """The row as JSON (`GET /api/v1/otlp/waiting`): `COLUMNS`, the time in ISO 8601 UTC."""
        return {
            **dict(zip(COLUMNS, self.values(), strict=True)),
            "waiting_since": _aware(self.since).isoformat(),
            "response_id": self.response_id,
            "evaluations": list(self.evaluations),
        }


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
    verdicts that wait out the week without a word anywhere. Calls no verdict came for are counted
    in SQL and only the oldest `limit` read: an app exporting every call has a week of them."""
    verdicts = list(_verdict_rows(session, _waiting_verdicts(session)))
    rows = sorted([*verdicts, *_call_rows(session, limit)], key=lambda r: _aware(r.since))[:limit]
    counts: dict[str, WhyCount] = {}
    calls, oldest = session.execute(
        select(func.count(), func.min(_SPANS.c.received_at)).where(_WAITS, _IS_CALL)
    ).one()
    if calls:
        counts["no_verdict"] = WhyCount("no_verdict", calls, 0, oldest)
    for row in verdicts:
        known = counts.get(row.why)
        counts[row.why] = (
            WhyCount(row.why, 1, len(row.evaluations), row.since)
            if known is None
            else WhyCount(
                row.why, known.rows + 1, known.verdicts + len(row.evaluations), min(known.oldest, row.since)
            )
        )
    ordered = [counts[why] for why in WHY if why in counts]
    return Waiting(rows, ordered, swept(session))


def waiting_record(waiting: Waiting) -> dict[str, Any]:
    """What waits as JSON (`GET /api/v1/otlp/waiting`): counts by why, the rows, what was forgotten."""
    last = waiting.swept.last_at
    return {
        "total": waiting.total,
        "counts": [
            {
                "why": c.why,
                "title": c.title,
                "rows": c.rows,
                "verdicts": c.verdicts,
                "oldest": _aware(c.oldest).isoformat(),
            }
            for c in waiting.counts
        ],
        "rows": [row.record() for row in waiting.rows],
        "swept": {
            "sweeps": waiting.swept.sweeps,
            "calls": waiting.swept.calls,
            "verdicts": waiting.swept.verdicts,
            "last_at": None if last is None else _aware(last).isoformat(),
        },
    }


def csv_chunks(engine: Engine) -> Iterator[bytes]:
    """The whole list as UTF-8 CSV (`COLUMNS`, oldest first), cells a spreadsheet would run
    neutralised (lib.export.iter_csv): the CLI's `--csv` and the Admin page's download."""
    from lib.db import session_scope
    from lib.export import iter_csv

    with session_scope(engine, read_only=True) as session:
        waiting = read(session)
    return iter_csv(COLUMNS, (row.values() for row in waiting.rows))


def frames(waiting: Waiting) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The counts by why and the rows, as the Admin page shows them."""
    import pandas as pd

    counts = pd.DataFrame(
        [(c.title, c.rows, c.verdicts, _aware(c.oldest)) for c in waiting.counts],
        columns=["why", "rows", "verdicts", "oldest"],
    )
    rows = pd.DataFrame([row.values() for row in waiting.rows], columns=list(COLUMNS))
    rows["waiting_since"] = pd.to_datetime(rows["waiting_since"], utc=True)
    return counts, rows


# ---------------------------------------------------------------------------------------------
# Reading and explaining the rows


_WAITS = _SPANS.c.snapshot_id.is_(None)  # not (yet) an evaluation: a call or verdicts waiting
# A call's row holds its span; a row of verdicts none (SQL NULL as lib.otlp writes it, or a JSON null
# as the ORM writes None): told apart without parsing a week of spans' JSON.
_IS_CALL = and_(_SPANS.c.span_json.is_not(None), cast(_SPANS.c.span_json, Text) != "null")


def _call_rows(session: Session, limit: int | None) -> Iterator[WaitingRow]:
    """The oldest `limit` calls waiting (None: all), explained from their span's name, product and
    what it lacks; their question and answer are not read. With a limit, the keys are picked first:
    the JSON of only those spans is read."""
    j = _SPANS.c.span_json
    columns = (
        _SPANS.c.key,
        _SPANS.c.response_id,
        _SPANS.c.received_at,
        j["name"].as_string(),
        j["product"].as_string(),
        j["missing"].as_json(),
    )
    oldest = (_SPANS.c.received_at, _SPANS.c.key)
    statement = select(*columns).where(_WAITS, _IS_CALL)
    if limit is not None:
        keys = select(_SPANS.c.key).where(_WAITS, _IS_CALL).order_by(*oldest).limit(limit)
        statement = statement.where(_SPANS.c.key.in_(keys.scalar_subquery()))
    for key, response_id, received_at, name, product, missing in session.execute(statement.order_by(*oldest)):
        yield _call_row(key, response_id, received_at, name or "", product, missing or [])


def _waiting_verdicts(session: Session) -> list[tuple[str, str | None, datetime, list[Any]]]:
    """Every row of verdicts waiting for their call: key, response id, since, the verdicts."""
    statement = select(_SPANS.c.key, _SPANS.c.response_id, _SPANS.c.received_at, _SPANS.c.pending_json)
    rows = session.execute(statement.where(_WAITS, not_(_IS_CALL)))
    return [(key, rid, since, pending) for key, rid, since, pending in rows if pending]


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
                    f"Emitted in {where}, and its trace holds no call yet: they join that span when "
                    "it arrives as the call (spans are exported a few seconds after their verdicts). If "
                    "it is sampled out or exported elsewhere it never will: emit the verdicts in the "
                    "judged call's span context, or name the call's gen_ai.response.id."
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

    statement = select(_SPANS.c.received_at, _SPANS.c.pending_json, _IS_CALL).where(
        _WAITS, _SPANS.c.received_at < cutoff
    )
    calls = verdicts = 0
    names: dict[str, None] = {}
    oldest: datetime | None = None
    for received_at, pending, is_call in session.execute(statement):
        oldest = received_at if oldest is None or received_at < oldest else oldest
        if is_call:
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
