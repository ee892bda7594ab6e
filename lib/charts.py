"""DataFrame → plotly Figure, one function per chart; no streamlit here, so charts test under pytest.

Plotly reads a subset of HTML (`<b>`, `<a href>`, `<br>`) in trace names and labels, so every name
taken from data goes through `plotly_text` first and shows literally.
"""

from __future__ import annotations

from html import escape

import pandas as pd
import plotly.graph_objects as go


def plotly_text(value: object) -> str:
    """Data as plotly label text: tags and entities shown literally, never interpreted."""
    return escape(str(value), quote=False)


def correction_rate_figure(frame: pd.DataFrame, *, title: str = "Correction rate over time") -> go.Figure:
    """One line per product: the share of reviewed judgments that reviewers overruled, per period.

    `frame` has the columns of `lib.corrections.correction_rate_over_time`: product, period,
    reviewed, corrected, correction_rate.
    """
    fig = go.Figure()
    for product, rows in frame.groupby("product", sort=True):
        rows = rows.sort_values("period")
        fig.add_trace(
            go.Scatter(
                x=rows["period"],
                y=rows["correction_rate"],
                mode="lines+markers",
                name=plotly_text(product),
                customdata=rows[["corrected", "reviewed"]].to_numpy(),
                hovertemplate=(
                    "%{x|%Y-%m-%d}: %{y:.0%} corrected (%{customdata[0]} of %{customdata[1]} reviewed)"
                    "<extra>%{fullData.name}</extra>"
                ),
            )
        )
    fig.update_layout(
        title=title,
        xaxis_title="judged in the period starting",
        yaxis_title="corrected / reviewed",
        yaxis={"tickformat": ".0%", "range": [0, 1.05]},
        legend_title_text="product",
        hovermode="closest",
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig
