"""Overview: where the review stands, at a glance."""

import streamlit as st

from lib import counters, overview
from lib.charts import evidence_state_figure
from lib.notes import SESSION_COUNT_CAP
from lib.ui import csv_download, session_scope
from lib.ui.tables import (
    count_column,
    datetime_column,
    link_column,
    link_to,
    rate_column,
    show_table,
    text_column,
)

st.title("Overrule")
st.caption("Review what the AI judge decided, overrule it where it is wrong, and watch it improve.")

with session_scope(read_only=True) as session:
    stats = overview.overview_stats(session=session)
    products = overview.per_product_frame(session=session)
    activity = overview.recent_activity(session=session)
    metric_sets = overview.metric_sets_frame(session=session)

if stats.evaluations == 0 and stats.judgments == 0:
    st.info(
        "The database is empty. Import evaluations with `python -m lib import FILE`, "
        "or load the demo data set with `python -m lib demo`."
    )


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def _list_link(name: str) -> None:
    """The link under a figure to the filtered list it counts (lib.overview.FIGURE_LINKS)."""
    target = overview.FIGURE_LINKS[name]
    link_to(target.page, f"{target.label} →", url_path=target.path, query=target.params)


cols = st.columns(5)
with cols[0]:
    st.metric("Evaluations", f"{stats.evaluations:,}", help=f"{stats.archived:,} archived, not counted")
    _list_link("evaluations")
with cols[1]:
    st.metric("Pending reviews", f"{stats.pending_reviews:,}", help=f"of {stats.judgments:,} judgments")
    _list_link("pending")
with cols[2]:
    st.metric("Agreement rate", _pct(stats.agreement_rate), help="Reviewed judgments the reviewer confirmed")
    _list_link("agreement")
with cols[3]:
    st.metric(
        counters.CORRECTED_OF_REVIEWED_LABEL,
        _pct(stats.corrected_of_reviewed),
        help=f"{counters.CORRECTED_OF_REVIEWED_HELP} {stats.corrected:,} of {stats.reviewed:,} reviewed.",
    )
    _list_link("correction")
with cols[4]:
    st.metric(
        "Evidence verified", _pct(stats.verification_rate), help=f"{stats.evidence_total:,} evidence items"
    )
    _list_link("evidence")

cols = st.columns(4)
cols[0].metric("Products", f"{stats.products:,}", help=overview.PRODUCTS_HELP)
cols[1].metric(
    "Second-opinion agreement",
    _pct(stats.second_opinion_agreement),
    help=(
        f"{stats.second_opinions:,} second opinions: {stats.second_opinion_validated:,} validated, "
        f"{stats.second_opinion_improved:,} improved, {stats.second_opinion_questioned:,} questioned"
    ),
)
with cols[2]:
    st.metric(
        "Session notes",
        counters.count_label(stats.notes),  # both capped: lib.notes.notes_health
        help=f"from {counters.count_label(stats.note_sessions, SESSION_COUNT_CAP)} sessions",
    )
    _list_link("notes")
# The day fits a quarter of the page at 1400 px; the minute is in the help.
cols[3].metric(
    "Latest note",
    f"{stats.latest_note:%Y-%m-%d}" if stats.latest_note else "—",
    help=f"{stats.latest_note:%Y-%m-%d %H:%M} UTC" if stats.latest_note else None,
)

# Each table and chart takes the page's width: side by side, the per-product table scrolled
# sideways and the evidence labels were cut at 1400 px (issue 25).
st.subheader("Per product")
show_table(
    products,
    key="overview_products",
    order=["link", "product", "corrected_of_reviewed", "pending", "evaluations", "judgments"],
    alt="Evaluations and review progress per product",
    columns={
        "link": link_column(
            "", text="List", help="The product's evaluations (its judgments when it has no evaluation)"
        ),
        "product": text_column("Product"),
        "evaluations": count_column("Evaluations", help="Live evaluations (archived left out)"),
        "pending": count_column("Pending", help="Judgments not reviewed yet"),
        "judgments": count_column("Judgments"),
        "corrected_of_reviewed": rate_column(
            counters.CORRECTED_OF_REVIEWED_LABEL, help="Corrected ÷ reviewed judgments", width=130
        ),
    },
)
csv_download(products, "products.csv", key="overview_products_csv")

st.subheader("Evidence verification")
evidence = overview.evidence_state_frame(stats)
if stats.evidence_total:
    st.plotly_chart(evidence_state_figure(evidence), key="overview_evidence_chart")
else:
    st.caption("No evidence recorded yet.")
csv_download(evidence, "evidence_verification.csv", key="overview_evidence_csv")

st.subheader("Recent activity")
if activity.empty:
    st.caption("Nothing has happened yet.")
else:
    show_table(
        activity,
        key="overview_activity",
        order=["link", "when", "who", "what"],
        alt="The latest reviews and evaluations",
        columns={
            "link": link_column("", help="Open what changed: the evaluation, or the judgment on Corrections"),
            "when": datetime_column("When (UTC)"),
            "who": text_column("Who"),
            "what": text_column("What", width="large"),
        },
    )
    csv_download(activity, "recent_activity.csv", key="overview_activity_csv")

with st.expander("Metric sets (rubrics and scales)"):
    show_table(
        metric_sets, key="overview_metric_sets", columns={"rubric": text_column("Rubric", width="large")}
    )
    csv_download(metric_sets, "metric_sets.csv", key="overview_metric_sets_csv")
