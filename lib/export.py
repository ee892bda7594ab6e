"""Exports (SPEC §6): every table and view as CSV, Parquet or JSON, streamed through DuckDB.

Whole tables never pass through pandas: DuckDB's `COPY (SELECT ...) TO` reads the app database via
`lib.duck` and writes the file itself. CSV is Excel-safe: a text cell starting with `= + - @`, tab or
carriage return is prefixed with a single quote (the OWASP rule against CSV injection), done in SQL;
numbers are never touched, so a negative number stays a number. JSON for judgments is the seed-004
cache file `{"cache_version": "1.0", "judgments": {change_id: {...}}}`, written a batch at a time;
JSON for other tables is JSON Lines. Files appear whole or not at all (written aside, then renamed;
what an export killed meanwhile leaves aside, a later export to the same file removes: `_written_aside`).

Small page-sized frames the UI offers for download go through `frame_to_csv_bytes`, same rule;
the pages' download buttons call the `*_bytes` functions here, built on click.

The Evaluations CSV of every match (wide: per metric the user's score, the judge's score, the gap
and the reviewer's decision; long: one row per judgment; both with the answer) keeps the list's
filters in one definition: the inspector's SQL. The wide form runs it inside the database through
DuckDB's scanner in a lean worker process (`lib.wide_scan`: DuckDB and Arrow only) that writes the
CSV into a FIFO this process hands on (`_scanned_chunks`; no scanner opens the SQLite file in the
app process, issue #17); the long form, and the wide one where no scanner attaches, stream rows
from the app's own connection a batch at a time. Memory is one batch, never a frame of every match.
Every streamed CSV (these and the Corrections, Notes and Precedents ones) is written a batch of
columns at a time by Arrow kernels (`lib.csv_text.csv_batch`, issue 27): the same bytes the
row-by-row `csv.writer` wrote for `_stream_cell` of each value, several times faster.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import re
import secrets
import select
import tempfile
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import duckdb
import pandas as pd
from sqlalchemy import Engine
from sqlmodel import Session

from lib import claims, corrections, duck, inspector, notes
from lib.auth import Actor, Permission, authorize
from lib.config import get_settings
from lib.corrections import CSV_ROW_LIMIT, JudgmentFilter
from lib.csv_text import (
    FORMULA_PREFIXES,
    CsvColumn,
    ValueRule,
    counted_chunks,
    iso_utc,
    iter_csv_batches,
    neutralise_cell,
    write_chunks,
)
from lib.db import session_scope
from lib.duck import model_tables, table_ref, tables_in_sql, with_duck
from lib.inspector import EvaluationFilters
from lib.sql_quote import quote_ident, quote_literal
from lib.wide_scan import EXPORT_WORKERS, WideScan, write_wide_csv

log = logging.getLogger(__name__)

FORMATS = ("csv", "parquet", "json")
CACHE_VERSION = "1.0"
# Tables whose JSON export is the seed-004 cache file rather than JSON Lines.
CACHE_FORMAT_TABLES = frozenset({"judgments", "corrections"})
JSON_BATCH_ROWS = 10_000
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # DuckDB strftime; connections run in UTC

Params = Sequence[Any] | Mapping[str, Any] | None

# Every model table by its table name, plus the views reviewers and pipelines ask for by name.
# API token hashes never leave the database (lib.tokens).
UNEXPORTABLE_TABLES = frozenset({"api_tokens"})
EXPORTABLE_TABLES: dict[str, str] = {
    **{
        name: f"SELECT * FROM {table_ref(name)}"
        for name in sorted(model_tables())
        if name not in UNEXPORTABLE_TABLES
    },
    "evaluations": f"SELECT * FROM {table_ref('evaluation_snapshots')} WHERE deleted_at IS NULL",
    "corrections": f"SELECT * FROM {table_ref('judgments')} WHERE was_corrected",
}
# Who may export each table: the access records the Admin page shows only admins (role rows, the
# audit trail of sign-ins, role changes and refusals) need EXPORT_ACCESS; the review data EXPORT.
ACCESS_TABLES = frozenset({"audit_events", "user_roles"})
EXPORT_PERMISSIONS: dict[str, Permission] = {
    name: Permission.EXPORT_ACCESS if name in ACCESS_TABLES else Permission.EXPORT
    for name in EXPORTABLE_TABLES
}

# The seed-004 entry: these keys always, then the optional ones only when set.
_CACHE_KEYS = (
    "change_id",
    "decision",
    "reasoning",
    "user_decision",
    "user_reasoning",
    "product",
    "timestamp",
)
_CACHE_OPTIONAL_KEYS = ("metric", "url", "description", "ai_provider")


class ExportError(Exception):
    """An export that cannot be done (unknown table, format or unwritable path); says how to fix it."""


def frame_to_csv_bytes(frame: pd.DataFrame) -> bytes:
    """CSV bytes of a small (page-sized) frame for a download button, formula cells neutralised."""
    safe = frame.copy()
    for column in safe.columns:
        series = safe[column]
        if (
            pd.api.types.is_numeric_dtype(series)
            or pd.api.types.is_bool_dtype(series)
            or pd.api.types.is_datetime64_any_dtype(series)
        ):
            continue  # not text: a negative number must stay a number
        safe[column] = series.map(neutralise_cell)
    safe.columns = [neutralise_cell(c) for c in safe.columns]
    # RFC 4180 line ends: with them the csv writer quotes a cell holding a bare CR, as Excel needs.
    return safe.to_csv(index=False, lineterminator="\r\n").encode("utf-8")


def judgment_cache_entry(row: Mapping[str, Any]) -> dict[str, Any]:
    """One judgment as a seed-004 cache entry (optional fields only when set)."""
    entry = {key: row.get(key) for key in _CACHE_KEYS}
    entry["reasoning"] = entry["reasoning"] or ""  # the seed's cache requires a string
    if isinstance(entry["timestamp"], datetime):
        entry["timestamp"] = iso_utc(entry["timestamp"])
    for key in _CACHE_OPTIONAL_KEYS:
        if row.get(key) not in (None, ""):
            entry[key] = row[key]
    return entry


def export_table(
    *,
    engine: Engine,
    table: str,
    fmt: str,
    out: Path | str,
    where_sql: str | None = None,
    params: Params = None,
    actor: Actor | str | None = None,
) -> int:
    """Write a table or view to `out` as csv, parquet or json; returns the number of rows written.

    `actor` must hold the table's export permission (`EXPORT_PERMISSIONS`; PermissionDenied
    otherwise; in open mode anyone may). `where_sql` is a DuckDB condition over the table's columns
    written by our code (values go in `params`, never into the SQL text).
    """
    if table not in EXPORTABLE_TABLES:
        raise ExportError(f"unknown table {table!r}; exportable: {', '.join(sorted(EXPORTABLE_TABLES))}")
    authorize(engine, actor, EXPORT_PERMISSIONS[table])
    if fmt not in FORMATS:
        raise ExportError(f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    sql = EXPORTABLE_TABLES[table]
    if where_sql:
        sql = f"SELECT * FROM ({sql}) AS t WHERE {where_sql}"
    if fmt == "json" and table in CACHE_FORMAT_TABLES:
        return _export(engine, sql, params, Path(out), _write_cache_json)
    return _export(engine, sql, params, Path(out), _copy_writer(fmt))


# `lib.corrections.live_judgment` in DuckDB's SQL over a judgments row: no evaluation, or a live one
# (seed 002 AD-13). Archived evaluations are few, so the anti-join reads a short list.
LIVE_JUDGMENT_SQL = (
    f"(snapshot_id IS NULL OR snapshot_id NOT IN "
    f"(SELECT id FROM {table_ref('evaluation_snapshots')} WHERE deleted_at IS NOT NULL))"
)


def export_cache_bytes(
    *, engine: Engine, product: str | None = None, actor: Actor | str | None = None
) -> bytes:
    """The Corrections page's cache file (`cache_version` "1.0") for one product or all, as bytes.

    Only live judgments: an archived evaluation's judgments are left out, as history, statistics
    and lists leave them out (`python -m lib export judgments` dumps the whole table).
    """
    where, params = LIVE_JUDGMENT_SQL, []
    if product is not None:
        where, params = f"{where} AND product = ?", [product]
    with claims.TempFolder("cache") as tmp:
        out = tmp / "cache.json"
        export_table(
            engine=engine, table="judgments", fmt="json", out=out, where_sql=where, params=params, actor=actor
        )
        return out.read_bytes()


def _precedents_table(filters: Any, limit: int) -> CsvTable:
    from lib import precedent_view

    return lambda session: CsvRows(
        precedent_view.LIST_COLUMNS,
        precedent_view.iter_list_rows(session=session, filters=filters, limit=limit),
    )


def _notes_table(filters: notes.NoteFilter) -> CsvTable:
    return lambda session: CsvRows(
        notes.FRAME_COLUMNS, notes.iter_note_rows(session=session, filters=filters)
    )


def _evaluations_table(filters: EvaluationFilters, form: str) -> CsvTable:
    return lambda session: inspector.export_evaluations(session=session, filters=filters, form=form)


def judgments_csv_bytes(*, engine: Engine, filters: JudgmentFilter, limit: int = CSV_ROW_LIMIT) -> bytes:
    """The Corrections page's CSV: every matching judgment (newest `limit`), formulas neutralised,
    streamed a batch at a time (`corrections.iter_judgment_rows`), never a frame."""
    return _streamed_csv_bytes(
        engine,
        lambda session: CsvRows(
            corrections.JUDGMENT_COLUMNS,
            corrections.iter_judgment_rows(session=session, filters=filters, limit=limit),
        ),
    )


def precedents_csv_bytes(*, engine: Engine, filters: Any, limit: int = CSV_ROW_LIMIT) -> bytes:
    """The Precedents page's CSV: every matching interaction (newest `limit`), formulas neutralised,
    streamed a batch at a time. `filters` is a `lib.precedent_view.PrecedentFilters`."""

    return _streamed_csv_bytes(engine, _precedents_table(filters, limit))


def precedents_csv_chunks(*, engine: Engine, filters: Any, limit: int = CSV_ROW_LIMIT) -> Iterator[bytes]:
    """The Precedents CSV as UTF-8 chunks, for a streamed download (`lib.downloads`)."""
    return _csv_chunks(engine, _precedents_table(filters, limit))


def notes_csv_bytes(*, engine: Engine, filters: notes.NoteFilter) -> bytes:
    """The Notes page's CSV of every matching note (bare types, the import format), formulas
    neutralised, written a batch at a time (`notes.iter_note_rows`), never a frame."""
    return _streamed_csv_bytes(engine, _notes_table(filters))


def notes_csv_chunks(*, engine: Engine, filters: notes.NoteFilter) -> Iterator[bytes]:
    """The Notes CSV as UTF-8 chunks, for a streamed download (`lib.downloads`)."""
    return _csv_chunks(engine, _notes_table(filters))


# Rows encoded at a time: the streamed CSV's memory is one batch, whatever the number of rows.
CSV_BATCH_ROWS = 5_000


def _row_batches(rows: Iterable[Sequence[Any]], width: int) -> Iterator[list[Sequence[Any]]]:
    """Rows regrouped as columns, CSV_BATCH_ROWS rows at a time."""
    iterator = iter(rows)
    while batch := list(itertools.islice(iterator, CSV_BATCH_ROWS)):
        columns = list(zip(*batch, strict=True))
        if len(columns) != width:
            raise ValueError(f"a CSV row has {len(columns)} cells, the header {width}")
        yield columns


def iter_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Iterator[bytes]:
    """Rows as UTF-8 CSV chunks as they come (RFC 4180 line ends, cells neutralised), a batch at a time."""
    return iter_csv_batches(columns, CsvRows(columns, rows).batches)


def write_csv(out: BinaryIO, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """Rows as UTF-8 CSV into `out` (binary) as they come; returns the number of rows written."""
    return _write_source(out, CsvRows(columns, rows))


def _write_source(out: BinaryIO, source: CsvSource) -> int:
    return write_chunks(out, _counted_chunks(source))


def _counted_chunks(source: CsvSource) -> Generator[bytes, None, int]:
    """`source` as UTF-8 CSV chunks (`lib.csv_text.iter_csv_batches`); returns the rows written."""
    return counted_chunks(source.columns, source.batches, source.rules)


class CsvSource(Protocol):
    """A CSV's header and its rows as batches of columns (`csv_batch`), with per-column value rules."""

    columns: Sequence[str]
    batches: Iterable[Sequence[CsvColumn]]
    rules: Mapping[int, ValueRule]


