"""Streamed downloads: "Download CSV (all matches)" as a link whose response is written while it is sent.

Streamlit's `st.download_button` keeps the whole file in the server's memory while the session
lasts (its media store holds bytes), so an export of a million evaluations would cost its size in
RAM. When the app runs from `serve.py` (the ASGI entry), that file mounts `routes()` and a page
registers the export instead (`register`): it gets an unguessable one-time-per-15-minutes path
`/downloads/<token>`, and the response streams the CSV from the database chunk by chunk
(`lib.export.*_csv_chunks`), so the app's memory stays one batch of rows whatever the size.

A link is not a bearer capability (issue 24.8): it is bound to the browser session that made it
(`browser_binding`, a hash of the cookies that session carries) and, in sign-in mode, to that
sign-in's server-side session (`still_valid`, lib.auth.session_is_live). A client without those
cookies, another browser, or the same browser after "Sign out" (or after an admin ended its
session) gets 403; unknown or expired (`LINK_TTL_SECONDS`) links 404. Under plain
`streamlit run app.py` or AppTest there is no route (`enabled()` is False) and pages fall back to
the download button.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

DOWNLOAD_PREFIX = "/downloads"
LINK_TTL_SECONDS = 15 * 60
MAX_LINKS = 10_000  # every page rerun makes one; the oldest go first beyond this
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
# Streamlit's cookies: the signed identity cookie of st.login (and its tokens cookie; both may be
# split into numbered chunks), and the XSRF cookie every browser gets with the page.
IDENTITY_COOKIE = "_streamlit_user"
XSRF_COOKIE = "_streamlit_xsrf"

Chunks = Callable[[], Iterator[bytes]]


@dataclass(frozen=True)
class _Link:
    filename: str
    chunks: Chunks
    expires: float
    owner: str  # browser_binding of the session that made the link
    still_valid: Callable[[], bool] | None  # sign-in mode: is that sign-in's session still live?


def _xsrf_token(value: str) -> bytes | None:
    """The random token inside Streamlit's XSRF cookie ("2|mask|masked token|time"): the cookie's
    text changes (a new mask) on every page load, its token stays for the browser."""
    parts = value.strip("\"'").split("|")
    if len(parts) != 4 or parts[0] != "2":
        return None
    try:
        mask, masked = binascii.a2b_hex(parts[1]), binascii.a2b_hex(parts[2])
    except (binascii.Error, ValueError):
        return None
    if not mask or not masked:
        return None
    return bytes(b ^ mask[i % len(mask)] for i, b in enumerate(masked))


def browser_binding(cookies: Mapping[str, str]) -> str | None:
    """What ties a link to the browser session that made it: a hash of the st.login identity cookies
    when signed in (the same values until sign-out), else of the browser's XSRF token; None when
    the browser carries neither (then no link is handed out)."""
    signed_in = sorted(
        (name, value)
        for name, value in cookies.items()
        if name == IDENTITY_COOKIE or name.startswith(IDENTITY_COOKIE + "_")
    )
    if signed_in:
        material = "\n".join(f"{name}={value}" for name, value in signed_in).encode()
        return "user:" + hashlib.sha256(material).hexdigest()
    token = _xsrf_token(cookies.get(XSRF_COOKIE, ""))
    return "xsrf:" + hashlib.sha256(token).hexdigest() if token else None


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


def register(
    filename: str,
    chunks: Chunks,
    *,
    owner: str,
    still_valid: Callable[[], bool] | None = None,
    now: float | None = None,
) -> str:
    """A path that streams `chunks()` as the attachment `filename` for the next LINK_TTL_SECONDS, to
    the browser session `owner` (`browser_binding`) only, and only while `still_valid()` holds."""
    if not owner:
        raise ValueError("a download link must be bound to the browser session that asked for it")
    moment = time.monotonic() if now is None else now
    token = secrets.token_urlsafe(24)
    with _lock:
        while _links and (len(_links) >= MAX_LINKS or next(iter(_links.values())).expires <= moment):
            _links.popitem(last=False)
        _links[token] = _Link(
            _SAFE_NAME.sub("_", filename) or "export.csv",
            chunks,
            moment + LINK_TTL_SECONDS,
            owner,
            still_valid,
        )
    return f"{DOWNLOAD_PREFIX}/{token}"


def _lookup(token: str, now: float | None = None) -> _Link | None:
    moment = time.monotonic() if now is None else now
    with _lock:
        link = _links.get(token)
    return link if link is not None and link.expires > moment else None


def serve(request: Request) -> Response:
    """GET /downloads/<token>: the export streamed as text/csv to the session that made the link;
    404 for an unknown or expired link, 403 for another client or an ended session."""
    link = _lookup(request.path_params["token"])
    if link is None:
        return PlainTextResponse(
            "This download link has expired or is unknown: open the page again and use its download button.",
            status_code=404,
        )
    if not hmac.compare_digest(link.owner, browser_binding(request.cookies) or ""):
        return PlainTextResponse(
            "This download link belongs to another browser session: open the page yourself and use "
            "its download button.",
            status_code=403,
        )
    if link.still_valid is not None and not link.still_valid():
        return PlainTextResponse(
            "The session that made this download link has ended: sign in again and open the page.",
            status_code=403,
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
