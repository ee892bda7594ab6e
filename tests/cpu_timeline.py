"""A pytest plugin that records each test's CPU seconds and when it ran, per xdist worker.

Wall time is no fair measure on a machine that other jobs share: a test that takes 8 s alone takes
80 s at load 20. CPU seconds barely move with the load, so they say what a test costs the suite, and
the start/end times show whether a worker sat idle. Load it with `-p tests.cpu_timeline` and name a
directory in OVERRULE_CPU_LOG; `scripts/suite_cpu.py DIR` prints the summary (docs/development.md).

Per test it writes the worker, the test id, its start and end (epoch seconds, setup to teardown),
`self` (the worker's own user+system CPU) and `child` (CPU of the child processes it started and
waited for: Streamlit servers, CLI runs). Not counted: the PostgreSQL server.

A session-scoped fixture is torn down in the teardown of its worker's last test, whatever that test
is: the CPU of what it reaps then (the session's Chromium and Playwright driver: 65 CPU s of a whole
run, all of it once charged to the last test of test_webhooks.py) goes to a record of its own, id
`<where it is defined>::<name> (session teardown)` with `"fixture": true`, not to that test.
Module-scoped fixtures stay with their module's last test: the CPU is still their file's.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import IO

import pytest

_log: IO[str] | None = None
_started: dict[str, tuple[float, float, float]] = {}
# During a test's teardown: the CPU when the last fixture finished tearing down (so the next one's
# teardown is the difference), and what session fixtures' teardowns took (moved off the test).
_teardown_mark: tuple[float, float] | None = None
_session_teardowns: list[tuple[str, float, float]] = []  # (id, own, children)


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _worker() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def pytest_configure(config: pytest.Config) -> None:
    global _log
    directory = os.environ.get("OVERRULE_CPU_LOG")
    # The xdist controller sees every test's hooks too (from the workers' reports): only record
    # where the test runs, or alone when there are no workers.
    controller = not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))
    if not directory or controller:
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    _log = (Path(directory) / f"{_worker()}.jsonl").open("a", buffering=1, encoding="utf-8")


def pytest_unconfigure(config: pytest.Config) -> None:
    global _log
    if _log is not None:
        _log.close()
        _log = None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    global _teardown_mark
    _teardown_mark = _cpu() if _log is not None else None
    try:
        return (yield)
    finally:
        _teardown_mark = None


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    global _teardown_mark
    if _teardown_mark is None:
        return  # not in a teardown (a parametrized fixture finished during setup), or not logging
    now = _cpu()
    own, children = now[0] - _teardown_mark[0], now[1] - _teardown_mark[1]
    _teardown_mark = now
    if fixturedef.scope == "session" and own + children >= 0.01:
        where = fixturedef.baseid
        where = where if where.endswith(".py") else f"{where}/conftest.py" if where else "<plugin>"
        _session_teardowns.append((f"{where}::{fixturedef.argname} (session teardown)", own, children))


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is not None:
        _started[nodeid] = (time.time(), *_cpu())


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is None or nodeid not in _started:
        return
    start, own, children = _started.pop(nodeid)
    own_now, children_now = _cpu()
    end = time.time()
    for fixture_id, fixture_own, fixture_children in _session_teardowns:  # on a worker's last test
        own, children = own + fixture_own, children + fixture_children  # moved off the test
        fixture = {"worker": _worker(), "id": fixture_id, "start": end, "end": end, "fixture": True}
        fixture |= {"self": round(fixture_own, 3), "child": round(fixture_children, 3)}
        _log.write(json.dumps(fixture) + "\n")
    _session_teardowns.clear()
    record = {"worker": _worker(), "id": nodeid, "start": start, "end": end}
    record |= {"self": round(own_now - own, 3), "child": round(children_now - children, 3)}
    _log.write(json.dumps(record) + "\n")
