"""DuckDB worker processes, and the scanner database a worker keeps (issue #17, issue 27).

DuckDB's scanner extensions read the app database inside the database (`sqlite_query`,
`postgres_query`) at a speed no Python driver reaches. On SQLite the scanner may only open the file in
a child process that holds no connection of its own (`lib.duck` explains why: POSIX locks), so
such reads run in a worker process (`WorkerPool`). Two pools use this module:

- `lib.duck`'s, forked from a fork server that preloads the app's export code (table exports,
  `with_duck`);
- `lib.wide_scan`'s, for the Evaluations CSV of every match (issue 27): a fresh interpreter
  (`lib.lean_worker.LeanExecutor`) that imports only `lib.lean_worker`, this module,
  `lib.wide_scan`, `lib.csv_text` and `lib.judgment_text`: DuckDB and Arrow, never numpy, pandas,
  SQLAlchemy or SQLModel. It sits at ~50-70 MiB PSS beside the app instead of a fork server with
  the app's imports and its worker (~120 MiB), which is what kept the export above 300 MiB.

This module is therefore lean on purpose: the standard library, DuckDB and Arrow. A worker attaches
the app database from a `ScanSource` (a path or a libpq string), never from a SQLAlchemy engine,
and keeps one DuckDB database with the extension loaded for its life (`scanner_session`): the
extension's LOAD checks a signature by hashing its 35-42 MB file (~0.15 CPU s), once per worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from importlib import resources
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from lib.sql_quote import quote_ident, quote_literal

log = logging.getLogger(__name__)

T = TypeVar("T")
RAW_CATALOG = "app_raw"
# The scanner's table function that runs a query of the app's own SQL dialect in its database,
# streaming the rows in the query's order.
RAW_QUERY_FUNCTIONS = {"sqlite": "sqlite_query", "postgresql": "postgres_query"}
_EXTENSION_PACKAGES = {
    "sqlite": ("duckdb_extension_sqlite_scanner", "sqlite_scanner"),
    "postgres": ("duckdb_extension_postgres_scanner", "postgres_scanner"),
}
# At most this many DuckDB child processes at once per pool and app process.
ISOLATED_WORKERS = 2
# The test suite's switch (set by tests/conftest.py, never by a deployment): skip DuckDB's signature
# check of the scanner extension on LOAD. The check hashes the whole 35-42 MB file on every new
# connection (0.15-0.2 CPU s each; the suite opens thousands of connections to the same pip-installed
# files). test_scanner_loads_from_the_package_without_install loads without it, so the shipped files'
# signatures are still checked on every run.
TRUST_EXTENSIONS_VAR = "OVERRULE_TEST_TRUST_DUCKDB_EXTENSIONS"
# True only in a worker process, which holds no SQLite connection of its own (`init_worker`).
_sqlite_scanner_allowed = False


class DuckUnavailable(RuntimeError):
    """A scanner extension could not be loaded or attached; the caller falls back to Arrow."""


@dataclass(frozen=True)
class ScanSource:
    """The app database as a worker's scanner attaches it (picklable, no engine: a lean worker has
    no SQLAlchemy). `lib.duck.scan_source(engine)` makes one."""

    dialect: str  # "sqlite" or "postgresql"
    target: str  # SQLite: the file's path; PostgreSQL: a libpq key/value connection string
    secret: str | None = None  # the password, masked in error messages


def scanner_allowed() -> bool:
    """Whether this process may open a SQLite file through the scanner (a worker: no connection here)."""
    return _sqlite_scanner_allowed


def extension_path(kind: str) -> str:
    """Where the pip-installed scanner extension for this DuckDB version lives."""
    package, name = _EXTENSION_PACKAGES[kind]
    try:
        root = resources.files(package)
    except ModuleNotFoundError as exc:
        raise DuckUnavailable(f"package {package} is not installed") from exc
    path = root / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise DuckUnavailable(f"{package} has no extension for DuckDB {duckdb.__version__}")
    return str(path)


def new_connection(config: Mapping[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection that never downloads, in UTC, without a progress bar."""
    con = duckdb.connect(
        config={
            # Nothing may download at run time (SPEC §8): no silent INSTALL behind a query.
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_unsigned_extensions": os.environ.get(TRUST_EXTENSIONS_VAR) == "1",
            **(config or {}),
        }
    )
    # TIMESTAMPTZ values print and export as UTC, and naive times read as UTC. GLOBAL: a plain SET
    # holds for this connection only, and a cursor (a new connection to the same database, as
    # `scanner_session` hands out) would start in the host's zone.
    con.execute("SET GLOBAL TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # a child's stderr is the server's log
    return con


def _extension_kind(source: ScanSource) -> str:
    if source.dialect == "sqlite":
        return "sqlite"
    if source.dialect == "postgresql":
        return "postgres"
    raise DuckUnavailable(f"no DuckDB scanner for {source.dialect}")


def attach_scanner(con: duckdb.DuckDBPyConnection, source: ScanSource, *, loaded: bool = False) -> None:
    """Attach the app database read-only as `app_raw` through the packaged scanner extension
    (loaded first, unless `loaded` says the connection's database has it already)."""
    try:
        kind = _extension_kind(source)
        if kind == "sqlite":
            if not source.target or source.target == ":memory:":
                raise DuckUnavailable("an in-memory SQLite database cannot be attached")
            if not _sqlite_scanner_allowed:  # see lib.duck's docstring: it would drop the app's locks
                raise DuckUnavailable("the sqlite scanner only runs in an isolated process")
        if not loaded:
            con.execute(f"LOAD {quote_literal(extension_path(kind))}")
        con.execute(f"ATTACH {quote_literal(source.target)} AS {RAW_CATALOG} (TYPE {kind}, READ_ONLY)")
    except duckdb.Error as exc:
        message = str(exc)
        if source.secret:
            message = message.replace(source.secret, "***")
        raise DuckUnavailable(message) from exc


# The worker's own DuckDB database for `scanner_session`, kept for the worker's life: the scanner
# extension's LOAD is paid once per worker, not once per export. Only the app database's attachment
# is per call. One that fails (an invalidating error, a failed setup or cleanup) is replaced.
_kept_scanner: duckdb.DuckDBPyConnection | None = None
_kept_extensions: set[str] = set()


@contextlib.contextmanager
def scanner_session(
    source: ScanSource, config: Mapping[str, Any] | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection with the app database attached read-only as `app_raw` through the scanner,
    for one use inside a worker (which runs one call at a time), on a DuckDB database the worker
    keeps with the extension already loaded: the app database is attached on entry and detached on
    exit, so no file handle outlives the call. `config` holds settings (threads, memory_limit)
    applied to the kept database for this use. Outside a worker it is a fresh connection, closed
    after. Raises DuckUnavailable when the scanner cannot attach (the caller has a path of its own).

    `RAW_QUERY_FUNCTIONS[dialect]('app_raw', sql)` then runs the app's own SQL in the database. Every
    column of a `sqlite_query` comes as text (SQLite's own rendering: 15 digits for a float)."""
    if not _sqlite_scanner_allowed:
        con = new_connection(config)
        try:
            attach_scanner(con, source)
            yield con
        finally:
            con.close()
        return
    kept = _kept_database()
    try:
        kind = _extension_kind(source)
        for key, value in (config or {}).items():
            kept.execute(f"SET {quote_ident(key)} = {quote_literal(str(value))}")
        if kind not in _kept_extensions:
            kept.execute(f"LOAD {quote_literal(extension_path(kind))}")
            _kept_extensions.add(kind)
        attach_scanner(kept, source, loaded=True)
        con = kept.cursor()
    except DuckUnavailable:
        _drop_kept_database()  # this use's settings are on it: the next use starts on a fresh one
        raise
    except duckdb.Error as exc:
        _drop_kept_database()
        raise DuckUnavailable(str(exc)) from exc
    try:
        yield con
    finally:
        # A cleanup that fails must not hide the use's own error (nor fail a use that went well):
        # it is logged, and the kept database, in an unknown state now, is replaced.
        try:
            con.close()
            kept.execute(f"DETACH DATABASE IF EXISTS {RAW_CATALOG}")
            _give_back_memory(kept, config or {})
        except duckdb.Error:
            log.warning("could not reset the worker's DuckDB database after a use; dropped", exc_info=True)
            _drop_kept_database()


def _kept_database() -> duckdb.DuckDBPyConnection:
    """The worker's kept DuckDB database, with nothing attached; a fresh one when there is none or
    the kept one fails (a fatal error invalidates a DuckDB database: every later statement fails)."""
    global _kept_scanner
    if _kept_scanner is not None:
        try:
            _kept_scanner.execute(f"DETACH DATABASE IF EXISTS {RAW_CATALOG}")  # a call that died half-way
            return _kept_scanner
        except duckdb.Error as exc:
            log.warning("the worker's DuckDB database failed, a fresh one replaces it: %s", exc)
            _drop_kept_database()
    _kept_scanner = new_connection()
    _kept_extensions.clear()
    return _kept_scanner


def _drop_kept_database() -> None:
    """Close and forget the kept database (after a failure); the next use opens a fresh one."""
    global _kept_scanner
    kept, _kept_scanner = _kept_scanner, None
    _kept_extensions.clear()
    if kept is not None:
        with contextlib.suppress(duckdb.Error):
            kept.close()


def _give_back_memory(con: duckdb.DuckDBPyConnection, config: Mapping[str, Any]) -> None:
    """Return what a use of the kept database took, so an idle worker is as small as a fresh one:
    DuckDB keeps freed blocks until its memory limit shrinks (~80 MiB after a wide export), Arrow's
    pool its freed pages (~20 MiB). The use's settings go back to their defaults."""
    with contextlib.suppress(duckdb.Error):
        con.execute("SET memory_limit = '1MB'")  # nothing is in use now: DuckDB frees what it cached
    for key in {"memory_limit", *config}:
        con.execute(f"RESET {quote_ident(key)}")
    pa.default_memory_pool().release_unused()


# ---------------------------------------------------------------------------------------------
# Worker processes


def init_worker(app_pid: int, *, child_of_app: bool = False) -> None:
    """Worker initializer: this process holds no other SQLite connection, so the scanner may open it.

    It also leaves when the app process is gone (even killed with SIGKILL), instead of lingering.
    `child_of_app`: the app started this process itself (a spawned lean worker, not a fork server's
    child), so its parent's pid says exactly whether the app is still there (`_app_gone`)."""
    global _sqlite_scanner_allowed
    _sqlite_scanner_allowed = True

    def watch() -> None:
        while not _app_gone(app_pid, child_of_app=child_of_app):
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="overrule-app-watch", daemon=True).start()


def _app_gone(app_pid: int, *, child_of_app: bool) -> bool:
    """Whether the app process `app_pid` is gone. A child of the app is re-parented when the app
    dies: exact. Otherwise (a fork server's child) the pid is probed, which a reused pid of the same
    user, or an app that is a zombie not yet reaped, would still pass."""
    if child_of_app:
        return os.getppid() != app_pid
    try:
        os.kill(app_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # the pid now belongs to another user's process: ours is gone
        return True
    return False


def _no_op() -> None:
    return None


# How a pool makes its executor: (max_workers, initializer, initargs) -> an executor whose broken
# worker raises BrokenProcessPool and whose `_processes` maps pids to killable processes (as
# ProcessPoolExecutor's): `process_pool(context)`, or `lib.lean_worker.LeanExecutor`.
ExecutorFactory = Callable[[int, Callable[[int], None], tuple[Any, ...]], Executor]


def process_pool(context: Callable[[], BaseContext]) -> ExecutorFactory:
    """A ProcessPoolExecutor of workers started by `context()` (multiprocessing)."""

    def make(max_workers: int, initializer: Callable[[int], None], initargs: tuple[Any, ...]) -> Executor:
        return ProcessPoolExecutor(
            max_workers=max_workers, mp_context=context(), initializer=initializer, initargs=initargs
        )

    return make


class WorkerPool:
    """Worker processes started on first use and reused (each call opens and closes what it
    attaches, so no file handle outlives a call); a pool whose worker died starts anew on the next
    call. `executor` makes the workers (`ExecutorFactory`); `initializer(app_pid)` runs in each
    worker first. Every pool stops when the app exits (`_stop_pools`)."""

    def __init__(self, executor: ExecutorFactory, initializer: Callable[[int], None]) -> None:
        self._make_executor = executor
        self._initializer = initializer
        self._pool: Executor | None = None
        self._made_in = 0  # the process that started `_pool`: its workers are that process's children
        self._lock = threading.Lock()
        # The executor of each call not yet forgotten: a broken one is dropped only if still current.
        self._executors: weakref.WeakKeyDictionary[Future[Any], Executor] = weakref.WeakKeyDictionary()
        _POOLS.add(self)

    def _executor(self) -> Executor:
        with self._lock:
            if self._pool is None:
                self._pool = self._make_executor(ISOLATED_WORKERS, self._initializer, (os.getpid(),))
                self._made_in = os.getpid()
            return self._pool

    def _broken(self, exc: BrokenProcessPool, broken: Executor | None) -> RuntimeError:
        with self._lock:
            if self._pool is broken:  # not a new pool another thread made since: that one is healthy
                self._pool = None  # the next call starts a new pool
        return RuntimeError(f"the DuckDB worker process died: {exc}")

    def submit(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """`func(*args, **kwargs)` in a worker, without waiting: take `result(future)` after.
        `func` must be a module-level function (not in `__main__`), its arguments and result
        picklable."""
        executor = self._executor()
        try:
            future = executor.submit(func, *args, **kwargs)
        except BrokenProcessPool as exc:
            raise self._broken(exc, executor) from exc
        self._executors[future] = executor
        return future

    def result(self, future: Future[T], timeout: float | None = None) -> T:
        """The result of a `submit` call; its exceptions raised here, a dead worker as RuntimeError."""
        try:
            return future.result(timeout)
        except BrokenProcessPool as exc:
            raise self._broken(exc, self._executors.get(future)) from exc

    def run(self, func: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`submit`, then wait for its result."""
        return self.result(self.submit(func, *args, **kwargs))

    def start(self, warm: Callable[[], None] = _no_op) -> None:
        """Start a worker now (running `warm`, e.g. to import a module) rather than on the first call."""
        self.run(warm)

    def stop(self) -> None:
        """Stop the workers now, without waiting for their calls (a running call fails, as
        RuntimeError from `result`; a queued one is cancelled); the next call starts anew. A call
        blocked for good (an export whose reader stopped reading) must not keep the app from
        stopping: the executor's own shutdown waits for every running call, so its processes are
        killed (a worker holds nothing that needs a clean exit: an in-memory DuckDB database,
        read-only attachments). In a process forked from the one that started them (a copy of
        this object), the workers are not its own: only the copy is forgotten."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None or self._made_in != os.getpid():
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())  # before shutdown forgets them
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            with contextlib.suppress(OSError, ValueError):  # gone already, or closed
                process.kill()


# Every WorkerPool of this process, stopped at exit by `_stop_pools`.
_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _stop_pools() -> None:
    """Stop every pool before `concurrent.futures` joins its executors at interpreter exit: that join
    waits for every running call, so a worker blocked in a call (a stalled download) kept the app
    from exiting until it was killed (a SIGTERM'd server hung in finalisation)."""
    for pool in list(_POOLS):
        pool.stop()


# `concurrent.futures.process` joins its executors in a `threading` exit hook, which runs before
# `atexit`'s; these hooks run in reverse order of registration, and that module registered its
# own when this one imported it, so this one runs first.
threading._register_atexit(_stop_pools)  # type: ignore[attr-defined]
