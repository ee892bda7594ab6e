"""DuckDB over the app database, for analytics and exports that must not load tables into pandas.

Usage (analytics, exports, pages)::

    con = duck_connect(engine)
    try:
        frame = fetch_frame(
            con, f"SELECT product, count(*) AS n FROM {table_ref('judgments')} WHERE was_corrected "
            "AND timestamp >= ? GROUP BY 1", [since]
        )
    finally:
        con.close()

How it works (SPEC §8): `db.<table>` views with one set of types on both backends (below) over a
catalog `app_raw` that holds the app's tables, filled in one of two ways:

- PostgreSQL: attached read-only through the postgres scanner extension, shipped by the PyPI package
  `duckdb-extension-postgres-scanner` and loaded from its file (`LOAD '<path>'`, signature checked;
  never `INSTALL`, which would download).
- SQLite: the tables are read through the app's own SQLAlchemy connection (Python's sqlite3, the
  same SQLite library the app uses) and handed to DuckDB as Arrow record batches, never through a
  pandas frame; pass `tables=` to copy only what the query needs. DuckDB's sqlite scanner carries a
  second SQLite library: if it opened and closed the database file inside a process that holds it,
  POSIX lock semantics (locks belong to the process, and any close drops them) would release the
  app's locks, and the next other process to close the database would delete the app's `-wal` and
  `-shm` files under it (lost writes, corruption; issue #17). So the scanner may only open the SQLite
  file in a child process that holds no connection: `with_duck(engine, func, ...)` runs `func(con)`
  there (`run_isolated`), which is how exports and analytics read SQLite, at the scanner's speed.
The worker processes, the scanner's attachment and the database a worker keeps are `lib.isolated`'s
(lean: the Evaluations CSV's worker, `lib.wide_scan`, imports it without this module).

Raw column types differ by backend (SQLite booleans are integers, JSON is text, timestamps are
naive), so every model table is exposed as a view in the schema `db` with one set of types:

    BOOLEAN, BIGINT, DOUBLE, VARCHAR, JSON, BLOB, DATE, TIMESTAMPTZ (UTC; the session time zone is UTC)

Callers write `db.judgments` (or `table_ref("judgments")`, which also refuses unknown names) and get
the same result on SQLite and PostgreSQL.

Fetch results with `fetch_frame(con, sql, params)` (through Arrow) or `.to_arrow_reader()`, not
`fetchall()`: DuckDB turns TIMESTAMPTZ into Python datetimes only with pytz, which Overrule does not
ship, and `.df()` raises pandas 3.1 deprecation warnings. Keep results small (aggregates, one page).

If the postgres extension cannot be loaded (another DuckDB version, a platform without the wheel),
PostgreSQL tables are copied through Arrow batches too. `source_kind(con)` tells which path was
taken. A scanner connection costs about 0.3 s to open (the extension's signature check); the Arrow
copy is a snapshot, so take a new connection per use rather than caching one.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from multiprocessing import forkserver, popen_forkserver, util
from multiprocessing.context import ForkServerContext, ForkServerProcess
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pandas as pd
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlmodel import SQLModel

import lib.models  # noqa: F401 - registers every table on SQLModel.metadata
from lib.db import create_db_engine
from lib.isolated import (
    RAW_CATALOG,
    DuckUnavailable,
    ScanSource,
    WorkerPool,
    attach_scanner,
    init_worker,
    new_connection,
    process_pool,
    scanner_allowed,
)
from lib.lean_worker import dump_launch
from lib.sql_quote import quote_ident

log = logging.getLogger(__name__)

VIEW_SCHEMA = "db"
ARROW_BATCH_ROWS = 50_000
_SURROGATE = re.compile("[\ud800-\udfff]")
_TABLE_NAME_IN_SQL = re.compile(rf'\b{VIEW_SCHEMA}\s*\.\s*"?(\w+)"?')


T = TypeVar("T")


def model_tables() -> dict[str, sa.Table]:
    """Every table of lib.models by name: what `db.<name>` can refer to."""
    return dict(SQLModel.metadata.tables)


def table_ref(name: str) -> str:
    """`db."name"` for a model table; unknown names are refused, so user input cannot inject SQL."""
    if name not in model_tables():
        raise ValueError(f"unknown table {name!r}; known tables: {', '.join(sorted(model_tables()))}")
    return f"{VIEW_SCHEMA}.{quote_ident(name)}"


def tables_in_sql(sql: str) -> set[str]:
    """The model tables a query names as `db.<table>`, so the fallback copies only those."""
    return {name for name in _TABLE_NAME_IN_SQL.findall(sql) if name in model_tables()}


def _duck_type(column: sa.Column) -> str:
    """The DuckDB type a model column is normalised to on every backend."""
    col_type = column.type
    if isinstance(col_type, sa.TypeDecorator):  # e.g. SQLModel's UTCDateTime wraps DateTime
        col_type = col_type.impl_instance
    for sql_type, duck_type in (
        (sa.JSON, "JSON"),
        (sa.Boolean, "BOOLEAN"),
        (sa.Integer, "BIGINT"),
        (sa.Float, "DOUBLE"),
        (sa.Numeric, "DOUBLE"),
        (sa.DateTime, "TIMESTAMPTZ"),
        (sa.Date, "DATE"),
        (sa.LargeBinary, "BLOB"),
    ):
        if isinstance(col_type, sql_type):
            return duck_type
    return "VARCHAR"


_ARROW_TYPES = {
    "BOOLEAN": pa.bool_(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="UTC"),
    "DATE": pa.date32(),
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BLOB": pa.binary(),
}


def _pg_conninfo(engine: Engine) -> str:
    """A libpq key/value string for the engine's PostgreSQL database."""
    url = engine.url
    parts: dict[str, Any] = {
        "host": url.host,
        "port": url.port,
        "dbname": url.database,
        "user": url.username,
        "password": url.password,
    }
    for key, value in url.query.items():
        parts[key] = value[-1] if isinstance(value, tuple) else value

    def libpq_quote(value: Any) -> str:
        text = str(value).replace("\\", "\\\\").replace("'", "\\'")
        return f"'{text}'"

    return " ".join(f"{key}={libpq_quote(value)}" for key, value in parts.items() if value is not None)


