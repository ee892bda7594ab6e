"""DataFrame → plotly Figure: the shared chart rules (palette, measures, rate-with-sample-size) and
the Corrections and Notes charts; no streamlit here, so charts test under pytest.

Every chart module (`analytics_charts`, `relevance_charts`, `alignment_charts`, `precedent_view`)
takes its colours, measure ranges and escaping from here, so a product or a metric keeps one colour
on every page and a rate always comes with its sample size.

Plotly reads a subset of HTML (`<b>`, `<a href>`, `<br>`) in trace names, labels and hover text, so
every text taken from data goes through `plotly_text` first and shows literally. Hover templates
refer to names as `%{fullData.name}` or `%{customdata[i]}` instead of pasting them in, so a name
containing `%{...}` is never read as a template.
"""

from __future__ import annotations

import math
import textwrap
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from lib.notes import note_type_label

# Okabe & Ito (2008), "Color Universal Design": eight colours that stay distinct under the common
# colour-vision deficiencies. Yellow and black come last: yellow is faint on white, black reads as
# "axis" more than "series".
OKABE_ITO: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#F0E442",  # yellow
    "#000000",  # black
)
NEUTRAL = "#999999"  # references and "other": never a series colour
SAMPLE_OPACITY = 0.3  # the faint n bars under a rate


def plotly_text(value: object) -> str:
    """Data as plotly label text: tags and entities shown literally, never interpreted."""
    return escape(str(value), quote=False)


def hover_excerpt(value: object, *, chars: int = 160, width: int = 60) -> str:
    """Untrusted text for a hover box: cut to `chars`, escaped, wrapped with `<br>` every `width`."""
    text = " ".join(str(value).split())
    if len(text) > chars:
        text = text[: chars - 1] + "…"
    return "<br>".join(plotly_text(line) for line in textwrap.wrap(text, width) or [""])


# --------------------------------------------------------------------------------------------
# Colours: one per name, the same on every page


STRONG = 6  # the first six colours; yellow and black serve only when a chart needs more


def color_for(name: object) -> str:
    """The colour a name prefers, one of the six strong ones: a stable hash (crc32), so it never
    depends on call order, page or process."""
    return OKABE_ITO[zlib.crc32(str(name).encode("utf-8")) % STRONG]


def colors_for(names: Iterable[object]) -> dict[str, str]:
    """A colour per name for one chart: each its preferred colour unless an earlier name (sorted) has it.

    The same set of names always gets the same colours whatever their order, and a name keeps its
    preferred colour on every page unless another name of the same chart hashes to it. Yellow and
    black come after the six strong colours are taken; more names than colours cycle the palette.
    """
    taken: set[str] = set()
    colors: dict[str, str] = {}
    for name in sorted({str(n) for n in names}):
        preferred = OKABE_ITO.index(color_for(name))
        free = [OKABE_ITO[(preferred + k) % STRONG] for k in range(STRONG)] + list(OKABE_ITO[STRONG:])
        color = next((c for c in free if c not in taken), free[0])
        taken.add(color)
        if len(taken) == len(OKABE_ITO):
            taken.clear()
        colors[name] = color
    return colors


def faint(color: str, opacity: float = SAMPLE_OPACITY) -> str:
    """A `#rrggbb` colour as `rgba(...)` with the given opacity: the sample-size bars behind a rate."""
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},{opacity})"


# --------------------------------------------------------------------------------------------
# Agreement measures: one title, range and colour each, for Analytics and the Alignment lab


@dataclass(frozen=True)
class Measure:
    """An agreement measure: how it is titled, the values it can take, its colour in every chart."""

    title: str
    low: float
    high: float
    color: str


MEASURES: dict[str, Measure] = {
    "exact_agreement": Measure("Exact agreement", 0.0, 1.0, OKABE_ITO[0]),
    "within_1_agreement": Measure("Within-1 agreement", 0.0, 1.0, OKABE_ITO[4]),
    "weighted_kappa": Measure("Weighted kappa (quadratic)", -1.0, 1.0, OKABE_ITO[1]),
    "spearman": Measure("Spearman ρ", -1.0, 1.0, OKABE_ITO[3]),
    "mean_rescaled_gap": Measure("Mean gap (1–5 span)", 0.0, 4.0, OKABE_ITO[5]),
    # Reviewer vs reviewer (lib.agreement); kappa keeps kappa's colour.
    "alpha": Measure("Krippendorff's α", -1.0, 1.0, OKABE_ITO[2]),
    "mean_pairwise_kappa": Measure("Mean pairwise kappa", -1.0, 1.0, OKABE_ITO[1]),
}


