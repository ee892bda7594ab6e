"""Database setup: engines for SQLite (default) and PostgreSQL, sessions, and migrations.

SQLite is tuned for several reviewers at once: WAL so readers never block the writer, `BEGIN
IMMEDIATE` for every transaction that may write, so a read-then-write transaction takes the write
lock up front and can never hit the "database is locked" upgrade failure of a deferred transaction,
a first-come-first-served queue of the writers of one process (`WriterQueue`), and a busy timeout
so writers of other processes wait instead of failing.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
from sqlalchemy.exc import OperationalError
from sqlmodel import Session

# The ORM hooks that keep derived tables in step with every write through a Session are registered
# by importing their modules here, where engines and sessions are made: lib.counters (the counters)
# and lib.scores (metric_scores, agreement counts). lib.models sits below both and imports neither.
import lib.counters
import lib.scores  # noqa: F401
from lib.config import ROOT, get_settings
from lib.locks import PG_MIGRATION_LOCK

log = logging.getLogger(__name__)

MIGRATIONS_DIR = ROOT / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 15_000

# PostgreSQL aborts one transaction of a lock cycle (deadlock_detected) and, above read committed,
# one of two that conflict (serialization_failure); both mean "run it again", never "bad input".
RETRY_SQLSTATES = frozenset({"40P01", "40001"})
# The first run and up to seven retries: review8's hammer (8 threads on 40 evaluations, no pause)
# still let 3 of 800 archives lose five times in a row.
WRITE_ATTEMPTS = 8
RETRY_BACKOFF_S = 0.05  # the first retry waits up to this long, doubling per attempt (jittered)
RETRY_BACKOFF_MAX_S = 0.5  # and never longer: PostgreSQL's deadlock_timeout (1 s) already passed
# No attempt starts once this long has passed since the first began: a long import losing every
# race would otherwise keep its caller (an HTTP client, a reviewer) waiting WRITE_ATTEMPTS times its
# length (review13 F2: a 2.2 s import failing each time answered after 25.6 s).
RETRY_BUDGET_S = 30.0

T = TypeVar("T")


def normalize_url(url: str) -> str:
    """Route plain `postgresql://` URLs to psycopg 3, the driver Overrule ships with."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


class WriterQueue:
    """Turns to write one SQLite file, handed out first come, first served to the threads of this
    process (the app server's reviewers, the API, a background import).

    SQLite's own busy handler is not fair: a waiting writer sleeps and polls (1 ms, growing to
    100 ms), and a thread that has just committed begins its next transaction before any sleeper
    wakes. Under load one reviewer's label could lose every retry for `SQLITE_BUSY_TIMEOUT_MS` and
    fail with "database is locked" while the others wrote on (seen once in the suite, five reviewer
    threads at load 16). Here each writer waits in line and is handed the turn when the one before
    it commits or rolls back. Writers in other processes still meet in SQLite's busy handler.
    """

    def __init__(self) -> None:
        # Nothing inside the mutex allocates, so the garbage collector cannot run there: a connection
        # it finalizes ends its transaction and calls `release` on this thread (a plain Lock would
        # deadlock, an RLock would let that release run in the middle of another).
        self._mutex = threading.Lock()
        self._busy = False
        self._waiting: deque[threading.Event] = deque()  # not empty only while busy

    def acquire(self, timeout: float) -> bool:
        """Wait for the turn, at most `timeout` seconds; False when it did not come."""
        turn = threading.Event()
        with self._mutex:
            if not self._busy:
                self._busy = True
                return True
            self._waiting.append(turn)
        try:
            if turn.wait(timeout):
                return True
        except BaseException:
            # Interrupted (KeyboardInterrupt in the CLI): leave the line, or pass on a turn just handed over.
            if not self._leave(turn):
                self.release()
            raise
        if self._leave(turn):
            return False
        turn.wait()  # handed over as the wait ran out: `release` sets it at once
        return True

    def _leave(self, turn: threading.Event) -> bool:
        """Take `turn` out of the line; False when `release` already took it out to hand it over."""
        with self._mutex:
            if turn in self._waiting:
                self._waiting.remove(turn)
                return True
            return False

    def release(self) -> None:
        """End this writer's turn: hand it to the longest waiting writer, if any."""
        with self._mutex:
            turn = self._waiting.popleft() if self._waiting else None
            if turn is None:
                self._busy = False
        if turn is not None:
            turn.set()  # still busy: the turn is now the next writer's


