"""A pytest plugin that records what each PostgreSQL test variant sends to PostgreSQL and runs in lib.

Loaded by `scripts/pg_cover.py` (`-p tests.pg_cover`, with OVERRULE_PG_COVER=DIR), never by the
suite. Per test it writes one JSON line to DIR/<worker>.jsonl:

- `sql`: the normalized shapes of the statements product code (lib/, pages/, the app) sent to a
  PostgreSQL engine in this process (a `before_cursor_execute` listener on every Engine):
  literals, placeholders, IN-list lengths, multi-row VALUES batches, SAVEPOINT names and psycopg
  casts folded, so twenty parameter cases of one query are one shape; `test_sql`: those the test's
  own code sent (its setup rows, its raw checks), which prove nothing about the product;
- `duck`: the normalized DuckDB statements run on a connection attached to PostgreSQL (the scanner
  turns them into its own COPY statements, which the listener cannot see);
- `lines`: the lib/ lines executed (coverage.py, one dynamic context per test);
- `fixtures`, `child`: the test's fixtures and whether the test itself started a process; plus, once
  per worker, which fixtures started one (an app server, a CLI run). What a child process sends is
  not recorded, so the report treats such tests as ones to keep.
- `pg_repeats`: the reason of the test's `pg_repeats` mark, if it has one.

OVERRULE_PG_COVER_BACKENDS=sqlite records the SQLite variants the same way (their `lines` tell
which lines a PostgreSQL variant runs only because it is on PostgreSQL).

With OVERRULE_PG_COVER set, conftest also keeps the variants `pg_repeats` marks (see conftest),
so a check sees the dropped variants beside the kept ones. Only PostgreSQL variants run.
"""

from __future__ import annotations

import json
import multiprocessing.process
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import coverage
import pytest
from sqlalchemy import Engine, event

ROOT = Path(__file__).resolve().parent.parent
LIB = ROOT / "lib"
PRODUCT = tuple(str(ROOT / part) for part in ("lib" + os.sep, "pages" + os.sep, "app.py", "serve.py"))

_log: IO[str] | None = None
_cov: coverage.Coverage | None = None
_current: dict[str, Any] | None = None
_lock = threading.Lock()
_records: dict[str, dict[str, Any]] = {}
_child_fixtures: set[str] = set()
_fixture_stack: list[str] = []

_SUBSTITUTIONS = [
    (re.compile(r"'(?:[^']|'')*'"), "?"),  # string literals
    (re.compile(r"%\(\w+\)s|%s|\$\d+|\?"), "?"),  # placeholders
    (re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])"), "?"),  # number literals
    (
        re.compile(
            r"\?::(?:(?:TIMESTAMP|TIME) WITH(?:OUT)? TIME ZONE|DOUBLE PRECISION|CHARACTER VARYING|\w+)(?:\[\])?"
        ),
        "?",
    ),
    (re.compile(r"\bsa_savepoint_\w+"), "sa_savepoint"),
    (re.compile(r"\s+"), " "),
    (re.compile(r"\(\?(?:, \?)*\)"), "(?)"),  # a row of parameters, an IN list
    (re.compile(r"\(\?\)(?:, \(\?\))+"), "(?)"),  # multi-row VALUES batches
    (re.compile(r"\bp\d+\b"), "p"),  # insertmanyvalues column names (p0, p1, ...)
]


def normalize(statement: str) -> str:
    """One shape for every statement that differs only in its values (see the module docstring)."""
    shape = statement.strip()
    for pattern, replacement in _SUBSTITUTIONS:
        shape = pattern.sub(replacement, shape)
    return shape


def _record(kind: str, statement: str) -> None:
    current = _current
    if current is not None:
        with _lock:
            current[kind].add(normalize(statement))


