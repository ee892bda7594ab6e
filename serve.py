"""The ASGI entry `./scripts/run` starts: the Streamlit app (app.py), the pipeline API at /api/v1 and
the streamed CSV downloads at /downloads (lib.downloads), and the OTLP/HTTP receiver at /v1/traces and
/v1/logs (lib.otlp; also /api/v1/otlp/v1/...).

`streamlit run serve.py` finds `app` (an `st.App`) and serves it with uvicorn in this process, so one
port answers both the pages and `/api/v1` (OpenAPI docs at `/api/v1/docs`). The launcher
`lib.ui.server` keeps deep links on the router as before.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware
from starlette.routing import Mount

from lib import downloads, webhooks
from lib.api import API_PREFIX, create_app, otlp_root_routes
from lib.ui.server import HostCheck, apply_allowed_hosts, no_external_ip_lookup

# "Download CSV (all matches)" links stream from the database (lib.downloads): no file in memory.
downloads.enable()
# Also when started without the launcher (`streamlit run serve.py`, uvicorn): no third-party lookup.
no_external_ip_lookup()
apply_allowed_hosts()  # done by the launcher already; here for `streamlit run serve.py` and uvicorn


@asynccontextmanager
async def lifespan(_app: st.App) -> AsyncIterator[None]:
    """Webhook deliveries run in a background thread of the server (lib.webhooks), never in a request.
    Temporary folders that a killed server's requests left an hour ago or more go first (lib.claims)."""
    from lib.claims import sweep_temp_folders
    from lib.db import init_db

    sweep_temp_folders()
    worker = webhooks.start_worker(init_db())
    try:
        yield
    finally:
        worker.stop()


api = create_app()
app = st.App(
    str(Path(__file__).resolve().parent / "app.py"),
    lifespan=lifespan,
    # OTLP/HTTP (lib.otlp) also at its conventional /v1/traces and /v1/logs, by the same API app
    # (and /v1/metrics, answered 501: "set OTEL_METRICS_EXPORTER=none").
    routes=[Mount(API_PREFIX, app=api), *otlp_root_routes(api), *downloads.routes()],
    # DNS rebinding (issue 24): a request whose Host this server was not given is refused on every
    # route (pages, WebSocket, API, downloads, Streamlit's own), by the list Streamlit checks too.
    middleware=[Middleware(HostCheck)],
)
