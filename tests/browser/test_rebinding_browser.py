"""DNS rebinding in a real browser (issue 24 point 4).

Chromium is told that `evil.example` resolves to 127.0.0.1 (`--host-resolver-rules`), which is what
a rebinding attack achieves with a short-lived DNS record: script running in a document of
`evil.example:PORT` then talks to the app as its own origin. Its WebSocket and requests carry
`Host: evil.example:PORT` and a matching `Origin`; before the fix the handshake was accepted (101),
every page and API answer came back, and in open mode such a socket could add a note.

The attacker's document is opened from the mapped name itself, so that Chromium's private-network
checks (which block a public document from reaching loopback) do not hide what the server does.
"""

from __future__ import annotations

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

pytestmark = pytest.mark.browser

PROBE = """async ({host}) => {
  const ws = await new Promise((resolve) => {
    const socket = new WebSocket(`ws://${host}/_stcore/stream`, ["streamlit"]);
    socket.onopen = () => { socket.close(); resolve("open"); };
    socket.onerror = () => resolve("refused");
    setTimeout(() => resolve("no answer"), 30000);  // a guard, not a measurement
  });
  const status = async (path) => {
    try { return (await fetch(path)).status; } catch (error) { return "failed"; }
  };
  return {ws, api: await status("/api/v1/health"), page: await status("/"), docs: await status("/api/v1/docs")};
}"""


def test_a_rebound_name_gets_no_websocket_page_or_api(streamlit_app, browser, tmp_path) -> None:
    server = streamlit_app(f"sqlite:///{tmp_path / 'rebind.db'}")
    port = server.port
    rebinding = browser.browser_type.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=[*CHROMIUM_ARGS, "--host-resolver-rules=MAP evil.example 127.0.0.1"],
    )
    try:
        page = rebinding.new_context().new_page()
        # The legitimate origin first: the probe can see an open WebSocket and 200s.
        page.goto(f"{server.base_url}/_stcore/health")
        assert page.evaluate(PROBE, {"host": f"127.0.0.1:{port}"}) == {
            "ws": "open", "api": 200, "page": 200, "docs": 200,
        }  # fmt: skip
        refused = page.goto(f"http://evil.example:{port}/_stcore/health")
        assert refused is not None and refused.status == 400
        assert "OVERRULE_ALLOWED_HOSTS" in page.content()
        assert page.evaluate(PROBE, {"host": f"evil.example:{port}"}) == {
            "ws": "refused", "api": 400, "page": 400, "docs": 400,
        }  # fmt: skip
    finally:
        rebinding.close()
