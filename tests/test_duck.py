"""lib.duck: quoting, the table whitelist, and the `db.*` views on both backends and both read paths.

The export tests (tests/test_export.py) cover the scanner's offline loading and the typed columns;
these cover the helpers every DuckDB query is built from, and what a cursor of a kept connection sees.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlmodel import Session

import lib.isolated
from lib.db import create_db_engine
from lib.duck import (
    duck_connect,
    fetch_frame,
    isolated_url,
    model_tables,
    run_isolated,
    scan_source,
    source_kind,
    table_ref,
    tables_in_sql,
)
from lib.isolated import RAW_QUERY_FUNCTIONS, DuckUnavailable, WorkerPool, extension_path, scanner_session
from lib.lean_worker import LeanExecutor, init_lean_worker
from lib.models import Judgment
from lib.sql_quote import quote_ident, quote_literal
from tests import lean_calls

T0 = datetime(2024, 5, 1, 12, tzinfo=UTC)


@pytest.mark.parametrize(
    ("name", "quoted"),
    [
        ("judgments", '"judgments"'),
        ('we"ird', '"we""ird"'),
        ('"; DROP TABLE x; --', '"""; DROP TABLE x; --"'),
    ],
)
def test_quote_ident_doubles_quotes(name: str, quoted: str) -> None:
    assert quote_ident(name) == quoted


@pytest.mark.parametrize(
    ("value", "quoted"), [("/tmp/a.db", "'/tmp/a.db'"), ("it's", "'it''s'"), ("''", "''''''")]
)
def test_quote_literal_doubles_single_quotes(value: str, quoted: str) -> None:
    assert quote_literal(value) == quoted


def test_table_ref_names_the_typed_view_of_a_model_table() -> None:
    assert "judgments" in model_tables()
    assert table_ref("judgments") == 'db."judgments"'


@pytest.mark.parametrize("name", ["nope", "judgments; DROP TABLE judgments", 'judgments"', ""])
def test_table_ref_refuses_what_is_not_a_model_table(name: str) -> None:
    with pytest.raises(ValueError, match="unknown table"):
        table_ref(name)


@pytest.mark.parametrize(
    ("sql", "tables"),
    [
        ('SELECT * FROM db."judgments" j JOIN db.evaluation_snapshots s ON true', {"judgments", "evaluation_snapshots"}),
        ("SELECT * FROM db . session_notes", {"session_notes"}),
        ("SELECT * FROM db.not_a_table, other.judgments", set()),
        ("SELECT 1", set()),
    ],
)  # fmt: skip
def test_tables_in_sql_finds_only_model_tables_under_db(sql: str, tables: set[str]) -> None:
    assert tables_in_sql(sql) == tables


def test_extension_path_of_an_unknown_backend_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        extension_path("mysql")


def test_extension_path_points_at_an_existing_file_or_says_why_not() -> None:
    try:
        path = extension_path("sqlite")
    except DuckUnavailable as exc:  # a platform without the wheel: the message names the package
        assert "duckdb_extension_sqlite_scanner" in str(exc)
    else:
        assert path.endswith("sqlite_scanner.duckdb_extension")


def test_the_fallback_refuses_unknown_tables(engine: Engine) -> None:
    with pytest.raises(ValueError, match="unknown tables: nope"):
        duck_connect(engine, tables=["judgments", "nope"], scanner=False)


def _judgment(engine: Engine, change_id: str, *, corrected: bool) -> None:
    with Session(engine) as s:
        s.add(
            Judgment(
                change_id=change_id,
                product="acme",
                decision="INCLUDE",
                user_decision="EXCLUDE" if corrected else None,
                was_corrected=corrected,
                timestamp=T0,
            )
        )
        s.commit()


@pytest.mark.parametrize("scanner", [True, False], ids=["scanner", "arrow"])
def test_fetch_frame_binds_parameters_and_returns_typed_columns(engine: Engine, scanner: bool) -> None:
    _judgment(engine, "a", corrected=True)
    _judgment(engine, "b", corrected=False)
    con = duck_connect(engine, tables=["judgments"], scanner=scanner)
    try:
        # In this process SQLite is always read through Arrow batches: the sqlite scanner may only
        # open the file in an isolated worker (lib.duck.run_isolated, issue #17).
        kind = source_kind(con)
        assert kind == ("postgres" if scanner and engine.dialect.name == "postgresql" else "duckdb")
        frame = fetch_frame(
            con,
            f"SELECT change_id, was_corrected, timestamp FROM {table_ref('judgments')} "
            "WHERE product = ? ORDER BY change_id",
            ["acme"],
        )
        assert list(frame["change_id"]) == ["a", "b"]
        assert list(frame["was_corrected"]) == [True, False]
        assert frame["timestamp"].iloc[0] == T0  # TIMESTAMPTZ in UTC on both backends
        none = fetch_frame(
            con, f"SELECT count(*) AS n FROM {table_ref('judgments')} WHERE product = ?", ["'; --"]
        )
        assert int(none["n"].iloc[0]) == 0  # a value is bound, never spliced into the SQL
    finally:
        con.close()