def measure_range(measures: Sequence[str], values: Iterable[float]) -> list[float]:
    """A y range on the values the measures really take: from 0 unless a value is negative.

    Kappa and Spearman may run to −1, but when every shown value is ≥ 0 an axis down to −1 leaves
    half the plot empty; the range only extends below 0 as far as the lowest value needs.
    A measure bounded by 1 keeps 1 as its top, so bars of different charts compare; an unbounded
    one (the mean gap) stops a little above its largest value.
    """
    finite = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    bounds = [MEASURES[m] for m in measures if m in MEASURES]
    low_bound = min((b.low for b in bounds), default=0.0)
    high_bound = max((b.high for b in bounds), default=1.0)
    lowest = min(finite, default=0.0)
    low = 0.0 if lowest >= 0 else max(low_bound, math.floor(lowest * 10 - 0.5) / 10)
    if high_bound <= 1.0:
        high = high_bound + 0.02
    else:
        high = min(high_bound, max(1.0, max(finite, default=1.0) * 1.15))
    return [low, high]


# --------------------------------------------------------------------------------------------
# Rates with their sample size


def sample_marker_sizes(
    counts: Iterable[float], largest: float, *, low: int = 4, high: int = 12
) -> list[float]:
    """Marker sizes that grow with the square root of n (area ∝ n), so a rate over 2 pairs is a dot
    and one over 200 a disc: the eye weighs the points before reading the bars."""
    if largest <= 0:
        return [float(low) for _ in counts]
    return [low + (high - low) * math.sqrt(max(float(c), 0.0) / largest) for c in counts]


