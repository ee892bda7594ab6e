"""Tables as reviewers read them: one `show_table` and the column types every page shares.

Why one home: a rate is a progress bar everywhere, a score says its scale, a date reads the same on
every page, a missing value shows "—" (never Streamlit's grey "None"), a row that has a detail page
links to it, and a page of rows is shown whole (Streamlit's default height shows about ten rows).
Pages pass a display frame built in `lib` and a `columns` mapping built from these helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitPageNotFoundError

from lib.display import page_url
from lib.safe_markdown import escape_markdown

MISSING = "—"
# Glide's default row height plus the header row; `height="content"` is capped by Streamlit at
# 10,000 px, so very long frames get a fixed height and scroll inside the table instead.
ROW_PX = 35
MAX_CONTENT_ROWS = 60

ColumnConfig = Any  # streamlit's ColumnConfig TypedDict, or a label string, or None (hide)


def link_column(label: str, *, text: str = "Open", help: str | None = None) -> ColumnConfig:
    """A column of in-app URLs (see lib.display) that shows `text` and opens the linked detail."""
    return st.column_config.LinkColumn(label, display_text=text, help=help, width="small", pinned=True)


def title_column(label: str = "Question", *, help: str | None = None) -> ColumnConfig:
    """The row's title (an evaluation's question's first line): wide enough to read, not to crowd."""
    return st.column_config.TextColumn(label, width="medium", help=help)


def text_column(label: str, *, width: str | None = None, help: str | None = None) -> ColumnConfig:
    """Plain text (cells of st.dataframe are never rendered as Markdown, so no escaping is needed)."""
    return st.column_config.TextColumn(label, width=width, help=help)  # type: ignore[arg-type]


def rate_column(label: str, *, help: str | None = None, width: int | str | None = None) -> ColumnConfig:
    """A share between 0 and 1, drawn as a bar with its percentage.

    Blue, not the theme's red: a rate is a measurement, and red would read as an alarm at any value.
    """
    return st.column_config.ProgressColumn(
        label,
        min_value=0.0,
        max_value=1.0,
        format="percent",
        help=help,
        color="blue",
        width=width,  # type: ignore[arg-type]
    )


def score_column(
    label: str, *, low: float | None = None, high: float | None = None, help: str | None = None
) -> ColumnConfig:
    """A score on its metric's scale: the scale goes into the header's tooltip (e.g. "scale 1–5")."""
    scale = f"Scale {low:g}–{high:g}." if low is not None and high is not None else None
    tip = " ".join(part for part in (help, scale) if part) or None
    return st.column_config.NumberColumn(label, format="%g", help=tip)


def gap_column(label: str = "Gap", *, help: str | None = None) -> ColumnConfig:
    """A judge–reviewer gap rescaled to the 1–5 span (0–4), two decimals."""
    return st.column_config.NumberColumn(
        label,
        format="%.2f",
        help=help or "|user − judge|, rescaled to the 1–5 span: 0 agrees, 4 is opposite.",
    )


def count_column(label: str, *, help: str | None = None) -> ColumnConfig:
    """A whole count with thousands separators."""
    return st.column_config.NumberColumn(label, format="localized", help=help)


def number_column(label: str, *, decimals: int = 2, help: str | None = None) -> ColumnConfig:
    """A measurement with a fixed number of decimals."""
    return st.column_config.NumberColumn(label, format=f"%.{decimals}f", help=help)


def percent_column(label: str, *, help: str | None = None) -> ColumnConfig:
    """A share between 0 and 1 shown as a percentage, without a bar (for values that are not progress)."""
    return st.column_config.NumberColumn(label, format="percent", help=help)


def datetime_column(label: str = "When (UTC)", *, help: str | None = None) -> ColumnConfig:
    """A UTC timestamp to the minute: the same format on every page."""
    return st.column_config.DatetimeColumn(label, format="YYYY-MM-DD HH:mm", help=help)


def date_column(label: str = "Day", *, help: str | None = None) -> ColumnConfig:
    """A calendar day."""
    return st.column_config.DateColumn(label, format="YYYY-MM-DD", help=help)


def check_column(label: str, *, help: str | None = None) -> ColumnConfig:
    """A yes/no flag as a read-only checkbox."""
    return st.column_config.CheckboxColumn(label, help=help)


def table_height(rows: int) -> int | str:
    """Tall enough for every row of a page (Streamlit's default shows ~10), scrolling past 60 rows."""
    return "content" if rows <= MAX_CONTENT_ROWS else (MAX_CONTENT_ROWS + 1) * ROW_PX + 3


def show_table(
    frame: pd.DataFrame,
    *,
    key: str,
    columns: Mapping[str, ColumnConfig] | None = None,
    order: list[str] | None = None,
    on_select: str = "ignore",
    alt: str | None = None,
) -> Any:
    """Show `frame` with its column types, every row visible, "—" for missing values, no index.

    `columns` maps frame columns to configs (None hides one); `order`, when given, lists the
    columns shown and their order (the useful ones first, so the gap and review state fit a
    1400 px window); the frame keeps the rest for selection and download. With
    `on_select="rerun"` one row can be selected and the selection state is returned.
    """
    options: dict[str, Any] = {}
    if on_select != "ignore":
        options = {"on_select": on_select, "selection_mode": "single-row"}
    return st.dataframe(
        frame,
        key=key,
        hide_index=True,
        column_config=dict(columns or {}),
        column_order=[c for c in order if c in frame.columns] if order else None,
        height=table_height(len(frame)),  # type: ignore[arg-type]
        placeholder=MISSING,
        alt=alt,
        **options,
    )


def link_to(
    page: str,
    label: str,
    *,
    url_path: str,
    query: Mapping[str, str] | None = None,
    icon: str | None = None,
    help: str | None = None,
    disabled: bool = False,
) -> None:
    """A link to another page with query parameters (a deep link the target page honours); `label`
    is plain text (escaped here).

    Inside the app it is an `st.page_link` (no reload); a page run on its own (under test, or
    outside `st.navigation`) gets a plain Markdown link with the same relative URL instead.
    """
    params = {k: str(v) for k, v in (query or {}).items()}
    text = escape_markdown(label)  # `label` is plain text; both renderings read Markdown
    try:
        st.page_link(page, label=text, icon=icon, query_params=params or None, help=help, disabled=disabled)
    except StreamlitPageNotFoundError:
        text = f"{icon} {text}" if icon else text
        st.markdown(text if disabled else f"[{text}]({page_url(url_path, params)})", help=help)
