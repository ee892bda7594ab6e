"""Run inside a private network namespace by tests/test_server.py (issue 24 point 5).

The namespace has only loopback, and `checkip.amazonaws.com` (where Streamlit looks up the machine's
external address) is mapped in /etc/hosts to 127.0.0.2, where a listener accepts connections and
never answers: an outbound lookup that hangs, as on a network that drops packets, without a packet
leaving the machine. The probe starts the app through the launcher, then opens `HANDSHAKES`
WebSocket handshakes from a foreign origin; during each one it times `/_stcore/health`. It prints
JSON: the handshake statuses, the health latencies (seconds), and how many connections the
hanging listener received.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HANDSHAKES = 20
SILENT = "127.0.0.2"


def silent_listener(port: int, accepted: list[socket.socket]) -> None:
    """Accept on SILENT:port and never answer (the lookup's connection stays open until it times out)."""
    server = socket.create_server((SILENT, port))
    while True:
        conn, _ = server.accept()
        accepted.append(conn)


def health(port: int) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=60) as reply:
        reply.read()
    return time.monotonic() - started


def handshake(port: int, origin: str) -> int:
    request = (
        "GET /_stcore/stream HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Protocol: streamlit\r\n"
        f"Origin: {origin}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(request.encode())
        return int(conn.recv(4096).split(b" ", 2)[1])


def main(database: str, log_path: str) -> None:
    accepted: list[socket.socket] = []
    for silent_port in (80, 443):
        threading.Thread(target=silent_listener, args=(silent_port, accepted), daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OVERRULE_", "OPENAI_", "STREAMLIT_"))}
    env.update(OVERRULE_DATABASE_URL=database, OVERRULE_LOAD_DEMO="false")
    with open(log_path, "wb") as log:
        app = subprocess.Popen(
            [sys.executable, "-m", "lib.ui.server", "--server.port", str(port), "--server.headless", "true",
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            for _ in range(300):
                try:
                    health(port)
                    break
                except OSError:
                    time.sleep(0.2)
            baseline = [health(port) for _ in range(HANDSHAKES)]
            statuses: list[int] = []
            during: list[float] = []
            for _ in range(HANDSHAKES):
                worker = threading.Thread(target=lambda: statuses.append(handshake(port, "http://evil.test")))
                worker.start()
                time.sleep(0.02)  # the handshake is in the server before the health request
                during.append(health(port))
                worker.join()
        finally:
            app.terminate()
            app.wait(timeout=30)
    print(
        json.dumps({"statuses": statuses, "baseline": baseline, "during": during, "lookups": len(accepted)})
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
