"""PostgreSQL server sessions kept between the engines the tests open, as one long-lived pool keeps them.

The app opens one engine and its pool keeps a few connections for the life of the process. The
suite opens a new engine for nearly every PostgreSQL test (its `engine` fixture, the engines a test
makes for a second reviewer or a thread, the app's cached engine after each cache clear), and each
disposed engine closed its connections. Every new connection costs a server process: fork,
authentication and a cold catalog cache, about 25 CPU ms of the server's and 5 of the test's
(`create_db_engine`, one write and one read: 30 ms of server CPU with a new engine, 6 ms with a kept
connection), on a machine where the server shares the two cores with the tests.

`install()` wraps `psycopg.connect` (what SQLAlchemy's psycopg dialect calls): a connection a test
closes goes back, reset, to a short list of idle sessions for the same connection parameters, and
the next connect to them takes one from there instead of starting a server process. The session
is reset on its way back to what a new one starts with: its transaction rolled back, then DISCARD
ALL (settings back to the role's defaults, session advisory locks released, cursors closed, LISTENs,
temporary tables, sequence state, cached plans and prepared statements dropped), and the psycopg
object's own state (its prepared-statement cache, autocommit, isolation level, read-only,
deferrable, notice and notify handlers, adapters, factories) set as `connect` leaves it. A session
that is broken, fails its reset, does not answer a ping when taken (the server ended it: a test's
`pg_terminate_backend`, a restart) or is in excess of `MAX_IDLE` is closed for real. Nothing changes
in what a test sends or reads; concurrent connections are still separate server processes (only
idle ones are handed out), so lock waits between two engines behave as before. A forked child
(multiprocessing's workers) never takes its parent's idle sessions: they are the parent's sockets.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

import psycopg
from psycopg import pq
from psycopg.adapt import AdaptersMap

# Idle sessions kept per set of connection parameters (a database, a user): enough for a test's
# engine, the app's and a second reviewer's; the others close as before. At most 4 databases a
# worker (its own, the module one, the fill template, the admin one): 16 idle sessions, so that two
# runs at once stay well inside the server's 100 connections.
MAX_IDLE = 4

_RESET = "DISCARD ALL"
_PING = ""  # an empty query: a round trip the server answers without parsing anything
_real_connect = psycopg.connect
_idle: dict[tuple[Any, ...], list[KeptConnection]] = {}
_lock = threading.Lock()
_inherited: list[KeptConnection] = []  # a forked child's copies of its parent's idle sessions
stats = {"opened": 0, "reused": 0}


class KeptConnection(psycopg.Connection[Any]):
    """A psycopg connection whose `close()` hands its server session back to the idle list."""

    _kept_key: tuple[Any, ...] | None = None
    _kept_factories: tuple[Any, Any]

    def close(self) -> None:
        key = self._kept_key
        if key is None or self.closed or self.broken or not _reset(self):
            super().close()
            return
        with _lock:
            idle = _idle.setdefault(key, [])
            if len(idle) < MAX_IDLE:
                idle.append(self)
                return
        super().close()

    def really_close(self) -> None:
        self._kept_key = None
        super().close()


def _reset(conn: KeptConnection) -> bool:
    """Put the session back as a new connection starts; False when that failed (then it is closed)."""
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.autocommit = True
        conn.execute(_RESET, prepare=False)
        conn._prepared.clear()
        conn._prepared._to_flush.clear()  # DISCARD ALL deallocated what clear() would queue
        conn.autocommit = False
        conn.isolation_level = None
        conn.read_only = None
        conn.deferrable = None
        conn._notice_handlers.clear()
        conn._notify_handlers.clear()
        return conn.info.transaction_status == pq.TransactionStatus.IDLE
    except psycopg.Error:
        return False


def _ended(conn: KeptConnection) -> bool:
    """Whether the server ended an idle session meanwhile (a test's `pg_terminate_backend`, a
    restart): one round trip, since a session whose end was just requested may not say so yet."""
    try:
        conn.autocommit = True
        conn.execute(_PING, prepare=False)
        conn.autocommit = False
    except psycopg.Error:
        return True
    return False


def connect(conninfo: str = "", **kwargs: Any) -> psycopg.Connection[Any]:
    """`psycopg.connect`, taking an idle kept session for the same parameters when there is one.

    SQLAlchemy passes the engine's adapters as `context`: a kept session gets a new copy of them,
    as `connect` gives a new connection (every engine the suite opens is configured alike)."""
    if set(kwargs) - {"host", "port", "dbname", "user", "password", "context"}:
        return _real_connect(conninfo, **kwargs)  # options this layer does not reset: a plain connection
    context = kwargs.get("context")
    key = (conninfo, *sorted((k, v) for k, v in kwargs.items() if k != "context"))
    while True:
        with _lock:
            idle = _idle.get(key)
            conn = idle.pop() if idle else None
        if conn is None:
            break
        if _ended(conn):
            conn.really_close()
            continue
        conn._adapters = AdaptersMap(context.adapters) if context is not None else None
        conn.prepare_threshold = 5
        conn.row_factory, conn.cursor_factory = conn._kept_factories
        stats["reused"] += 1
        return conn
    conn = KeptConnection.connect(conninfo, **kwargs)
    conn._kept_key = key
    conn._kept_factories = (conn.row_factory, conn.cursor_factory)
    stats["opened"] += 1
    return conn


def _forget_after_fork() -> None:
    """In a forked child: the idle sessions are the parent's sockets. Never hand them out here, and
    keep them referenced so that nothing in the child ends them for the parent."""
    global _lock
    _lock = threading.Lock()  # another thread may have held the parent's at the fork
    _inherited.extend(c for idle in _idle.values() for c in idle)
    _idle.clear()


def install() -> None:
    """Route every psycopg connection of this process through `connect` (idempotent); the kept
    sessions end with the process."""
    if psycopg.connect is not connect:
        psycopg.connect = connect  # type: ignore[assignment]
        atexit.register(close_all)
        os.register_at_fork(after_in_child=_forget_after_fork)


def close_all() -> None:
    """Close every idle kept session (their server processes end)."""
    with _lock:
        conns = [c for idle in _idle.values() for c in idle]
        _idle.clear()
    for conn in conns:
        conn.really_close()