def test_a_cursor_of_a_kept_scanner_connection_sees_later_writes(engine: Engine) -> None:
    con = duck_connect(engine)
    try:
        if source_kind(con) == "duckdb":
            pytest.skip("no scanner in this process (SQLite is copied through Arrow, a snapshot)")
        count = f"SELECT count(*) AS n FROM {table_ref('judgments')}"
        assert int(fetch_frame(con.cursor(), count)["n"].iloc[0]) == 0
        _judgment(engine, "later", corrected=False)
        assert int(fetch_frame(con.cursor(), count)["n"].iloc[0]) == 1
    finally:
        con.close()


def _scanner_sessions_in_a_worker(url: str) -> tuple[list[int], list[str], list[str]]:
    """In an isolated worker: two `scanner_session`s in a row on the kept DuckDB database; the
    judgments each counted, the databases attached after them, and the worker's open files."""
    engine = create_db_engine(url)
    try:
        function = RAW_QUERY_FUNCTIONS[engine.dialect.name]
        counts = []
        for _ in range(2):
            with scanner_session(scan_source(engine), {"threads": 1}) as con:
                row = con.execute(f"SELECT count(*) FROM {function}('app_raw', 'SELECT id FROM judgments')")
                counts.append(int(row.fetchone()[0]))
        kept = lib.isolated._kept_scanner
        assert kept is not None
        attached = [
            str(r[0]) for r in kept.execute("SELECT database_name FROM duckdb_databases()").fetchall()
        ]
        files = []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone already
                files.append(os.readlink(f"/proc/self/fd/{fd}"))
        return counts, attached, files
    finally:
        engine.dispose()


def test_a_worker_keeps_its_scanner_database_but_no_attachment_outlives_an_export(engine: Engine) -> None:
    # The extension is loaded once per worker (its signature check costs ~0.15 CPU s); the app
    # database is attached per use and detached after, so the worker holds no handle of the file.
    _judgment(engine, "kept", corrected=False)
    counts, attached, files = run_isolated(_scanner_sessions_in_a_worker, isolated_url(engine))
    assert counts == [1, 1]
    assert "app_raw" not in attached
    if engine.dialect.name == "sqlite":
        assert not [f for f in files if f.startswith(str(engine.url.database))]


@pytest.fixture
def worker_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Engine]:
    """This process as an isolated worker with no kept DuckDB database yet, over a SQLite file
    that no connection of this process holds (so the sqlite scanner may open it)."""
    monkeypatch.setattr(lib.isolated, "_sqlite_scanner_allowed", True)
    monkeypatch.setattr(lib.isolated, "_kept_scanner", None)
    monkeypatch.setattr(lib.isolated, "_kept_extensions", set())
    path = tmp_path / "worker.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (n INTEGER)")
        db.execute("INSERT INTO t VALUES (1)")
        db.commit()
    engine = sa.create_engine(f"sqlite:///{path}")
    yield engine
    if lib.isolated._kept_scanner is not None:
        lib.isolated._kept_scanner.close()
    engine.dispose()


def _rows_of_t(con: Any) -> int:
    return int(con.execute("SELECT count(*) FROM sqlite_query('app_raw', 'SELECT n FROM t')").fetchone()[0])


def test_a_kept_scanner_database_that_failed_is_replaced_by_the_next_use(worker_engine: Engine) -> None:
    with scanner_session(scan_source(worker_engine)) as con:
        assert _rows_of_t(con) == 1
    broken = lib.isolated._kept_scanner
    assert broken is not None
    broken.close()  # what an invalidating error leaves behind: every statement on it fails
    with scanner_session(scan_source(worker_engine)) as con:
        assert _rows_of_t(con) == 1
    assert lib.isolated._kept_scanner is not None and lib.isolated._kept_scanner is not broken


