"""Analytics charts (DataFrame → plotly Figure): agreement per metric, gap histograms, weekly trend.

No streamlit here. Colours, measure ranges, escaping and the rate-with-sample-size layout come
from `lib.charts`, so these charts read like every other page's.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lib.analytics import GAP_BUCKET
from lib.charts import MEASURES, colors_for, measure_range, plotly_text, rate_figure

AGREEMENT_SERIES = {
    key: MEASURES[key].title
    for key in ("exact_agreement", "within_1_agreement", "weighted_kappa", "spearman")
}
GAP_FACET_COLUMNS = 4  # facets per row: four 1–5 histograms side by side still read at 1400 px
MAX_GAP = 4.0  # the rescaled gap's span (1–5)


def metric_label(product: object, metric_name: object, *, with_product: bool) -> str:
    """How a metric is named on an axis: "product · Metric" when several products are shown."""
    text = f"{product} · {metric_name}" if with_product else str(metric_name)
    return plotly_text(text)


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, annotations=[{"text": message, "showarrow": False}])
    return fig


# The human-vs-human figure (lib.agreement.human_ceiling) drawn over each judge-vs-human bar.
CEILING_COLUMNS = {
    "exact_agreement": "human_exact_agreement",
    "within_1_agreement": "human_within_1_agreement",
    "weighted_kappa": "human_weighted_kappa",
    "spearman": "human_spearman",
}
CEILING_NAME = "Human vs human (ceiling)"
CEILING_HALF = 0.012  # half the tick's height, in the measure's units


def agreement_figure(
    frame: pd.DataFrame,
    *,
    title: str = "Judge vs human agreement per metric",
    ceiling: pd.DataFrame | None = None,
) -> go.Figure:
    """Grouped bars per metric: exact, within-1, kappa and Spearman; n/a bars are left out. Several
    products get a panel (row) each, their metrics named plainly, one shared legend and y axis.

    Twenty "product · metric" labels in one row of 80 bars could only be read tilted; a row per
    product can be read straight. The y axis covers the values shown (from 0 unless one is
    negative), not the measures' full −1…1, which left half the plot empty.
    `frame` has the columns of `lib.analytics.AgreementReport.metrics`. With `ceiling`
    (`lib.agreement.human_ceiling`), a black tick over each bar marks how well reviewers agree with
    each other on the metric's multiply-labelled items: the most a judge could be expected to reach.
    """
    if frame.empty:
        return _empty(title, "No scored pairs")
    ceilings = ceiling.set_index(["product", "metric"]) if ceiling is not None and not ceiling.empty else None
    products = list(dict.fromkeys(frame["product"]))
    several = len(products) > 1
    fig = make_subplots(
        rows=len(products),
        cols=1,
        shared_yaxes=True,
        subplot_titles=[plotly_text(p) for p in products] if several else None,
        vertical_spacing=0.3 / len(products) if several else 0.0,
    )
    shown: list[float] = []
    ceiling_shown = False
    for row, product in enumerate(products, start=1):
        part = frame[frame["product"] == product]
        labels = [plotly_text(name) for name in part["metric_name"]]
        for column, name in AGREEMENT_SERIES.items():
            values = pd.to_numeric(part[column], errors="coerce")
            shown.extend(values.tolist())
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=values,
                    name=name,
                    legendgroup=column,
                    showlegend=row == 1,
                    marker={"color": MEASURES[column].color},
                    offsetgroup=column,
                    customdata=[[int(n), plotly_text(product)] for n in part["pairs"]],
                    hovertemplate=(
                        f"%{{customdata[1]}} · %{{x}}<br>{name}: %{{y:.3f}}<br>n = %{{customdata[0]}} pairs"
                        "<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
            )
            if ceilings is not None:
                shown.extend(_add_ceiling(fig, ceilings, part, labels, column, row, first=not ceiling_shown))
                ceiling_shown = ceiling_shown or any((product, m) in ceilings.index for m in part["metric"])
    fig.add_hline(y=0, line_width=1, line_color="grey", row="all", col=1)
    fig.update_yaxes(range=measure_range(list(AGREEMENT_SERIES), shown), title_text="value")
    fig.update_layout(
        title=title,
        barmode="group",
        legend_title_text="",
        height=max(380, 250 * len(products) + 110),
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
    )
    return fig


def _add_ceiling(
    fig: go.Figure,
    ceilings: pd.DataFrame,
    part: pd.DataFrame,
    labels: list[str],
    column: str,
    row: int,
    *,
    first: bool,
) -> list[float]:
    """One measure's human-vs-human ticks for a product's metrics (NaN where none); the values drawn."""
    keys = list(zip(part["product"], part["metric"], strict=True))
    values = [
        float(ceilings.at[key, CEILING_COLUMNS[column]]) if key in ceilings.index else float("nan")
        for key in keys
    ]
    items = [int(ceilings.at[key, "items"]) if key in ceilings.index else 0 for key in keys]
    if all(np.isnan(values)):
        return []
    # A thin black bar in the measure's own offset group sits exactly over that measure's bar (a
    # scatter marker is placed by its own grouping and drifted off the bars).
    fig.add_trace(
        go.Bar(
            x=labels,
            y=[np.nan if np.isnan(v) else 2 * CEILING_HALF for v in values],
            base=[np.nan if np.isnan(v) else v - CEILING_HALF for v in values],
            name=CEILING_NAME,
            legendgroup="ceiling",
            showlegend=first and column == next(iter(CEILING_COLUMNS)),
            offsetgroup=column,
            marker={"color": "#000000"},
            customdata=[[n, v] for n, v in zip(items, values, strict=True)],
            hovertemplate=(
                f"%{{x}}<br>{MEASURES[column].title}, reviewer vs reviewer: %{{customdata[1]:.3f}}<br>"
                "n = %{customdata[0]} items two or more reviewers labelled<extra></extra>"
            ),
        ),
        row=row,
        col=1,
    )
    return values


def gap_products(frame: pd.DataFrame) -> list[str]:
    """The products a gap frame covers, in order: what the page's product picker offers."""
    return [] if frame.empty else [str(p) for p in dict.fromkeys(frame["product"])]