@dataclass(frozen=True)
class CsvRows:
    """A `CsvSource` from rows (tuples), regrouped into column batches as they are read."""

    columns: Sequence[str]
    rows: Iterable[Sequence[Any]]
    rules: Mapping[int, ValueRule] = field(default_factory=dict)

    @property
    def batches(self) -> Iterator[Sequence[CsvColumn]]:
        return _row_batches(self.rows, len(self.columns))


@dataclass(frozen=True)
class CsvBatches:
    """A `CsvSource` from batches of columns."""

    columns: Sequence[str]
    batches: Iterable[Sequence[CsvColumn]]
    rules: Mapping[int, ValueRule] = field(default_factory=dict)


# A CSV's source, read in the session given: what the bytes and the chunks of one download share,
# so a page's button and its streamed link can never differ.
CsvTable = Callable[[Session], CsvSource]


def _csv_chunks(engine: Engine, table: CsvTable) -> Generator[bytes, None, int]:
    """`table` as UTF-8 CSV chunks, produced while a response sends them (`lib.downloads`), in one
    read-only session: neither the app nor Streamlit ever holds the file. Returns the row count."""
    with session_scope(engine, read_only=True) as session:
        return (yield from _counted_chunks(table(session)))


def _chunks_bytes(chunks: Generator[bytes, None, int]) -> bytes:
    """CSV chunks written into a temporary file, then its bytes.

    The app never holds more than a batch of rows; only the finished file's bytes come back
    (Streamlit's download button keeps those in memory while the session lasts, whatever it gets).
    """
    with tempfile.TemporaryFile() as raw:
        write_chunks(raw, chunks)
        raw.seek(0)
        return raw.read()