# Weak values: a queue lives as long as an engine on its file (the suite makes thousands of files).
_WRITER_QUEUES: weakref.WeakValueDictionary[str, WriterQueue] = weakref.WeakValueDictionary()
_WRITER_QUEUES_MUTEX = threading.Lock()


def _forget_turns() -> None:
    """In a forked child: the parent's threads, and so their turns, did not come along. Engines made
    before the fork keep their queue objects, so each is emptied, not replaced."""
    global _WRITER_QUEUES_MUTEX
    _WRITER_QUEUES_MUTEX = threading.Lock()
    for queue in list(_WRITER_QUEUES.values()):
        queue.__init__()  # type: ignore[misc]


os.register_at_fork(after_in_child=_forget_turns)


def writer_queue(path: str) -> WriterQueue:
    """The one queue of this process's writers to the SQLite file at `path` (every engine on it)."""
    key = os.path.realpath(path)
    with _WRITER_QUEUES_MUTEX:
        queue = _WRITER_QUEUES.get(key)
        if queue is None:
            queue = _WRITER_QUEUES[key] = WriterQueue()
        return queue


def _install_sqlite_hooks(engine: Engine, queue: WriterQueue | None) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" hook issues BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    holding: dict[int, Any] = {}  # id of a DBAPI connection -> the connection, while it has the turn

    def _end_turn(connection: Any) -> None:
        raw = getattr(connection, "dbapi_connection", connection)  # SQLAlchemy passes either
        if queue is not None and holding.pop(id(raw), None) is not None:
            queue.release()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:  # type: ignore[no-untyped-def]
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        if queue is None or mode == "DEFERRED":  # a reader takes no turn
            conn.exec_driver_sql(f"BEGIN {mode}")
            return
        raw = conn.connection.dbapi_connection  # may connect (and fail) before the turn is taken
        if not queue.acquire(SQLITE_BUSY_TIMEOUT_MS / 1000):
            waited = f"database is locked: waited {SQLITE_BUSY_TIMEOUT_MS / 1000:g} s for this server's other writers"
            raise OperationalError(f"BEGIN {mode}", None, sqlite3.OperationalError(waited))
        holding[id(raw)] = raw
        try:
            conn.exec_driver_sql(f"BEGIN {mode}")
        except BaseException:
            _end_turn(raw)
            raise

    # Every way a transaction ends passes through one of these dialect methods: a commit or rollback
    # of a Connection, the pool's rollback when a connection is returned, and closing a connection;
    # or, for a connection detached from the pool, the pool's close_detached event.
    # They are set on this engine's dialect only (each engine has its own).
    event.listen(engine, "close_detached", _end_turn)
    for name in ("do_commit", "do_rollback", "do_close"):
        setattr(engine.dialect, name, _then(getattr(engine.dialect, name), _end_turn))


def _then(end: Callable[[Any], None], after: Callable[[Any], None]) -> Callable[[Any], None]:
    def ended(dbapi_connection: Any) -> None:
        try:
            end(dbapi_connection)
        finally:
            after(dbapi_connection)

    return ended


class _SQLiteCompiler(SQLiteCompiler):
    """SQLite's statement compiler, rendering table hints: `select(...).with_hint(table, "INDEXED BY
    ix_name", "sqlite")` names the index a list walks (lib.inspector), where SQLAlchemy's own SQLite
    compiler drops every table hint."""

    def get_from_hint_text(self, table: Any, text: str | None) -> str | None:
        return text


# PostgreSQL plans every execution of a statement for its own values, never a generic plan. psycopg
# prepares a statement the fifth time a connection runs it, and after five custom plans PostgreSQL may
# keep one generic plan for any values; the lists' filters are bound values whose best plans differ
# (a common text vs a rare one, a minimum gap of 4 vs 2). After the Evaluations pages before it, "all
# metrics reviewed + a rare text, by largest gap" ran under a plan made for no text in particular:
# 0.21 s a render at 100k instead of 0.02. Planning costs ~0.1-0.5 ms a statement.
# Set on each new connection, not as a startup `options` parameter: that would replace any `options`
# the deployment's URL carries (a search_path, a statement_timeout), and PgBouncer refuses startup
# parameters it does not know. PostgreSQL before 12 has no such setting and keeps its default.
PG_PLAN_EACH_EXECUTION = "SET plan_cache_mode = force_custom_plan"


