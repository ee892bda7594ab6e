"""The wide Evaluations CSV of every match, written by a lean DuckDB worker (issue 27).

"Download CSV (all matches)", the CLI and the API hand the list's own SQL (`lib.inspector.wide_scan`
renders it with its values for the app's dialect) to a worker of `EXPORT_WORKERS`, whose DuckDB
scanner runs it inside the database (`sqlite_query`, `postgres_query`): the rows stream in the
list's order without crossing a Python driver value by value. Each row's reviewer decisions come
with it as one JSON object, latest review first (the evaluation's `reviewer_decisions`, kept on
write by `lib.counters`), which DuckDB cuts per metric. The worker writes the CSV into a FIFO that the app reads and hands on
(`lib.export._scanned_chunks`).

The worker is a fresh interpreter (`lib.lean_worker.LeanExecutor`) that imports this module and what it
imports: `lib.isolated`, `lib.csv_text`, `lib.judgment_text` (DuckDB, Arrow), never numpy, pandas,
SQLAlchemy, SQLModel or the app's models. The CSV rules, the score and decision rules and the
version names are those modules' (their one home, which the app's own path imports too), so the
scanner path and the in-session path (`lib.inspector._wide_batches`) write the same bytes
(tests/test_export_csv.py). Keep this module's imports lean: tests/test_export_csv.py fails when a
worker has imported pandas, SQLAlchemy or SQLModel.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from lib.csv_text import counted_chunks, write_chunks
from lib.isolated import (
    RAW_QUERY_FUNCTIONS,
    DuckUnavailable,
    ScanSource,
    WorkerPool,
    scanner_session,
)
from lib.judgment_text import (
    bare_entries_sql,
    decision_value,
    json_pointer,
    name_for,
    object_parse_sql,
    rescue_unread_scores,
    score_sql,
    unread_sql,
)
from lib.lean_worker import LeanExecutor, init_lean_worker
from lib.sql_quote import quote_literal

log = logging.getLogger(__name__)

# The workers of the scanner path: fresh interpreters with only this module's imports.
EXPORT_WORKERS = WorkerPool(LeanExecutor, init_lean_worker)
# DuckDB's own memory in the worker (the scan streams; the JSON cut needs little). Freed blocks go
# back at once rather than from 128 MiB / 512 MiB up (the worker's peak at 100k: 340 -> 310 MiB RSS).
SCAN_DUCKDB_CONFIG = {
    "threads": 1,
    "memory_limit": "128MB",
    "allocator_flush_threshold": "1MB",
    "allocator_bulk_deallocation_flush_threshold": "1MB",
}
# The labels of the list's SQL that SQLite hands over as text (as every column of a `sqlite_query`)
# and the worker reads back as numbers; the floats are rendered exactly (`lib.inspector.wide_scan`).
FLOAT_LABELS = ("weighted_gap", "max_gap")
INT_LABELS = (
    "judge_meta_score", "evidence", "highlighted", "unlocated", "unverified", "judged", "reviewed",
    "corrected", "judge_version_id",
)  # fmt: skip


@dataclass(frozen=True)
class WideScan:
    """What the worker needs to write the wide CSV (picklable): the header, the list's own columns at
    its head, the metrics, which columns are reviewer decisions (written by `decision_value`), the
    judge versions' names and the SQL its scanner runs."""

    columns: list[str]
    list_columns: list[str]
    slugs: list[str]
    decision_columns: list[int]
    versions: dict[int, str]
    sql: str


