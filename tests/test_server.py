"""The launcher binds loopback unless told otherwise, and the WebSocket refuses foreign origins (issue #17)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lib.ui.server import (
    APP,
    DEFAULT_ADDRESS,
    address_given,
    configured_address,
    script_imports,
    streamlit_args,
)
from tests.browser.conftest import ROOT, StreamlitServer

ALL = "0.0.0.0"  # noqa: S104 - the address that means "every interface"


@pytest.mark.parametrize(
    ("args", "environ", "configured", "expected"),
    [
        ([], {}, None, None),
        (["--server.port", "9000"], {}, None, None),
        (["--server.address", ALL], {}, None, ALL),
        (["--server.address=192.168.1.5"], {}, None, "192.168.1.5"),
        ([], {"STREAMLIT_SERVER_ADDRESS": "10.0.0.1"}, None, "10.0.0.1"),
        ([], {"STREAMLIT_SERVER_ADDRESS": ""}, None, None),
        ([], {}, ALL, ALL),
    ],
)
def test_address_given(args, environ, configured, expected) -> None:
    assert address_given(args, environ, configured) == expected


def test_streamlit_args_default_to_loopback_and_keep_a_chosen_address() -> None:
    assert streamlit_args(["--server.port", "9"], {}) == [
        "streamlit", "run", str(APP), "--server.address", DEFAULT_ADDRESS, "--server.port", "9"
    ]  # fmt: skip
    assert streamlit_args(["--server.address", ALL], {}) == [
        "streamlit", "run", str(APP), "--server.address", ALL
    ]  # fmt: skip
    assert streamlit_args([], {}, configured="::") == ["streamlit", "run", str(APP)]


def test_configured_address_reads_the_project_config_file_last_one_wins(tmp_path, monkeypatch) -> None:
    home, project = tmp_path / "home", tmp_path / "project"
    for folder, address in ((home, "10.1.1.1"), (project, "10.2.2.2")):
        (folder / ".streamlit").mkdir(parents=True)
        (folder / ".streamlit" / "config.toml").write_text(f'[server]\naddress = "{address}"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(project)
    assert configured_address() == "10.2.2.2"
    (project / ".streamlit" / "config.toml").write_text("[server]\nheadless = true\n")
    assert configured_address() == "10.1.1.1"
    (home / ".streamlit" / "config.toml").write_text("[server\nbroken")
    assert configured_address() is None


def _listening_addresses(port: int) -> set[str]:
    """Local addresses with a TCP socket in LISTEN state on `port`, from /proc/net/tcp{,6}."""
    found: set[str] = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state != "0A" or int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(socket.inet_ntop(family, raw))
    return found


def _upgrade_status(port: int, origin: str) -> int:
    """HTTP status of a WebSocket handshake to Streamlit's stream endpoint from `origin`."""
    request = (
        "GET /_stcore/stream HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: streamlit\r\n"
        f"Origin: {origin}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request.encode())
        status_line = conn.recv(4096).split(b"\r\n", 1)[0].decode()
    return int(status_line.split()[1])


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc")
def test_launcher_listens_on_loopback_only_and_refuses_foreign_websocket_origins(tmp_path) -> None:
    server = StreamlitServer(_server_env(tmp_path), tmp_path / "server.log", address=None)
    try:
        assert _listening_addresses(server.port) == {"127.0.0.1"}
        assert _upgrade_status(server.port, f"http://127.0.0.1:{server.port}") == 101
        assert _upgrade_status(server.port, "http://evil.test") == 403
        assert _upgrade_status(server.port, "https://attacker.example:8501") == 403
    finally:
        server.stop()
    # Issue 25: on loopback nothing warns of open mode "on every network interface", and Streamlit
    # does not think the [server] section changed after start ("... please restart streamlit").
    log = server.log_path.read_text()
    assert "open mode" not in log
    assert "config option section was detected" not in log
    assert f"URL: http://127.0.0.1:{server.port}" in log


def _server_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_", "STREAMLIT_"))}
    env.update(OVERRULE_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}", OVERRULE_LOAD_DEMO="false")
    return env


@pytest.mark.slow
def test_launcher_on_every_interface_warns_of_open_mode_once_naming_the_address(tmp_path) -> None:
    server = StreamlitServer(_server_env(tmp_path), tmp_path / "server.log", address=ALL)
    server.stop()
    log = server.log_path.read_text()
    assert log.count("WARNING: Overrule is in open mode on 0.0.0.0:") == 1, log
    assert "config option section was detected" not in log


def _isolated_network_works() -> bool:
    """Root with unshare(1): a private network and mount namespace can be made here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True).returncode == 0


def test_refused_handshakes_never_stall_the_server_in_an_isolated_network(tmp_path) -> None:
    """Issue 24.5: a refused cross-origin WebSocket made Streamlit look up the machine's external IP
    (checkip.amazonaws.com, 1 s timeout, then again over https) inside the event loop: the whole
    server, /_stcore/health included, stalled ~2 s per handshake.

    tests/netns_probe.py runs the app in a network namespace with only loopback, where that name
    leads to a local listener that never answers, and opens 20 refused handshakes. The check that
    cannot flake is that no lookup is made at all (the listener saw no connection). The latency
    bound the issue asks for is kept generous, since other jobs share this machine: the median
    health answer during the handshakes within 100 ms (or 3x the same run's baseline median, if
    that is slower), the slowest under 1 s, half of one stall.
    """
    if not _isolated_network_works():
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: unshare --net --mount must work")
        pytest.skip("needs root and unshare(1) for a private network namespace")
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n::1 localhost\n127.0.0.2 checkip.amazonaws.com\n")
    inside = (
        f"mount --bind {hosts} /etc/hosts && ip link set lo up && "
        f"exec {sys.executable} -m tests.netns_probe sqlite:///{tmp_path / 'x.db'} {tmp_path / 'server.log'}"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_", "STREAMLIT_"))}
    done = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c", inside],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + (tmp_path / "server.log").read_text()[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["statuses"] == [403] * 20
    assert probe["lookups"] == 0, "a refused handshake made an outbound lookup"
    assert statistics.median(probe["during"]) < max(0.1, 3 * statistics.median(probe["baseline"])), probe
    assert max(probe["during"]) < 1.0, probe


def _status(port: int, path: str, host: str, *, websocket: bool = False) -> int:
    """HTTP status of a GET (or a WebSocket handshake whose Origin matches `host`) sent as `Host: host`."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"]
    if websocket:
        lines += [
            "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version: 13", "Sec-WebSocket-Protocol: streamlit", f"Origin: http://{host}",
        ]  # fmt: skip
    else:
        lines.append("Connection: close")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return int(conn.recv(4096).split(b" ", 2)[1])


