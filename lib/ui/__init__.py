"""Streamlit glue shared by every page: the cached engine, sessions, reviewer identity, downloads.

This package is the only lib code that imports streamlit. Pages call these helpers so that the
engine is built once per process (`st.cache_resource`), every write knows its reviewer, and every
visible table can be downloaded as CSV.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, NoReturn, TypeVar
from urllib.parse import unquote

import pandas as pd
import streamlit as st
from sqlalchemy import Engine
from sqlmodel import Session

from lib import auth, db
from lib.config import LLM_SETUP_HINT, get_settings, llm_off_reason
from lib.safe_markdown import escape_markdown

T = TypeVar("T")

log = logging.getLogger(__name__)

REVIEWER_KEY = "sidebar_reviewer"


@st.cache_resource(show_spinner="Preparing the database…")
def _engine_for(url: str, load_demo: bool) -> Engine:
    engine = db.init_db(url)
    with db.session_scope(engine) as session:
        auth.bootstrap_admins(session=session)
    if load_demo:
        from lib.demo import load_demo as _load

        counts = _load(engine=engine, force=False)
        if counts:
            log.info("demo data loaded on first start: %s", counts)
    return engine


def get_engine() -> Engine:
    """The process-wide engine for the configured database, migrated (and demo-filled when empty)."""
    settings = get_settings()
    return _engine_for(settings.database_url, settings.load_demo)


@contextmanager
def session_scope(*, read_only: bool = False) -> Iterator[Session]:
    """A session on the app database that commits on success."""
    with db.session_scope(get_engine(), read_only=read_only) as session:
        yield session


def write(work: Callable[[Session], T]) -> T:
    """`work(session)` in one write transaction on the app database, run again on PostgreSQL when
    it was a deadlock's victim (`lib.db.write_retrying`): a reviewer's click never ends in one."""
    return db.write_retrying(get_engine(), work)


# ---------------------------------------------------------------------------------------------
# Identity: who is acting, in open mode (a name kept in a cookie) or sign-in mode (st.login)

REVIEWER_COOKIE = "overrule_reviewer"
_SAVED_KEY = "sidebar_reviewer_saved"


def _signed_in_claims() -> dict[str, Any] | None:
    """The signed-in user's ID-token claims (st.user), or None when nobody is signed in."""
    try:
        user = st.user
        if not user.get("is_logged_in", False):
            return None
        return dict(user.to_dict())
    except Exception:  # st.user raises when authentication is not configured
        log.debug("st.user unavailable", exc_info=True)
        return None


def current_session_key() -> str | None:
    """Sign-in mode: the key of this browser's sign-in (lib.auth.session_key), else None."""
    claims = None if auth.open_mode() else _signed_in_claims()
    return auth.session_key(claims) if claims is not None else None


def _cookies() -> dict[str, str]:
    """The cookies this browser session sent with its WebSocket handshake (AppTest hands out mocks)."""
    cookies = st.context.cookies
    return {str(k): v for k, v in cookies.items() if isinstance(v, str)} if hasattr(cookies, "items") else {}


def _session_still_live() -> Callable[[], bool] | None:
    """Sign-in mode: a check, callable later from another thread (a download's request), that this
    browser's sign-in is still live; None in open mode, which has no sessions."""
    if auth.open_mode():
        return None
    key, engine = current_session_key(), get_engine()

    def still_live() -> bool:
        with db.session_scope(engine, read_only=True) as session:
            return auth.session_is_live(session=session, key=key)

    return still_live


def current_actor() -> auth.Actor | None:
    """Who is acting in this browser: the signed-in user with their role while their session is live
    (lib.auth.signed_in_actor), or open mode's typed name."""
    if auth.open_mode():
        name = str(st.session_state.get(REVIEWER_KEY, "") or "").strip()
        return auth.Actor(identity=name, role="admin", kind="open") if name else None
    claims = _signed_in_claims()
    if claims is None:
        return None
    with session_scope(read_only=True) as session:
        return auth.signed_in_actor(session=session, claims=claims)


def current_reviewer() -> str | None:
    """The acting identity as recorded on rows (None when nobody is named or signed in)."""
    actor = current_actor()
    return actor.identity if actor else None


def denied_reason(permission: auth.Permission, actor: auth.Actor | None = None) -> str | None:
    """Why this browser cannot do `permission` (for a disabled button's help), or None when it can."""
    actor = actor or current_actor()
    if actor is None:
        return "Sign in first." if not auth.open_mode() else "Enter your name in the sidebar first."
    return None if actor.can(permission) else auth.denial_message(actor, permission)


def require_reviewer(
    action: str = "make changes", permission: auth.Permission = auth.Permission.REVIEW
) -> auth.Actor | None:
    """The acting user when their role allows `permission`, or None after saying why not."""
    actor = current_actor()
    if actor is None:
        where = "Enter your name in the sidebar" if auth.open_mode() else "Sign in"
        st.warning(f"{where} to {action}.", icon="👤")
        return None
    if not actor.can(permission):
        st.warning(auth.denial_message(actor, permission), icon="🔒")
        return None
    return actor


