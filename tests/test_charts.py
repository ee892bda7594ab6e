"""The chart modules (DataFrame → plotly Figure): lib.charts, lib.analytics_charts, lib.relevance_charts.

Pure functions over small hand-built frames: which traces a figure has, in what order, with what
values, and that names taken from data are shown literally (HTML-escaped, never a hover template).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from lib.analytics_charts import (
    AGREEMENT_SERIES,
    agreement_figure,
    gap_histogram_figure,
    metric_label,
    weekly_trend_figure,
)
from lib.charts import correction_rate_figure, plotly_text
from lib.config import get_settings
from lib.relevance_charts import ema_history_figure, tag_heatmap_figure

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


def test_correction_rate_figure_has_one_sorted_line_per_product() -> None:
    frame = pd.DataFrame(
        {
            "product": ["b", "a", "a", HOSTILE],
            "period": [T0, T0 + timedelta(days=7), T0, T0],
            "reviewed": [4, 2, 5, 1],
            "corrected": [1, 1, 0, 1],
            "correction_rate": [0.25, 0.5, 0.0, 1.0],
        }
    )
    fig = correction_rate_figure(frame)
    assert [t.name for t in fig.data] == [plotly_text(HOSTILE), "a", "b"]
    a = fig.data[1]
    assert list(a.y) == [0.0, 0.5]  # sorted by period, not by row order
    assert [list(row) for row in a.customdata] == [[0, 5], [1, 2]]
    assert "%{fullData.name}" in a.hovertemplate and HOSTILE not in a.hovertemplate
    assert fig.layout.yaxis.tickformat == ".0%"


def test_correction_rate_figure_of_nothing_has_no_lines() -> None:
    empty = pd.DataFrame(columns=["product", "period", "reviewed", "corrected", "correction_rate"])
    assert correction_rate_figure(empty, title="T").data == ()


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
    assert list(fig.data[0].customdata) == [10, 3]
    assert fig.layout.barmode == "group" and tuple(fig.layout.yaxis.range) == (-1, 1)


def test_agreement_figure_prefixes_products_when_several_are_shown() -> None:
    fig = agreement_figure(_agreement(["acme", "beta"]))
    assert list(fig.data[0].x) == ["acme · Clarity", plotly_text(f"beta · {HOSTILE}")]


@pytest.mark.parametrize("figure", [agreement_figure, gap_histogram_figure, weekly_trend_figure])
def test_an_empty_frame_gives_a_figure_that_says_so(figure) -> None:
    fig = figure(pd.DataFrame(), title="Nothing")
    assert fig.data == () and fig.layout.annotations[0].text == "No scored pairs"
    assert fig.layout.title.text == "Nothing"


def test_gap_histogram_has_one_series_per_product_and_metric() -> None:
    frame = pd.DataFrame(
        {
            "product": ["acme", "acme", "beta"],
            "metric": ["clarity", "clarity", "clarity"],
            "metric_name": ["Clarity", "Clarity", HOSTILE],
            "gap_bucket": [0.0, 1.5, 0.5],
            "pairs": [7, 2, 1],
        }
    )
    fig = gap_histogram_figure(frame)
    assert [(t.name, list(t.x), list(t.y)) for t in fig.data] == [
        ("acme · Clarity", [0.0, 1.5], [7, 2]),
        (plotly_text(f"beta · {HOSTILE}"), [0.5], [1]),
    ]
    assert all(HOSTILE not in t.hovertemplate for t in fig.data)


def test_weekly_trend_has_one_line_per_product() -> None:
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
    assert [t.name for t in fig.data] == [plotly_text(HOSTILE), "acme"]
    assert list(fig.data[1].y) == [0.25, 0.6]
    assert [list(r) for r in fig.data[1].customdata] == [[4, 0.5], [5, 0.8]]


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
    assert list(trace.y) == ["#1 TIP: note 1", plotly_text(f"#2 TIP: {HOSTILE}")]
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


def test_ema_history_has_a_line_per_tag_in_time_order_and_the_filter_threshold() -> None:
    frame = pd.DataFrame(
        {
            "tag": ["b", "a", "a", HOSTILE],
            "at": [T0, T0 + timedelta(hours=1), T0, T0],
            "new_score": [0.3, 0.51, 0.3, -0.3],
            "raw_score": [1.0, 1.0, 1.0, -1.0],
            "weight": [1.0, 0.7, 1.0, 1.0],
            "old_score": [0.0, 0.3, 0.0, 0.0],
            "source": ["reviewer", "judge", "<script>", "judge"],
        }
    )
    fig = ema_history_figure(frame)
    assert [t.name for t in fig.data] == [plotly_text(HOSTILE), "a", "b"]
    a = fig.data[1]
    assert list(a.y) == [0.3, 0.51]
    assert [row[3] for row in a.customdata] == ["&lt;script&gt;", "judge"]
    lines = [shape.y0 for shape in fig.layout.shapes]
    assert lines == [0, get_settings().negative_score_threshold]
