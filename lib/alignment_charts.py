"""Alignment-lab chart (DataFrame → plotly Figure): each arm's measure per metric with its 95 % interval.

No streamlit here. Metric and arm names come from data, so labels go through `plotly_text`.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from lib.charts import plotly_text

MEASURE_TITLES = {
    "exact_agreement": "Exact agreement",
    "within_1_agreement": "Within-1 agreement",
    "weighted_kappa": "Weighted kappa (quadratic)",
    "spearman": "Spearman ρ",
    "mean_rescaled_gap": "Mean gap (1–5 span)",
}


def comparison_figure(measures: pd.DataFrame, measure: str = "exact_agreement") -> go.Figure:
    """Grouped bars per metric, one per arm, with asymmetric error bars for the bootstrap interval."""
    title = MEASURE_TITLES.get(measure, measure)
    fig = go.Figure()
    for arm, group in measures.groupby("arm", sort=False):
        values = group[measure].astype(float)
        fig.add_bar(
            name=plotly_text(str(arm)),
            x=[plotly_text(str(m)) for m in group["metric"]],
            y=values,
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
        yaxis_title=title,
        legend_title="Arm",
    )
    return fig
