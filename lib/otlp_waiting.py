"""What the OTLP receiver (lib.otlp) keeps waiting for its other half, why, and what it forgot.

A GenAI span waits in `otlp_spans` for its evaluation events, and verdicts wait for their call
(under the span they were emitted in, or `response:<id>`), for lib.otlp_table.PENDING_DAYS; then
`lib.otlp._sweep` forgets them. Some cases wait the whole week with nothing in any answer (a verdict
emitted in a span Overrule never receives, one naming a response id no span records, ...): this
reader is where a lead sees them, on the Admin page ("OpenTelemetry: waiting") and from
`python -m lib otlp waiting`. Each row says, in words, what the sender should change.

The sweep records what it forgot as an audit row (`SWEPT_ACTION`, written by `record_sweep`), so
the count outlives the rows. A request whose answer rejects something or warns (OTLP's partial
success, which the SDK's exporters never read) is recorded the same way (`REFUSED_ACTION`, written by
`record_refused`): a lead sees it here, not only in the server's log (review18 L6).
"""

from __future__ import annotations

import heapq
import itertools
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Text, and_, bindparam, case, cast, func, not_, or_, select, text
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlmodel import Session, col

from lib.auth import AuditRate
from lib.csv_text import iso_utc, neutralise_cell
from lib.display import cut_at_word, one_line
from lib.models import AuditEvent, utcnow
from lib.otlp_table import METRIC_CHARS, PENDING_DAYS, SPANS, TRACE_END, aware, lacking

if TYPE_CHECKING:
    import pandas as pd

SWEPT_ACTION = "otlp_swept"
SWEPT_BY = "otlp receiver"  # the audit row's identity: no one's request, the receiver's clean-up
NOTHING = "Nothing waits: every span and verdict received has met its other half."  # CLI and page
REFUSED_ACTION = "otlp_refused"
NOTHING_REFUSED = "Nothing refused: no OTLP request's answer has rejected anything or warned of anything."
REFUSED_SHOWN = 50  # the latest refusals the Admin page shows
REFUSED_PRINTED = 10  # and the CLI's short part

# Rows of verdicts counted by why on the Admin page and in the API answer: the oldest this many
# (classing a row is the one cost of the counts that grows fast: SQLite 0.91 -> 0.43 CPU s an API
# call at 300k waiting verdicts); the rest are counted, not classed. The CLI and the CSV class all.
CLASSED = 10_000

# Why a row waits, in the order the summary lists them, with what the summary calls them.
WHY = {
    "no_verdict": "calls no verdict has come for",
    "span_not_received": "verdicts whose span has not arrived (no call in its trace)",
    "call_came_later": "verdicts whose span has not arrived (their trace's one call came later)",
    "several_calls": "verdicts in a span of a trace with several calls",
    "id_in_other_trace": "verdicts naming another trace's call, emitted in a span not received",
    "in_call_recording_another": "verdicts emitted in a call that records another response id",
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
        """The row as `COLUMNS` name its cells ("" for what it does not have, as a CSV cell is)."""
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
        """The row as JSON (`GET /api/v1/otlp/waiting`): `COLUMNS`, what the row does not have null
        (review14 F7: `trace_id: ""` beside `response_id: null`), the time as the CSV writes it."""
        return {
            **{k: v or None for k, v in zip(COLUMNS, self.values(), strict=True)},
            "waiting_since": utc_text(self.since),
            "evaluations": list(self.evaluations),
        }

    def cells(self) -> tuple[str, ...]:
        """The row as the CLI prints it: the CSV's text of each cell (the time `...Z`), formulas
        neutralised as the CSV's are: the plain table saved as .tsv opens in a spreadsheet too
        (review17 L2: `=HYPERLINK(...)` in an evaluation name ran there)."""
        return (utc_text(self.since), *(neutralise_cell(str(value)) for value in self.values()[1:]))


def utc_text(moment: datetime) -> str:
    """A stored time as the list writes it everywhere (CSV, API, CLI rows and counts): ISO 8601 UTC
    with microseconds and `Z`. Why one form: the three surfaces wrote three (review14 F7); why
    always the fraction: `iso_utc` drops a zero one, so the text varied in width and sorted
    `…:01Z` after `…:01.5Z` (review16 L6)."""
    return iso_utc(aware(moment), timespec="microseconds")


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

    def describe(self) -> str:
        """The count in words, rows and verdicts told apart ("1 row (2 verdicts) naming ..."), as the
        CLI prints it. Why: "1 verdicts naming ... (2 verdict(s))" read as two counts of one thing
        (review14 F7); the Admin table says Rows | Verdicts in columns."""
        if self.why == "no_verdict":  # a call's row is the call
            noun = "call" if self.rows == 1 else "calls"
            return f"{self.rows:,} {noun}{self.title.removeprefix('calls')}"
        rows = "row" if self.rows == 1 else "rows"
        verdicts = "verdict" if self.verdicts == 1 else "verdicts"
        held = f"{self.rows:,} {rows} ({self.verdicts:,} {verdicts})"
        return f"{held}{self.title.removeprefix('verdicts')}"


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
            f"{utc_text(self.last_at)}."
        )