def scan_source(engine: Engine) -> ScanSource:
    """The engine's database as a worker's scanner attaches it: a SQLite file by its absolute path,
    PostgreSQL by a libpq string (its password kept apart, to mask it in errors)."""
    if engine.dialect.name == "sqlite":
        path = engine.url.database or ""
        return ScanSource("sqlite", path if path in ("", ":memory:") else str(Path(path).resolve()))
    secret = engine.url.password
    return ScanSource(engine.dialect.name, _pg_conninfo(engine), str(secret) if secret else None)


def _raw_columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = ?", [RAW_CATALOG]
    ).fetchall()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    return found


def _create_typed_views(con: duckdb.DuckDBPyConnection) -> None:
    """One view per model table in schema `db`, casting raw backend types to the shared ones."""
    raw = _raw_columns(con)
    for name, table in model_tables().items():
        present = raw.get(name)
        if not present:
            continue  # a table the database does not have yet (an older schema)
        select_list = ", ".join(
            f"{_typed(quote_ident(c.name), _duck_type(c))} AS {quote_ident(c.name)}"
            for c in table.columns
            if c.name in present
        )
        con.execute(
            f"CREATE VIEW {VIEW_SCHEMA}.{quote_ident(name)} AS "
            f"SELECT {select_list} FROM {RAW_CATALOG}.{quote_ident(name)}"
        )


def _typed(column: str, duck_type: str) -> str:
    """The cast of a raw column to its shared type; JSON that DuckDB cannot parse never fails a read.

    Imports refuse unpaired surrogates (issue #17), but JSON stored earlier may hold an escaped one
    (`\\ud800`; SQLite text and PostgreSQL `json` accept it, DuckDB's parser does not). Such a value
    is read with every surrogate escape replaced by U+FFFD, and anything still unparsable as a JSON
    string of its text, so exports and analytics of the other rows go on.
    """
    if duck_type != "JSON":
        return f"CAST({column} AS {duck_type})"
    text = f"CAST({column} AS VARCHAR)"
    repaired = f"regexp_replace({text}, '\\\\u[dD][89a-fA-F][0-9a-fA-F]{{2}}', '\\\\ufffd', 'g')"
    return f"COALESCE(TRY_CAST({text} AS JSON), TRY_CAST({repaired} AS JSON), to_json({text}))"