def test_a_failed_reset_after_a_use_keeps_the_use_s_own_error(
    worker_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    # The export's error is what the user must see, not the cleanup's that it caused.
    with (
        pytest.raises(RuntimeError, match="the export's own error"),
        scanner_session(scan_source(worker_engine), {"threads": 1}),
    ):
        broken = lib.isolated._kept_scanner
        assert broken is not None
        broken.close()  # the detach and RESET after this use fail
        raise RuntimeError("the export's own error")
    assert "could not reset" in caplog.text
    with scanner_session(scan_source(worker_engine)) as con:  # and the next use gets a fresh database
        assert _rows_of_t(con) == 1
    assert lib.isolated._kept_scanner is not broken


def test_a_dead_worker_drops_its_own_pool_not_a_newer_one() -> None:
    """A call of a pool that broke, answered after another thread already made a new pool: the new,
    healthy pool is kept (it was dropped, and its workers left to the garbage collector)."""
    pool = WorkerPool(LeanExecutor, init_lean_worker)
    old, new = ProcessPoolExecutor(max_workers=1), ProcessPoolExecutor(max_workers=1)  # no process yet
    late: Future[int] = Future()
    pool._executors[late] = old
    late.set_exception(BrokenProcessPool("a worker died"))
    pool._pool = new
    try:
        with pytest.raises(RuntimeError, match="worker process died"):
            pool.result(late)
        assert pool._pool is new
        current: Future[int] = Future()
        pool._executors[current] = new
        current.set_exception(BrokenProcessPool("a worker died"))
        with pytest.raises(RuntimeError, match="worker process died"):
            pool.result(current)
        assert pool._pool is None  # the broken pool itself: the next call starts anew
    finally:
        old.shutdown()
        new.shutdown()


def test_a_lean_worker_that_dies_fails_its_call_and_the_next_call_gets_a_new_one() -> None:
    """A lean worker (`LeanExecutor`) killed in a call: the call fails as a dead worker's, and the
    pool starts a new worker for the next; a call's own error comes back as itself, with the
    worker's traceback as its cause; the worker is the app's own child."""
    pool = WorkerPool(LeanExecutor, init_lean_worker)
    try:
        first = pool.run(os.getpid)
        assert pool.run(os.getppid) == os.getpid()
        with pytest.raises(ValueError, match="invalid literal") as raised:
            pool.run(int, "not a number")
        assert "ValueError" in str(raised.value.__cause__)  # the worker's traceback
        assert pool.run(os.getpid) == first  # an error is not a death: the same worker
        assert {pool.run(os.getpid) for _ in range(20)} == {first}  # one call after another: one worker
        with pytest.raises(RuntimeError, match="worker process died"):
            pool.run(os._exit, 3)
        assert pool.run(os.getpid) != first
    finally:
        pool.stop()


def _lean_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "overrule-lean-worker"}


def test_a_lean_worker_death_stops_and_reaps_the_idle_one_too(tmp_path: Path) -> None:
    """One of two lean workers dies in a call while the other is idle: the executor breaks and kills
    the idle one, whose thread must then reap it and leave. It waited for a call for ever, and its
    killed worker stayed a zombie with its two pipes (review3 L1)."""
    pool = WorkerPool(LeanExecutor, init_lean_worker)
    before = _lean_threads()
    try:
        gate = tmp_path / "go"
        both = [pool.submit(lean_calls.wait_for, str(gate)) for _ in range(2)]  # two threads, two workers
        for future in both:
            _running(future)
        gate.touch()
        for future in both:
            pool.result(future)
        executor = pool._pool
        assert isinstance(executor, LeanExecutor)
        processes = list(executor._processes.values())
        threads = _lean_threads() - before
        assert len(processes) == 2 and len(threads) == 2
        with pytest.raises(RuntimeError, match="worker process died"):
            pool.run(os._exit, 3)  # one worker dies in its call; the other is idle
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)
        assert all(process.returncode is not None for process in processes)  # reaped: no zombie
        assert executor._processes == {}
    finally:
        pool.stop()


@pytest.mark.parametrize(
    ("call", "unpickling_error"),
    [(lean_calls.fail_not_rebuilt, TypeError), (lean_calls.not_rebuilt_result, ValueError)],
)
def test_an_answer_the_app_cannot_unpickle_fails_its_call_and_the_worker_goes_on(
    call: Callable[[], Any], unpickling_error: type[Exception]
) -> None:
    """A call whose error (or result) pickles in the worker but does not unpickle in the app fails
    with an error that says so; its future was left running for ever, its thread gone and its slot
    lost, so that two such calls left every later call queued for good (review3 L2)."""
    pool = WorkerPool(LeanExecutor, init_lean_worker)
    try:
        first = pool.run(os.getpid)
        future = pool.submit(call)
        with pytest.raises(RuntimeError, match="could not be unpickled in the app") as raised:
            pool.result(future, timeout=60)  # before: TimeoutError, the future still running
        assert isinstance(raised.value.__cause__, unpickling_error)
        assert pool.run(os.getpid) == first  # the worker read the answer whole: it takes the next call
        for _ in range(3):  # more than ISOLATED_WORKERS such calls: no slot is lost
            with pytest.raises(RuntimeError, match="could not be unpickled"):
                pool.result(pool.submit(call), timeout=60)
        assert pool.result(pool.submit(os.getpid), timeout=60) == first
    finally:
        pool.stop()


