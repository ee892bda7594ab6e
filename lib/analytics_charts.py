"""Analytics charts (DataFrame → plotly Figure): agreement per metric, gap histograms, weekly trend.

No streamlit here. Product and metric names come from imported data, so every label taken from data goes through
`plotly_text` (HTML-escaped) and hover templates refer to names as `%{fullData.name}` instead of
pasting them in, so a name containing `%{...}` is not read as a template.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lib.charts import plotly_text

AGREEMENT_SERIES = {
    "exact_agreement": "Exact agreement",
    "within_1_agreement": "Within-1 agreement",
    "weighted_kappa": "Weighted kappa (quadratic)",
    "spearman": "Spearman ρ",
}


def metric_label(product: object, metric_name: object, *, with_product: bool) -> str:
    """How a metric is named on an axis: "product · Metric" when several products are shown."""
    text = f"{product} · {metric_name}" if with_product else str(metric_name)
    return plotly_text(text)


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, annotations=[{"text": message, "showarrow": False}])
    return fig


def agreement_figure(frame: pd.DataFrame, *, title: str = "Judge vs human agreement per metric") -> go.Figure:
    """Grouped bars per metric: exact, within-1, kappa and Spearman (all on −1…1); n/a bars are left out.

    `frame` has the columns of `lib.analytics.AgreementReport.metrics`.
    """
    if frame.empty:
        return _empty(title, "No scored pairs")
    several = frame["product"].nunique() > 1
    labels = [metric_label(r.product, r.metric_name, with_product=several) for r in frame.itertuples()]
    fig = go.Figure()
    for column, name in AGREEMENT_SERIES.items():
        values = pd.to_numeric(frame[column], errors="coerce")
        fig.add_trace(
            go.Bar(
                x=labels,
                y=values,
                name=name,
                customdata=frame["pairs"],
                hovertemplate=f"%{{x}}<br>{name}: %{{y:.3f}}<br>pairs: %{{customdata}}<extra></extra>",
            )
        )
    fig.update_layout(
        title=title, barmode="group", yaxis={"range": [-1, 1], "title": "value"}, legend_title_text=""
    )
    return fig


def gap_histogram_figure(
    frame: pd.DataFrame, *, title: str = "Gap distribution (|user − judge| on 1–5)"
) -> go.Figure:
    """Bars per rescaled-gap bucket, one series per metric: how far apart judge and human are.

    `frame` has the columns of `lib.analytics.AgreementReport.gaps`.
    """
    if frame.empty:
        return _empty(title, "No scored pairs")
    several = frame["product"].nunique() > 1
    fig = go.Figure()
    for (product, _metric), rows in frame.groupby(["product", "metric"], sort=False):
        label = metric_label(product, rows["metric_name"].iloc[0], with_product=several)
        fig.add_trace(
            go.Bar(
                x=rows["gap_bucket"],
                y=rows["pairs"],
                name=label,
                hovertemplate="%{fullData.name}<br>gap ≥ %{x}: %{y} pairs<extra></extra>",
            )
        )
    fig.update_layout(
        title=title,
        barmode="group",
        xaxis={"title": "rescaled gap (bucket start)", "dtick": 0.5},
        yaxis={"title": "pairs"},
        legend_title_text="",
    )
    return fig


def weekly_trend_figure(frame: pd.DataFrame, *, title: str = "Exact agreement per week") -> go.Figure:
    """One line per product: the share of metric scores where judge and human agree exactly, per week.

    `frame` has the columns of `lib.analytics.AgreementReport.weekly`.
    """
    if frame.empty:
        return _empty(title, "No scored pairs")
    fig = go.Figure()
    for product, rows in frame.groupby("product", sort=True):
        name = plotly_text(product)
        fig.add_trace(
            go.Scatter(
                x=rows["week"],
                y=rows["exact_agreement"],
                mode="lines+markers",
                name=name,
                customdata=rows[["pairs", "within_1_agreement"]].to_numpy(),
                hovertemplate=(
                    "%{fullData.name}<br>week of %{x|%Y-%m-%d}<br>exact: %{y:.1%}"
                    "<br>within-1: %{customdata[1]:.1%}<br>pairs: %{customdata[0]}<extra></extra>"
                ),
            )
        )
    fig.update_layout(
        title=title,
        yaxis={"range": [0, 1], "tickformat": ".0%", "title": "exact agreement"},
        legend_title_text="",
    )
    return fig
