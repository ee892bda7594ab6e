"""Tag-relevance charts (DataFrame → plotly Figure): the note × tag heatmap and a note's EMA history.

Kept apart from `lib.charts` (another capability's file); the same rule holds: no streamlit here,
and every label taken from data goes through `plotly_text`, so notes and tags show literally.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lib.charts import NEUTRAL, OKABE_ITO, colors_for, plotly_text
from lib.config import get_settings
from lib.relevance import note_label

HISTORY_LINES_PER_FAMILY = 6  # more lines than this in one facet hide each other


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
    # Every column gets its label: on a category axis plotly otherwise labels only as many as fit
    # its automatic tick count (20 of 40 tags, issue 25). Upright labels, smaller as tags multiply,
    # and a top margin sized to the longest label so none is cut.
    longest = max(len(t) for t in tags)
    font = tag_label_size(len(tags))
    fig.update_layout(
        title={"text": title, "y": 0.995, "yanchor": "top"},
        xaxis={
            "title": "tag",
            "side": "top",
            "type": "category",
            "tickmode": "linear",
            "dtick": 1,
            "tickangle": -90,
            "tickfont": {"size": font},
            "automargin": True,
        },
        yaxis={"title": "note", "autorange": "reversed", "automargin": True},
        height=max(320, 28 * len(note_ids) + int(0.62 * font * longest) + 120),
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
    )
    return fig


def tag_label_size(columns: int) -> int:
    """The tag labels' font size (px): 12 up to 30 columns, one px less for each 8 more (10 at 40),
    never below 8, so upright labels sit side by side where the page leaves ~12 px per column."""
    return max(8, 12 - math.ceil(max(0, columns - 30) / 8))


def tag_family(tag: str) -> str:
    """The kind of context a tag names: "lang" for `lang:tr`, "other" for a tag without a prefix."""
    family, sep, _value = str(tag).partition(":")
    return family if sep and family else "other"


def history_tags(frame: pd.DataFrame) -> list[str]:
    """The tags of a history frame, most-evaluated first (ties by name): what the tag picker offers."""
    if frame.empty:
        return []
    counts = frame.groupby("tag").size()
    return sorted(counts.index.astype(str), key=lambda tag: (-int(counts[tag]), tag))


def ema_history_figure(
    frame: pd.DataFrame,
    *,
    tags: Sequence[str] = (),
    per_family: int = HISTORY_LINES_PER_FAMILY,
    title: str = "EMA history per tag",
) -> go.Figure:
    """The score after each applied evaluation, one facet per tag family (lang, product, metric, …)
    and in each at most `per_family` lines (the most evaluated), each labelled at its end.

    A note run under many contexts collects 14–30 tags; one legend listed them all while the lines,
    moved by the same evaluations, hid each other. Facets by family with direct labels show each
    line; the facet title says how many tags it leaves out, and `tags` (the page's picker) draws
    exactly those instead. `frame` has the columns of `lib.relevance.history_frame` (oldest first).
    """
    fig = go.Figure()
    if tags:
        frame = frame[frame["tag"].isin(list(tags))]
    if frame.empty:
        fig.update_layout(title=title, annotations=[{"text": "No scores applied yet", "showarrow": False}])
        return fig
    ranked = history_tags(frame)
    families: dict[str, list[str]] = {}
    for tag in ranked:
        families.setdefault(tag_family(tag), []).append(tag)
    names = sorted(families)
    limit = max(len(ranked), 1) if tags else max(per_family, 1)
    titles = []
    for family in names:
        total = len(families[family])
        shown = min(total, limit)
        more = f", {shown} most evaluated of {total} tags" if shown < total else ""
        titles.append(plotly_text(f"{family}{more}"))
    fig = make_subplots(
        rows=len(names), cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=0.12 / len(names)
    )
    for row, family in enumerate(names, start=1):
        chosen = families[family][:limit]
        colors = colors_for(chosen)
        for tag in sorted(chosen):
            rows = frame[frame["tag"] == tag].sort_values("at")
            name = plotly_text(tag)
            label = [""] * (len(rows) - 1) + [plotly_text(str(tag).partition(":")[2] or tag)]
            fig.add_trace(
                go.Scatter(
                    x=rows["at"],
                    y=rows["new_score"],
                    mode="lines+markers+text",
                    name=name,
                    text=label,
                    textposition="middle right",
                    textfont={"color": colors[tag]},
                    line={"color": colors[tag]},
                    showlegend=False,
                    customdata=rows[["raw_score", "weight", "old_score", "source"]]
                    .assign(source=rows["source"].map(plotly_text))
                    .to_numpy(dtype=object),
                    hovertemplate=(
                        "%{fullData.name}<br>%{x|%Y-%m-%d %H:%M}<br>%{customdata[2]:+.3f} → %{y:+.3f}"
                        "<br>raw %{customdata[0]:+.2f} × weight %{customdata[1]} (%{customdata[3]})"
                        "<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
            )
    settings = get_settings()
    scores = pd.concat([frame["new_score"], frame["old_score"]]).astype(float)
    low = min(float(scores.min()), settings.negative_score_threshold) - 0.15
    high = max(float(scores.max()), 0.0) + 0.15
    for row in range(1, len(names) + 1):
        fig.add_hline(y=0, line_width=1, line_color=NEUTRAL, row=row, col=1)
        fig.add_hline(
            y=settings.negative_score_threshold, line_dash="dot", line_color=OKABE_ITO[5], row=row, col=1
        )
    fig.update_yaxes(range=[low, high], title_text="score")
    fig.update_xaxes(title_text="evaluated at", row=len(names), col=1)
    fig.update_layout(
        title={"text": f"{title} (dotted: filter threshold, averaged over a run's tags)"},
        hovermode="closest",
        height=max(320, 190 * len(names) + 110),
        margin={"l": 10, "r": 80, "t": 80, "b": 10},
    )
    return fig
