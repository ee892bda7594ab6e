"""Agreement between reviewers on screen: Analytics' Reviewers tab and the per-queue figures.

`reviewers_tab` is the whole tab; `queue_agreement` shows one queue's figures (the queue page
calls it). Both read lib.agreement and draw with lib.agreement_charts; every table shown can be
downloaded as CSV with its numbers (the table shows intervals as text).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from lib import agreement
from lib.agreement import AgreementFilters, ReviewerAgreement
from lib.agreement_charts import anchoring_figure, calibration_figure, pairs_heatmap, reliability_figure
from lib.config import get_settings
from lib.ui import csv_download, session_scope
from lib.ui.tables import count_column, percent_column, show_table, text_column

ALL_QUEUES = "All queues"
# Shown tables leave out what another column already says (the metric's slug beside its name, the
# queue id beside its name) so the figures fit the page; the CSVs keep every column.
_REDUNDANT = ["metric", "queue_id"]


def _shown(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in _REDUNDANT if c in frame.columns])


@st.cache_data(max_entries=32, show_spinner="Computing agreement between reviewers…")
def _cached_agreement(url: str, filters: AgreementFilters, version: tuple[object, ...]) -> ReviewerAgreement:
    """The figures for these filters as of `version` (lib.agreement.labels_version): a new label,
    undo or adjudication changes the version, so a cached result is never stale; bootstraps are
    not redone on every rerun of the page."""
    del version  # part of the cache key only
    with session_scope(read_only=True) as session:
        return agreement.load_agreement(session=session, filters=filters)


def load_cached(filters: AgreementFilters) -> ReviewerAgreement:
    """`lib.agreement.load_agreement` for the app's database, cached per filters and label version."""
    with session_scope(read_only=True) as session:
        version = agreement.labels_version(session=session)
    return _cached_agreement(get_settings().database_url, filters, version)


RELIABILITY_HELP = (
    "**Krippendorff's α**: 1 = reviewers always agree, 0 = no better than chance, below 0 = worse; "
    "ordinal on whole-number scales (a 4 against a 5 counts less than a 1 against a 5), interval on "
    "continuous ones, nominal on labels. A common reading: α ≥ 0.8 reliable, 0.667–0.8 tentative. "
    "**Exact / within-1**: the share of pairs of labels on the same item that are equal, or at most "
    "one step of the 1–5 span apart (rescaled to each metric's scale). **Mean pairwise kappa**: the "
    "average of each two reviewers' Cohen's kappa (quadratic weights on whole-number scales, none on "
    "labels; n/a on continuous scales). Brackets hold the 95 % bootstrap interval over items: with "
    "few items it is wide, and two metrics whose intervals overlap cannot be told apart."
)


def _reliability_columns() -> dict[str, object]:
    return {
        "items": count_column("Items", help="Items two or more reviewers labelled"),
        "single_label_items": count_column("One label", help="Items with one label so far: not counted"),
        "labels": count_column("Labels"),
        "reviewers": count_column("Reviewers"),
        "alpha": text_column("α [95 %]"),
        "exact_agreement": text_column("Exact [95 %]"),
        "within_1_agreement": text_column("Within 1 [95 %]"),
        "mean_pairwise_kappa": text_column("Mean pairwise κ"),
    }


def show_reliability(result: ReviewerAgreement, *, key: str, by_queue: bool) -> None:
    """The per-metric chart and table (and the per-queue table when asked), each with its CSV."""
    st.plotly_chart(reliability_figure(result.metrics), key=f"{key}_reliability_chart")
    show_table(
        _shown(agreement.reliability_display(result.metrics)),
        key=f"{key}_reliability_table",
        columns=_reliability_columns(),
    )
    csv_download(result.metrics, "reviewer_agreement_per_metric.csv", key=f"{key}_reliability_csv")
    if by_queue and result.queues["queue_id"].nunique() > 1:
        st.markdown("**Per queue**")
        show_table(
            _shown(agreement.reliability_display(result.queues)),
            key=f"{key}_queues_table",
            columns=_reliability_columns(),
        )
        csv_download(result.queues, "reviewer_agreement_per_queue.csv", key=f"{key}_queues_csv")