def _streamed_csv_bytes(engine: Engine, table: CsvTable) -> bytes:
    """`table`'s CSV bytes, written row batch by row batch in one read-only session."""
    return _chunks_bytes(_csv_chunks(engine, table))


def evaluations_csv_bytes(*, engine: Engine, filters: EvaluationFilters, form: str = "wide") -> bytes:
    """The Evaluations page's CSV of every match (all pages), wide or long, formulas neutralised."""
    return _chunks_bytes(_evaluation_chunks(engine, filters, form))


def evaluations_csv_chunks(
    *, engine: Engine, filters: EvaluationFilters, form: str = "wide"
) -> Iterator[bytes]:
    """The same CSV as UTF-8 chunks, produced while a response sends them (`lib.downloads`):
    neither the app nor Streamlit ever holds the file."""
    return _evaluation_chunks(engine, filters, form)


# The scanner path of the wide Evaluations CSV (issue 27; lib.inspector's `wide_scan`): a worker
# of `lib.wide_scan.EXPORT_WORKERS` reads the list's SQL through DuckDB's scanner and writes the CSV into
# a FIFO that this process reads and hands on: the pipe's buffer is all that is held in between,
# and a slow reader holds the worker back (no spool file), for at most `export_stall_seconds` without
# a byte taken (then the worker stops with `ExportStalled`). Closing the chunks (a download stopped)
# closes the FIFO, and the worker's next write fails, which ends it.
SCAN_BATCH_ROWS = 2_048  # rows the worker encodes at a time: one DuckDB vector (5,000: +10 MiB peak)
SCAN_CHUNK_BYTES = 1 << 20  # bytes read from the FIFO at a time