def audit_denied(exc: auth.PermissionDenied) -> str:
    """Append a refused attempt to the audit trail (after its write rolled back); the message to show."""
    with session_scope() as session:
        auth.record_denied(session=session, exc=exc)
    return f"Not allowed, nothing was changed: {exc}"


def report_denied(exc: auth.PermissionDenied) -> None:
    """Audit a refused attempt and say so on the page."""
    st.error(escape_markdown(audit_denied(exc)), icon="🔒")


def _restore_name_from_cookie() -> None:
    """Open mode: the name typed once in this browser comes back on reloads, deep links and new tabs."""
    if REVIEWER_KEY in st.session_state:
        return
    raw = st.context.cookies.get(REVIEWER_COOKIE)
    name = unquote(raw).strip()[:200] if isinstance(raw, str) else ""  # AppTest hands out mocks
    st.session_state[REVIEWER_KEY] = name
    st.session_state[_SAVED_KEY] = name


def _save_name_cookie(name: str) -> None:
    """Store the typed name in a first-party cookie (one year), so the server sees it on every visit."""
    if st.session_state.get(_SAVED_KEY) == name:
        return
    st.session_state[_SAVED_KEY] = name
    # JSON-encoded, with <, > and & escaped, so no name can end the script element.
    value = json.dumps(name).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    age = 365 * 24 * 3600 if name else 0
    st.html(
        f"<script>document.cookie = '{REVIEWER_COOKIE}=' + encodeURIComponent({value}) + "
        f"'; path=/; max-age={age}; SameSite=Lax';</script>",
        unsafe_allow_javascript=True,
    )


def sign_in_gate() -> None:
    """Sign-in mode: show only the sign-in screen until the provider has signed the user in."""
    if auth.open_mode():
        _restore_name_from_cookie()
        return
    if not _auth_configured():
        st.error(
            "Sign-in mode (OVERRULE_AUTH_MODE=signin) needs an [auth] section in .streamlit/secrets.toml "
            "with redirect_uri, cookie_secret, client_id, client_secret and server_metadata_url. "
            'See docs/deployment.md, section "Sign-in and roles".'
        )
        st.stop()
    claims = _signed_in_claims()
    identity = auth.identity_from_claims(claims) if claims is not None else None
    if claims is None or identity is None:
        _sign_in_screen()
    # Every page run: the sign-in's server-side session must be live (issue 24.3), so a copied
    # cookie after "Sign out", an ended or too old session shows the sign-in screen again.
    with session_scope() as session:
        check = auth.check_session(session=session, claims=claims, identity=identity)
    if not check.live:
        _sign_in_screen(f"Your session has ended: {check.ended}. Sign in again to continue.")


def _sign_in_screen(notice: str | None = None) -> NoReturn:
    """The only thing a browser without a live sign-in sees."""
    st.title("Overrule")
    if notice:
        st.info(notice, icon="🔒")
    else:
        st.write("Sign in to continue.")
    st.button("Sign in", key="auth_sign_in", type="primary", on_click=st.login, icon="🔑")
    st.stop()


def _sign_out() -> None:
    """End this browser's session on the server, then let Streamlit drop its cookie."""
    claims = _signed_in_claims()
    key = auth.session_key(claims) if claims is not None else None
    if claims is not None and key is not None:
        with session_scope() as session:
            auth.end_session(
                session=session, key=key, by=auth.identity_from_claims(claims) or "unknown", reason="sign_out"
            )
    st.logout()


def _auth_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # no secrets file at all
        log.debug("no secrets", exc_info=True)
        return False


def reviewer_sidebar() -> None:
    """The sidebar identity: open mode asks for a name once per browser; sign-in mode shows the user."""
    with st.sidebar:
        if auth.open_mode():
            _restore_name_from_cookie()
            st.text_input(
                "Your name (recorded with every change)",
                key=REVIEWER_KEY,
                placeholder="e.g. ayse",
                max_chars=200,
            )
            name = str(st.session_state.get(REVIEWER_KEY, "") or "").strip()
            _save_name_cookie(name)
            if not name:
                st.caption("Enter your name to review, add notes or import data.")
            st.caption("⚠️ Open mode: anyone who can reach this server can act as anyone.")
            return
        actor = current_actor()
        if actor is not None:
            st.markdown(f"Signed in as **{escape_markdown(actor.identity)}** · role `{actor.role}`")
            if actor.identity.startswith(auth.SUB_PREFIX):
                st.caption(
                    "Your sign-in provider did not confirm an e-mail address for you, so you are known "
                    "by your account id above. An admin can give that identity a role."
                )
            st.button("Sign out", key="auth_sign_out", on_click=_sign_out, icon="🚪")


def csv_download(frame: pd.DataFrame, filename: str, *, key: str, label: str = "Download CSV") -> None:
    """A download button for exactly the rows shown, with spreadsheet formulas neutralised."""
    from lib.export import frame_to_csv_bytes

    st.download_button(label, data=frame_to_csv_bytes(frame), file_name=filename, mime="text/csv", key=key)


