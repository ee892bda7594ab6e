"""Overview: where the review stands, at a glance."""

import streamlit as st

from lib import overview
from lib.ui import csv_download, session_scope

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


cols = st.columns(5)
cols[0].metric("Evaluations", f"{stats.evaluations:,}", help=f"{stats.archived:,} archived, not counted")
cols[1].metric("Pending reviews", f"{stats.pending_reviews:,}", help=f"of {stats.judgments:,} judgments")
cols[2].metric("Agreement rate", _pct(stats.agreement_rate), help="Reviewed judgments the reviewer confirmed")
cols[3].metric(
    "Correction rate", _pct(stats.correction_rate), help=f"{stats.corrected:,} of {stats.reviewed:,} reviewed"
)
cols[4].metric(
    "Evidence verified", _pct(stats.verification_rate), help=f"{stats.evidence_total:,} evidence items"
)

cols = st.columns(4)
cols[0].metric("Products", f"{stats.products:,}")
cols[1].metric(
    "Second-opinion agreement",
    _pct(stats.second_opinion_agreement),
    help=(
        f"{stats.second_opinions:,} second opinions: {stats.second_opinion_validated:,} validated, "
        f"{stats.second_opinion_improved:,} improved, {stats.second_opinion_questioned:,} questioned"
    ),
)
cols[2].metric("Session notes", f"{stats.notes:,}", help=f"from {stats.note_sessions:,} sessions")
cols[3].metric("Latest note", stats.latest_note.strftime("%Y-%m-%d %H:%M") if stats.latest_note else "—")

left, right = st.columns(2)
with left:
    st.subheader("Evidence verification")
    evidence = overview.evidence_state_frame(stats)
    if stats.evidence_total:
        st.bar_chart(evidence, x="state", y="items", horizontal=True)
    else:
        st.caption("No evidence recorded yet.")
    csv_download(evidence, "evidence_verification.csv", key="overview_evidence_csv")
with right:
    st.subheader("Per product")
    st.dataframe(
        products,
        hide_index=True,
        key="overview_products",
        column_config={"correction_rate": st.column_config.NumberColumn("correction rate", format="percent")},
    )
    csv_download(products, "products.csv", key="overview_products_csv")

st.subheader("Recent activity")
if activity.empty:
    st.caption("Nothing has happened yet.")
else:
    st.dataframe(activity, hide_index=True, key="overview_activity")
    csv_download(activity, "recent_activity.csv", key="overview_activity_csv")

with st.expander("Metric sets (rubrics and scales)"):
    st.dataframe(metric_sets, hide_index=True, key="overview_metric_sets")
    csv_download(metric_sets, "metric_sets.csv", key="overview_metric_sets_csv")
