"""Analytics: how often the judge agrees with the human scores, per metric, per gap size and per
week (Judge vs human), each judge version's agreement with reviewers (Judge versions), and how well
reviewers agree with each other (Reviewers)."""

import streamlit as st

from lib import agreement, alignment, analytics, display
from lib.analytics_charts import agreement_figure, gap_histogram_figure, weekly_trend_figure
from lib.analytics_charts import gap_products as gap_products_of
from lib.ui import csv_download, session_scope
from lib.ui.agreement import reviewers_tab
from lib.ui.judge_versions import versions_tab
from lib.ui.tables import (
    count_column,
    date_column,
    link_to,
    number_column,
    percent_column,
    rate_column,
    show_table,
)

ANY = "Any"


def judge_vs_human() -> None:
    """The judge-vs-human tab; returns early on an empty state (st.stop would end the other tab too)."""
    st.caption(
        "Judge vs human, metric by metric on each metric's own scale. The human side is the user scores "
        "stored with each evaluation (not reviewers' decisions on judgments); archived evaluations are "
        "left out. Exact: equal scores. Within-1: |user − judge| at most one step of the 1–5 span, rescaled "
        "to the metric's scale. Weighted kappa: Cohen's kappa with quadratic weights, integer scales only "
        "(n/a on continuous scales or when undefined). Spearman: rank correlation."
    )

    with session_scope(read_only=True) as session:
        options = analytics.load_filter_options(session=session)
    if options.first_day is None:  # no live evaluation at all (products lists only those with pairs)
        st.info(
            "No evaluations yet. Import or create evaluations with user and judge scores to see agreement."
        )
        return

    cols = st.columns(3)
    products = cols[0].multiselect(
        "Products", options.products, key="analytics_products", placeholder="All products"
    )
    language = cols[1].selectbox("Language", [ANY, *options.languages], key="analytics_language")
    days = cols[2].date_input(
        "Created between (UTC)", value=(options.first_day, options.last_day), key="analytics_dates"
    )
    filters = analytics.filters_from_widgets(products, None if language == ANY else language, days)

    with session_scope(read_only=True) as session:
        report = analytics.load_report(session=session, filters=filters)
    if report.empty:
        st.info(
            "No metric was scored by both the user and the judge in the evaluations matching these filters."
        )
        return

    with session_scope(read_only=True) as session:
        ceiling = agreement.human_ceiling(session=session, filters=filters)
    st.subheader("Agreement per metric")
    st.plotly_chart(agreement_figure(report.metrics, ceiling=ceiling), key="analytics_agreement_chart")
    show_table(
        analytics.display_frame(report),
        key="analytics_metrics_table",
        columns={
            "pairs": count_column("Pairs", help="Metric scores with both a user's score and a judge's score")
        },
    )
    csv_download(
        report.metrics, "agreement_per_metric.csv", key="analytics_metrics_csv", label="Download (CSV)"
    )
    if not ceiling.empty:
        st.markdown("**Human vs human ceiling**")
        st.caption(
            "The black ticks over the bars: on the items two or more reviewers labelled in team queues "
            "(final labels), how well the reviewers agree with each other, beside the judge against "
            "those same reviewers. A judge cannot be expected to agree with people more than they agree "
            "with each other; a judge near the ceiling is as good as another reviewer."
        )
        show_table(
            ceiling,
            key="analytics_ceiling_table",
            columns={
                "items": count_column("Items", help="Items with two or more reviewers' labels"),
                "human_pairs": count_column("Reviewer pairs"),
                "human_exact_agreement": percent_column("Reviewers: exact"),
                "human_within_1_agreement": percent_column("Reviewers: within 1"),
                "human_weighted_kappa": number_column("Reviewers: kappa", decimals=3),
                "human_spearman": number_column("Reviewers: Spearman", decimals=3),
                "judge_pairs": count_column("Judge–reviewer pairs"),
                "judge_exact_agreement": percent_column("Judge: exact"),
                "judge_within_1_agreement": percent_column("Judge: within 1"),
                "judge_weighted_kappa": number_column("Judge: kappa", decimals=3),
                "judge_spearman": number_column("Judge: Spearman", decimals=3),
            },
        )
        csv_download(
            ceiling, "human_ceiling_per_metric.csv", key="analytics_ceiling_csv", label="Download (CSV)"
        )
    with session_scope(read_only=True) as session:
        latest_experiments = alignment.latest_per_product(session)
    for product, experiment_id in latest_experiments.items():
        link_to(
            "pages/alignment.py",
            f"Latest alignment experiment for {product} (#{experiment_id})",
            url_path=display.ALIGNMENT_PATH,
            query={"experiment": str(experiment_id)},
            icon="🧪",
        )

    st.subheader("Gap distributions")
    st.caption(
        "How far apart judge and human are: |user − judge| rescaled to the 1–5 span, in buckets of 0.5, "
        "as the share of each metric's pairs (n in each panel's title); one panel per metric."
    )
    gap_products = gap_products_of(report.gaps)
    gap_product = (
        st.selectbox("Product", gap_products, key="analytics_gaps_product") if len(gap_products) > 1 else None
    )
    st.plotly_chart(gap_histogram_figure(report.gaps, product=gap_product), key="analytics_gaps_chart")
    show_table(
        report.gaps,
        key="analytics_gaps_table",
        columns={
            "gap_bucket": number_column(
                "Gap from", decimals=1, help="Bucket start, |user − judge| on the 1–5 span"
            ),
            "pairs": count_column("Pairs"),
        },
    )
    csv_download(report.gaps, "gap_distribution.csv", key="analytics_gaps_csv", label="Download (CSV)")

    st.subheader("Trend per week")
    st.plotly_chart(weekly_trend_figure(report.weekly), key="analytics_weekly_chart")
    show_table(
        report.weekly,
        key="analytics_weekly_table",
        columns={
            "week": date_column("Week of"),
            "pairs": count_column("Pairs", help="User–judge score pairs behind the week's rates"),
            "exact_agreement": rate_column("Exact agreement"),
            "within_1_agreement": rate_column("Within 1"),
        },
    )
    csv_download(report.weekly, "agreement_per_week.csv", key="analytics_weekly_csv", label="Download (CSV)")


st.title("Analytics")
judge_tab, versions, reviewers = st.tabs(["Judge vs human", "Judge versions", "Reviewers"])
with judge_tab:
    judge_vs_human()
with versions:
    versions_tab(key="analytics_versions")
with reviewers:
    reviewers_tab(key="analytics_reviewers")