def _from_the_product() -> bool:
    """Whether the statement being sent comes from product code (lib, pages, the app), not from a
    test's own setup or check (a raw UPDATE that corrupts a counter proves nothing about lib)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(PRODUCT):
            return True
        frame = frame.f_back
    return False


def _before_cursor_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
    if conn.dialect.name == "postgresql":
        _record("sql" if _from_the_product() else "test_sql", statement)


class _RecordingDuck:
    """A DuckDB connection attached to PostgreSQL that notes each statement run on it."""

    def __init__(self, con: Any) -> None:
        self._con = con

    def execute(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
        _record("duck", str(sql))
        return self._con.execute(sql, *args, **kwargs)

    def sql(self, sql: Any, *args: Any, **kwargs: Any) -> Any:
        _record("duck", str(sql))
        return self._con.sql(sql, *args, **kwargs)

    query = sql

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    def __enter__(self) -> _RecordingDuck:
        return self

    def __exit__(self, *exc: object) -> None:
        self._con.close()


def _note_child() -> None:
    if _fixture_stack:
        _child_fixtures.add(_fixture_stack[-1])
    elif _current is not None:
        _current["child"] = True


def _patch_process_starts() -> None:
    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        _note_child()
        popen_init(self, *args, **kwargs)

    def start(self: Any) -> None:
        _note_child()
        process_start(self)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]


def _patch_duck() -> None:
    import lib.duck

    connect = lib.duck.duck_connect

    def recording_connect(engine: Engine, *args: Any, **kwargs: Any) -> Any:
        con = connect(engine, *args, **kwargs)
        return _RecordingDuck(con) if engine.dialect.name == "postgresql" else con

    lib.duck.duck_connect = recording_connect  # type: ignore[assignment]


def pytest_configure(config: pytest.Config) -> None:
    global _log, _cov
    directory = os.environ.get("OVERRULE_PG_COVER")
    controller = not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))
    if not directory or controller:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _log = (Path(directory) / f"{worker}.jsonl").open("w", encoding="utf-8")
    _cov = coverage.Coverage(data_file=None, source=[str(LIB)], branch=False, config_file=False)
    _cov.start()
    event.listen(Engine, "before_cursor_execute", _before_cursor_execute)
    _patch_process_starts()
    _patch_duck()


def _backend(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    values = {v for v in callspec.params.values() if isinstance(v, str)} if callspec is not None else set()
    return next((b for b in ("postgresql", "sqlite") if b in values), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the variants of OVERRULE_PG_COVER_BACKENDS: `postgresql` (default), `sqlite`, and
    `sqlite:marked` (the SQLite variants of `pg_repeats` tests only, all a check needs)."""
    if not os.environ.get("OVERRULE_PG_COVER"):
        return
    wanted = os.environ.get("OVERRULE_PG_COVER_BACKENDS", "postgresql").split(",")

    def runs(item: pytest.Item) -> bool:
        backend = _backend(item)
        marked = item.get_closest_marker("pg_repeats") is not None
        return backend in wanted or (backend == "sqlite" and "sqlite:marked" in wanted and marked)

    others = [item for item in items if not runs(item)]
    if others:
        config.hook.pytest_deselected(items=others)
        items[:] = [item for item in items if runs(item)]


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
) -> Iterator[None]:
    if _log is None or fixturedef.scope == "function":
        yield
        return
    _fixture_stack.append(fixturedef.argname)
    try:
        yield
    finally:
        _fixture_stack.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _current
    if _log is None or _cov is None:
        yield
        return
    mark = item.get_closest_marker("pg_repeats")
    record: dict[str, Any] = {"sql": set(), "test_sql": set(), "duck": set(), "child": False}
    _current = record
    _cov.switch_context(item.nodeid)
    try:
        yield
    finally:
        _cov.switch_context("")
        _current = None
        _records[item.nodeid] = {
            "id": item.nodeid,
            "backend": _backend(item),
            "sql": sorted(record["sql"]),
            "test_sql": sorted(record["test_sql"]),
            "duck": sorted(record["duck"]),
            "child": record["child"],
            "fixtures": sorted(getattr(item, "fixturenames", [])),
            "pg_repeats": (mark.args[0] if mark.args else "") if mark else None,
        }


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _log is None or _cov is None:
        return
    _cov.stop()
    data = _cov.get_data()
    lines: dict[str, set[str]] = {}
    for path in data.measured_files():
        short = Path(path).relative_to(ROOT).as_posix()
        for lineno, contexts in data.contexts_by_lineno(path).items():
            for context in contexts:
                if context in _records:
                    lines.setdefault(context, set()).add(f"{short}:{lineno}")
    for nodeid, record in _records.items():
        record["lines"] = sorted(lines.get(nodeid, ()))
        _log.write(json.dumps(record) + "\n")
    _log.write(json.dumps({"child_fixtures": sorted(_child_fixtures)}) + "\n")
    _log.close()
