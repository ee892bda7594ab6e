"""A pytest plugin that records each test's CPU seconds and when it ran, per xdist worker.

Wall time is no fair measure on a machine that other jobs share: a test that takes 8 s alone takes
80 s at load 20. CPU seconds barely move with the load, so they say what a test costs the suite, and
the start/end times show whether a worker sat idle. Load it with `-p tests.cpu_timeline` and name a
directory in OVERRULE_CPU_LOG; `scripts/suite_cpu.py DIR` prints the summary (docs/development.md).

Per test it writes the worker, the test id, its start and end (epoch seconds, setup to teardown),
`self` (the worker's own user+system CPU), `child` (CPU of the child processes it started and
waited for: Streamlit servers, CLI runs) and `browser` (CPU of the worker's Playwright driver and
the Chromium processes under it, sampled from /proc while it runs: that browser lives for the
whole session, so it is never a child a test waited for, and without the sampling only what the
worker reaps when it closes was seen, about a quarter of Chromium's CPU). Not counted: the
PostgreSQL server.

A session-scoped fixture is torn down in the teardown of its worker's last test, whatever that test
is: the CPU of what it reaps then (the session's Chromium and Playwright driver: 65 CPU s of a whole
run, all of it once charged to the last test of test_webhooks.py) goes to a record of its own, id
`<where it is defined>::<name> (session teardown)` with `"fixture": true`, not to that test. What
it reaps of the sampled browser, already counted as the tests' `browser`, is its `reaped_browser`,
not its `child`.
Module-scoped fixtures stay with their module's last test: the CPU is still their file's.
"""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path
from typing import IO

import pytest

_log: IO[str] | None = None
_started: dict[str, tuple[float, float, float, float]] = {}
# During a test's teardown: the CPU when the last fixture finished tearing down (so the next one's
# teardown is the difference), and what session fixtures' teardowns took (moved off the test).
_teardown_mark: tuple[float, float, float, int] | None = None
_session_teardowns: list[tuple[str, float, float, float, float]] = []  # (id, own, children, browser, reaped)


_TICKS = os.sysconf("SC_CLK_TCK")


class _BrowserTree:
    """CPU seconds of the processes under this worker's Playwright driver (a `node` child of the
    worker, and the Chromium it starts), including those that have ended, each at its last sample.

    Chromium starts and ends a renderer with each context and tab, between samples: a thread
    samples every SAMPLE_S while the driver lives, and each test's start and end are sampled too,
    so a process that ends loses at most SAMPLE_S of its CPU. Until a driver starts, a sample
    costs a listing of /proc (0.2 ms); once it has ended, nothing."""

    SAMPLE_S = 0.5

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parents: dict[int, tuple[int, str]] = {}  # pid: (ppid, name)
        self._seen: dict[tuple[int, str], float] = {}  # (pid, start time): CPU s at the last sample
        self._driver: int | None = None
        self.ended = 0  # drivers that have ended (the browser closed)

    @staticmethod
    def _stat(pid: int) -> list[str] | None:
        """/proc/PID/stat's fields from the third on (state, ppid, ...), the name first."""
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                text = f.read()
        except OSError:
            return None
        return [text[text.index("(") + 1 : text.rindex(")")], *text[text.rindex(")") + 2 :].split()]

    def _tree(self) -> set[int]:
        pids = {int(d) for d in os.listdir("/proc") if d.isdigit()}
        for gone in self._parents.keys() - pids:
            del self._parents[gone]
        for pid in pids - self._parents.keys():
            fields = self._stat(pid)
            if fields:
                self._parents[pid] = (int(fields[2]), fields[0])
        if self._driver is not None and self._driver not in self._parents:
            self._driver, self.ended = None, self.ended + 1
        if self._driver is None:
            me = os.getpid()
            drivers = [p for p, (pp, name) in self._parents.items() if pp == me and name.startswith("node")]
            if self.ended or not drivers:  # one browser per session: after it, no more scanning
                return set()
            self._driver = drivers[0]
            threading.Thread(target=self._sample, args=(self.ended,), daemon=True, name="browser-cpu").start()
        inside, outside = {self._driver}, set()
        for pid in self._parents:
            chain, up = [], pid
            while up not in inside and up not in outside and up in self._parents and len(chain) < 100:
                chain.append(up)
                up = self._parents[up][0]
            (inside if up in inside else outside).update(chain)
        return inside

    def cpu(self) -> float:
        with self._lock:
            if not self.ended:
                for pid in self._tree():
                    fields = self._stat(pid)
                    if fields:
                        self._seen[(pid, fields[20])] = (int(fields[12]) + int(fields[13])) / _TICKS
            return sum(self._seen.values())

    def _sample(self, ended: int) -> None:
        while self.ended == ended:
            time.sleep(self.SAMPLE_S)
            self.cpu()


_browser = _BrowserTree()


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
    _teardown_mark = (*_cpu(), _browser.cpu(), _browser.ended) if _log is not None else None
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
    now = (*_cpu(), _browser.cpu(), _browser.ended)
    own, children = now[0] - _teardown_mark[0], now[1] - _teardown_mark[1]
    browser = now[2] - _teardown_mark[2]
    # The sampled browser ended in this teardown: what the worker reaped of it is counted already.
    reaped = children if now[3] > _teardown_mark[3] else 0.0
    _teardown_mark = now
    if fixturedef.scope == "session" and own + children + browser >= 0.01:
        where = fixturedef.baseid
        where = where if where.endswith(".py") else f"{where}/conftest.py" if where else "<plugin>"
        name = f"{where}::{fixturedef.argname} (session teardown)"
        _session_teardowns.append((name, own, children, browser, reaped))


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest) -> object:
    """A session fixture may have started the browser: sample from now on, not from the test's end
    (a renderer that ends before the first sample would be missed)."""
    try:
        return (yield)
    finally:
        if _log is not None and fixturedef.scope == "session":
            _browser.cpu()


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is not None:
        _started[nodeid] = (time.time(), *_cpu(), _browser.cpu())


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is None or nodeid not in _started:
        return
    start, own, children, browser = _started.pop(nodeid)
    own_now, children_now = _cpu()
    browser_now = _browser.cpu()
    end = time.time()
    for fixture_id, f_own, f_children, f_browser, f_reaped in _session_teardowns:  # a worker's last test
        own, children, browser = own + f_own, children + f_children, browser + f_browser  # moved off it
        fixture = {"worker": _worker(), "id": fixture_id, "start": end, "end": end, "fixture": True}
        fixture |= {"self": round(f_own, 3), "child": round(f_children - f_reaped, 3)}
        fixture |= {"browser": round(f_browser, 3), "reaped_browser": round(f_reaped, 3)}
        _log.write(json.dumps(fixture) + "\n")
    _session_teardowns.clear()
    record = {"worker": _worker(), "id": nodeid, "start": start, "end": end}
    record |= {"self": round(own_now - own, 3), "child": round(children_now - children, 3)}
    record["browser"] = round(browser_now - browser, 3)
    _log.write(json.dumps(record) + "\n")
