"""Browser fixtures: a real `streamlit run app.py` server and Debian's headless Chromium via Playwright.

Playwright's own browser download fails offline, so Chromium comes from Debian (`/usr/bin/chromium`).
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

import pytest

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
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60) -> None:
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


@pytest.fixture
def streamlit_app(tmp_path: Path) -> Iterator[Callable[..., StreamlitServer]]:
    """Start the app against a given database URL (and extra env); stopped after the test."""
    servers: list[StreamlitServer] = []

    def _start(database_url: str, *, args: Sequence[str] = (), **extra_env: str) -> StreamlitServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_"))}
        env.update({"OVERRULE_DATABASE_URL": database_url, "OVERRULE_LOAD_DEMO": "false", **extra_env})
        server = StreamlitServer(env, tmp_path / f"streamlit-{len(servers)}.log", args=args)
        servers.append(server)
        return server

    yield _start
    for server in servers:
        server.stop()


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
    context = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.dialogs = []  # type: ignore[attr-defined]
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
    yield pg
    context.close()