def _plan_each_execution(dbapi_connection: Any, _record: Any) -> None:
    # psycopg 3 and psycopg2 alike: `info.server_version`, `autocommit`, a cursor.
    if dbapi_connection.info.server_version < 120000:
        return
    autocommit = dbapi_connection.autocommit
    dbapi_connection.autocommit = True  # outside a transaction: the pool's rollback must not undo it
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(PG_PLAN_EACH_EXECUTION)
        finally:
            cursor.close()
    finally:
        dbapi_connection.autocommit = autocommit


def create_db_engine(url: str | None = None) -> Engine:
    """An engine for `url` (default: the configured database) without touching the schema."""
    url = normalize_url(url or get_settings().database_url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        engine.dialect.statement_compiler = _SQLiteCompiler
        _install_sqlite_hooks(engine, writer_queue(path) if path and path != ":memory:" else None)
        return engine
    engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    if engine.dialect.name == "postgresql" and engine.dialect.driver in {"psycopg", "psycopg2"}:
        event.listen(engine, "connect", _plan_each_execution)
    return engine


def alembic_config(engine: Engine | None = None) -> Config:
    """An Alembic config pointing at this repo's migrations (and at `engine` when given)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return cfg


def migrate(engine: Engine) -> None:
    """Upgrade the schema to the newest migration; safe when several processes start at once."""
    cfg = alembic_config(engine)
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": PG_MIGRATION_LOCK})
            conn.commit()
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        finally:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": PG_MIGRATION_LOCK})
                conn.commit()


def init_db(url: str | None = None) -> Engine:
    """An engine for `url` (default `OVERRULE_DATABASE_URL`, else `data/overrule.db`), schema migrated."""
    engine = create_db_engine(url)
    migrate(engine)
    return engine


# Rows sampled per index by ANALYZE: statistics good enough for plan choice in ~50 ms at any size.
SQLITE_ANALYSIS_LIMIT = 400


def refresh_statistics(conn: Connection) -> None:
    """Refresh SQLite's planner statistics (sampled, ~50 ms); PostgreSQL's autovacuum keeps its own once
    a load commits, and `LoadStatistics` keeps them during one.

    Without statistics SQLite guesses that `deleted_at IS NULL` is selective and scans the list
    index, probing the search index per row, instead of reading the few rows the trigram index
    names (lib.search): a search then costs time in proportion to all rows, not to its matches.
    """
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql(f"PRAGMA analysis_limit={SQLITE_ANALYSIS_LIMIT}")
        conn.exec_driver_sql("ANALYZE")


# Rows a load writes before PostgreSQL's statistics of the tables are refreshed in its transaction.
PG_ANALYZE_MIN_ROWS = 1000


class LoadStatistics:
    """PostgreSQL's planner statistics kept in step with a long load inside one transaction.

    Autovacuum analyses a table only after other transactions can see its new rows, so during an
    import the planner still believes what it last saw; on a new or emptied database that is "no
    rows". It then plans the per-batch counter updates (an IN list of a batch's ids joined to the
    judgments) as scans of a table it takes to be empty, and each batch costs time in proportion to
    all rows loaded so far: minutes for a few thousand evaluations. ANALYZE in the load's own
    transaction counts its uncommitted rows; run whenever the rows written since the last refresh
    outnumber what the planner believes the first table holds, it runs about log2(rows) times,
    each a sample of at most 30,000 rows. SQLite is refreshed once after the load
    (`refresh_statistics`).
    """

    def __init__(self, conn: Connection, tables: Sequence[str]) -> None:
        self._conn = conn
        self._tables = tuple(tables)
        self._on = conn.dialect.name == "postgresql"
        self._believed = self._estimate() if self._on else 0
        self._written = 0

    def _estimate(self) -> int:
        found = self._conn.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = to_regclass(:t)"), {"t": self._tables[0]}
        ).scalar()
        return max(int(found or 0), 0)  # -1: never analysed

    def wrote(self, rows: int) -> None:
        """`rows` more rows are in the first table: refresh the statistics if the planner is now wrong."""
        if not self._on:
            return
        self._written += rows
        if self._written >= max(PG_ANALYZE_MIN_ROWS, self._believed):
            self._conn.exec_driver_sql("ANALYZE " + ", ".join(f'"{t}"' for t in self._tables))
            self._believed, self._written = self._estimate(), 0


@contextmanager
def session_scope(engine: Engine, *, read_only: bool = False) -> Iterator[Session]:
    """A session that commits on success and rolls back on error.

    `read_only=True` starts SQLite transactions deferred, so pure readers never queue behind writers.
    """
    bind = engine.execution_options(sqlite_begin="DEFERRED") if read_only else engine
    session = Session(bind, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except Exception:
        session.rollback()
        raise
    finally:
        session.close()


def must_retry(exc: BaseException) -> bool:
    """True when `exc` (or what it was raised from) is PostgreSQL's deadlock or serialization failure.

    The SQLSTATE is psycopg 3's `.sqlstate` or psycopg2's `.pgcode`: a deployment whose URL names
    psycopg2 (`postgresql+psycopg2://`) gets its deadlock victims run again too (review10 L3)."""
    seen: BaseException | None = exc
    for _ in range(8):  # a chain of wrappers, never a loop
        if seen is None:
            return False
        for candidate in (seen, getattr(seen, "orig", None)):
            for attribute in ("sqlstate", "pgcode"):
                if getattr(candidate, attribute, None) in RETRY_SQLSTATES:
                    return True
        seen = seen.__cause__ or seen.__context__
    return False


def write_retrying(engine: Engine, work: Callable[[Session], T], *, attempts: int | None = None) -> T:
    """`work(session)` in one write transaction (`session_scope`), run again whole on PostgreSQL when
    the database aborted it as a deadlock's victim or a serialization failure.

    Why: under contention (reviews, undos, re-judges, archives sharing counter rows) PostgreSQL picks
    a victim in every lock cycle; the victim did nothing wrong and succeeds when run again, so a
    reviewer should not see an error page for it. Each attempt is a fresh session after a short
    jittered back-off (the other transaction finishes meanwhile). `work` must therefore read what it
    checks inside the transaction (a version check after a lost race then refuses as it should) and
    have no effect outside it: its result is what the last attempt returned. SQLite never needs it
    (one writer at a time), so there `work` runs once. `attempts`: WRITE_ATTEMPTS unless given.
    """

    def attempt() -> T:
        with session_scope(engine) as session:
            return work(session)

    return run_retrying(engine, attempt, attempts=attempts)


def run_retrying(engine: Engine, attempt: Callable[[], T], *, attempts: int | None = None) -> T:
    """`attempt()` again whole on PostgreSQL while it fails as a deadlock's victim or a serialization
    failure (`must_retry`), after the same jittered back-off as `write_retrying`.

    For a writer that opens its own sessions (an import validates under a read-only session, then
    writes in one transaction): every write of `attempt` must be in that one transaction, and what
    it reads (a file on disk, a request body in memory) must read the same again. An import is all
    or nothing, so a victim's attempt left nothing behind. SQLite: runs once."""
    attempts = WRITE_ATTEMPTS if attempts is None else attempts  # read when called (a test may lower it)
    retries = attempts - 1 if engine.dialect.name == "postgresql" else 0
    started = time.monotonic()
    for n in range(retries + 1):
        try:
            return attempt()
        except Exception as exc:
            if n == retries or not must_retry(exc) or time.monotonic() - started > RETRY_BUDGET_S:
                raise
            # Warned: a retry costs the caller at least deadlock_timeout, and many mean a lock cycle
            # to remove (docs/internals.md, Counters), not only to survive.
            log.warning(
                "write transaction retried after %s (attempt %d of %d)",
                type(exc).__name__,
                n + 2,
                attempts,
            )
            # The failed attempt's frames (an import's whole batch) are let go before the next one
            # builds its own, not when a garbage collection finds the exception's cycle (review13 F3).
            traceback.clear_frames(exc.__traceback__)
        time.sleep(random.uniform(0.5, 1.0) * min(RETRY_BACKOFF_S * 2**n, RETRY_BACKOFF_MAX_S))
    raise AssertionError("unreachable")  # the loop returns or raises
