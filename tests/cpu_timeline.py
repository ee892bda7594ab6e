"""A pytest plugin that records each test's CPU seconds and when it ran, per xdist worker.

Wall time is no fair measure on a machine that other jobs share: a test that takes 8 s alone takes
80 s at load 20. CPU seconds barely move with the load, so they say what a test costs the suite, and
the start/end times show whether a worker sat idle. Load it with `-p tests.cpu_timeline` and name a
directory in OVERRULE_CPU_LOG; `scripts/suite_cpu.py DIR` prints the summary (docs/development.md).

Per test it writes the worker, the test id, its start and end (epoch seconds, setup to teardown),
`self` (the worker's own user+system CPU) and `child` (CPU of the child processes it started and
waited for: Streamlit servers, CLI runs). Not counted: the PostgreSQL server, and a Chromium whose
browser outlives the test (its CPU lands on the worker's last test when the browser closes).
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


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is not None:
        _started[nodeid] = (time.time(), *_cpu())


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    if _log is None or nodeid not in _started:
        return
    start, own, children = _started.pop(nodeid)
    own_now, children_now = _cpu()
    record = {"worker": _worker(), "id": nodeid, "start": start, "end": time.time()}
    record |= {"self": round(own_now - own, 3), "child": round(children_now - children, 3)}
    _log.write(json.dumps(record) + "\n")