class _NoScanner(Exception):
    """The worker could not attach the database through the scanner, before writing anything."""


def _evaluation_chunks(engine: Engine, filters: EvaluationFilters, form: str) -> Generator[bytes, None, int]:
    """The Evaluations CSV as chunks, by the scanner path where it can run (the wide form of a file
    or PostgreSQL database), else in the app's session; returns the number of rows."""
    if form == "wide" and engine.url.database not in (None, "", ":memory:"):
        with session_scope(engine, read_only=True) as session:
            scan = inspector.wide_scan(session=session, filters=filters)
        if scan is not None:
            try:
                return (yield from _scanned_chunks(engine, scan))
            except _NoScanner as exc:
                log.warning("the Evaluations CSV is read in the app's session (slower): %s", exc.__cause__)
    return (yield from _csv_chunks(engine, _evaluations_table(filters, form)))


def _scanned_chunks(engine: Engine, scan: WideScan) -> Generator[bytes, None, int]:
    """What `lib.wide_scan.write_wide_csv` writes into a FIFO, read as it comes; returns its row count."""
    with claims.TempFolder("export") as folder:
        fifo = str(folder / "evaluations.csv")
        os.mkfifo(fifo, 0o600)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opens before the worker's end exists
        sent = False
        waiting = select.poll()  # not select(): a server may hold more than 1,024 descriptors
        waiting.register(reader, select.POLLIN)
        future: futures.Future[int] | None = None
        try:
            source = duck.scan_source(engine)
            stall = get_settings().export_stall_seconds
            future = EXPORT_WORKERS.submit(write_wide_csv, source, scan, fifo, SCAN_BATCH_ROWS, stall)
            while True:
                waiting.poll(500)
                try:
                    data = os.read(reader, SCAN_CHUNK_BYTES)
                except BlockingIOError:  # the worker's end is open, nothing written yet
                    continue
                if data:
                    sent = True
                    yield data
                elif future.done():  # no writer now, and none to come: what is left is the rest
                    while data := os.read(reader, SCAN_CHUNK_BYTES):
                        yield data
                    break
                else:  # the worker has not opened its end yet
                    futures.wait([future], timeout=0.02)
            try:
                return EXPORT_WORKERS.result(future)
            except duck.DuckUnavailable as exc:
                if sent:
                    raise
                raise _NoScanner(str(exc)) from exc
        finally:
            # An export abandoned while its call still waits for a worker: it never runs. (A call
            # the executor already handed on finds the FIFO gone and ends at once: write_wide_csv.)
            if future is not None:
                future.cancel()
            os.close(reader)


