"""tests/cpu_timeline.py charges a session fixture's teardown to a record of its own, not to the
worker's last test (which once carried the browser tier's 65 Chromium CPU s as if it were its own)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

BURN = 0.2  # CPU seconds the session fixture's child spends while the fixture is torn down

TESTS = f"""
import subprocess, sys
import pytest

@pytest.fixture(scope="session")
def server():
    yield
    burn = "import time\\nstart = time.process_time()\\nwhile time.process_time() - start < {BURN}: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)  # reaped here, as Chromium is

def test_first(server):
    pass

def test_last(server):
    pass
"""


def test_a_session_fixtures_teardown_is_not_charged_to_the_last_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A copy of the plugin of its own: the outer run may have loaded tests.cpu_timeline, whose log
    # must stay untouched.
    spec = importlib.util.spec_from_file_location(
        "cpu_timeline_copy", Path(__file__).with_name("cpu_timeline.py")
    )
    assert spec and spec.loader
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    log = pytester.path / "cpu"
    monkeypatch.setenv("OVERRULE_CPU_LOG", str(log))
    pytester.makepyfile(test_served=TESTS)
    pytester.runpytest("-p", "no:xdist", "-p", "no:cacheprovider", plugins=[plugin]).assert_outcomes(passed=2)
    records = {r["id"]: r for path in log.glob("*.jsonl") for r in map(json.loads, path.open())}
    fixture = records["test_served.py::server (session teardown)"]
    assert fixture["fixture"] is True and fixture["child"] >= BURN
    assert records["test_served.py::test_last"]["child"] < BURN / 2