def _bucket_text(start: float) -> str:
    """A gap bucket as its interval: "1.0–1.5"; the last one holds only the full span (4.0)."""
    return f"{start:.1f}" if start >= MAX_GAP else f"{start:.1f}–{start + GAP_BUCKET:.1f}"


def gap_histogram_figure(
    frame: pd.DataFrame,
    *,
    product: str | None = None,
    title: str = "Gap distribution (|user − judge| on 1–5)",
) -> go.Figure:
    """One small histogram per metric (facets, four to a row) for one product: how far apart judge
    and human are, as the share of that metric's pairs per gap bucket.

    Twenty overlaid series could not be told apart; facets on one shared 0–4 axis can, and shares
    (with n in each facet's title and hover) let a metric with 12 pairs sit next to one with 300.
    `product=None` draws every product in the frame (use it for a single product).
    `frame` has the columns of `lib.analytics.AgreementReport.gaps`.
    """
    if product is not None:
        frame = frame[frame["product"] == product] if not frame.empty else frame
    if frame.empty:
        return _empty(title, "No scored pairs")
    several = frame["product"].nunique() > 1
    groups = list(frame.groupby(["product", "metric"], sort=False))
    columns = min(GAP_FACET_COLUMNS, len(groups))
    rows = math.ceil(len(groups) / columns)
    titles = [
        f"{metric_label(p, g['metric_name'].iloc[0], with_product=several)} (n = {int(g['pairs'].sum())})"
        for (p, _m), g in groups
    ]
    fig = make_subplots(
        rows=rows,
        cols=columns,
        subplot_titles=titles,
        shared_xaxes=True,
        shared_yaxes=True,
        horizontal_spacing=0.04,
        vertical_spacing=0.5 / rows if rows > 1 else 0.0,
    )
    colors = colors_for(str(m) for (_p, m), _g in groups)
    for index, ((product_name, metric), rows_of) in enumerate(groups):
        total = int(rows_of["pairs"].sum())
        share = rows_of["pairs"] / total
        fig.add_trace(
            go.Bar(
                # Each bar spans its bucket (a histogram), so bucket [1.0, 1.5) sits between 1 and 1.5.
                x=rows_of["gap_bucket"] + GAP_BUCKET / 2,
                width=GAP_BUCKET * 0.92,
                y=share,
                name=metric_label(product_name, rows_of["metric_name"].iloc[0], with_product=several),
                marker={"color": colors[str(metric)]},
                customdata=[
                    [int(pairs), total, _bucket_text(float(bucket))]
                    for pairs, bucket in zip(rows_of["pairs"], rows_of["gap_bucket"], strict=True)
                ],
                hovertemplate=(
                    "%{fullData.name}<br>gap %{customdata[2]}: %{customdata[0]} of n = "
                    "%{customdata[1]} pairs (%{y:.0%})<extra></extra>"
                ),
                showlegend=False,
            ),
            row=index // columns + 1,
            col=index % columns + 1,
        )
    fig.update_xaxes(range=[0, MAX_GAP + GAP_BUCKET], dtick=1)
    # One explicit range for every facet: shares compare across panels, and autorange over shared
    # axes overshoots (it ran to 400 %).
    top = max(float((g["pairs"] / g["pairs"].sum()).max()) for _key, g in groups)
    fig.update_yaxes(tickformat=".0%", range=[0, min(1.0, top * 1.1) + 0.02])
    fig.update_xaxes(title_text="rescaled gap", row=rows)
    fig.update_yaxes(title_text="share of pairs", col=1)
    fig.update_layout(
        title=title,
        height=max(320, 230 * rows + 90),
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
    )
    return fig


def weekly_trend_figure(frame: pd.DataFrame, *, title: str = "Exact agreement per week") -> go.Figure:
    """One line per product: the share of metric scores where judge and human agree exactly, per
    week, over faint bars of the week's pairs (n also in every hover).

    `frame` has the columns of `lib.analytics.AgreementReport.weekly`.
    """
    if frame.empty:
        return _empty(title, "No scored pairs")
    return rate_figure(
        frame,
        x="week",
        rate="exact_agreement",
        n="pairs",
        extra=["within_1_agreement"],
        title=title,
        rate_title="exact agreement",
        n_title="pairs",
        x_title="week starting",
        hover="week of %{x|%Y-%m-%d}<br>exact: %{y:.1%}<br>within-1: %{customdata[1]:.1%}<br>n = %{customdata[0]} pairs",
    )
