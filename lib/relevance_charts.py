"""Tag-relevance charts (DataFrame → plotly Figure): the note × tag heatmap and a note's EMA history.

Kept apart from `lib.charts` (another capability's file); the same rule holds: no streamlit here,
and every label taken from data goes through `plotly_text`, so notes and tags show literally.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from lib.charts import plotly_text
from lib.config import get_settings
from lib.relevance import note_label


def tag_heatmap_figure(frame: pd.DataFrame, *, title: str = "Relevance score per note and tag") -> go.Figure:
    """Notes down, tags across, colour = EMA score on a diverging scale centred at 0; hover shows ± counts.

    `frame` has the columns of `lib.relevance.scores_frame`. A cell without a score stays blank:
    "never evaluated here" is not the same as a score of 0.
    """
    fig = go.Figure()
    if frame.empty:
        fig.update_layout(title=title, annotations=[{"text": "No scores yet", "showarrow": False}])
        return fig
    rows = frame.sort_values(["note_id", "tag"])
    labels = {
        int(r.note_id): plotly_text(note_label(int(r.note_id), str(r.note_type), str(r.content)))
        for r in rows.drop_duplicates("note_id").itertuples()
    }
    note_ids = sorted(labels)
    tags = sorted(rows["tag"].unique())
    row_of = {nid: i for i, nid in enumerate(note_ids)}
    col_of = {tag: j for j, tag in enumerate(tags)}
    z = np.full((len(note_ids), len(tags)), np.nan)
    counts = np.zeros((len(note_ids), len(tags), 2), dtype=int)
    for r in rows.itertuples():
        i, j = row_of[int(r.note_id)], col_of[r.tag]
        z[i, j] = float(r.score)
        counts[i, j] = (int(r.positive_evals), int(r.negative_evals))
    bound = get_settings().score_clamp
    # Symmetric range around 0 (at most the clamp), so white always means "no signal".
    extent = float(min(bound, max(0.1, np.nanmax(np.abs(z)))))
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=[plotly_text(t) for t in tags],
            y=[labels[nid] for nid in note_ids],
            customdata=counts,
            colorscale="RdBu",
            zmid=0.0,
            zmin=-extent,
            zmax=extent,
            hoverongaps=False,
            colorbar={"title": {"text": "score"}},
            hovertemplate=(
                "%{y}<br>tag: %{x}<br>score: %{z:+.3f}<br>evaluations: +%{customdata[0]} / "
                "−%{customdata[1]}<extra></extra>"
            ),
        )
    )
    fig.update_layout(
        title=title,
        xaxis={"title": "tag", "side": "top"},
        yaxis={"title": "note", "autorange": "reversed"},
        height=max(320, 28 * len(note_ids) + 160),
        margin={"l": 10, "r": 10, "t": 90, "b": 10},
    )
    return fig


def ema_history_figure(frame: pd.DataFrame, *, title: str = "EMA history per tag") -> go.Figure:
    """One line per tag: the score after each applied evaluation, with the raw score in the hover.

    `frame` has the columns of `lib.relevance.history_frame` (oldest first).
    """
    fig = go.Figure()
    for tag, rows in frame.groupby("tag", sort=True):
        rows = rows.sort_values("at")
        fig.add_trace(
            go.Scatter(
                x=rows["at"],
                y=rows["new_score"],
                mode="lines+markers",
                name=plotly_text(tag),
                customdata=rows[["raw_score", "weight", "old_score", "source"]]
                .assign(source=rows["source"].map(plotly_text))
                .to_numpy(dtype=object),
                hovertemplate=(
                    "%{x|%Y-%m-%d %H:%M}<br>%{customdata[2]:+.3f} → %{y:+.3f}"
                    "<br>raw %{customdata[0]:+.2f} × weight %{customdata[1]} (%{customdata[3]})"
                    "<extra>%{fullData.name}</extra>"
                ),
            )
        )
    settings = get_settings()
    fig.add_hline(y=0, line_width=1, line_color="grey")
    fig.add_hline(
        y=settings.negative_score_threshold,
        line_dash="dot",
        line_color="firebrick",
        annotation_text="filter threshold (avg, with enough evidence)",
        annotation_position="bottom right",
    )
    fig.update_layout(
        title=title,
        xaxis_title="evaluated at",
        yaxis_title="score (EMA)",
        legend_title_text="tag",
        hovermode="closest",
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig
