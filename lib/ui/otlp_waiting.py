"""The Admin page's "OpenTelemetry: waiting" section: what the OTLP receiver keeps waiting for its
other half, why, what the sender should change, what it forgot, and what its answers refused or
warned of lately (lib.otlp_waiting).

Leads see it as admins do: they own the pipelines that export to Overrule (OTLP takes a lead's token).
"""

from __future__ import annotations

import functools

import streamlit as st

from lib import otlp_waiting
from lib.otlp_table import PENDING_DAYS
from lib.ui import csv_download_all, get_engine, session_scope
from lib.ui.tables import check_column, count_column, datetime_column, show_table, text_column

SHOWN = 50  # the oldest rows in the table; the download holds them all
CLASSED = otlp_waiting.CLASSED  # rows of verdicts counted by why (the oldest); the download classes all
FIRST = ("waiting_since", "what", "advice")  # the table's first columns: what waits, and what to change


def otlp_waiting_section() -> None:
    """Whether anything waits; opened, counts by why, the oldest rows, the whole list as CSV; and
    what was forgotten."""
    st.subheader("OpenTelemetry: waiting")
    st.caption(
        "The OTLP receiver keeps a GenAI span until its verdicts come, and verdicts until their call "
        f"comes, for {PENDING_DAYS} days (docs/opentelemetry.md). Calls no judge looked at wait here "
        "as a matter of course; verdicts waiting long usually mean the sender should change how it "
        "emits them: each row says what."
    )
    _waiting()


@st.fragment
def _waiting() -> None:
    """Closed (the default), one indexed look-up: reading what waits grows with it (~0.3 CPU s per
    100k waiting rows), and the roles and tokens forms above rerun the whole page on every click.
    A fragment, so opening and closing it reruns this section only."""
    opened = st.toggle(
        "Show what waits",
        key="admin_otlp_open",
        help="How many rows wait, why, the oldest, and the whole list as CSV. Off, the rest of the page "
        "does not pay for reading them.",
    )
    with session_scope(read_only=True) as session:
        if not opened:
            st.caption(
                "Rows wait: show them for how many, why, and what the sender should change."
                if otlp_waiting.anything_waits(session)
                else otlp_waiting.NOTHING
            )
            st.caption(otlp_waiting.swept(session).describe())
            return
        waiting = otlp_waiting.read(session, limit=SHOWN, classed=CLASSED)
        refused = otlp_waiting.refused(session, otlp_waiting.REFUSED_SHOWN)
    if not waiting.counts:
        st.caption(otlp_waiting.NOTHING)
    else:
        counts, rows = otlp_waiting.frames(waiting)
        show_table(
            counts,
            key="admin_otlp_counts",
            columns={
                "why": text_column("Waiting", width="large"),
                "rows": count_column("Rows"),
                "verdicts": count_column("Verdicts", help="evaluation events the rows hold"),
                "oldest": datetime_column("Oldest since (UTC)"),
            },
        )
        if waiting.unclassed:
            st.caption(
                f"Rows of verdicts are counted by why among the oldest {CLASSED:,} only: "
                f"{waiting.unclassed:,} newer ones wait besides. The download and `python -m lib "
                "otlp waiting` class them all."
            )
        shown = len(waiting.rows)
        if waiting.total > shown:
            st.caption(f"The oldest {shown:,} of {waiting.total:,} rows; the download holds them all.")
        show_table(
            rows,
            key="admin_otlp_waiting_table",
            # What to change right after what waits: the reason the section exists, on screen
            # without scrolling the table sideways (review18 M5).
            order=[*FIRST, *(c for c in otlp_waiting.COLUMNS if c not in FIRST and c != "why")],
            columns={
                "waiting_since": datetime_column("Since (UTC)"),
                "what": text_column("What"),
                "why": None,
                "trace_id": text_column("Trace id"),
                "span_id": text_column("Span id"),
                "response_id": text_column("Response id"),
                "span_name": text_column("Span"),
                "product": text_column("Product"),
                "evaluations": text_column("Evaluations"),
                "advice": text_column("Why, and what to change", width="large"),
            },
        )
        engine = get_engine()
        csv_download_all(
            f"Download CSV (all {waiting.total:,} row{'' if waiting.total == 1 else 's'})",
            "otlp-waiting.csv",
            chunks=functools.partial(otlp_waiting.csv_chunks, engine),
            data=lambda: b"".join(otlp_waiting.csv_chunks(engine)),
            key="admin_otlp_csv",
        )
    st.caption(waiting.swept.describe())  # numbers and dates only: nothing to escape
    _refused(refused)


def _refused(refused: list[otlp_waiting.Refusal]) -> None:
    """The latest answers that rejected something or warned (review18 L6: the SDK's exporters never
    read them, and the server's log was the one place they were seen), the sender's text in cells."""
    st.markdown("**Refused or warned of lately**")
    if not refused:
        st.caption(otlp_waiting.NOTHING_REFUSED)
        return
    st.caption(
        f"The latest {len(refused):,} OTLP requests whose answer rejected spans or log records, or "
        "warned of what was not taken (the rest of each request was stored). The audit trail below "
        f"keeps them all ({otlp_waiting.REFUSED_ACTION})."
    )
    show_table(
        otlp_waiting.refused_frame(refused),
        key="admin_otlp_refused_table",
        columns={
            "at": datetime_column("When (UTC)"),
            "signal": text_column("Signal"),
            "token": text_column("Token"),
            "rejected": count_column("Rejected"),
            "warning": check_column("Warning", help="nothing rejected: the request was stored"),
            "messages": text_column("What the answer said", width="large"),
        },
    )