def utc_times(values: Sequence[Any]) -> pa.Array:
    """Timestamps as the driver hands them (SQLite: UTC text; PostgreSQL: aware datetimes) as one
    UTC Arrow array, parsed in C++ rather than by SQLAlchemy's result processor, row by row."""
    moments = pa.array(values)
    if pa.types.is_timestamp(moments.type):
        return moments.cast(pa.timestamp("us", tz="UTC"))
    try:
        return moments.cast(pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC"))
    except pa.ArrowException:  # text with an offset, or in a form Arrow does not parse
        if isinstance(values, pa.Array | pa.ChunkedArray):  # the scanner's text: as the driver's
            values = values.to_pylist()
        parsed = [None if v is None else datetime.fromisoformat(v) for v in values]
        aware = [v if v is None or v.tzinfo else v.replace(tzinfo=UTC) for v in parsed]
        return pa.array(aware, pa.timestamp("us", tz="UTC"))


def wide_columns(
    values: Mapping[str, Any],
    list_columns: Sequence[str],
    user: Sequence[pa.Array],
    judge: Sequence[pa.Array],
    decided: Sequence[pa.Array],
    versions: Mapping[int, str],
) -> list[Any]:
    """One batch of the wide form's columns, in `lib.inspector.wide_header`'s order: the list's
    columns (times as UTC Arrow timestamps), the answer, the judge version's name, then per metric
    the user's score, the judge's score, their gap (|user - judge| on a whole column) and the
    reviewer's decision."""
    columns = [values[name] for name in list_columns]
    columns[list(list_columns).index("created_at")] = utc_times(values["created_at"])
    columns.append(values["answer"])
    version_ids = values["judge_version_id"]
    if isinstance(version_ids, pa.Array | pa.ChunkedArray):
        version_ids = version_ids.to_pylist()
    columns.append([name_for(v, versions) for v in version_ids])
    for user_score, judge_score, decision in zip(user, judge, decided, strict=True):
        columns += [user_score, judge_score, pc.abs(pc.subtract(user_score, judge_score)), decision]
    return columns


def scanned_wide_batches(
    con: duckdb.DuckDBPyConnection, scan: WideScan, function: str, batch_rows: int
) -> Iterator[list[Any]]:
    """The wide form's columns a batch at a time, read by `function('app_raw', scan.sql)` on `con`
    (`lib.isolated.scanner_session`; in the worker): the same columns as the in-session path, the
    scores read by `judgment_text.score_sql` and the decisions cut from each row's JSON object, in
    DuckDB."""
    slugs = scan.slugs
    casts = [f"CAST({label} AS DOUBLE) AS {label}" for label in FLOAT_LABELS]
    casts += [f"CAST({label} AS BIGINT) AS {label}" for label in INT_LABELS]
    texts = [f"CAST({label} AS VARCHAR) AS {label}" for label in ("user_scores", "judge_scores", "decided")]
    pointers = ", ".join(quote_literal(json_pointer(slug)) for slug in slugs)
    reads = []
    for side in ("user", "judge"):
        # The stored text only where DuckDB could not parse it (`rescue_unread_scores` reads it).
        unread = unread_sql(f"_{side}", f"{side}_scores")
        reads.append(f"CASE WHEN {unread} THEN {side}_scores END AS {side}_unread")
        reads += [f"{score_sql(f'_{side}', f'_{side}_e', slugs, i)} AS {side}_{i}" for i in range(len(slugs))]
    reads += [f"_decided[{i + 1}] AS decided_{i}" for i in range(len(slugs))]
    rows = f"(SELECT * REPLACE ({', '.join(casts + texts)}) FROM {function}('app_raw', ?))"
    if not slugs:  # no metric: no score columns (DuckDB cannot bind `object_parse_sql`'s empty struct)
        query = f"SELECT * EXCLUDE (user_scores, judge_scores, decided) FROM {rows}"
    else:
        parsed = "user_scores, judge_scores, decided, _user, _judge, _decided, _user_e, _judge_e"
        query = (
            f"SELECT * EXCLUDE ({parsed}), {', '.join(reads)} "
            f"FROM (SELECT *, {bare_entries_sql('_user', 'user_scores', slugs)} AS _user_e, "
            f"{bare_entries_sql('_judge', 'judge_scores', slugs)} AS _judge_e "
            f"FROM (SELECT *, {object_parse_sql('user_scores', slugs)} AS _user, "
            f"{object_parse_sql('judge_scores', slugs)} AS _judge, "
            f"json_extract_string(decided, [{pointers}]::VARCHAR[]) AS _decided FROM {rows}))"
        )
    reader = con.execute(query, [scan.sql]).to_arrow_reader(batch_rows)
    for batch in reader:
        if not batch.num_rows:
            continue  # DuckDB may hand over an empty batch (no match): nothing to encode
        values = {name: batch.column(name) for name in batch.schema.names}
        user, judge = (
            rescue_unread_scores(
                [values[f"{side}_{i}"] for i in range(len(slugs))],
                values[f"{side}_unread"],
                pc.is_valid(values[f"{side}_unread"]),
                slugs,
            )
            if slugs
            else []
            for side in ("user", "judge")
        )
        decisions = [values[f"decided_{i}"] for i in range(len(slugs))]
        yield wide_columns(values, scan.list_columns, user, judge, decisions, scan.versions)


class ExportStalled(RuntimeError):
    """The export's reader took no byte for the stall limit (`OVERRULE_EXPORT_STALL_SECONDS`)."""


class _FifoWriter:
    """The worker's end of the export FIFO: each write waits for the reader (backpressure), but
    never longer than `stall_seconds` without a byte taken. A client that stops reading (a paused
    or stalled download) would otherwise hold this worker, one of two, for ever, and a worker
    blocked in a write keeps the app from exiting (the pool's manager thread is joined at exit)."""

    def __init__(self, fd: int, stall_seconds: float) -> None:
        self._fd = fd
        self._stall_seconds = stall_seconds
        self._ready = select.poll()
        self._ready.register(fd, select.POLLOUT)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
                continue
            except BlockingIOError:  # the pipe is full: wait for the reader (a gone one: EPIPE next)
                pass
            if not self._ready.poll(max(1, round(self._stall_seconds * 1000))):
                log.error(
                    "the Evaluations CSV's reader took nothing for %s s: the export stops "
                    "(OVERRULE_EXPORT_STALL_SECONDS)",
                    self._stall_seconds,
                )
                raise ExportStalled(f"the download took nothing for {self._stall_seconds} s")


def write_wide_csv(
    source: ScanSource, scan: WideScan, fifo: str, batch_rows: int, stall_seconds: float
) -> int:
    """In the worker: the wide CSV of `scan` into `fifo`; returns the number of rows. Raises
    ExportStalled when the reader takes nothing for `stall_seconds`."""
    # Opened first, non-blocking: fails at once (ENXIO) when the reader is gone, or (ENOENT) when the
    # export was abandoned before this call left the queue, before anything is attached.
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        with scanner_session(source, SCAN_DUCKDB_CONFIG) as con:
            batches = scanned_wide_batches(con, scan, RAW_QUERY_FUNCTIONS[source.dialect], batch_rows)
            try:  # the first rows before the first byte: a query that fails at once lets the app
                # write the CSV in its own session instead of sending a header and breaking off
                first = list(itertools.islice(batches, 1))
            except duckdb.Error as exc:
                raise DuckUnavailable(
                    f"the scanner's query failed before its first row ({exc}); an export of most of a "
                    "large SQLite database sorts in SQLite's temporary directory (SQLITE_TMPDIR, else "
                    "the system temp dir): is it full?"
                ) from exc
            batches = itertools.chain(first, batches)
            rules = dict.fromkeys(scan.decision_columns, decision_value)
            return write_chunks(
                _FifoWriter(writer, stall_seconds), counted_chunks(scan.columns, batches, rules)
            )
    finally:
        os.close(writer)


def start_export_workers() -> None:
    """Start an export worker now (a fresh interpreter importing this module, ~0.3 CPU s) rather
    than on the first export."""
    EXPORT_WORKERS.start(_ready)


def _ready() -> None:
    """Nothing: unpickling this function in a new worker imports this module, which is the point."""
