"""Reviewer-agreement charts (DataFrame → plotly Figure): reliability per metric, reviewer pairs,
calibration and anchoring. No streamlit here; frames are lib.agreement's tables.

Colours, measure ranges and escaping come from `lib.charts`, so alpha, kappa and agreement keep the
colours they have on Analytics' judge-vs-human charts. Every interval drawn is the one the table
beside it holds (bootstrap for alpha and agreement, Wilson for shares, normal for means).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lib.agreement import ALL_METRICS
from lib.charts import MEASURES, NEUTRAL, OKABE_ITO, measure_range, plotly_text

RELIABILITY_SERIES = ("alpha", "exact_agreement", "within_1_agreement", "mean_pairwise_kappa")
PAIR_MEASURES = {"kappa": "Cohen's kappa", "exact_agreement": "Exact agreement"}


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, annotations=[{"text": message, "showarrow": False}])
    return fig


def _metric_labels(frame: pd.DataFrame) -> list[str]:
    several = frame["product"].nunique() > 1
    return [
        plotly_text(f"{p} · {m}" if several else str(m))
        for p, m in zip(frame["product"], frame["metric_name"], strict=True)
    ]


def _error_bars(frame: pd.DataFrame, column: str) -> dict[str, object] | None:
    """Asymmetric error bars from `column_lo`/`column_hi`, or None when the frame has no interval."""
    if f"{column}_lo" not in frame:
        return None
    values = pd.to_numeric(frame[column], errors="coerce")
    return {
        "type": "data",
        "symmetric": False,
        "array": (pd.to_numeric(frame[f"{column}_hi"], errors="coerce") - values).clip(lower=0),
        "arrayminus": (values - pd.to_numeric(frame[f"{column}_lo"], errors="coerce")).clip(lower=0),
        "color": NEUTRAL,
    }


def reliability_figure(
    metrics: pd.DataFrame, *, title: str = "Agreement between reviewers per metric (95 % intervals)"
) -> go.Figure:
    """Grouped bars per metric: Krippendorff's alpha, exact and within-1 agreement (with their
    bootstrap intervals) and the mean pairwise kappa; n/a values are left out, n in every hover."""
    if metrics.empty:
        return _empty(title, "No item has two reviewers' labels yet")
    labels = _metric_labels(metrics)
    fig = go.Figure()
    shown: list[float] = []
    for column in RELIABILITY_SERIES:
        values = pd.to_numeric(metrics[column], errors="coerce")
        shown += values.tolist()
        for bound in ("_lo", "_hi"):
            if f"{column}{bound}" in metrics:
                shown += pd.to_numeric(metrics[f"{column}{bound}"], errors="coerce").tolist()
        name = MEASURES[column].title
        fig.add_bar(
            x=labels,
            y=values,
            name=name,
            marker={"color": MEASURES[column].color},
            error_y=_error_bars(metrics, column),
            customdata=np.column_stack([metrics["items"], metrics["reviewers"]]),
            hovertemplate=(
                f"%{{x}}<br>{name}: %{{y:.3f}}<br>n = %{{customdata[0]}} items, "
                "%{customdata[1]} reviewers<extra></extra>"
            ),
        )
    fig.add_hline(y=0, line_width=1, line_color="grey")
    fig.update_layout(
        title=title,
        barmode="group",
        yaxis={"title": "value", "range": measure_range(list(RELIABILITY_SERIES), shown)},
        legend_title_text="",
        margin={"l": 10, "r": 10, "t": 80, "b": 10},
    )
    return fig


def pairs_heatmap(pairs: pd.DataFrame, *, measure: str = "kappa", title: str | None = None) -> go.Figure:
    """Reviewer × reviewer matrix of one metric's pairwise kappa (or exact agreement), mirrored,
    each cell with its value and the number of shared items; empty where two never shared one."""
    name = PAIR_MEASURES.get(measure, measure)
    title = title or f"{name} between each two reviewers"
    if pairs.empty:
        return _empty(title, "No two reviewers labelled the same item")
    reviewers = sorted(set(pairs["reviewer_a"]) | set(pairs["reviewer_b"]))
    index = {r: i for i, r in enumerate(reviewers)}
    values = np.full((len(reviewers), len(reviewers)), np.nan)
    items = np.zeros((len(reviewers), len(reviewers)), dtype=int)
    for row in pairs.itertuples():
        i, j = index[row.reviewer_a], index[row.reviewer_b]
        value = float(getattr(row, measure))
        values[i, j] = values[j, i] = value
        items[i, j] = items[j, i] = int(row.items)
    text = [
        ["" if not items[i, j] else ("n/a" if np.isnan(values[i, j]) else f"{values[i, j]:.2f}") + f"<br>n={items[i, j]}"
         for j in range(len(reviewers))]
        for i in range(len(reviewers))
    ]  # fmt: skip
    names = [plotly_text(r) for r in reviewers]
    fig = go.Figure(
        go.Heatmap(
            z=values,
            x=names,
            y=names,
            text=text,
            texttemplate="%{text}",
            customdata=items,
            zmin=-1.0 if measure == "kappa" else 0.0,
            zmax=1.0,
            colorscale="RdBu",
            hovertemplate=f"%{{y}} and %{{x}}<br>{name}: %{{z:.3f}}<br>n = %{{customdata}} shared items<extra></extra>",
        )
    )
    fig.update_layout(
        title=title, yaxis={"autorange": "reversed"}, height=max(320, 60 * len(reviewers) + 140)
    )
    return fig


def calibration_figure(
    calibration: pd.DataFrame, *, title: str = "Each reviewer against the resolved decision"
) -> go.Figure:
    """Per reviewer (every metric together): the mean signed difference from the decision on the
    1–5 span (right: scores higher) and how often adjudication went against them, with intervals."""
    totals = calibration[calibration["metric_name"] == ALL_METRICS] if not calibration.empty else calibration
    if totals.empty:
        return _empty(title, "No labelled item has been resolved yet")
    names = [plotly_text(r) for r in totals["reviewer"]]
    fig = make_subplots(
        rows=1,
        cols=2,
        shared_yaxes=True,
        subplot_titles=("Mean signed difference (1–5 span)", "Adjudications that went against them"),
        horizontal_spacing=0.08,
    )
    difference = pd.to_numeric(totals["mean_signed_difference_rescaled"], errors="coerce")
    fig.add_trace(
        go.Scatter(
            x=difference,
            y=names,
            mode="markers",
            marker={"color": OKABE_ITO[0], "size": 10},
            error_x=_error_bars(totals, "mean_signed_difference_rescaled"),
            customdata=totals[["decided"]].to_numpy(),
            hovertemplate="%{y}: %{x:+.2f} on the 1–5 span<br>n = %{customdata[0]} decided labels<extra></extra>",
            showlegend=False,
        ),
        row=1,
        col=1,
    )
    share = pd.to_numeric(totals["adjudicated_against_share"], errors="coerce")
    fig.add_trace(
        go.Bar(
            x=share,
            y=names,
            orientation="h",
            marker={"color": OKABE_ITO[5]},
            error_x=_error_bars(totals, "adjudicated_against_share"),
            customdata=totals[["adjudicated_against", "adjudicated"]].to_numpy(),
            hovertemplate=(
                "%{y}: %{customdata[0]} of %{customdata[1]} adjudications went against them (%{x:.0%})"
                "<extra></extra>"
            ),
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    fig.add_vline(x=0, line_width=1, line_color="grey", row=1, col=1)
    # Symmetric around 0, so "scores higher" and "scores lower" read at the same distance.
    reach = [*difference.abs(), *pd.to_numeric(totals["mean_signed_difference_rescaled_hi"], errors="coerce").abs(),
             *pd.to_numeric(totals["mean_signed_difference_rescaled_lo"], errors="coerce").abs()]  # fmt: skip
    half = max(0.5, max((v for v in reach if np.isfinite(v)), default=0.0) * 1.1)
    fig.update_xaxes(range=[-half, half], zeroline=False, row=1, col=1)
    fig.update_xaxes(range=[0, 1.02], tickformat=".0%", row=1, col=2)
    fig.update_layout(title=title, height=max(300, 40 * len(totals) + 160), yaxis={"autorange": "reversed"})
    return fig


ANCHORING_PARTS = (
    ("moved_toward_judge", "Moved toward the judge", OKABE_ITO[5]),
    ("moved_away", "Moved away from the judge", OKABE_ITO[0]),
    ("_other_change", "Changed, no closer", OKABE_ITO[6]),
    ("_kept", "Kept their blind label", NEUTRAL),
)


def anchoring_figure(
    anchoring: pd.DataFrame, *, title: str = "After the reveal: what reviewers did with their blind label"
) -> go.Figure:
    """Per reviewer (every metric together), the share of blind labels moved toward the judge's
    score, moved away, changed without getting closer, and kept, as 100 % stacked bars."""
    totals = anchoring[anchoring["metric_name"] == ALL_METRICS] if not anchoring.empty else anchoring
    if totals.empty:
        return _empty(title, "No blind-first label has been revealed and confirmed yet")
    totals = totals.assign(
        _other_change=totals["changed"] - totals["moved_toward_judge"] - totals["moved_away"],
        _kept=totals["labels"] - totals["changed"],
    )
    names = [plotly_text(r) for r in totals["reviewer"]]
    fig = go.Figure()
    for column, label, color in ANCHORING_PARTS:
        counts = totals[column].astype(int)
        fig.add_bar(
            x=counts / totals["labels"],
            y=names,
            orientation="h",
            name=label,
            marker={"color": color},
            customdata=np.column_stack([counts, totals["labels"]]),
            hovertemplate=f"%{{y}}: {label.lower()} on %{{customdata[0]}} of %{{customdata[1]}} labels (%{{x:.0%}})<extra></extra>",
        )
    fig.update_layout(
        title=title,
        barmode="stack",
        xaxis={"range": [0, 1], "tickformat": ".0%", "title": "share of blind labels"},
        yaxis={"autorange": "reversed"},
        height=max(300, 40 * len(totals) + 160),
        legend={"orientation": "h", "y": -0.2},
    )
    return fig