def csv_download_all(
    label: str,
    filename: str,
    *,
    chunks: Callable[[], Iterator[bytes]],
    data: Callable[[], bytes],
    key: str,
    container: Any = None,
) -> None:
    """ "Download CSV (all matches)": a streamed link when serve.py mounts `lib.downloads`, else a
    download button whose bytes are built on click (`data`). The link keeps memory flat in the row
    count; the button makes Streamlit hold the file while the session lasts. The link works only
    for this browser session (and, signed in, only while its session is live: issue 24.8)."""
    from lib import downloads

    target = container if container is not None else st
    owner = downloads.browser_binding(_cookies()) if downloads.enabled() else None
    if owner is not None:
        path = downloads.register(filename, chunks, owner=owner, still_valid=_session_still_live())
        target.link_button(label, path, icon=":material/download:")
    else:
        target.download_button(
            label, data=data, file_name=filename, mime="text/csv", key=key, on_click="ignore"
        )


# What a list shows on a page past its last match: a capped count ("1,000+") lets `pager` offer one.
EMPTY_PAGE_TEXT = "This page is empty."


def _step_page(key: str, delta: int, pages: int) -> None:
    """Move the page number by `delta` before the rerun draws the number box (a callback may)."""
    current = int(st.session_state.get(key, 1) or 1)
    st.session_state[key] = min(pages, max(1, current + delta))


def pager(
    total: int,
    *,
    key: str,
    page_size: int | None = None,
    capped: bool = False,
    persist_state: Literal["page"] | None = None,
) -> tuple[int, int]:
    """A compact page selector (‹ [n] › of N); returns (offset, limit) so the query fetches one page.

    One row of small controls, not a full-width box: the number box is keyed `key` (the page
    number lives there, so a deep link may seed it), the arrows are `key`_prev / `key`_next.
    A page number left over from more matches (the filters changed) falls back to the first page.
    `capped`: `total` is a count stopped at its cap, so more rows match than it says; the pages
    then go on one past the current one ("of 401+ pages") instead of ending at the cap.
    `persist_state="page"`: the page number outlives runs that do not draw the pager (a hidden tab
    that does not run); Streamlit otherwise deletes a keyed widget's value when a run skips it.
    """
    size = page_size or get_settings().page_size
    pages = max(1, math.ceil(total / size))
    current = int(st.session_state.get(key, 1) or 1)
    if capped:
        pages = max(pages, current + 1)
    if current > pages:
        st.session_state.pop(key, None)
        current = 1
    if pages == 1:
        return 0, size
    with st.container(horizontal=True, vertical_alignment="center", gap="small", key=f"{key}_bar"):
        st.button(
            "",
            key=f"{key}_prev",
            icon=":material/chevron_left:",
            help="Previous page",
            disabled=current <= 1,
            on_click=_step_page,
            args=(key, -1, pages),
        )
        page = st.number_input(
            "Page",
            min_value=1,
            max_value=pages,
            value=1,
            step=1,
            key=key,
            label_visibility="collapsed",
            width=90,
            persist_state=persist_state,
        )
        st.button(
            "",
            key=f"{key}_next",
            icon=":material/chevron_right:",
            help="Next page",
            disabled=current >= pages,
            on_click=_step_page,
            args=(key, 1, pages),
        )
        of = f"{max(pages - 1, math.ceil(total / size)):,}+" if capped else f"{pages:,}"
        st.caption(f"of {of} pages · {size:,} per page")
    return (int(page) - 1) * size, size


_FLASH_ICONS = {"success": "✅", "info": "ℹ️", "warning": "👤", "error": "⚠️"}


def flash(key: str, level: str, message: str) -> None:
    """Keep an outcome for the next run to show: a write is usually followed by a rerun that would lose it."""
    if level not in _FLASH_ICONS:
        raise ValueError(f"flash level must be one of {', '.join(_FLASH_ICONS)}, got {level!r}")
    st.session_state[key] = (level, message)


def show_flash(key: str) -> None:
    """Show (once) the outcome kept under `key`, escaped: messages may quote names and file names."""
    level, message = st.session_state.pop(key, (None, None))
    if level in _FLASH_ICONS:
        show = {"success": st.success, "info": st.info, "warning": st.warning, "error": st.error}[level]
        show(escape_markdown(str(message)), icon=_FLASH_ICONS[level])


def llm_unavailable_message() -> str | None:
    """Why LLM actions are disabled (the page-wide notice), or None when an LLM is configured."""
    if get_settings().llm_configured:
        return None
    return (
        "No LLM is configured, so judging, coaching and second opinions are disabled; "
        f"everything else works without it. {LLM_SETUP_HINT}"
    )


def llm_off_help(action: str, *, plural: bool = False) -> str | None:
    """Why a control that needs an LLM is disabled (with the setup hint), or None when it can work."""
    return None if get_settings().llm_configured else llm_off_reason(action, plural=plural)