@dataclass(frozen=True)
class Waiting:
    """What waits (oldest first), counted by why, and what was forgotten."""

    rows: list[WaitingRow]
    counts: list[WhyCount]
    swept: Swept
    unclassed: int = 0  # rows of verdicts newer than the `classed` oldest, not in `counts` (a capped read)

    @property
    def total(self) -> int:
        return sum(c.rows for c in self.counts) + self.unclassed


def read(session: Session, *, limit: int | None = None, classed: int | None = None) -> Waiting:
    """Everything that waits in `otlp_spans`, counted by why; `rows` the oldest `limit` (None: all).
    With `classed`, only the oldest `classed` rows of verdicts are counted by why; the rest are
    counted, not classed (`Waiting.unclassed`): the Admin page's and the API's bound (`CLASSED`;
    the CLI and the CSV class all).

    Why: a lead sees what waits, for which reason, and what the sender should change, instead of
    verdicts that wait out the week without a word anywhere. The counts are SQL's (`_why`, grouped:
    no row comes into Python for them), and only the oldest `limit` rows are read and explained,
    their verdicts' JSON decoded once: a broken pipeline keeps a week of waiting rows, and the Admin
    page and the API run this on every visit (review11 F4: 100k waiting verdicts cost 1.7 CPU s and
    166 MiB a run when each was read and classified in Python)."""
    _without_jit(session)
    rows = list(itertools.islice(_rows(session, limit), limit))
    counts = _counts(session, classed)
    unclassed = 0
    if classed is not None and sum(c.rows for c in counts if c.why != "no_verdict") >= classed:
        unclassed = session.execute(select(func.count()).where(*_VERDICTS)).scalar_one() - classed
    return Waiting(rows, counts, swept(session), unclassed)


def anything_waits(session: Session) -> bool:
    """Whether any row waits (a call or verdicts): one indexed look-up, whatever waits. Why: the
    Admin page's section, closed, says whether there is anything to open for."""
    return session.execute(select(SPANS.c.key).where(_WAITS).limit(1)).first() is not None


def waiting_record(waiting: Waiting) -> dict[str, Any]:
    """What waits as JSON (`GET /api/v1/otlp/waiting`): counts by why, the rows, what was forgotten."""
    last = waiting.swept.last_at
    return {
        "total": waiting.total,
        "unclassed": waiting.unclassed,
        "counts": [
            {
                "why": c.why,
                "title": c.title,
                "rows": c.rows,
                "verdicts": c.verdicts,
                "oldest": utc_text(c.oldest),
            }
            for c in waiting.counts
        ],
        "rows": [row.record() for row in waiting.rows],
        "swept": {
            "sweeps": waiting.swept.sweeps,
            "calls": waiting.swept.calls,
            "verdicts": waiting.swept.verdicts,
            "last_at": None if last is None else utc_text(last),
        },
    }