def show_pairs(result: ReviewerAgreement, *, key: str) -> None:
    """Each two reviewers on one metric: a heatmap and the table of every pair."""
    pairs = result.pairs
    if pairs.empty:
        st.info("No two reviewers have labelled the same item yet.")
        return
    choices = list(dict.fromkeys(zip(pairs["product"], pairs["metric"], pairs["metric_name"], strict=True)))
    labels = [f"{p} · {name}" for p, _m, name in choices]
    cols = st.columns(2)
    picked = cols[0].selectbox(
        "Metric", range(len(choices)), format_func=labels.__getitem__, key=f"{key}_pair_metric"
    )
    product, metric, _name = choices[picked or 0]
    part = pairs[(pairs["product"] == product) & (pairs["metric"] == metric)]
    kappa_available = part["kappa"].notna().any()
    measure = cols[1].radio(
        "Show",
        ["kappa", "exact_agreement"] if kappa_available else ["exact_agreement"],
        format_func={"kappa": "Cohen's kappa", "exact_agreement": "Exact agreement"}.__getitem__,
        horizontal=True,
        key=f"{key}_pair_measure",
    )
    st.plotly_chart(pairs_heatmap(part, measure=measure), key=f"{key}_pairs_chart")
    show_table(
        _shown(agreement.pairs_display(part)),
        key=f"{key}_pairs_table",
        columns={
            "reviewer_a": text_column("Reviewer"),
            "reviewer_b": text_column("and reviewer"),
            "items": count_column("Shared items"),
            "exact_agreement": percent_column("Exact"),
            "within_1_agreement": percent_column("Within 1"),
            "kappa": text_column("κ [95 %]"),
            "kappa_weights": text_column("κ weights"),
        },
    )
    csv_download(pairs, "reviewer_pairs.csv", key=f"{key}_pairs_csv")


def show_calibration(result: ReviewerAgreement, *, key: str) -> None:
    st.caption(
        "Each reviewer's final labels against the decision their items were resolved to (agreement "
        "or a lead's adjudication). **Mean signed difference**: above 0 they score higher than the "
        "decision, below 0 lower (on the metric's scale, and on the 1–5 span to compare metrics; 95 % "
        "normal interval). **Adjudications against them**: of the disputed items they labelled that a "
        "lead decided, the share decided otherwise (95 % Wilson interval)."
    )
    if result.calibration.empty:
        st.info("No labelled item has been resolved or adjudicated yet.")
        return
    st.plotly_chart(calibration_figure(result.calibration), key=f"{key}_calibration_chart")
    show_table(
        _shown(agreement.calibration_display(result.calibration)),
        key=f"{key}_calibration_table",
        columns={
            "decided": count_column("Decided labels"),
            "mean_signed_difference": text_column("Mean signed diff. [95 %]"),
            "mean_signed_difference_rescaled": text_column("On 1–5 span [95 %]"),
            "differs_from_decision": percent_column("Differs from decision"),
            "adjudicated": count_column("Adjudicated"),
            "adjudicated_against": count_column("Went against them"),
            "adjudicated_against_share": text_column("Share against [95 %]"),
        },
    )
    csv_download(result.calibration, "reviewer_calibration.csv", key=f"{key}_calibration_csv")


