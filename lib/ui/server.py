"""Start `streamlit run app.py` with the router in charge of every URL from the first request.

Streamlit decides once per process whether a `pages/` folder beside the entry script means its old
file-based multipage mode, and keeps that mode until `app.py` has called `st.navigation` once. On a
freshly started server, a shared deep link such as `/review` would therefore run `pages/review.py`
on its own: no router, no sidebar, no reviewer name. Settling the flag before the server starts
makes every URL go through `app.py`. Usage: `python -m lib.ui.server [streamlit run options]`.

Exposure (issue #17): Streamlit listens on every interface unless told otherwise, and in open mode
anyone who reaches the port can act as anyone. So the launcher binds loopback (`127.0.0.1`) unless
an address is chosen: `--server.address 0.0.0.0` (or any address), `STREAMLIT_SERVER_ADDRESS`, or
`address` under `[server]` in a Streamlit config file.
Cross-site protection stays on in `.streamlit/config.toml` (`enableXsrfProtection`, `enableCORS`:
the WebSocket accepts only same-origin and local origins). Against DNS rebinding (issue 24) the
launcher sets Streamlit's `server.allowedHosts` to the names `lib.hosts` allows (loopback, the bound
address, OVERRULE_ALLOWED_HOSTS), and serve.py refuses every other Host on every route.
"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from starlette.responses import PlainTextResponse

from lib.hosts import refusal

# serve.py is the ASGI entry: app.py (the pages) plus the pipeline API at /api/v1, on one port.
APP = Path(__file__).resolve().parents[2] / "serve.py"
# What the server runs: its modules' module-level imports are made before the heap is frozen.
SCRIPTS = (APP, APP.parent / "app.py", *sorted((APP.parent / "pages").glob("*.py")))
DEFAULT_ADDRESS = "127.0.0.1"
_ADDRESS_FLAG = "--server.address"


def address_given(
    args: Sequence[str], environ: Mapping[str, str], configured: str | None = None
) -> str | None:
    """The address the operator chose (flag, environment variable, config file), or None for the default."""
    for index, arg in enumerate(args):
        if arg == _ADDRESS_FLAG and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith(f"{_ADDRESS_FLAG}="):
            return arg.split("=", 1)[1]
    return environ.get("STREAMLIT_SERVER_ADDRESS") or configured or None


def configured_address() -> str | None:
    """`server.address` from Streamlit's config files (`~/.streamlit`, `./.streamlit`), if set there.

    Read from the files directly: parsing Streamlit's config here, before `streamlit run` parses it
    with the command-line options, made Streamlit see the [server] section change between the two
    parses and print "An update to the [server] config option section was detected" (issue 25).
    """
    import tomllib

    from streamlit import config

    address = None
    for path in config.get_config_files("config.toml"):  # later files override earlier ones
        try:
            with open(path, "rb") as file:
                server = tomllib.load(file).get("server")
        except (OSError, tomllib.TOMLDecodeError):
            continue  # missing, unreadable or broken: Streamlit reports a broken file itself
        if isinstance(server, dict) and server.get("address"):
            address = str(server["address"])
    return address


def streamlit_args(
    args: Sequence[str], environ: Mapping[str, str], configured: str | None = None
) -> list[str]:
    """`streamlit run app.py` with the given options, bound to loopback when no address is chosen."""
    chosen = address_given(args, environ, configured)
    return ["streamlit", "run", str(APP), *([] if chosen else [_ADDRESS_FLAG, DEFAULT_ADDRESS]), *args]


def no_external_ip_lookup() -> None:
    """Never ask an outside service for this machine's address (issue 24 point 5).

    Streamlit asks checkip.amazonaws.com (1 s timeout, then again over https) whenever a WebSocket
    handshake comes from an origin it does not know, to see whether it is the machine's public
    address, and does so inside the event loop and again for every handshake while the lookup
    fails: on a network that drops the request, each refused handshake froze the whole server
    for ~2 s, so any web page a reviewer visited could keep the app frozen. Overrule serves
    offline and calls no third party, so the lookup is off: a page opened on the machine's
    public address is same-origin anyway, and other origins go in `server.corsAllowedOrigins`.
    The "External URL" line of the start-up banner goes with it.
    """
    from streamlit import net_util

    net_util.get_external_ip = _no_external_ip


def _no_external_ip() -> None:
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Run the Overrule app with Streamlit's CLI in this process; options pass through."""
    from streamlit import config
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.web import cli

    PagesManager.uses_pages_directory = False
    no_external_ip_lookup()

    # Streamlit parses its config when `streamlit run` applies the command-line options (the
    # launcher's loopback address among them): the allowed hosts follow every parse, the open-mode
    # warning waits for that parse and runs once.
    def warn_once() -> None:
        disconnect()
        _warn_if_open()

    config.on_config_parsed(apply_allowed_hosts, force_connect=True)
    disconnect = config.on_config_parsed(warn_once, force_connect=True)
    sys.argv = streamlit_args(sys.argv[1:] if argv is None else argv, os.environ, configured_address())
    freeze_imported_heap()
    cli.main()