def csv_chunks(engine: Engine) -> Iterator[bytes]:
    """The whole list as UTF-8 CSV (`COLUMNS`, oldest first), cells a spreadsheet would run
    neutralised (lib.export.iter_csv): the CLI's `--csv` and the Admin page's download. Streamed:
    rows are read in batches (`_BATCH`) as the CSV is written, never the whole list at once."""
    from lib.db import session_scope
    from lib.export import iter_csv

    with session_scope(engine, read_only=True) as session:
        _without_jit(session)
        rows = ((utc_text(row.since), *row.values()[1:]) for row in _rows(session, None))
        yield from iter_csv(COLUMNS, rows)


def frames(waiting: Waiting) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The counts by why and the rows, as the Admin page shows them."""
    import pandas as pd

    counts = pd.DataFrame(
        [(c.title, c.rows, c.verdicts, aware(c.oldest)) for c in waiting.counts],
        columns=["why", "rows", "verdicts", "oldest"],
    )
    rows = pd.DataFrame([row.values() for row in waiting.rows], columns=list(COLUMNS))
    rows["waiting_since"] = pd.to_datetime(rows["waiting_since"], utc=True)
    return counts, rows


# ---------------------------------------------------------------------------------------------
# Reading and explaining the rows


_WAITS = SPANS.c.snapshot_id.is_(None)  # not (yet) an evaluation: a call or verdicts waiting


# A call's row holds its span; a row of verdicts none (SQL NULL as lib.otlp writes it, or a JSON null
# as the ORM writes None): told apart without parsing a week of spans' JSON.
def _holds_span(table: Any) -> Any:
    return and_(table.c.span_json.is_not(None), cast(table.c.span_json, Text) != "null")


_IS_CALL = _holds_span(SPANS)


class _Parsable(FunctionElement[Any]):
    """A row's `pending_json` as SQL's JSON functions may read it: on SQLite, text its JSON parser
    refuses reads as one verdict of nothing (`[{}]`). Python's json module wrote NaN and Infinity,
    which SQLite's parser calls malformed: one such row (a non-finite score kept before lib.otlp
    refused them, review17 H1) made every read of the list fail, the API's, the CLI's and the
    Admin page's, for the week it waited. PostgreSQL's JSON type never stored one."""

    type = SPANS.c.pending_json.type
    inherit_cache = True
    name = "parsable"


@compiles(_Parsable)
def _parsable(element: _Parsable, compiler: Any, **kw: Any) -> str:
    return str(compiler.process(element.clauses, **kw))


@compiles(_Parsable, "sqlite")
def _parsable_sqlite(element: _Parsable, compiler: Any, **kw: Any) -> str:
    text = compiler.process(element.clauses, **kw)
    return f"CASE WHEN json_valid({text}) THEN {text} ELSE '[{{}}]' END"


_PENDING = _Parsable(SPANS.c.pending_json)
_VERDICTS = (_WAITS, not_(_IS_CALL), func.json_array_length(_PENDING) > 0)
_OLDEST = (SPANS.c.received_at, SPANS.c.key)


def _oldest_keys(limit: int, *where: Any) -> Any:
    """`SELECT key` of the oldest `limit` rows matching `where`: a listing's rows are picked by key
    first, so only theirs are read whole."""
    return select(SPANS.c.key).where(*where).order_by(*_OLDEST).limit(limit)


def _naming(other: Any, response_id: Any, key: Any) -> tuple[Any, ...]:
    """`other` is a call stored in the last PENDING_DAYS (parameter `recent`) that records
    `response_id` and is not `key`'s own row: lib.otlp `_Join._named`'s other calls of an id."""
    return (
        other.c.response_id == response_id,
        other.c.key != key,
        _stored_call(other),
        other.c.received_at >= bindparam("recent"),
    )


_BATCH = 1000  # rows a read brings at a time (the CSV's, streamed)


def _rows(session: Session, limit: int | None) -> Iterator[WaitingRow]:
    """The waiting rows, oldest first: the oldest `limit` calls and the oldest `limit` rows of
    verdicts (None: all, read `_BATCH` at a time), merged; the caller takes the first `limit`."""
    return heapq.merge(
        _call_rows(session, limit), _verdict_rows(session, limit), key=lambda r: aware(r.since)
    )


def _call_rows(session: Session, limit: int | None) -> Iterator[WaitingRow]:
    """The oldest `limit` calls waiting (None: all), explained from their span's name, product and
    what it lacks; their question and answer are not read. With a limit, the keys are picked first:
    the JSON of only those spans is read."""
    j = SPANS.c.span_json
    other = SPANS.alias("other")
    # lib.otlp `_Join._named`: a verdict naming an id other calls record is refused
    shared = select(other.c.key).where(*_naming(other, SPANS.c.response_id, SPANS.c.key)).exists()
    columns = (
        SPANS.c.key,
        SPANS.c.response_id,
        SPANS.c.received_at,
        j["name"].as_string(),
        j["product"].as_string(),
        j["missing"].as_json(),
        shared,
    )
    statement = select(*columns).where(_WAITS, _IS_CALL)
    if limit is not None:
        statement = statement.where(SPANS.c.key.in_(_oldest_keys(limit, _WAITS, _IS_CALL).scalar_subquery()))
    statement = statement.order_by(*_OLDEST).execution_options(yield_per=_BATCH)
    for key, response_id, received_at, name, product, missing, is_shared in session.execute(
        statement, {"recent": _recent()}
    ):
        yield _call_row(key, response_id, received_at, name or "", product, missing or [], bool(is_shared))


def _stored_call(table: Any) -> Any:
    """A GenAI call's row of `table` (lib.otlp `_Stored.is_call`): its span waiting, or joined."""
    return or_(table.c.snapshot_id.is_not(None), _holds_span(table))