def show_anchoring(result: ReviewerAgreement, *, key: str) -> None:
    st.caption(
        "Blind-first queues only: each reviewer's blind label (given before the judge was shown) "
        "against their final label, measured against the judge's score. **Toward the judge**: of the "
        "blind labels that differed from the judge, the share the reviewer moved closer to it (95 % "
        "Wilson interval). **Mean shift toward the judge**: how far, on the 1–5 span, over every label "
        "(0 = unmoved; negative = away). Blind and final exact agreement with the judge show how much "
        "the reveal raised the judge's apparent agreement."
    )
    if result.anchoring.empty:
        st.info("No blind-first label has been revealed and confirmed yet.")
        return
    st.plotly_chart(anchoring_figure(result.anchoring), key=f"{key}_anchoring_chart")
    show_table(
        _shown(agreement.anchoring_display(result.anchoring)),
        key=f"{key}_anchoring_table",
        columns={
            "labels": count_column("Labels"),
            "changed": count_column("Changed"),
            "changed_share": percent_column("Changed share"),
            "could_move": count_column("Blind ≠ judge"),
            "moved_toward_judge": count_column("Toward judge"),
            "toward_share": text_column("Toward share [95 %]"),
            "moved_away": count_column("Away"),
            "mean_shift_toward_judge": text_column("Mean shift [95 %]"),
            "blind_exact_with_judge": percent_column("Blind = judge"),
            "final_exact_with_judge": percent_column("Final = judge"),
        },
    )
    csv_download(result.anchoring, "reviewer_anchoring.csv", key=f"{key}_anchoring_csv")


def reviewers_tab(*, key: str = "reviewers") -> None:
    """Analytics' Reviewers tab: filters, then reliability, reviewer pairs, calibration, anchoring."""
    with session_scope(read_only=True) as session:
        options = agreement.label_options(session=session)
    if not options.queues:
        st.info(
            "No team-queue labels yet. When a lead creates a queue with two or more reviewers per item "
            "(Review page, or `python -m lib queue create --overlap 2`), agreement between reviewers "
            "appears here."
        )
        return
    cols = st.columns(3)
    products = cols[0].multiselect(
        "Products", options.products, key=f"{key}_products", placeholder="All products"
    )
    names = {q.id: q.name for q in options.queues}
    queue = cols[1].selectbox(
        "Queue",
        [None, *names],
        format_func=lambda q: ALL_QUEUES if q is None else names[q],
        key=f"{key}_queue",
    )
    basis = cols[2].radio(
        "Labels",
        agreement.BASES if options.any_blind else agreement.BASES[:1],
        format_func=agreement.BASIS_LABELS.__getitem__,
        horizontal=True,
        key=f"{key}_basis",
        help="Blind labels were given before the judge's score was shown: their agreement is the "
        "reviewers' own. Final labels may have moved toward the judge after the reveal.",
    )
    filters = AgreementFilters(
        products=tuple(products), queue_ids=() if queue is None else (int(queue),), basis=basis
    )
    result = load_cached(filters)
    if result.empty:
        st.info("No labels match these filters.")
        return
    st.subheader("Agreement per metric")
    st.caption(RELIABILITY_HELP)
    if result.metrics.empty:
        st.info("No item has two reviewers' labels yet: agreement needs at least two labels on an item.")
    else:
        show_reliability(result, key=key, by_queue=queue is None)
    st.subheader("Reviewer pairs")
    show_pairs(result, key=key)
    st.subheader("Calibration against the resolved decision")
    show_calibration(result, key=key)
    st.subheader("Anchoring in blind-first queues")
    show_anchoring(result, key=key)


def queue_agreement(*, queue_id: int, key: str = "queue_agreement") -> None:
    """One queue's agreement figures (final labels): what the queue page shows under its progress."""
    result = load_cached(AgreementFilters(queue_ids=(queue_id,)))
    if result.metrics.empty:
        st.info("Agreement appears once two reviewers have labelled the same item.")
        return
    st.caption(RELIABILITY_HELP)
    show_reliability(result, key=key, by_queue=False)
    with st.expander("Reviewer pairs, calibration and anchoring"):
        show_pairs(result, key=key)
        show_calibration(result, key=key)
        show_anchoring(result, key=key)
