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

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
# Debian's headless shell (package chromium-headless-shell, the same Chromium built for headless use
# only, which Playwright itself runs headless) where installed: the same page loads and clicks cost
# it about an eighth less CPU than the full browser's headless mode (27 Nov, 3 rounds: 7.4-8.0
# against 8.6-9.5 CPU s). OVERRULE_CHROMIUM names another.
HEADLESS_SHELL = "/usr/bin/chromium-headless-shell"
CHROMIUM = os.environ.get("OVERRULE_CHROMIUM") or (
    HEADLESS_SHELL if Path(HEADLESS_SHELL).exists() else "/usr/bin/chromium"
)
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
    shows at rest is the same.

    The context comes clean from the browser's pool (`_ContextPool`): its first `new_page()` is a
    tab an earlier test used, whose renderer has already compiled Streamlit's scripts; `close()`
    gives it back, emptied."""
    options.setdefault("reduced_motion", "reduce")
    return _ContextPool.of(browser).take(options)


def _tracked_context(browser: Any, options: dict[str, Any]) -> Any:
    context = browser.new_context(**options)
    context.add_init_script(script=RUN_TRACKER)
    # Every wait (an action's, wait_for's, expect's) as long as `settle`'s: a bound on a hang, not a
    # measure of speed, on a machine that other jobs may keep busy.
    context.set_default_timeout(SETTLE_MS)
    return context


# A pooled context's viewport (most tests ask for it) and Playwright's own default (1280x720), which
# a test that names none gets, as from `browser.new_context()`.
POOL_VIEWPORT = {"width": 1400, "height": 1000}
PLAYWRIGHT_VIEWPORT = {"width": 1280, "height": 720}
# Options a test may name whose value is Playwright's own default: dropped from the pool's key, so
# the `page` fixture's contexts (accept_downloads=True) and new_app_context's share warm ones.
PLAYWRIGHT_DEFAULTS: dict[str, Any] = {"accept_downloads": True}


class AppContext:
    """A pooled browser context as a test sees it: Playwright's BrowserContext (every attribute is
    the real context's) whose first `new_page()` is the pool's warm tab and whose `close()` empties
    the context and gives it back to the pool instead of closing it.

    Why: a context's first page load costs Chromium 7-10 CPU s, most of it V8 compiling Streamlit's
    scripts afresh in a new renderer process; the same load in a tab that has loaded them before,
    from the same address, costs about 3 (servers reuse their worker's ports for that, see
    `_server_port`). A test that closes the real context (`page.context.close()`) only loses the
    saving: the pool drops a context that is closed or whose warm tab is."""

    def __init__(self, pool: _ContextPool, key: str, context: Any) -> None:
        self._pool, self._key, self._context = pool, key, context
        self._viewport = POOL_VIEWPORT
        self._closed = self._lent = False
        context.on("close", lambda _: setattr(self, "_closed", True))
        self._tab = context.new_page()
        self._origins: set[str] = set()
        self._tab.on("framenavigated", self._visited)
        # The tab's own listeners (Playwright's and ours): any other is a test's, removed on return.
        self._own_listeners = {event: list(ls) for event, ls in self._listeners().items()}
        self._tab_lent = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def _listeners(self) -> dict[str, list[Any]]:
        # Playwright's EventEmitter (playwright/_impl/event_emitter.py) keeps one listener or a list.
        events = self._tab._impl_obj._events
        return {event: list(ls) if isinstance(ls, list) else [ls] for event, ls in events.items()}

    def _visited(self, frame: Any) -> None:
        if frame.url.startswith(("http://", "https://")):
            self._origins.add("/".join(frame.url.split("/", 3)[:3]))

    def new_page(self) -> Any:
        if self._tab_lent:
            page = self._context.new_page()
            page.on("framenavigated", self._visited)
        else:
            self._tab_lent, page = True, self._tab
        if page.viewport_size != self._viewport:
            page.set_viewport_size(self._viewport)
        return page

    def close(self) -> None:
        self._pool.give_back(self)

    def _reset(self) -> bool:
        """Empty the context for the next test, as a new one would be; False if it cannot be."""
        if self._closed or self._tab.is_closed():
            return False
        for page in self._context.pages:
            if page != self._tab:
                page.close()
        impl = self._tab._impl_obj
        for event, listeners in self._listeners().items():
            for listener in listeners:
                if listener not in self._own_listeners.get(event, []):
                    impl.remove_listener(event, listener)
        self._context.unroute_all(behavior="ignoreErrors")
        self._tab.unroute_all(behavior="ignoreErrors")
        # Session storage belongs to the tab: it is only reachable from a document of its origin.
        self._tab.evaluate("() => { try { sessionStorage.clear(); localStorage.clear(); } catch {} }")
        # Off the app before its server stops: a page left on it would reconnect to whichever
        # server takes the port next, and rerun its page there.
        self._tab.goto("about:blank")
        self._context.clear_cookies()
        self._context.clear_permissions()
        cdp = self._context.new_cdp_session(self._tab)
        try:
            for origin in self._origins:
                cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
            cdp.send("Page.resetNavigationHistory")
        finally:
            cdp.detach()
        self._origins.clear()
        self._tab_lent = False
        return True


class _ContextPool:
    """Per browser, the idle `AppContext`s by the options they were made with, but for the viewport
    and any option named at Playwright's own default (PLAYWRIGHT_DEFAULTS): `AppContext.new_page`
    gives each page the viewport the test asked for (a page opened through the real context,
    `page.context.new_page()`, has POOL_VIEWPORT).

    Kept between tests: the tab's renderer process (V8's compiled scripts, decoded images and
    styles) and the context's in-memory HTTP cache (Streamlit's hashed, immutable static files).
    Emptied between tests: pages other than the tab, the tab's listeners and history, routes,
    cookies (of every port), permissions, and each visited origin's storage (local and session
    storage, IndexedDB, cache storage, service workers)."""

    MAX_IDLE = 4  # per options (a test uses up to 4 contexts); each keeps a renderer on about:blank

    _pools: ClassVar[dict[int, _ContextPool]] = {}

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.idle: dict[str, list[AppContext]] = {}

    @classmethod
    def of(cls, browser: Any) -> _ContextPool:
        pool = cls._pools.get(id(browser))
        if pool is None or pool.browser is not browser:
            pool = cls._pools[id(browser)] = cls(browser)
            browser.on("disconnected", lambda _: cls._pools.pop(id(browser), None))
        return pool

    def take(self, options: dict[str, Any]) -> Any:
        options = {"viewport": PLAYWRIGHT_VIEWPORT} | options
        shared = {
            name: value
            for name, value in options.items()
            if name != "viewport" and (name not in PLAYWRIGHT_DEFAULTS or PLAYWRIGHT_DEFAULTS[name] != value)
        }
        try:
            key = json.dumps(shared, sort_keys=True)
        except TypeError:  # options that are no plain data (a callable, a path): a context of its own
            return _tracked_context(self.browser, options)
        idle = self.idle.get(key)
        if idle:
            context = idle.pop()  # the one given back last: likely the same server's scripts
        else:
            context = AppContext(
                self, key, _tracked_context(self.browser, shared | {"viewport": POOL_VIEWPORT})
            )
        context._lent, context._viewport = True, options["viewport"]
        return context

    def give_back(self, context: AppContext) -> None:
        if not context._lent:  # closed twice: it may already serve another test
            return
        context._lent = False
        try:
            clean = context._reset()
        except PlaywrightError:  # a crashed tab, a context closed under it: never lend it again
            clean = False
        idle = self.idle.setdefault(context._key, [])
        if clean and len(idle) < self.MAX_IDLE and context not in idle:
            idle.append(context)
        elif not context._closed:
            context._context.close()


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


def open_in_app(page: Any, path: str) -> None:
    """Open the app's page at `path` ("review", "admin", "" for the Overview) as a reviewer does:
    by its sidebar link, in the page's own session (showing the nav's hidden pages first when it
    is one of them), then `settle`. Call it on a settled page.

    Why: `page.goto` reloads Streamlit's scripts and opens a new WebSocket session, about 1.5-2
    Chromium CPU s more than the link (a script run either way); keep `goto` where a test is about
    a fresh load (a deep link, a reload, a new session)."""
    origin = "/".join(page.url.split("/", 3)[:3])
    nav = page.get_by_test_id("stSidebarNav")
    link = nav.locator(f'a[href="{origin}/{path}"]')
    if link.count() == 0:  # the nav shows ten pages until asked for the rest
        nav.get_by_role("button", name=re.compile(r"View \d+ more")).click()
    link.click()
    # The path, with whatever query the page writes on its first run (Team queues adds `?queue=N`).
    page.wait_for_url(re.compile(rf"^{re.escape(origin)}/{re.escape(path)}(\?.*)?$"))
    settle(page)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The ports this process's servers have listened on, and those a running server holds. A new server
# takes the first port an earlier one has freed, so the pages of successive tests load Streamlit's
# scripts from the same address, which the pooled tab (`AppContext`) has compiled already; a new
# address costs Chromium a full compile (3 -> 6 CPU s for a page load).
_PORTS: list[int] = []
_PORTS_HELD: set[int] = set()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _server_port() -> int:
    for port in _PORTS:
        if port not in _PORTS_HELD and _bindable(port):
            return port
    port = _free_port()
    _PORTS.append(port)
    return port


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
        self.log_path = log_path
        for attempt in range(2):
            self.port = _server_port()
            _PORTS_HELD.add(self.port)
            self.base_url = f"http://127.0.0.1:{self.port}"
            self._start(env, address, args)
            try:
                self._wait_ready()
                return
            except BaseException as exc:
                self.stop()  # a server that never answered must not outlive its test (and load the machine)
                taken = "already in use" in log_path.read_text(errors="replace")
                if not (attempt == 0 and taken and isinstance(exc, RuntimeError)):
                    raise
                _PORTS.remove(self.port)  # another process took it since: a fresh port, once

    def _start(self, env: dict[str, str], address: str | None, args: Sequence[str]) -> None:
        self._log = self.log_path.open("wb")
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
            self.proc.wait()
        self._log.close()
        _PORTS_HELD.discard(self.port)


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