ROUTES = [("/", False), ("/_stcore/health", False), ("/api/v1/health", False), ("/api/v1/docs", False),
          ("/downloads/nope", False), ("/_stcore/stream", True)]  # fmt: skip


def test_every_route_refuses_a_host_name_it_was_not_given(tmp_path) -> None:
    """Issue 24.4 (DNS rebinding): `Host: evil.example:PORT` with a matching Origin got a WebSocket (101)
    and every page; now pages, WebSocket, API and downloads answer only to the names in lib.hosts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_", "STREAMLIT_"))}
    env.update(
        OVERRULE_DATABASE_URL=f"sqlite:///{tmp_path / 'x.db'}",
        OVERRULE_LOAD_DEMO="false",
        OVERRULE_ALLOWED_HOSTS="overrule.example.com",
    )
    server = StreamlitServer(env, tmp_path / "server.log")
    port = server.port
    try:
        for path, websocket in ROUTES:
            for name in ("evil.example", "overrule.example.com.evil.example", "127.0.0.1.nip.io"):
                assert _status(port, path, f"{name}:{port}", websocket=websocket) in (400, 403), (path, name)
            for name in ("127.0.0.1", "localhost", "[::1]", "overrule.example.com", "OVERRULE.example.com"):
                assert _status(port, path, f"{name}:{port}", websocket=websocket) in (101, 200, 404), (
                    path,
                    name,
                )
        refused = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/v1/health", headers={"Host": "evil.example"}
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=30)  # noqa: S310
        assert "OVERRULE_ALLOWED_HOSTS" in answer.value.read().decode()
    finally:
        server.stop()


def test_launcher_freezes_the_imported_heap_and_bulk_loads_leave_the_freeze_alone() -> None:
    """Review3 B1: the server's entry imports what the app's scripts import, collects and freezes the
    heap (full collections then skip the libraries' ~230,000 objects), and marks it frozen elsewhere,
    so a bulk load's `frozen_heap` neither freezes again nor unfreezes it. In a fresh interpreter
    (the launcher with Streamlit's CLI left out): the test process has its own freeze (conftest)."""
    probe = """
import gc
import streamlit.web.cli

streamlit.web.cli.main = lambda: None  # everything of the launcher but the server itself
from lib import bulk
from lib.ui import server

assert gc.get_freeze_count() == 0 and not bulk.HEAP_FROZEN_ELSEWHERE
server.main(["--server.port", "1"])
frozen = gc.get_freeze_count()
assert bulk.HEAP_FROZEN_ELSEWHERE
for name in ("lib.ui.review", "lib.ui.tables", "lib.metrics", "pandas"):  # the pages' imports
    assert name in __import__("sys").modules, name
with bulk.frozen_heap():
    assert gc.get_freeze_count() == frozen  # no freeze of its own inside a frozen heap
assert gc.get_freeze_count() == frozen  # and no unfreeze leaving
print(frozen)
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "STREAMLIT_"))}
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.split()[-1]) > 100_000  # the libraries, not a handful of objects
    assert "No runtime found" not in result.stderr  # Streamlit's warning for cached functions is kept quiet
    assert "lib.ui.review" in script_imports() and "lib.ui.server" in script_imports()