def _running(future: Future[Any]) -> None:
    deadline = time.monotonic() + 60
    while not future.running():
        assert time.monotonic() < deadline, "the call never started"
        time.sleep(0.01)


def test_a_queued_lean_call_can_be_cancelled(tmp_path: Path) -> None:
    """A call still queued behind a busy worker is cancelled (lib.export's `finally` cancels the one
    it no longer needs) and never runs; the worker then takes the next call. The busy call runs until
    the test says (a 0.5 s sleep could end before the cancel on a loaded machine)."""
    gate = tmp_path / "go"
    executor = LeanExecutor(1, init_lean_worker, (os.getpid(),))
    try:
        busy = executor.submit(lean_calls.wait_for, str(gate))
        _running(busy)
        queued = executor.submit(os.getpid)
        assert queued.cancel()
        gate.touch()
        assert busy.result(timeout=60) is None
        assert queued.cancelled()
        later = executor.submit(os.getpid)
        assert later.result(timeout=60) in executor._processes
    finally:
        executor.shutdown(cancel_futures=True)


def test_a_lean_shutdown_cancels_the_queued_calls_lets_the_running_one_end_and_reaps_the_worker(
    tmp_path: Path,
) -> None:
    """`shutdown(cancel_futures=True)` (what `WorkerPool.stop` calls): the queued calls are cancelled,
    the running one ends with its result, then the thread leaves and reaps its worker; no new call
    is taken. The busy call runs until the test says, after the shutdown."""
    gate = tmp_path / "go"
    before = _lean_threads()
    executor = LeanExecutor(1, init_lean_worker, (os.getpid(),))
    try:
        worker = executor.submit(os.getpid).result(timeout=60)
        busy = executor.submit(lean_calls.wait_for, str(gate))
        _running(busy)
        queued = [executor.submit(os.getpid) for _ in range(2)]
        processes = list(executor._processes.values())
        (thread,) = _lean_threads() - before
    finally:  # a failure above must not leave the worker for the rest of the session
        executor.shutdown(cancel_futures=True)
        gate.touch()
    assert all(future.cancelled() for future in queued)
    assert busy.result(timeout=60) is None
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert [process.pid for process in processes] == [worker]
    assert processes[0].returncode is not None  # reaped
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(os.getpid)


def test_the_lean_workers_start_no_resource_tracker(tmp_path: Path) -> None:
    """An app that exports only through lean workers has them as its one kind of child: no
    multiprocessing resource tracker beside them (~7 MiB of the export's summed PSS, issue 27)."""
    script = """
import os
from lib.wide_scan import EXPORT_WORKERS, start_export_workers
start_export_workers()
worker = EXPORT_WORKERS.run(os.getpid)
children = [int(p) for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/stat")
            and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1] == str(os.getpid())]
print(sorted(children) == [worker], flush=True)
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True\n"


def test_a_spawned_worker_knows_its_app_is_gone_by_its_parent() -> None:
    """A lean worker is the app's own child: when its parent is not the app any more, the app is gone,
    even if the app's pid is alive (reused, or a zombie), which the pid probe cannot tell."""
    alive_but_not_parent = os.getpid()
    assert lib.isolated._app_gone(alive_but_not_parent, child_of_app=True)
    assert not lib.isolated._app_gone(os.getppid(), child_of_app=True)
    assert not lib.isolated._app_gone(alive_but_not_parent, child_of_app=False)  # the probe's blind spot


def test_a_forked_copy_of_a_pool_never_stops_the_parent_s_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """At exit every pool kills its workers; a process forked from the app holds a copy of the
    app's pools, whose workers are the app's, not its own: it leaves them alone."""
    pool = WorkerPool(LeanExecutor, init_lean_worker)
    stopped: list[bool] = []

    class Executor:
        _processes = None

        def shutdown(self, wait: bool, cancel_futures: bool) -> None:
            stopped.append(wait)

    pool._pool, pool._made_in = Executor(), os.getpid() + 1  # type: ignore[assignment]
    pool.stop()
    assert stopped == [] and pool._pool is None
    pool._pool, pool._made_in = Executor(), os.getpid()  # type: ignore[assignment]
    pool.stop()
    assert stopped == [False]


def test_a_lean_worker_whose_start_fails_in_any_way_is_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not only an OSError (the worker died at once): any error sending it its start leaves no
    process and no open pipe behind (before, a MemoryError there left both to the garbage collector)."""
    from lib import lean_worker

    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def send(*_args: object) -> None:
        raise MemoryError("no memory for the start")

    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(lean_worker, "_send", send)
    with pytest.raises(MemoryError):
        lean_worker._Worker(b"")
    (process,) = started
    assert process.returncode is not None  # reaped
