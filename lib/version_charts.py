"""Judge-version charts (DataFrame → plotly Figure): agreement per version with intervals, and the
weekly timeline with version changes marked. No streamlit here; colours and escaping are `lib.charts`'."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lib.charts import colors_for, plotly_text


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, annotations=[{"text": message, "showarrow": False}])
    return fig


def version_agreement_figure(frame: pd.DataFrame, *, measure: str = "exact_agreement") -> go.Figure:
    """One point per version and metric with its bootstrap interval (lib.version_agreement's rows)."""
    title = "Agreement with reviewers per judge version"
    shown = frame[frame[measure].notna()] if len(frame) else frame
    if shown.empty:
        return _empty(title, "No reviewed judgments with this measure yet")
    several = shown["product"].nunique() > 1
    fig = go.Figure()
    metrics = list(dict.fromkeys(shown["metric_name"].astype(str)))
    colors = colors_for(metrics)
    for metric in metrics:
        part = shown[shown["metric_name"].astype(str) == metric]
        labels = [
            plotly_text(f"{p} · {v}" if several else v)
            for p, v in zip(part["product"], part["version"], strict=True)
        ]
        fig.add_trace(
            go.Scatter(
                x=labels,
                y=part[measure],
                mode="markers+lines",
                name=plotly_text(metric),
                marker={"color": colors[metric], "size": 9},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": (part[f"{measure}_hi"] - part[measure]).clip(lower=0),
                    "arrayminus": (part[measure] - part[f"{measure}_lo"]).clip(lower=0),
                },
                customdata=part["pairs"],
                hovertemplate="%{x}<br>%{y:.3f} (%{customdata} pairs)<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        title=title,
        xaxis_title="Judge version (oldest first)",
        yaxis_title=measure.replace("_", " "),
        legend_title="Metric",
        margin={"t": 60},
    )
    return fig


def version_timeline_figure(weekly: pd.DataFrame, starts: pd.DataFrame) -> go.Figure:
    """Weekly exact agreement per version, a dotted line where each version's judgments begin."""
    title = "Exact agreement per week, by judge version"
    if weekly.empty:
        return _empty(title, "No reviewed judgments yet")
    several = weekly["product"].nunique() > 1
    names = [
        f"{p} · {v}" if several else str(v) for p, v in zip(weekly["product"], weekly["version"], strict=True)
    ]
    weekly = weekly.assign(series=names)
    colors = colors_for(list(dict.fromkeys(names)))
    fig = go.Figure()
    for name, part in weekly.groupby("series", sort=False):
        fig.add_trace(
            go.Scatter(
                x=part["week"],
                y=part["exact_agreement"],
                mode="lines+markers",
                name=plotly_text(name),
                marker={"color": colors[str(name)]},
                customdata=part["pairs"],
                hovertemplate="week of %{x|%Y-%m-%d}: %{y:.0%} (%{customdata} pairs)<extra>%{fullData.name}</extra>",
            )
        )
    for row in starts.itertuples():
        if row.first_week is None or pd.isna(row.first_week):
            continue
        fig.add_vline(x=pd.Timestamp(row.first_week).to_pydatetime(), line_dash="dot", line_color="grey")
        fig.add_annotation(
            x=pd.Timestamp(row.first_week).to_pydatetime(),
            y=1.04,
            yref="paper",
            text=plotly_text(row.version),
            showarrow=False,
            textangle=-20,
            font={"size": 10},
        )
    fig.update_layout(
        title=title,
        yaxis={"title": "Exact agreement", "tickformat": ".0%", "range": [0, 1.02]},
        xaxis_title="Week judged",
        legend_title="Version",
        margin={"t": 80},
    )
    return fig
