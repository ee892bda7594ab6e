"""The chart modules (DataFrame → plotly Figure): lib.charts, lib.analytics_charts, lib.relevance_charts,
lib.alignment_charts.

Pure functions over small hand-built frames: which traces a figure has, in what order, with what
values, and that names taken from data are shown literally (HTML-escaped, never a hover template).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from lib.alignment_charts import comparison_figure
from lib.analytics_charts import (
    AGREEMENT_SERIES,
    agreement_figure,
    gap_histogram_figure,
    gap_products,
    metric_label,
    weekly_trend_figure,
)
from lib.charts import (
    MEASURES,
    NOTE_TYPE_STYLES,
    OKABE_ITO,
    color_for,
    colors_for,
    corrected_of_reviewed_figure,
    faint,
    hover_excerpt,
    measure_range,
    notes_timeline_figure,
    plotly_text,
    sample_marker_sizes,
)
from lib.config import get_settings
from lib.models import NOTE_TYPES
from lib.notes import TYPE_LABELS, note_type_label
from lib.precedent_view import MATCHED, reason_figure
from lib.relevance_charts import ema_history_figure, history_tags, tag_heatmap_figure

HOSTILE = "<b>x</b> %{y} & co"
T0 = datetime(2024, 5, 6, tzinfo=UTC)


# --------------------------------------------------------------------------------------------
# lib.charts


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain", "plain"),
        ("<b>x</b>", "&lt;b&gt;x&lt;/b&gt;"),
        ("a & b", "a &amp; b"),
        (3, "3"),
        ('"q"', '"q"'),
    ],
)
def test_plotly_text_escapes_markup(value: object, shown: str) -> None:
    assert plotly_text(value) == shown


def _lines(fig) -> list:
    return [t for t in fig.data if t.type == "scatter"]


def _bars(fig) -> list:
    return [t for t in fig.data if t.type == "bar"]


def test_corrected_of_reviewed_figure_has_one_sorted_line_per_product_over_bars_of_n() -> None:
    frame = pd.DataFrame(
        {
            "product": ["b", "a", "a", HOSTILE],
            "period": [T0, T0 + timedelta(days=7), T0, T0],
            "reviewed": [4, 2, 5, 1],
            "corrected": [1, 1, 0, 1],
            "corrected_of_reviewed": [0.25, 0.5, 0.0, 1.0],
        }
    )
    fig = corrected_of_reviewed_figure(frame)
    lines, bars = _lines(fig), _bars(fig)
    assert [t.name for t in lines] == [plotly_text(HOSTILE), "a", "b"]
    a = lines[1]
    assert list(a.y) == [0.0, 0.5]  # sorted by period, not by row order
    assert [list(row) for row in a.customdata] == [[5, 0], [2, 1]]  # n first, then corrected
    assert "n = %{customdata[0]}" in a.hovertemplate
    assert "%{fullData.name}" in a.hovertemplate and HOSTILE not in a.hovertemplate
    # The sample size under each line: a faint bar per point, same colour, on the lower axis.
    assert [(t.name, list(t.y)) for t in bars] == [(plotly_text(HOSTILE), [1]), ("a", [5, 2]), ("b", [4])]
    assert all(t.yaxis == "y2" and not t.showlegend for t in bars)
    for line, bar in zip(lines, bars, strict=True):
        assert bar.marker.color == faint(line.line.color)
    assert fig.layout.yaxis.tickformat == ".0%" and tuple(fig.layout.yaxis.range) == (0, 1.05)


def test_rate_markers_grow_with_their_sample_size() -> None:
    sizes = sample_marker_sizes([0, 2, 50, 200], 200)
    assert sizes[0] == 4 and sizes[-1] == 12 and sizes == sorted(sizes)
    assert sizes[2] == pytest.approx(4 + 8 * 0.5)  # a quarter of the largest n: half the way (area ∝ n)
    frame = pd.DataFrame(
        {"product": ["a", "a"], "period": [T0, T0 + timedelta(days=7)], "reviewed": [2, 200],
         "corrected": [2, 20], "corrected_of_reviewed": [1.0, 0.1]}
    )  # fmt: skip
    (line,) = _lines(corrected_of_reviewed_figure(frame))
    assert line.marker.size[0] < line.marker.size[1]  # the 100 % over 2 is the small dot


def test_corrected_of_reviewed_figure_of_nothing_has_no_lines() -> None:
    empty = pd.DataFrame(columns=["product", "period", "reviewed", "corrected", "corrected_of_reviewed"])
    assert corrected_of_reviewed_figure(empty, title="T").data == ()


# --------------------------------------------------------------------------------------------
# lib.charts: the palette


def test_palette_is_okabe_ito() -> None:
    assert set(OKABE_ITO) == {
        "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000"
    }  # fmt: skip


def test_a_name_keeps_its_colour_whatever_the_order_and_the_call() -> None:
    names = ["acme-support", "docsearch-rag", "mentor-tr", "beta", "clarity"]
    first = colors_for(names)
    assert colors_for(reversed(names)) == first == colors_for(names * 2)
    assert all(color in OKABE_ITO for color in first.values())


def test_names_of_one_chart_get_distinct_colours_up_to_the_palette_size() -> None:
    names = [f"metric-{i}" for i in range(len(OKABE_ITO))]
    assert len(set(colors_for(names).values())) == len(OKABE_ITO)
    more = colors_for([*names, "one-more"])
    assert len(more) == len(OKABE_ITO) + 1  # beyond eight the palette cycles rather than failing


def test_a_name_without_a_clash_gets_its_preferred_colour() -> None:
    assert colors_for(["acme"])["acme"] == color_for("acme")


def test_yellow_and_black_are_kept_for_charts_with_more_than_six_series() -> None:
    weak = {"#F0E442", "#000000"}
    assert not weak & {color_for(f"name-{i}") for i in range(200)}
    assert not weak & set(colors_for([f"m{i}" for i in range(6)]).values())
    assert weak <= set(colors_for([f"m{i}" for i in range(8)]).values())


def test_the_same_product_has_the_same_colour_on_every_page() -> None:
    """Corrections trend, Analytics trend and the alignment lab colour a name the same way."""
    products = ["acme", "beta"]
    corrections = corrected_of_reviewed_figure(
        pd.DataFrame(
            {"product": products, "period": [T0, T0], "reviewed": [3, 4], "corrected": [1, 1],
             "corrected_of_reviewed": [1 / 3, 0.25]}
        )
    )  # fmt: skip
    weekly = weekly_trend_figure(
        pd.DataFrame(
            {"product": products, "week": [T0, T0], "pairs": [3, 4], "exact_agreement": [0.5, 0.5],
             "within_1_agreement": [1.0, 1.0]}
        )
    )  # fmt: skip
    alignment = comparison_figure(_alignment_measures(products))
    by_page = [
        {t.name: t.line.color for t in _lines(corrections)},
        {t.name: t.line.color for t in _lines(weekly)},
        {t.name: t.marker.color for t in alignment.data},
    ]
    assert by_page[0] == by_page[1] == by_page[2] == colors_for(products)


def test_faint_keeps_the_colour_and_lowers_the_opacity() -> None:
    assert faint("#0072B2", 0.3) == "rgba(0,114,178,0.3)"


@pytest.mark.parametrize(
    ("measures", "values", "expected"),
    [
        (["exact_agreement", "spearman"], [0.2, 0.9, float("nan")], [0.0, 1.02]),
        (["weighted_kappa"], [-0.23, 0.5], [-0.3, 1.02]),
        (["spearman"], [-1.0, 0.5], [-1.0, 1.02]),
        (["mean_rescaled_gap"], [0.4, 2.0], [0.0, 2.3]),
        (["mean_rescaled_gap"], [3.9], [0.0, 4.0]),
        (["exact_agreement"], [], [0.0, 1.02]),
    ],
)
def test_measure_range_covers_the_values_not_the_whole_theoretical_span(
    measures: list[str], values: list[float], expected: list[float]
) -> None:
    assert measure_range(measures, values) == pytest.approx(expected)


def test_hover_excerpt_escapes_cuts_and_wraps() -> None:
    text = hover_excerpt("<script>alert(1)</script> " + "word " * 100, chars=80, width=30)
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert text.count("<br>") >= 2 and text.endswith("…")
    assert len(text.replace("<br>", " ")) < 120


# --------------------------------------------------------------------------------------------
# lib.analytics_charts


def _agreement(products: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "product": products,
            "metric_name": ["Clarity", HOSTILE][: len(products)],
            "pairs": [10, 3][: len(products)],
            "exact_agreement": [0.5, 1.0][: len(products)],
            "within_1_agreement": [0.9, 1.0][: len(products)],
            "weighted_kappa": [0.4, None][: len(products)],
            "spearman": [0.3, float("nan")][: len(products)],
        }
    )


@pytest.mark.parametrize(("with_product", "label"), [(False, "Clarity"), (True, "acme · Clarity")])
def test_metric_label_names_the_product_only_when_several_are_shown(with_product: bool, label: str) -> None:
    assert metric_label("acme", "Clarity", with_product=with_product) == label
    assert metric_label("<i>", "m", with_product=True) == "&lt;i&gt; · m"


def test_agreement_figure_has_a_series_per_measure_and_labels_per_metric() -> None:
    fig = agreement_figure(_agreement(["acme", "acme"]))
    assert [t.name for t in fig.data] == list(AGREEMENT_SERIES.values())
    assert list(fig.data[0].x) == ["Clarity", plotly_text(HOSTILE)]
    kappa = fig.data[2]
    assert kappa.y[0] == 0.4 and math.isnan(kappa.y[1])  # n/a stays a gap, never a 0 bar
    assert [list(r) for r in fig.data[0].customdata] == [[10, "acme"], [3, "acme"]]
    assert "n = %{customdata[0]} pairs" in fig.data[0].hovertemplate
    assert all(HOSTILE not in t.hovertemplate for t in fig.data)
    assert not fig.layout.annotations  # one product: no panel titles
    assert [t.marker.color for t in fig.data] == [MEASURES[m].color for m in AGREEMENT_SERIES]
    # Every value is ≥ 0: the axis starts at 0, not at kappa's theoretical −1.
    assert fig.layout.barmode == "group" and tuple(fig.layout.yaxis.range) == (0, 1.02)


def test_agreement_axis_goes_below_zero_only_as_far_as_a_negative_value_needs() -> None:
    frame = _agreement(["acme", "acme"]).assign(spearman=[-0.35, 0.1])
    assert tuple(agreement_figure(frame).layout.yaxis.range) == pytest.approx((-0.4, 1.02))


def test_agreement_figure_gives_each_product_a_panel_with_one_legend_and_axis_range() -> None:
    frame = _agreement(["acme", "acme"])
    frame = pd.concat([frame, frame.assign(product=HOSTILE)], ignore_index=True)
    fig = agreement_figure(frame)
    assert [a.text for a in fig.layout.annotations] == ["acme", plotly_text(HOSTILE)]
    assert [(t.yaxis, list(t.x)) for t in fig.data[::4]] == [
        ("y", ["Clarity", plotly_text(HOSTILE)]),
        ("y2", ["Clarity", plotly_text(HOSTILE)]),
    ]  # metric names plainly, the product is the panel
    assert [t.name for t in fig.data if t.showlegend is not False] == list(AGREEMENT_SERIES.values())
    assert fig.data[4].customdata[0][1] == plotly_text(HOSTILE)  # the product reaches the hover escaped
    assert tuple(fig.layout.yaxis.range) == tuple(fig.layout.yaxis2.range) == (0, 1.02)


@pytest.mark.parametrize("figure", [agreement_figure, gap_histogram_figure, weekly_trend_figure])
def test_an_empty_frame_gives_a_figure_that_says_so(figure) -> None:
    fig = figure(pd.DataFrame(), title="Nothing")
    assert fig.data == () and fig.layout.annotations[0].text == "No scored pairs"
    assert fig.layout.title.text == "Nothing"


def _gaps() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "product": ["acme", "acme", "acme", "beta"] + ["wide"] * 6,
            "metric": ["clarity", "clarity", "tone", "clarity"] + [f"m{i}" for i in range(6)],
            "metric_name": ["Clarity", "Clarity", HOSTILE, "Clarity"] + [f"M{i}" for i in range(6)],
            "gap_bucket": [0.0, 1.5, 4.0, 0.5] + [0.0] * 6,
            "pairs": [6, 2, 3, 1] + [5] * 6,
        }
    )


def test_gap_histogram_draws_one_facet_per_metric_of_the_picked_product() -> None:
    fig = gap_histogram_figure(_gaps(), product="acme")
    assert [(t.name, list(t.x), list(t.y)) for t in fig.data] == [
        ("Clarity", [0.25, 1.75], [0.75, 0.25]),  # bucket centres; shares of the metric's 8 pairs
        (plotly_text(HOSTILE), [4.25], [1.0]),
    ]
    assert [t.xaxis for t in fig.data] == ["x", "x2"]  # two panels, not two overlaid series
    assert [a.text for a in fig.layout.annotations] == ["Clarity (n = 8)", plotly_text(f"{HOSTILE} (n = 3)")]
    assert [list(r) for r in fig.data[0].customdata] == [[6, 8, "0.0–0.5"], [2, 8, "1.5–2.0"]]
    assert [list(r) for r in fig.data[1].customdata] == [[3, 3, "4.0"]]
    assert all(HOSTILE not in t.hovertemplate and "n = %{customdata[1]}" in t.hovertemplate for t in fig.data)
    assert fig.layout.xaxis.range == fig.layout.xaxis2.range == (0, 4.5)  # the whole 1–5 span
    assert fig.layout.yaxis.range[1] <= 1.02 and fig.layout.yaxis.tickformat == ".0%"


def test_gap_histogram_wraps_facets_four_to_a_row() -> None:
    fig = gap_histogram_figure(_gaps(), product="wide")
    assert len(fig.data) == 6 and {t.xaxis for t in fig.data} == {
        f"x{i}" if i > 1 else "x" for i in range(1, 7)
    }
    assert fig.layout.xaxis5.domain == fig.layout.xaxis.domain  # 5th panel starts the second row
    assert len({t.marker.color for t in fig.data}) == 6  # each metric its own palette colour


def test_gap_histogram_names_products_when_no_product_is_picked() -> None:
    fig = gap_histogram_figure(_gaps()[lambda f: f["product"] != "wide"])
    assert [t.name for t in fig.data] == [
        "acme · Clarity",
        plotly_text(f"acme · {HOSTILE}"),
        "beta · Clarity",
    ]


def test_gap_products_lists_the_products_in_order() -> None:
    assert gap_products(_gaps()) == ["acme", "beta", "wide"]
    assert gap_products(pd.DataFrame()) == []


def test_weekly_trend_has_one_line_per_product_and_bars_of_pairs() -> None:
    frame = pd.DataFrame(
        {
            "product": ["acme", "acme", HOSTILE],
            "week": [T0, T0 + timedelta(days=7), T0],
            "pairs": [4, 5, 1],
            "exact_agreement": [0.25, 0.6, 1.0],
            "within_1_agreement": [0.5, 0.8, 1.0],
        }
    )
    fig = weekly_trend_figure(frame)
    lines = _lines(fig)
    assert [t.name for t in lines] == [plotly_text(HOSTILE), "acme"]
    assert list(lines[1].y) == [0.25, 0.6]
    assert [list(r) for r in lines[1].customdata] == [[4, 0.5], [5, 0.8]]
    assert "n = %{customdata[0]} pairs" in lines[1].hovertemplate
    assert [list(t.y) for t in _bars(fig)] == [[1], [4, 5]]


# --------------------------------------------------------------------------------------------
# lib.relevance_charts


def _scores(rows: list[tuple[int, str, float, int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "note_id": nid,
                "note_type": "TIP",
                "content": HOSTILE if nid == 2 else f"note {nid}",
                "tag": tag,
                "score": score,
                "positive_evals": pos,
                "negative_evals": neg,
            }
            for nid, tag, score, pos, neg in rows
        ]
    )


def test_heatmap_puts_notes_down_and_tags_across_and_leaves_unscored_cells_blank() -> None:
    fig = tag_heatmap_figure(
        _scores([(2, "math", -0.5, 0, 2), (1, "geo", 0.2, 1, 0), (1, "math", 0.4, 3, 1)])
    )
    (trace,) = fig.data
    assert list(trace.x) == ["geo", "math"]
    assert list(trace.y) == ["#1 💭 TIP: note 1", plotly_text(f"#2 💭 TIP: {HOSTILE}")]
    assert trace.z[0][0] == 0.2 and trace.z[0][1] == 0.4 and trace.z[1][1] == -0.5
    assert math.isnan(trace.z[1][0])  # never evaluated with geo: blank, not 0
    assert [list(c) for c in trace.customdata[0]] == [[1, 0], [3, 1]]
    assert trace.zmid == 0.0 and trace.zmin == -0.5 and trace.zmax == 0.5


def test_heatmap_range_is_at_least_a_tenth_and_at_most_the_clamp() -> None:
    tiny = tag_heatmap_figure(_scores([(1, "t", 0.01, 1, 0)])).data[0]
    assert (tiny.zmin, tiny.zmax) == (-0.1, 0.1)
    clamp = get_settings().score_clamp
    huge = tag_heatmap_figure(_scores([(1, "t", clamp * 10, 1, 0)])).data[0]
    assert (huge.zmin, huge.zmax) == (-clamp, clamp)


def test_heatmap_of_nothing_says_so() -> None:
    fig = tag_heatmap_figure(pd.DataFrame())
    assert fig.data == () and fig.layout.annotations[0].text == "No scores yet"


def _history(tags: list[str], *, points: dict[str, int] | None = None) -> pd.DataFrame:
    rows = []
    for tag in tags:
        for k in range((points or {}).get(tag, 1)):
            rows.append(
                {"tag": tag, "at": T0 + timedelta(hours=k), "new_score": 0.1 * (k + 1), "raw_score": 1.0,
                 "weight": 1.0, "old_score": 0.1 * k, "source": "<script>" if tag == HOSTILE else "judge"}
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_ema_history_has_a_facet_per_tag_family_and_a_line_per_tag_in_time_order() -> None:
    frame = pd.DataFrame(
        {
            "tag": ["lang:tr", "lang:en", "lang:en", HOSTILE],
            "at": [T0, T0 + timedelta(hours=1), T0, T0],
            "new_score": [0.3, 0.51, 0.3, -0.3],
            "raw_score": [1.0, 1.0, 1.0, -1.0],
            "weight": [1.0, 0.7, 1.0, 1.0],
            "old_score": [0.0, 0.3, 0.0, 0.0],
            "source": ["reviewer", "judge", "<script>", "judge"],
        }
    )
    fig = ema_history_figure(frame)
    assert [(t.name, t.yaxis) for t in fig.data] == [
        ("lang:en", "y"), ("lang:tr", "y"), (plotly_text(HOSTILE), "y2")
    ]  # fmt: skip
    assert [a.text for a in fig.layout.annotations] == ["lang", "other"]
    en = fig.data[0]
    assert list(en.y) == [0.3, 0.51]  # time order, not row order
    assert [row[3] for row in en.customdata] == ["&lt;script&gt;", "judge"]
    assert list(en.text) == ["", "en"]  # labelled at its end instead of in a legend
    assert not any(t.showlegend for t in fig.data)
    assert all(HOSTILE not in t.hovertemplate for t in fig.data)
    threshold = get_settings().negative_score_threshold
    assert sorted({shape.y0 for shape in fig.layout.shapes}) == sorted({0, threshold})
    assert fig.layout.yaxis.range[0] < min(-0.3, threshold)


def test_ema_history_draws_the_most_evaluated_tags_of_a_family_and_says_how_many_it_leaves_out() -> None:
    tags = [f"category:c{i}" for i in range(9)]
    fig = ema_history_figure(_history(tags, points={"category:c8": 3, "category:c7": 2}), per_family=3)
    assert [t.name for t in fig.data] == ["category:c0", "category:c7", "category:c8"]
    assert fig.layout.annotations[0].text == "category, 3 most evaluated of 9 tags"


def test_ema_history_draws_exactly_the_picked_tags() -> None:
    tags = [f"category:c{i}" for i in range(9)]
    fig = ema_history_figure(_history(tags), tags=["category:c5", "category:c6"], per_family=1)
    assert [t.name for t in fig.data] == ["category:c5", "category:c6"]


def test_history_tags_puts_the_most_evaluated_first() -> None:
    frame = _history(["b", "a", "c"], points={"c": 3})
    assert history_tags(frame) == ["c", "a", "b"]
    assert history_tags(pd.DataFrame()) == []


def test_ema_history_of_nothing_says_so() -> None:
    fig = ema_history_figure(pd.DataFrame(columns=["tag", "at", "new_score"]))
    assert fig.data == () and "No scores" in fig.layout.annotations[0].text


# --------------------------------------------------------------------------------------------
# lib.alignment_charts


def _alignment_measures(arms: list[str]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arm": arms,
            "metric": ["clarity"] * len(arms),
            "pairs": [12] * len(arms),
            "exact_agreement": [0.5] * len(arms),
            "exact_agreement_lo": [0.3] * len(arms),
            "exact_agreement_hi": [0.7] * len(arms),
            "weighted_kappa": [-0.2] * len(arms),
            "weighted_kappa_lo": [-0.45] * len(arms),
            "weighted_kappa_hi": [0.1] * len(arms),
        }
    )


@pytest.mark.parametrize(
    ("measure", "expected"), [("exact_agreement", (0.0, 1.02)), ("weighted_kappa", (-0.5, 1.02))]
)
def test_comparison_axis_covers_values_and_intervals(measure: str, expected: tuple[float, float]) -> None:
    fig = comparison_figure(_alignment_measures(["bare", HOSTILE]), measure)
    assert tuple(fig.layout.yaxis.range) == pytest.approx(expected)
    assert [t.name for t in fig.data] == ["bare", plotly_text(HOSTILE)]
    assert "n = %{customdata[0]} pairs" in fig.data[0].hovertemplate
    assert all(HOSTILE not in t.hovertemplate for t in fig.data)


# --------------------------------------------------------------------------------------------
# Notes: type labels and the timeline


def test_every_note_type_has_an_icon_label_and_a_style() -> None:
    assert list(TYPE_LABELS) == list(NOTE_TYPES) == list(NOTE_TYPE_STYLES)
    assert note_type_label("STRATEGY") == "💡 STRATEGY"
    assert note_type_label("ODD") == "📝 ODD"
    assert len({s.symbol for s in NOTE_TYPE_STYLES.values()}) == len(NOTE_TYPES)
    assert len({s.color for s in NOTE_TYPE_STYLES.values()}) == len(NOTE_TYPES)


def _timeline() -> tuple[pd.DataFrame, pd.DataFrame]:
    sessions = pd.DataFrame(
        {
            "session_id": ["old", HOSTILE],
            "notes": [2, 1],
            "first_note": [T0, T0 + timedelta(days=3)],
            "last_note": [T0 + timedelta(minutes=40), T0 + timedelta(days=3)],
        }
    )
    notes = pd.DataFrame(
        {
            "session_id": ["old", "old", HOSTILE, "elsewhere"],
            "note_type": ["TIP", "FAILURE", "TIP", "TIP"],
            "timestamp": [T0, T0 + timedelta(minutes=40), T0 + timedelta(days=3), T0],
            "language": ["en", "", "tr", "en"],
            "content": ["short", '<img src=x onerror="alert(1)"> ' + "long " * 80, "%{y} text", "x"],
        }
    )
    return sessions, notes


def test_notes_timeline_puts_sessions_on_rows_and_notes_as_marks_by_type() -> None:
    sessions, notes = _timeline()
    fig = notes_timeline_figure(sessions, notes)
    span, *marks = fig.data
    assert span.mode == "lines" and list(span.y) == [0, 0, None, 1, 1, None]  # newest session on top
    assert [t.name for t in marks] == ["❌ FAILURE", "💭 TIP"]  # type order, not data order
    failure, tip = marks
    assert failure.marker.symbol == NOTE_TYPE_STYLES["FAILURE"].symbol
    assert tip.marker.color == NOTE_TYPE_STYLES["TIP"].color
    assert len(tip.x) == 2  # the note of a session not on this page is left out
    assert failure.y[0] != tip.y[0] and round(failure.y[0]) == round(tip.y[0]) == 0  # own lane, same row
    assert list(fig.layout.yaxis.ticktext) == ["old · 2 notes", plotly_text(f"{HOSTILE} · 1 note")]


def test_notes_timeline_hover_shows_escaped_excerpts() -> None:
    sessions, notes = _timeline()
    fig = notes_timeline_figure(sessions, notes)
    failure = fig.data[1]
    session_id, language, excerpt = failure.customdata[0]
    assert (session_id, language) == ("old", "every language")
    assert "<img" not in excerpt and "&lt;img" in excerpt and excerpt.endswith("…")
    tip_texts = [row[2] for row in fig.data[2].customdata]
    assert "%{y} text" in tip_texts  # data, never part of the template
    assert all("%{customdata[2]}" in t.hovertemplate for t in fig.data[1:])


def test_notes_timeline_without_sessions_says_so() -> None:
    empty = pd.DataFrame(columns=["session_id", "notes", "first_note", "last_note"])
    fig = notes_timeline_figure(empty, pd.DataFrame())
    assert fig.data == () and fig.layout.annotations[0].text == "No sessions"


# --------------------------------------------------------------------------------------------
# lib.precedent_view: outcomes in the palette


def test_precedent_outcomes_use_the_palette() -> None:
    counts = pd.DataFrame({"outcome": [MATCHED, "no_qa_match", HOSTILE], "count": [3, 1, 1]})
    (bars,) = reason_figure(counts).data
    assert list(bars.marker.color) == [OKABE_ITO[2], OKABE_ITO[5], OKABE_ITO[5]]
    assert list(bars.x)[2] == plotly_text(HOSTILE)