def judgments_csv_chunks(
    *, engine: Engine, filters: JudgmentFilter, limit: int = CSV_ROW_LIMIT
) -> Iterator[bytes]:
    """The Corrections CSV as UTF-8 chunks, for a streamed download (`lib.downloads`)."""
    return _csv_chunks(
        engine,
        lambda session: CsvRows(
            corrections.JUDGMENT_COLUMNS,
            corrections.iter_judgment_rows(session=session, filters=filters, limit=limit),
        ),
    )


def export_evaluations_csv(
    *, engine: Engine, out: Path | str, form: str = "wide", filters: EvaluationFilters | None = None
) -> int:
    """Write the evaluations CSV (wide or long) to `out`, whole or not at all; for the CLI."""
    path = Path(out)
    _check_writable(path)
    try:
        with _written_aside(path) as partial, partial.open("wb") as fh:
            return write_chunks(fh, _evaluation_chunks(engine, filters or EvaluationFilters(), form))
    except ValueError as exc:
        raise ExportError(str(exc)) from exc


def export_query_csv(*, engine: Engine, sql: str, out: Path | str, params: Params = None) -> int:
    """Write exactly the rows of a DuckDB query over `db.<table>` (e.g. a page's filter) as safe CSV."""
    return _export(engine, sql, params, Path(out), _copy_writer("csv"))


