"""Streamed downloads: "Download CSV (all matches)" as a link whose response is written while it is sent.

Streamlit's `st.download_button` keeps the whole file in the server's memory while the session
lasts (its media store holds bytes), so an export of a million evaluations would cost its size in
RAM. When the app runs from `serve.py` (the ASGI entry), that file mounts `routes()` and a page
registers the export instead (`register`): it gets an unguessable one-time-per-15-minutes path
`/downloads/<token>`, and the response streams the CSV from the database chunk by chunk
(`lib.export.*_csv_chunks`), so the app's memory stays one batch of rows whatever the size.

The token is a capability: only the page of a signed-in viewer makes one, it carries no data, it
names one filtered export, and it expires (`LINK_TTL`). Under plain `streamlit run app.py` or
AppTest there is no route (`enabled()` is False) and pages fall back to the download button.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

DOWNLOAD_PREFIX = "/downloads"
LINK_TTL_SECONDS = 15 * 60
MAX_LINKS = 10_000  # every page rerun makes one; the oldest go first beyond this
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")

Chunks = Callable[[], Iterator[bytes]]


@dataclass(frozen=True)
class _Link:
    filename: str
    chunks: Chunks
    expires: float


# Process-wide on purpose: the HTTP route and the pages' sessions share it, like Streamlit's own
# media store. Holds only small closures (engine, filters), never file contents.
_links: OrderedDict[str, _Link] = OrderedDict()
_lock = threading.Lock()
_enabled = False


def enable() -> None:
    """Called by serve.py when it mounts `routes()`: pages may now hand out links."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    """Whether this process serves `/downloads/...` (False under `streamlit run app.py` and AppTest)."""
    return _enabled


def register(filename: str, chunks: Chunks, *, now: float | None = None) -> str:
    """A path that streams `chunks()` as the attachment `filename` for the next LINK_TTL_SECONDS."""
    moment = time.monotonic() if now is None else now
    token = secrets.token_urlsafe(24)
    with _lock:
        while _links and (len(_links) >= MAX_LINKS or next(iter(_links.values())).expires <= moment):
            _links.popitem(last=False)
        _links[token] = _Link(
            _SAFE_NAME.sub("_", filename) or "export.csv", chunks, moment + LINK_TTL_SECONDS
        )
    return f"{DOWNLOAD_PREFIX}/{token}"


def _lookup(token: str, now: float | None = None) -> _Link | None:
    moment = time.monotonic() if now is None else now
    with _lock:
        link = _links.get(token)
    return link if link is not None and link.expires > moment else None


def serve(request: Request) -> Response:
    """GET /downloads/<token>: the export streamed as text/csv, or 404 with what to do."""
    link = _lookup(request.path_params["token"])
    if link is None:
        return PlainTextResponse(
            "This download link has expired or is unknown: open the page again and use its download button.",
            status_code=404,
        )
    return StreamingResponse(
        link.chunks(),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{link.filename}"',
            "Cache-Control": "no-store",
        },
    )


def routes() -> list[Route]:
    """The route serve.py mounts beside the pages and the API."""
    return [Route(f"{DOWNLOAD_PREFIX}/{{token}}", serve, methods=["GET"])]