@dataclass(frozen=True)
class _Why:
    """Why each row of verdicts waits, and what its advice names, as SQL of the outer `otlp_spans`
    row (correlated subqueries, each an indexed read): the receiver's routing (lib.otlp `_Join`)
    restated once, for the counts (grouped) and the rows alike."""

    why: Any
    trace_calls: Any  # the calls of the row's trace (rows under a span)
    first_call: Any  # the first of them (its span id is what `call_came_later` names)
    recorded: Any  # calls of other keys received in the last PENDING_DAYS that record its response id
    context_records: Any  # what the call it was emitted in records (rows under `response:<id>`)


def _why_of(session: Session) -> _Why:
    return _why(session.get_bind().dialect.name)


def _without_jit(session: Session) -> None:
    """On PostgreSQL, no JIT for the rest of this (read-only) transaction: the estimate of the
    correlated subqueries (a key range is guessed at 500 rows a loop) and of a week of spans' JSON
    passes jit_above_cost, and compiling the plans cost more of the server's CPU than running them
    (100k waiting calls, the counts: 0.24 -> 0.04 CPU s)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SET LOCAL jit = off"))


def _why(dialect: str) -> _Why:
    key, rid = SPANS.c.key, SPANS.c.response_id
    other = SPANS.alias("other")
    if dialect == "postgresql":
        prefix = func.split_part(key, ":", 1).concat(":")
    else:
        prefix = func.substr(key, 1, func.instr(key, ":"))
    in_trace = (  # the key range lib.otlp `_in_traces` reads, then only `<trace>:` keys
        other.c.key >= prefix,
        other.c.key <= prefix.concat(TRACE_END.removeprefix(":")),
        func.substr(other.c.key, 1, func.length(prefix)) == prefix,
        _stored_call(other),
    )
    trace_calls = select(func.count()).where(*in_trace).scalar_subquery()
    first_call = select(func.min(other.c.key)).where(*in_trace).scalar_subquery()
    naming = _naming(other, rid, key)
    recorded = select(func.count()).where(*naming).scalar_subquery()
    context = _PENDING[(0, "context")].as_string()  # lib.otlp `_verdict_json`
    context_records = (
        select(other.c.response_id).where(other.c.key == context, _stored_call(other)).scalar_subquery()
    )
    under_response = key.startswith("response:")
    why = case(
        (
            rid.is_(None),
            case({0: "span_not_received", 1: "call_came_later"}, value=trace_calls, else_="several_calls"),
        ),
        (and_(not_(under_response), select(other.c.key).where(*naming).exists()), "id_in_other_trace"),
        (and_(under_response, context_records.is_not(None)), "in_call_recording_another"),
        else_="id_unrecorded",
    )
    return _Why(why, trace_calls, first_call, recorded, context_records)


def _counts(session: Session, classed: int | None = None) -> list[WhyCount]:
    """Rows, verdicts and the oldest for each why, counted in SQL; rows of verdicts only among the
    oldest `classed` (None: all): classing a row runs `_Why`'s subqueries, the one cost of the
    counts that grows fast (0.24 of 0.30 CPU s at 100k waiting verdicts), and the oldest are the
    ones nearest being forgotten. Calls and verdicts apart: one grouped pass telling them apart in
    a `CASE` cost more (SQLite 0.31 -> 0.51 CPU s a page run at 100k waiting calls) than the second
    scan it saves."""
    counts: dict[str, WhyCount] = {}
    calls, oldest = session.execute(
        select(func.count(), func.min(SPANS.c.received_at)).where(_WAITS, _IS_CALL)
    ).one()
    if calls:
        counts["no_verdict"] = WhyCount("no_verdict", calls, 0, oldest)
    rows = select(
        _why_of(session).why.label("why"),
        func.json_array_length(_PENDING).label("verdicts"),
        SPANS.c.received_at,
    ).where(*_VERDICTS)
    if classed is not None:  # from the oldest keys to their rows: only those are classed
        oldest_keys = _oldest_keys(classed, *_VERDICTS).subquery()
        rows = rows.select_from(oldest_keys.join(SPANS, SPANS.c.key == oldest_keys.c.key))
    listed = rows.subquery()
    statement = select(
        listed.c.why, func.count(), func.sum(listed.c.verdicts), func.min(listed.c.received_at)
    ).group_by(listed.c.why)
    for reason, n, verdicts, since in session.execute(statement, {"recent": _recent()}):
        counts[reason] = WhyCount(reason, n, int(verdicts or 0), since)
    return [counts[reason] for reason in WHY if reason in counts]


def _recent() -> datetime:
    return utcnow() - timedelta(days=PENDING_DAYS)


def _verdict_rows(session: Session, limit: int | None) -> Iterator[WaitingRow]:
    """The oldest `limit` rows of verdicts (None: all, `_BATCH` at a time), each with why it waits
    and what the sender should change; their JSON decoded once, for these rows only."""
    why = _why_of(session)
    statement = select(
        SPANS.c.key,
        SPANS.c.response_id,
        SPANS.c.received_at,
        SPANS.c.pending_json,
        why.why,
        why.trace_calls,
        why.first_call,
        why.recorded,
        why.context_records,
    ).where(*_VERDICTS)
    if limit is not None:
        statement = statement.where(SPANS.c.key.in_(_oldest_keys(limit, *_VERDICTS).scalar_subquery()))
    statement = statement.order_by(*_OLDEST).execution_options(yield_per=_BATCH)
    for values in session.execute(statement, {"recent": _recent()}):
        yield _verdict_row(*values)


def _split(key: str) -> tuple[str, str]:
    if key.startswith("response:"):
        return "", ""
    trace, _, span = key.partition(":")
    return trace, span


def _call_row(
    key: str,
    response_id: str | None,
    since: datetime,
    name: str,
    product: str | None,
    missing: list[Any],
    shared: bool,
) -> WaitingRow:
    """A waiting call's row. Its response id is advised only when no other call records it: a
    verdict naming a shared id outside any span is refused (review14 F1: re-running the docs'
    example against a server whose ids repeat was advised exactly what had been refused)."""
    if shared:
        named = (
            f" or in one span with the call (other calls record its gen_ai.response.id {response_id!r} "
            "too: a verdict naming it outside their traces is refused)"
        )
    else:
        named = f" or naming its gen_ai.response.id {response_id!r}" if response_id else ""
    advice = (
        f"No verdict has come for this call. If a judge scored it, emit the verdicts in this span's "
        f"context{named}; a call no judge looks at is forgotten after {PENDING_DAYS} days."
    )
    if missing:
        advice += f" Its verdicts will be refused when they come: the span has no {lacking(list(map(str, missing)))}."
    trace, span = _split(key)
    return WaitingRow(since, "call", "no_verdict", trace, span, response_id, name, product or "", (), advice)


def _verdict_row(
    key: str,
    rid: str | None,
    since: datetime,
    pending: list[Any],
    why: str,
    trace_calls: int,
    first_call: str | None,
    recorded: int,
    context_records: str | None,
) -> WaitingRow:
    """A row of verdicts as `_Why` classed it, with its advice in words."""
    trace, span = _split(key)
    verdicts = [v for v in pending if isinstance(v, dict)]
    evaluations = tuple(dict.fromkeys(str(v.get("metric")) for v in verdicts))
    # "not kept", not "not received": a span that is no call may have come before them and been
    # passed over (review14 F7: a received handler span was said not to have arrived).
    where = f"span {span} (trace {trace}), which Overrule has not kept"
    passed_over = (
        "if that span came before them (a span that is no call is passed over, not kept) or never "
        "comes, they wait in vain"
    )
    if why == "span_not_received":
        advice = (
            f"Emitted in {where}, and its trace holds no call yet: when that span arrives they join it "
            "if it is the call, else the one call of its trace (spans are exported a few seconds after "
            f"their verdicts); {passed_over}. If it is sampled out or exported elsewhere, or its trace "
            "holds several calls: emit the verdicts in the judged call's span context, or name the "
            "call's gen_ai.response.id."
        )
    elif why == "call_came_later":
        one = (first_call or "").partition(":")[2]
        advice = (
            f"Emitted in {where}; its trace's one call (span {one}) came after the verdicts. They "
            f"join it when span {span} arrives; {passed_over}: emit the verdicts in the judged call's "
            "span context, or name its gen_ai.response.id."
        )
    elif why == "several_calls":
        advice = (
            f"Emitted in {where}, in a trace of {trace_calls} calls: Overrule cannot tell which one "
            f"they judge (when span {span} arrives they are named in the answer and dropped; if it "
            "came before them they wait in vain). Emit the verdicts in the judged call's span "
            "context, or name its gen_ai.response.id."
        )
    elif why == "id_in_other_trace":
        advice = (
            f"Names gen_ai.response.id {rid!r}, which {recorded} call(s) of another trace record, but "
            f"was emitted in {where}: it waits for that span, since some servers repeat ids. If the "
            "span is sampled out or exported elsewhere, emit the verdicts outside any span (with the "
            "response id) or in the judged call's span context."
        )
    elif why == "in_call_recording_another":
        context = str(verdicts[0].get("context") or "")
        ctx_trace, _, ctx_span = context.partition(":")
        trace, span = ctx_trace, ctx_span  # where it was emitted: the list says so (review11 F2)
        advice = (
            f"Names gen_ai.response.id {rid!r}, which no call received in the last {PENDING_DAYS} "
            f"days records, but was emitted in call span {ctx_span} (trace {ctx_trace}), which records "
            f"gen_ai.response.id {context_records!r}: a verdict emitted in a call recording another id "
            "is taken for a judge's verdict emitted in the judge's own LLM call, so it waits for the "
            f"call of the id it names. If that call is the judged one, make the ids match (or drop the "
            "verdict's gen_ai.response.id); if it is the judge's own call, the judged call has not "
            "arrived: emit the verdicts in the judged call's span context."
        )
    elif recorded:  # under `response:<id>`, yet calls record it: they came with it in no request
        advice = (
            f"Names gen_ai.response.id {rid!r}, which {recorded} stored call(s) record, but it "
            "waits for a call that names it to arrive: emit the verdicts in the judged call's span "
            "context."
        )
    else:
        emitted = f", emitted in {where}" if span else ""
        advice = (
            f"Names gen_ai.response.id {rid!r}, which no call received in the last {PENDING_DAYS} "
            f"days records{emitted}. The call's span has not arrived, or it records no "
            "gen_ai.response.id (streaming or hand-made spans: emit the verdicts in that span's "
            "context), or the id is not the judged call's."
        )
    return WaitingRow(since, "verdicts", why, trace, span, rid, "", "", evaluations, advice)


# ---------------------------------------------------------------------------------------------
# What the sweep forgot


# The sweep's audit row begins with this (`record_sweep` writes it, `swept_counts` reads it back):
# the counts first, any untrusted evaluation name after the fixed words. The audit trail is
# permanent, so every wording ever written must stay readable (tests freeze today's).
_SWEPT_HEAD = "forgot {calls} call(s) no verdict came for and {verdicts} verdict(s) whose call never came"
_SWEPT = re.compile(
    "^" + re.escape(_SWEPT_HEAD).replace(r"\{calls\}", r"(\d+)").replace(r"\{verdicts\}", r"(\d+)")
)


def swept_detail(calls: int, verdicts: int, evaluations: Sequence[str], oldest: datetime) -> str:
    """The sweep's audit row (`SWEPT_ACTION`): what it forgot, in words a lead reads in the audit
    trail, its counts where `swept_counts` finds them."""
    names = f" ({', '.join(evaluations[:20])})" if evaluations else ""
    return (
        f"{_SWEPT_HEAD.format(calls=calls, verdicts=verdicts)}{names}, after {PENDING_DAYS} days; "
        f"the oldest waited since {aware(oldest):%Y-%m-%d %H:%M} UTC"
    )


def swept_counts(detail: str) -> tuple[int, int] | None:
    """(calls, verdicts) a sweep's audit row says it forgot (`swept_detail`); None if it is no such row."""
    match = _SWEPT.match(detail)
    return None if match is None else (int(match.group(1)), int(match.group(2)))