Writer = Callable[[duckdb.DuckDBPyConnection, str, Params, Path], int]


def _export(engine: Engine, sql: str, params: Params, out: Path, writer: Writer) -> int:
    """Run `writer` into a hidden file beside `out`, then rename it, so readers never see half a file.

    Through `with_duck`: on SQLite the writing happens in a child process (see `lib.duck`).
    """
    _check_writable(out)
    return with_duck(engine, _write_aside, sql, params, out.resolve(), writer, tables=tables_in_sql(sql))


def _write_aside(con: duckdb.DuckDBPyConnection, sql: str, params: Params, out: Path, writer: Writer) -> int:
    try:
        with _written_aside(out) as partial:
            return writer(con, sql, params, partial)
    except duckdb.Error as exc:
        raise ExportError(f"export to {out} failed: {exc}") from exc


_TOKEN = re.compile(r"[0-9a-f]{8}")


@contextmanager
def _written_aside(out: Path) -> Iterator[Path]:
    """The hidden `.NAME.<hex>.partial` beside `out` that the block writes; renamed onto `out` when
    the block ends, removed whatever happens: readers see the file whole or not at all.

    The one home of that rule for every export to a file, and of its leftovers. An export killed
    before this `finally` runs (at interpreter exit, SIGKILL, a lost machine) leaves its partial
    behind, hidden, for ever. So each export first claims its token with an empty
    `.NAME.<hex>.lock` it keeps locked until its partial is gone (`lib.claims`, the rule that tells
    a dead writer's leftovers from a live one's), and sweeps the leftovers of earlier exports to
    the same file (`_sweep_leftovers`). An OSError (disk full, permission) becomes an ExportError."""
    try:
        token, fd = _claim(out)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    partial, claim = _aside_paths(out, token)
    try:
        _sweep_leftovers(out)
        yield partial
        os.replace(partial, out)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from exc
    finally:
        # Cleanup never hides the block's own error and always lets the claim go: an unlink that
        # fails (EACCES, EROFS, EBUSY) is logged, and what it left a later export sweeps.
        try:
            for path in (partial, claim):  # the claim while still locked: no sweeper takes a live one
                try:
                    path.unlink(missing_ok=True)
                except OSError:
                    log.warning("could not remove %s after an export", path, exc_info=True)
        finally:
            os.close(fd)


def _aside_paths(out: Path, token: str) -> tuple[Path, Path]:
    """An export's partial and its claim, by its token."""
    return out.with_name(f".{out.name}.{token}.partial"), out.with_name(f".{out.name}.{token}.lock")


def _claim(out: Path) -> tuple[str, int]:
    """A fresh token for an export to `out` and the descriptor of its claim, created and locked."""
    while True:
        token = secrets.token_hex(4)
        try:
            return token, claims.hold(_aside_paths(out, token)[1])
        except FileExistsError:  # another export's token (1 in 4 billion): draw again
            continue


def _sweep_leftovers(out: Path) -> None:
    """Remove what dead exports to `out` left beside it, never what a live export is writing.

    A token's files (`.NAME.<hex>.partial`, `.NAME.<hex>.lock`) go by `lib.claims.sweep`: both
    older than `claims.STALE_SECONDS` and the claim's lock free. A partial without a claim is an
    older version's. Only this file name's leftovers are looked at: other names in the folder may
    be anyone's. Best effort: a sweep that fails leaves the files and never fails the export."""
    prefix = f".{out.name}."
    stale_before = time.time() - claims.STALE_SECONDS
    try:
        with os.scandir(out.parent) as entries:
            names = [entry.name for entry in entries if entry.name.startswith(prefix)]
    except OSError:
        return
    tokens: set[str] = set()
    for name in names:
        token, _, suffix = name.removeprefix(prefix).partition(".")
        if _TOKEN.fullmatch(token) and suffix in ("partial", "lock"):
            tokens.add(token)
    for token in tokens:
        partial, claim = _aside_paths(out, token)
        try:
            claims.sweep(
                claim,
                functools.partial(_unlink_all, partial, claim),
                aged=(partial, claim),
                stale_before=stale_before,
            )
        except OSError:
            log.warning("could not remove the leftovers of an export to %s", out, exc_info=True)


