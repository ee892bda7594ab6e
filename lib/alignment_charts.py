"""Alignment-lab chart (DataFrame → plotly Figure): each arm's measure per metric with its 95 % interval.

No streamlit here. Metric and arm names come from data, so labels go through `plotly_text`.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lib.charts import MEASURES, colors_for, measure_range, plotly_text

MEASURE_TITLES = {key: measure.title for key, measure in MEASURES.items()}


def comparison_figure(measures: pd.DataFrame, measure: str = "exact_agreement") -> go.Figure:
    """Grouped bars per metric, one per arm, with asymmetric error bars for the bootstrap interval.

    Arms keep their palette colour (`lib.charts.colors_for`) and the y axis covers the measure's
    values with their intervals, from 0 unless one is negative.
    """
    title = MEASURE_TITLES.get(measure, measure)
    fig = go.Figure()
    colors = colors_for(measures["arm"]) if not measures.empty else {}
    shown: list[float] = []
    for arm, group in measures.groupby("arm", sort=False):
        values = group[measure].astype(float)
        shown += [*values, *group[f"{measure}_lo"].astype(float), *group[f"{measure}_hi"].astype(float)]
        fig.add_bar(
            name=plotly_text(str(arm)),
            marker={"color": colors[str(arm)]},
            x=[plotly_text(str(m)) for m in group["metric"]],
            y=values,
            customdata=group[["pairs", f"{measure}_lo", f"{measure}_hi"]].to_numpy(dtype=object),
            hovertemplate=(
                f"%{{fullData.name}} · %{{x}}<br>{title}: %{{y:.3f}} "
                "(95 %: %{customdata[1]:.3f}–%{customdata[2]:.3f})<br>n = %{customdata[0]} pairs<extra></extra>"
            ),
            error_y={
                "type": "data",
                "symmetric": False,
                "array": (group[f"{measure}_hi"].astype(float) - values).clip(lower=0),
                "arrayminus": (values - group[f"{measure}_lo"].astype(float)).clip(lower=0),
            },
        )
    fig.update_layout(
        title=f"{title} per arm (95 % bootstrap interval)",
        barmode="group",
        yaxis={"title": title, "range": measure_range([measure], shown)},
        legend_title="Arm",
    )
    return fig