def record_sweep(session: Session, cutoff: datetime) -> None:
    """Before lib.otlp._sweep deletes what waited since before `cutoff`: one audit row saying how many
    calls and verdicts it forgets and which evaluations (none when nothing waited that long)."""
    from lib.auth import record_event

    statement = select(SPANS.c.received_at, SPANS.c.pending_json, _IS_CALL).where(
        _WAITS, SPANS.c.received_at < cutoff
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
                names[cut_at_word(str(verdict.get("metric")), METRIC_CHARS)] = None  # bounded (review17)
    if oldest is None:
        return
    detail = swept_detail(calls, verdicts, list(names), oldest)
    record_event(session=session, identity=SWEPT_BY, action=SWEPT_ACTION, detail=detail)


def swept(session: Session) -> Swept:
    """The sweep's audit rows summed: what the receiver forgot so far."""
    statement = select(AuditEvent.at, AuditEvent.detail).where(col(AuditEvent.action) == SWEPT_ACTION)
    sweeps = calls = verdicts = 0
    last: datetime | None = None
    for at, detail in session.execute(statement):
        counted = swept_counts(detail)
        if counted is None:  # not ours (the audit trail is append-only, but anyone may read it)
            continue
        sweeps += 1
        calls += counted[0]
        verdicts += counted[1]
        last = at if last is None or aware(at) > aware(last) else last
    return Swept(sweeps, calls, verdicts, last)


def summary_lines(waiting: Waiting) -> Iterable[str]:
    """The counts as the CLI prints them (our words and numbers only)."""
    if not waiting.counts:
        yield NOTHING
    for count in waiting.counts:
        yield f"{count.describe()}; the oldest since {utc_text(count.oldest)}"
    yield waiting.swept.describe()


# ---------------------------------------------------------------------------------------------
# What the receiver refused or warned of


# A request's audit row (`record_refused` writes it, `refused_fields` reads it back): the signal and
# the counts first, the answer's messages (the sender's names in them) after the fixed words. The
# audit trail is permanent, so every wording ever written must stay readable (tests freeze today's).
_REFUSED = re.compile(r"^(traces|logs): (a warning, )?(\d+) rejected: (.*)\Z", re.DOTALL)


def refused_detail(signal: str, rejected: int, messages: str) -> str:
    """A refusing or warning answer's audit row (`REFUSED_ACTION`): its counts where
    `refused_fields` finds them, then `messages` (already cut by lib.otlp's rule) within the audit
    trail's bound, cut at a word. Nothing rejected is a warning: the request was stored."""
    from lib.auth import MAX_DETAIL_CHARS

    head = f"{signal}: {'' if rejected else 'a warning, '}{rejected} rejected: "
    return head + cut_at_word(messages, MAX_DETAIL_CHARS - len(head))


@dataclass(frozen=True, slots=True)
class Refusal:
    """One request's answer that rejected something or warned: when, which signal, whose token."""

    at: datetime
    identity: str
    signal: str
    rejected: int
    warning: bool
    messages: str

    def cells(self) -> tuple[str, ...]:
        """The CLI's line (when, signal, token, rejected or "warning", messages): the sender's text
        neutralised as the waiting rows'."""
        kind = "warning" if self.warning else f"{self.rejected:,} rejected"
        return (
            utc_text(self.at),
            self.signal,
            neutralise_cell(self.identity),
            kind,
            neutralise_cell(self.messages),
        )


def refused_fields(detail: str) -> tuple[str, int, bool, str] | None:
    """(signal, rejected, warning, messages) of a refusal's audit row (`refused_detail`); None if
    it is no such row."""
    match = _REFUSED.match(detail)
    if match is None:
        return None
    return match.group(1), int(match.group(3)), match.group(2) is not None, match.group(4)


# An exporter whose every batch warns (a span re-sent with other content, one non-finite score in
# each) wrote a row per batch for good: ~17,000 a day for one app at the BatchSpanProcessor's 5 s
# (review19 L6). At most this many rows a token and hour; past that one row counts the rest
# (lib.auth.AuditRate, the API refusals' rule).
REFUSED_PER_HOUR = 30
_refused_rate = AuditRate(REFUSED_PER_HOUR, 3600)


def record_refused(
    session: Session, *, signal: str, identity: str, rejected: int, messages: str, clock: float | None = None
) -> None:
    """One audit row for a request whose answer rejected `rejected` items or warned: written in the
    request's own transaction by lib.otlp.ingest, only when there is something to say, and within
    `REFUSED_PER_HOUR` a token; past that the hour's one more row says how many were not recorded
    and quotes the last."""
    from lib.auth import record_event

    own_row, dropped = _refused_rate.admit(identity, time.monotonic() if clock is None else clock)
    if own_row:
        detail = refused_detail(signal, rejected, messages)
        record_event(session=session, identity=identity, action=REFUSED_ACTION, detail=detail)
    elif dropped is not None:
        said = (
            f"{dropped.count} more answer(s) to this token that rejected or warned in this hour were counted, "
            f"not recorded one by one (more than {REFUSED_PER_HOUR} an hour); the last: {messages}"
        )
        detail = refused_detail(signal, rejected, said)
        _refused_rate.summarise(session, dropped, identity=identity, action=REFUSED_ACTION, detail=detail)


def refused(session: Session, limit: int = REFUSED_SHOWN) -> list[Refusal]:
    """The latest `limit` refusing or warning answers, newest first (one indexed look-up)."""
    statement = (
        select(AuditEvent.at, AuditEvent.identity, AuditEvent.detail)
        .where(col(AuditEvent.action) == REFUSED_ACTION)
        .order_by(col(AuditEvent.at).desc(), col(AuditEvent.id).desc())
        .limit(limit)
    )
    found = []
    for at, identity, detail in session.execute(statement):
        fields = refused_fields(detail)
        if fields is not None:  # not ours (anyone may write an audit row): left out
            found.append(Refusal(aware(at), identity, *fields))
    return found


def refused_frame(refusals: Sequence[Refusal]) -> pd.DataFrame:
    """The Admin page's table of refusals: the sender's text as plain cells, never Markdown."""
    import pandas as pd

    return pd.DataFrame(
        {
            "at": [r.at for r in refusals],
            "signal": [r.signal for r in refusals],
            "token": [r.identity for r in refusals],
            "rejected": [r.rejected for r in refusals],
            "warning": [r.warning for r in refusals],
            "messages": [r.messages for r in refusals],
        }
    )


def refused_lines(refusals: Sequence[Refusal]) -> Iterator[str]:
    """The CLI's short "refused lately" part: a heading, then a line each (tab-separated)."""
    if not refusals:
        yield NOTHING_REFUSED
        return
    yield f"Refused or warned of lately (the latest {len(refusals):,}; the Admin page shows {REFUSED_SHOWN}):"
    for refusal in refusals:
        yield "\t".join(one_line(cell) for cell in refusal.cells())