def rate_figure(
    frame: pd.DataFrame,
    *,
    x: str,
    rate: str,
    n: str,
    title: str,
    rate_title: str,
    n_title: str,
    x_title: str,
    hover: str,
    extra: Sequence[str] = (),
    group: str = "product",
) -> go.Figure:
    """One line per group for a rate over time, over faint bars of each point's sample size.

    A rate of 0 % or 100 % over 2 pairs looks like a swing until you see the 2: the bars below (same
    colour, faint), the marker size and the hover put n next to every rate. `hover` is the hover line after the
    group's name; it may use `%{x}`, `%{y}`, `%{customdata[0]}` (n) and `%{customdata[1…]}` (the
    `extra` columns, in order).
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.74, 0.26], vertical_spacing=0.05)
    colors = colors_for(frame[group]) if not frame.empty else {}
    largest = float(frame[n].max()) if not frame.empty else 0.0
    for key, rows in frame.groupby(group, sort=True):
        rows = rows.sort_values(x)
        name = plotly_text(key)
        color = colors[str(key)]
        fig.add_trace(
            go.Scatter(
                x=rows[x],
                y=rows[rate],
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line={"color": color},
                marker={"size": sample_marker_sizes(rows[n], largest)},
                customdata=rows[[n, *extra]].to_numpy(dtype=object),
                hovertemplate=f"%{{fullData.name}}<br>{hover}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Bar(
                x=rows[x],
                y=rows[n],
                name=name,
                legendgroup=name,
                showlegend=False,
                marker={"color": faint(color)},
                hovertemplate=f"%{{fullData.name}}<br>%{{x|%Y-%m-%d}}: n = %{{y}} {n_title}<extra></extra>",
            ),
            row=2,
            col=1,
        )
    fig.update_yaxes(title_text=rate_title, tickformat=".0%", range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(title_text=f"n ({n_title})", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text=x_title, row=2, col=1)
    fig.update_layout(
        title=title,
        barmode="group",
        legend_title_text=group,
        hovermode="closest",
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def corrected_of_reviewed_figure(
    frame: pd.DataFrame, *, title: str = "Corrected of reviewed over time"
) -> go.Figure:
    """One line per product: the share of reviewed judgments that reviewers overruled, per period,
    over faint bars of how many were reviewed.

    `frame` has the columns of `lib.corrections.corrected_of_reviewed_over_time`: product, period,
    reviewed, corrected, corrected_of_reviewed.
    """
    return rate_figure(
        frame,
        x="period",
        rate="corrected_of_reviewed",
        n="reviewed",
        extra=["corrected"],
        title=title,
        rate_title="corrected / reviewed",
        n_title="reviewed",
        x_title="judged in the period starting",
        hover="%{x|%Y-%m-%d}: %{y:.0%} corrected (%{customdata[1]} of n = %{customdata[0]} reviewed)",
    )


# --------------------------------------------------------------------------------------------
# Note types: one icon, colour and marker each


@dataclass(frozen=True)
class NoteTypeStyle:
    """How a note type is drawn: colour and marker symbol (its icon and label live in `lib.notes`)."""

    color: str
    symbol: str


NOTE_TYPE_STYLES: dict[str, NoteTypeStyle] = {
    "SUCCESS": NoteTypeStyle(OKABE_ITO[2], "circle"),
    "FAILURE": NoteTypeStyle(OKABE_ITO[5], "x"),
    "PATTERN": NoteTypeStyle(OKABE_ITO[0], "diamond"),
    "STRATEGY": NoteTypeStyle(OKABE_ITO[1], "star"),
    "TIP": NoteTypeStyle(OKABE_ITO[3], "triangle-up"),
}
_OTHER_TYPE = NoteTypeStyle(NEUTRAL, "square")


def notes_timeline_figure(
    sessions: pd.DataFrame,
    notes: pd.DataFrame,
    *,
    title: str = "Sessions and their notes",
) -> go.Figure:
    """Sessions on a time axis (a grey span from first to last note, newest on top), each note a
    mark coloured and shaped by its type, in its own lane of the session's row.

    Notes of one session are minutes apart while sessions are days apart, so the marks of a type
    get a lane of their own inside the session row: they stay apart when the axis is zoomed out,
    and zooming in (plotly's box zoom) spreads them along time. The hover shows the type, time,
    language and an escaped excerpt of the note.

    `sessions` has the columns of `lib.notes.timeline_frame`; `notes` those of
    `lib.notes.as_frame`. Types are named as everywhere, icon and word (`lib.notes.note_type_label`).
    """
    fig = go.Figure()
    if sessions.empty:
        fig.update_layout(title=title, annotations=[{"text": "No sessions", "showarrow": False}])
        return fig
    ordered = sessions.sort_values(["last_note", "session_id"]).reset_index(drop=True)
    row_of = {str(s): i for i, s in enumerate(ordered["session_id"])}
    fig.add_trace(
        go.Scatter(
            x=[v for r in ordered.itertuples() for v in (r.first_note, r.last_note, None)],
            y=[v for i in range(len(ordered)) for v in (i, i, None)],
            mode="lines",
            line={"color": NEUTRAL, "width": 10},
            opacity=0.35,
            name="session",
            hoverinfo="skip",
            showlegend=False,
        )
    )
    types = list(NOTE_TYPE_STYLES)
    lane_of = {t: (k - (len(types) - 1) / 2) * 0.16 for k, t in enumerate(types)}
    shown = notes[notes["session_id"].astype(str).isin(row_of)] if not notes.empty else notes
    groups = dict(tuple(shown.groupby("note_type", sort=False))) if not shown.empty else {}
    # The legend lists types in their one order (lib.models.NOTE_TYPES), whatever the data's order.
    for kind in sorted(groups, key=lambda t: types.index(str(t)) if t in types else len(types)):
        rows = groups[kind]
        style = NOTE_TYPE_STYLES.get(str(kind), _OTHER_TYPE)
        lane = lane_of.get(str(kind), 0.0)
        fig.add_trace(
            go.Scatter(
                x=rows["timestamp"],
                y=[row_of[str(s)] + lane for s in rows["session_id"]],
                mode="markers",
                name=plotly_text(note_type_label(kind)),
                marker={"color": style.color, "symbol": style.symbol, "size": 11, "line": {"width": 0}},
                customdata=[
                    [plotly_text(s), plotly_text(lang or "every language"), hover_excerpt(text)]
                    for s, lang, text in zip(
                        rows["session_id"], rows["language"], rows["content"], strict=True
                    )
                ],
                hovertemplate=(
                    "%{fullData.name} · %{x|%Y-%m-%d %H:%M} UTC · %{customdata[1]}"
                    "<br>session %{customdata[0]}<br><br>%{customdata[2]}<extra></extra>"
                ),
            )
        )
    fig.update_layout(
        title=title,
        xaxis={"title": "time (UTC)", "type": "date"},
        yaxis={
            "tickmode": "array",
            "tickvals": list(range(len(ordered))),
            "ticktext": [
                plotly_text(f"{r.session_id} · {r.notes} note{'' if r.notes == 1 else 's'}")
                for r in ordered.itertuples()
            ],
            "range": [-0.6, len(ordered) - 0.4],
            "title": "session",
            "zeroline": False,
        },
        legend={"title": {"text": "note type"}, "traceorder": "normal"},
        hovermode="closest",
        height=max(320, 34 * len(ordered) + 150),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def evidence_state_figure(frame: pd.DataFrame) -> go.Figure:
    """Evidence items per verification outcome (`lib.overview.evidence_state_frame`) as horizontal
    bars whose labels are shown whole: the axis makes room for them instead of cutting them."""
    fig = go.Figure(
        go.Bar(
            x=frame["items"],
            y=[plotly_text(state) for state in frame["state"]],
            orientation="h",
            marker_color=OKABE_ITO[4],
            hovertemplate="%{y}: %{x}<extra></extra>",
        )
    )
    fig.update_layout(
        xaxis_title="evidence items",
        yaxis={"automargin": True, "autorange": "reversed"},
        height=60 * len(frame) + 110,
        margin={"l": 10, "r": 10, "t": 10, "b": 10},
    )
    return fig
