"""Browser fixtures: a real `streamlit run app.py` server and Debian's headless Chromium via Playwright.

Playwright's own browser download fails offline, so Chromium comes from Debian (`/usr/bin/chromium`).

Every test reads the page only once the app has finished its runs: `settle(page)` after each action
(a click, a key, a navigation) and before any read or assertion. While Streamlit reruns a script it
keeps the previous run's elements on the page, so a read mid-run can see a text twice or an old value;
`fresh(locator)` drops those elements from a locator for the rare wait that must happen mid-run.
Pages come from `new_app_context` (the `page` fixture uses it), which installs the run tracker
`settle` relies on.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("OVERRULE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


# Long enough for a page run on a 2-core machine kept busy by other work; a hung page still fails.
SETTLE_MS = 90_000
expect.set_options(timeout=SETTLE_MS)
RUN_TRACKER = (Path(__file__).with_name("streamlit_runs.js")).read_text(encoding="utf-8")
# How often `settle` asks the page (ms). Not on every animation frame (Playwright's default): that
# kept Chromium drawing 60 frames a second for as long as a page waited on the server, about four
# times the renderer CPU of a 50 ms timer while idle. The tracker still counts an animation frame
# between the two polls that find the page settled.
SETTLE_POLL_MS = 50
# Matches every element that is neither marked stale by Streamlit nor inside one that is.
NOT_STALE = ':not([data-stale="true"], [data-stale="true"] *)'


# pytest-timeout's bound for one browser test (pytest.ini's 300 s is for the rest): a test that drives
# a page through a dozen runs takes minutes on a loaded 2-core machine. It catches a hang; it is no
# measure of speed.
BROWSER_TEST_TIMEOUT = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("browser") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(BROWSER_TEST_TIMEOUT))


def new_app_context(browser: Any, **options: Any) -> Any:
    """A browser context (Playwright `new_context` options) whose pages can be `settle`d: the run
    tracker (streamlit_runs.js) is installed in each page before Streamlit's own scripts.

    It prefers reduced motion unless told otherwise: Streamlit then draws its loading skeletons,
    tab underlines and entering elements without animations, which otherwise keep the renderer
    drawing frames while a page loads (about a fifth of Chromium's CPU for a page); what a page
    shows at rest is the same."""
    options.setdefault("reduced_motion", "reduce")
    context = browser.new_context(**options)
    context.add_init_script(script=RUN_TRACKER)
    # Every wait (an action's, wait_for's, expect's) as long as `settle`'s: a bound on a hang, not a
    # measure of speed, on a machine that other jobs may keep busy.
    context.set_default_timeout(SETTLE_MS)
    return context


def settle(page: Any, timeout: float = SETTLE_MS) -> None:
    """Wait until the app in `page` has finished its runs and shows only their elements.

    Settled means: connected; what every input event (a click, a key) made Streamlit send has been
    sent (it sends from a timer, after the event); every run the page asked for has started and its
    chain (st.rerun() included) has finished, fragment runs too; the app has drawn the last messages; the script state
    is "notRunning"; no element is marked stale (`data-stale="true"`), no running indicator, no
    element still loading; and all of that at two polls in a row (every SETTLE_POLL_MS) with an
    animation frame drawn in between and no message received. Call it after every action and
    before reading; a timeout says what was still pending.
    """
    try:
        # Evaluated again in each new document while the page navigates (a redirect, a reload).
        done = page.wait_for_function(
            "() => window.__overruleRuns?.settled() ?? 'no tracker'", timeout=timeout, polling=SETTLE_POLL_MS
        )
    except PlaywrightTimeoutError as exc:
        pending = page.evaluate("() => window.__overruleRuns?.pending()")
        raise AssertionError(f"the app did not settle within {timeout / 1000:.0f} s: {pending}") from exc
    if done.json_value() == "no tracker":
        raise AssertionError(
            "this page has no run tracker: open it from new_app_context (or the page fixture)"
        )


def fresh(locator: Any) -> Any:
    """`locator` without the elements of an earlier run that Streamlit still shows (marked stale):
    for a wait that has to watch a page while it reruns. After `settle` there are none."""
    return locator.and_(locator.page.locator(NOT_STALE))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StreamlitServer:
    """A running `streamlit run app.py` on localhost."""

    def __init__(
        self,
        env: dict[str, str],
        log_path: Path,
        *,
        address: str | None = "127.0.0.1",
        args: Sequence[str] = (),
    ) -> None:
        """`address=None` leaves the listening address to the launcher's default."""
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "lib.ui.server",
                "--server.port",
                str(self.port),
                *(["--server.address", address] if address else []),
                "--server.headless",
                "true",
                "--browser.gatherUsageStats",
                "false",
                "--server.fileWatcherType",
                "none",
                *args,
            ],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = log_path
        try:
            self._wait_ready()
        except BaseException:
            self.stop()  # a server that never answered must not outlive its test (and load the machine)
            raise

    def _wait_ready(self, timeout: float = 240) -> None:
        """Until the health check answers or the process ends; the bound only catches a hung start
        (a 2-core machine shared with other jobs has taken over a minute to import the app)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/_stcore/health", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"streamlit did not become healthy:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def _app_starter(folder: Path) -> Iterator[Callable[..., StreamlitServer]]:
    """Start the app against a given database URL (and extra env); every server stopped at the end."""
    servers: list[StreamlitServer] = []

    def _start(database_url: str, *, args: Sequence[str] = (), **extra_env: str) -> StreamlitServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_"))}
        env.update({"OVERRULE_DATABASE_URL": database_url, "OVERRULE_LOAD_DEMO": "false", **extra_env})
        server = StreamlitServer(env, folder / f"streamlit-{len(servers)}.log", args=args)
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.stop()


@pytest.fixture
def streamlit_app(tmp_path: Path) -> Iterator[Callable[..., StreamlitServer]]:
    """Start the app against a given database URL (and extra env); stopped after the test."""
    yield from _app_starter(tmp_path)


@pytest.fixture(scope="module")
def module_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., StreamlitServer]]:
    """`streamlit_app` for a whole module: each server start costs ~3 CPU s of imports plus its first
    page, so the tests of a module that only read one database share one server (each with its own
    browser context). A test that writes gets its own database, or runs last and says why."""
    yield from _app_starter(tmp_path_factory.mktemp("app"))


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        if os.environ.get("CI"):
            pytest.fail(f"CI=true but Chromium is missing at {CHROMIUM}")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, tmp_path: Path) -> Iterator[object]:
    """A fresh page that records dialogs (alert/confirm) so tests can assert no script ran."""
    context = new_app_context(browser, accept_downloads=True, viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.dialogs = []  # type: ignore[attr-defined]
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    yield pg
    context.close()