def script_imports(scripts: Sequence[Path] = SCRIPTS) -> list[str]:
    """The modules `scripts` import at module level (absolute imports; `from lib import x` names the
    submodule lib.x), read from their source: the pages are run by Streamlit, never imported."""
    names: set[str] = set()
    for script in scripts:
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                spec = importlib.util.find_spec(node.module)
                if spec is not None and spec.submodule_search_locations is not None:
                    for alias in node.names:
                        if importlib.util.find_spec(f"{node.module}.{alias.name}") is not None:
                            names.add(f"{node.module}.{alias.name}")
    return sorted(names)


def freeze_imported_heap() -> None:
    """Import what the app's scripts import, collect, and freeze the heap for the server's lifetime.

    Why: the imported libraries (Streamlit, pandas, SQLAlchemy, the app's modules) are ~230,000
    objects that live as long as the process, and every full (oldest-generation) collection walked
    them all again: ~150 ms, falling on whichever user's render happened to trigger it. Frozen
    (`gc.freeze`), they are never walked again; what requests make afterwards is collected as
    before. The imports are the ones the first render would make anyway (moved to start-up).
    `lib.bulk.frozen_heap` must then leave the heap alone, as its unfreeze would undo this freeze.
    Only the server's entry calls this: the test suite runs app.py in-process and freezes itself.
    """
    from lib import bulk

    # Streamlit warns, when a cached function is declared before its runtime exists, that it checks
    # the cache's options against an in-memory store; the runtime's own store is used at run time.
    caching_log = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    level = caching_log.level
    caching_log.setLevel(logging.ERROR)
    try:
        for name in script_imports():
            importlib.import_module(name)
    finally:
        caching_log.setLevel(level)
    gc.collect()
    gc.freeze()
    bulk.HEAP_FROZEN_ELSEWHERE = True


def apply_allowed_hosts() -> None:
    """Set Streamlit's `server.allowedHosts` (its WebSocket Host check, which `lib.hosts.HostCheck`
    in serve.py reads for every other route) to the names `lib.hosts.allowed_hosts` gives for the
    bound address, keeping any the operator listed there; said at start when the server is exposed."""
    from streamlit import config

    from lib.auth import is_loopback
    from lib.config import get_settings
    from lib.hosts import allowed_hosts

    address = config.get_option("server.address")
    names = allowed_hosts(
        address, get_settings().allowed_hosts.split(","), config.get_option("server.allowedHosts") or ()
    )
    if names != config.get_option("server.allowedHosts"):
        config.set_option("server.allowedHosts", names, where_defined="Overrule (lib.hosts)")
        if not is_loopback(address):
            print(
                f"Overrule answers to the host names {', '.join(names)}; add others (your server's "
                "DNS name) with OVERRULE_ALLOWED_HOSTS.",
                file=sys.stderr,
            )


class HostCheck:
    """ASGI middleware (serve.py): a request or WebSocket whose Host is not in `server.allowedHosts`
    gets 400 (403 on a handshake) before any route, the API's and Streamlit's own included, sees it.
    The match is Streamlit's own for that option, so every layer applies one rule to one list."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        from streamlit.web.server.starlette.starlette_websocket import is_host_allowed

        if scope["type"] in ("http", "websocket"):
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
            if not is_host_allowed(host):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})  # refused before the 101
                    return
                await PlainTextResponse(refusal(host), status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _warn_if_open() -> None:
    """Open mode on an address others can reach: say so at start, naming the setting for sign-in."""
    from streamlit import config

    from lib.auth import open_mode_warning

    warning = open_mode_warning(config.get_option("server.address"))
    if warning:
        print(f"WARNING: {warning}", file=sys.stderr)


if __name__ == "__main__":
    main()