def _json_text(value: Any) -> str | None:
    """JSON text for the Arrow copy; escaped (ASCII) when a lone surrogate cannot be UTF-8 encoded."""
    if value is None:
        return None
    text = json.dumps(value, ensure_ascii=False)
    return text if text.isascii() or not _SURROGATE.search(text) else json.dumps(value)


def _record_batches(engine: Engine, table: sa.Table, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The table's rows as Arrow batches, streamed from the database a batch at a time."""
    json_columns = {c.name for c in table.columns if isinstance(c.type, sa.JSON)}
    reader = engine.execution_options(sqlite_begin="DEFERRED")  # a pure reader never takes the write lock
    with reader.connect() as conn:
        result = conn.execution_options(stream_results=True, yield_per=ARROW_BATCH_ROWS).execute(
            sa.select(table)
        )
        for rows in result.partitions():
            columns = list(zip(*rows, strict=True))
            arrays = []
            for field, values in zip(schema, columns, strict=True):
                if field.name in json_columns:
                    values = tuple(_json_text(v) for v in values)
                arrays.append(pa.array(values, type=field.type))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _copy_through_arrow(con: duckdb.DuckDBPyConnection, engine: Engine, names: Iterable[str]) -> None:
    """The fallback: copy tables into an in-memory `app_raw` catalog via Arrow record batches."""
    con.execute(f"ATTACH ':memory:' AS {RAW_CATALOG}")
    tables = model_tables()
    for name in sorted(names):
        table = tables[name]
        schema = pa.schema([pa.field(c.name, _ARROW_TYPES[_duck_type(c)]) for c in table.columns])
        reader = pa.RecordBatchReader.from_batches(schema, _record_batches(engine, table, schema))
        con.register("_overrule_stream", reader)
        try:
            con.execute(f"CREATE TABLE {RAW_CATALOG}.{quote_ident(name)} AS SELECT * FROM _overrule_stream")
        finally:
            con.unregister("_overrule_stream")


def scanner_connect(engine: Engine, config: Mapping[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the app database attached read-only as `app_raw` through the scanner
    extension, and no fallback: raises DuckUnavailable instead (the caller has a path of its own).

    `RAW_QUERY_FUNCTIONS[dialect]('app_raw', sql)` then runs the app's own SQL in the database (on
    SQLite only inside a `run_isolated` child, like every scanner read of the file). Every column
    of a `sqlite_query` comes as text (SQLite's own rendering: 15 digits for a float).
    """
    con = new_connection(config)
    try:
        attach_scanner(con, scan_source(engine))
    except BaseException:
        con.close()
        raise
    return con


def duck_connect(
    engine: Engine, *, tables: Iterable[str] | None = None, scanner: bool = True
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where `db.<table>` reads the app database with backend-neutral types.

    `tables` only matters on the Arrow path (which copies just those); `scanner=False` forces it.
    On SQLite the Arrow path is the rule, except in a `run_isolated` child.
    """
    con = new_connection()
    try:
        if not scanner:
            raise DuckUnavailable("scanner disabled by the caller")
        if engine.dialect.name == "sqlite" and not scanner_allowed():
            raise DuckUnavailable("SQLite is read through the app's own connection")
        attach_scanner(con, scan_source(engine))
    except DuckUnavailable as exc:
        if engine.dialect.name != "sqlite":
            log.warning("DuckDB reads %s through Arrow batches (slower): %s", engine.dialect.name, exc)
        wanted = set(model_tables()) if tables is None else set(tables)
        unknown = wanted - set(model_tables())
        if unknown:
            con.close()
            raise ValueError(f"unknown tables: {', '.join(sorted(unknown))}") from None
        _copy_through_arrow(con, engine, wanted)
    con.execute(f"CREATE SCHEMA {VIEW_SCHEMA}")
    _create_typed_views(con)
    return con


def source_kind(con: duckdb.DuckDBPyConnection) -> str:
    """How `db.*` is read: 'sqlite' or 'postgres' (scanner), or 'duckdb' (the Arrow fallback copy)."""
    row = con.execute("SELECT type FROM duckdb_databases() WHERE database_name = ?", [RAW_CATALOG]).fetchone()
    return str(row[0]) if row else "none"


def fetch_frame(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | dict[str, Any] | None = None
) -> pd.DataFrame:
    """A small (aggregated or paged) query result as a DataFrame, through Arrow (no pytz needed)."""
    return con.execute(sql, params or []).to_arrow_table().to_pandas()


def isolated_url(engine: Engine) -> str:
    """The engine's URL for a child process: password kept, a SQLite path made absolute."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        url = url.set(database=str(Path(url.database).resolve()))
    return url.render_as_string(hide_password=False)


class _Popen(popen_forkserver.Popen):
    """Forkserver start without re-running the parent's main script in the worker
    (`lib.lean_worker.preparation_data`): the same launch as Python's otherwise."""

    def _launch(self, process_obj: Any) -> None:
        buf = dump_launch(self, process_obj)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        parent_w = os.dup(w)  # the child watches this end to notice the parent's death
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(ForkServerProcess):
    _Popen = staticmethod(_Popen)  # type: ignore[assignment]


class _Context(ForkServerContext):
    Process = _Process  # type: ignore[assignment]


def _preloaded_context() -> ForkServerContext:
    """Workers forked from a fork server that has imported the export code once."""
    ctx = _Context()
    ctx.set_forkserver_preload(["lib.export", "lib.analytics"])  # imports paid once
    return ctx


# The isolated workers of `with_duck` and table exports: forked from a preloaded fork server.
_POOL = WorkerPool(process_pool(_preloaded_context), init_worker)


def start_isolated_workers() -> None:
    """Start the fork server now (about 2 s of imports) rather than on the first export or chart."""
    _POOL.start()


def stop_isolated_workers() -> None:
    """Stop the worker processes (they also stop when this process exits); the next call starts anew."""
    _POOL.stop()


def run_isolated(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`func(*args, **kwargs)` in a child process where the sqlite scanner may open the database file.

    `func` must be a module-level function, its arguments and result picklable (give it a URL from
    `isolated_url`, not an engine); its exceptions are raised here. The child is forked from a fork
    server that has already imported lib (started on first use, ~2 s), then reused: a call costs
    about as much as the same call in this process. The main script is never re-run in a worker
    (see `_Popen`), so `func` cannot live in `__main__`.
    """
    return isolated_result(submit_isolated(func, *args, **kwargs))


def submit_isolated(func: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
    """`run_isolated` without waiting: take `isolated_result(future)` after."""
    return _POOL.submit(func, *args, **kwargs)


def isolated_result(future: Future[T], timeout: float | None = None) -> T:
    """The result of a `submit_isolated` call; its exceptions raised here, a dead worker as RuntimeError."""
    return _POOL.result(future, timeout)


def with_duck(
    engine: Engine,
    func: Callable[..., T],
    /,
    *args: Any,
    tables: Iterable[str] | None = None,
    **kwargs: Any,
) -> T:
    """`func(con, *args, **kwargs)` on a fresh `duck_connect(engine, tables=...)` connection, closed after.

    The one way lib code runs DuckDB over the app database. On SQLite it runs in a `run_isolated`
    child, where the scanner reads the file at full speed without touching this process's locks;
    `func` (module-level) and its result cross the process boundary, so keep results small.
    """
    if engine.dialect.name == "sqlite" and not scanner_allowed():
        wanted = None if tables is None else sorted(tables)
        return run_isolated(_with_duck_at, isolated_url(engine), func, args, kwargs, wanted)
    con = duck_connect(engine, tables=tables)
    try:
        return func(con, *args, **kwargs)
    finally:
        con.close()


def _with_duck_at(
    url: str, func: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any], tables: list[str] | None
) -> T:
    """`with_duck` inside the child: an engine of its own that never opens a connection on SQLite."""
    engine = create_db_engine(url)
    try:
        return with_duck(engine, func, *args, tables=tables, **kwargs)
    finally:
        engine.dispose()