def _unlink_all(*paths: Path) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _check_writable(out: Path) -> None:
    if out.is_dir():
        raise ExportError(f"cannot write {out}: it is a directory; give a file name")
    if not out.parent.is_dir():
        raise ExportError(f"cannot write {out}: directory {out.parent} does not exist")
    if not os.access(out.parent, os.W_OK):
        raise ExportError(f"cannot write {out}: directory {out.parent} is not writable")


def _column_types(con: duckdb.DuckDBPyConnection, sql: str, params: Params) -> list[tuple[str, str]]:
    cursor = con.execute(f"SELECT * FROM ({sql}) AS t LIMIT 0", params or [])
    return [(name, str(duck_type)) for name, duck_type, *_ in cursor.description]


def _neutralised(expr: str) -> str:
    """SQL doing what `neutralise_cell` does, so 1M-row exports never leave DuckDB."""
    return (
        f"CASE WHEN left({expr}, 1) IN ({', '.join(f'chr({ord(p)})' for p in FORMULA_PREFIXES)}) "
        f"THEN '''' || {expr} ELSE {expr} END"
    )


def _projection(columns: list[tuple[str, str]], fmt: str) -> str:
    """The select list for a format: CSV neutralises text; CSV/Parquet write JSON as its text."""
    parts = []
    for name, duck_type in columns:
        col = quote_ident(name)
        if fmt == "csv" and duck_type in ("VARCHAR", "JSON", "BLOB"):
            parts.append(f"{_neutralised(f'CAST({col} AS VARCHAR)')} AS {col}")
        elif fmt == "parquet" and duck_type == "JSON":
            parts.append(f"CAST({col} AS VARCHAR) AS {col}")
        else:
            parts.append(col)
    return ", ".join(parts)


_COPY_OPTIONS = {
    "csv": f"FORMAT csv, HEADER true, TIMESTAMPFORMAT {quote_literal(TIMESTAMP_FORMAT)}",
    "parquet": "FORMAT parquet, COMPRESSION zstd",
    "json": f"FORMAT json, TIMESTAMPFORMAT {quote_literal(TIMESTAMP_FORMAT)}",
}


def _copy_writer(fmt: str) -> Writer:
    """A writer for `COPY ... TO` in `fmt`; a partial of a module function, so it pickles."""
    return functools.partial(_copy_write, fmt)


def _copy_write(fmt: str, con: duckdb.DuckDBPyConnection, sql: str, params: Params, path: Path) -> int:
    select_list = _projection(_column_types(con, sql, params), fmt)
    row = con.execute(
        f"COPY (SELECT {select_list} FROM ({sql}) AS t) TO {quote_literal(str(path))} ({_COPY_OPTIONS[fmt]})",
        params or [],
    ).fetchone()
    return int(row[0]) if row else 0


def _write_cache_json(con: duckdb.DuckDBPyConnection, sql: str, params: Params, path: Path) -> int:
    """The seed-004 cache file, streamed: one judgment per line inside the top-level object."""
    keys = ", ".join(quote_ident(k) for k in (*_CACHE_KEYS, *_CACHE_OPTIONAL_KEYS))
    reader = con.execute(f"SELECT {keys} FROM ({sql}) AS t", params or []).to_arrow_reader(JSON_BATCH_ROWS)
    count = 0
    with path.open("w", encoding="utf-8") as fh:
        fh.write(f'{{"cache_version": {json.dumps(CACHE_VERSION)}, "judgments": {{')
        for batch in reader:
            for row in batch.to_pylist():
                fh.write(",\n" if count else "\n")
                fh.write(json.dumps(row["change_id"], ensure_ascii=False))
                fh.write(": ")
                fh.write(json.dumps(judgment_cache_entry(row), ensure_ascii=False))
                count += 1
        fh.write("\n}}\n")
    return count
