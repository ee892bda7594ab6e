"""Streamlit glue shared by every page: the cached engine, sessions, reviewer identity, downloads.

This package is the only lib code that imports streamlit. Pages call these helpers so that the
engine is built once per process (`st.cache_resource`), every write knows its reviewer, and every
visible table can be downloaded as CSV.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

import pandas as pd
import streamlit as st
from sqlalchemy import Engine
from sqlmodel import Session

from lib import db
from lib.config import get_settings
from lib.safe_markdown import escape_markdown

log = logging.getLogger(__name__)

REVIEWER_KEY = "sidebar_reviewer"


@st.cache_resource(show_spinner="Preparing the database…")
def _engine_for(url: str, load_demo: bool) -> Engine:
    engine = db.init_db(url)
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


def current_reviewer() -> str | None:
    """Who is acting: the signed-in user when Streamlit auth is configured, else the sidebar name."""
    try:
        user = st.user
        if getattr(user, "is_logged_in", False):
            name = user.get("email") or user.get("name")
            if name:
                return str(name)
    except Exception:  # st.user raises when authentication is not configured
        log.debug("st.user unavailable", exc_info=True)
    name = str(st.session_state.get(REVIEWER_KEY, "") or "").strip()
    return name or None


def reviewer_sidebar() -> None:
    """The sidebar field asking for the reviewer's name once per browser session."""
    with st.sidebar:
        st.text_input(
            "Your name (recorded with every change)",
            key=REVIEWER_KEY,
            placeholder="e.g. ayse",
            max_chars=200,
        )
        if not current_reviewer():
            st.caption("Enter your name to review, add notes or import data.")


def require_reviewer(action: str = "make changes") -> str | None:
    """The reviewer's name, or None after telling the user to enter it first."""
    name = current_reviewer()
    if not name:
        st.warning(f"Enter your name in the sidebar to {action}.", icon="👤")
    return name


def csv_download(frame: pd.DataFrame, filename: str, *, key: str, label: str = "Download CSV") -> None:
    """A download button for exactly the rows shown, with spreadsheet formulas neutralised."""
    from lib.export import frame_to_csv_bytes

    st.download_button(label, data=frame_to_csv_bytes(frame), file_name=filename, mime="text/csv", key=key)


def pager(total: int, *, key: str, page_size: int | None = None) -> tuple[int, int]:
    """A page selector; returns (offset, limit) so the query fetches one page only.

    A page number left over from more matches (the filters changed) falls back to the first page.
    """
    size = page_size or get_settings().page_size
    pages = max(1, math.ceil(total / size))
    if st.session_state.get(key, 1) > pages:
        st.session_state.pop(key, None)
    if pages == 1:
        return 0, size
    page = st.number_input(f"Page (of {pages})", min_value=1, max_value=pages, value=1, step=1, key=key)
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
    """Why LLM actions are disabled, or None when an LLM is configured."""
    if get_settings().llm_configured:
        return None
    return (
        "No LLM is configured, so judging, coaching and second opinions are disabled. "
        "Set OPENAI_API_KEY (and OPENAI_BASE_URL for any OpenAI-compatible server such as "
        "vLLM, Ollama or LiteLLM), then restart. Everything else works without it."
    )
