"""Reviewer-agreement charts: intervals drawn as the tables hold them, pairs mirrored, anchoring
shares that add up, names from data shown literally, and empty states."""

from __future__ import annotations

import pandas as pd
import pytest

from lib import agreement
from lib.agreement_charts import anchoring_figure, calibration_figure, pairs_heatmap, reliability_figure

HOSTILE = "<b>eve</b>%{x}"


def metrics_frame() -> pd.DataFrame:
    row = dict.fromkeys(agreement.METRIC_COLUMNS, 0.0)
    row |= {
        "product": "acme", "metric": "clarity", "metric_name": "Clarity", "level": "ordinal", "items": 40,
        "reviewers": 3, "alpha": 0.7, "alpha_lo": 0.5, "alpha_hi": 0.85, "exact_agreement": 0.6,
        "exact_agreement_lo": 0.45, "exact_agreement_hi": 0.75, "within_1_agreement": float("nan"),
        "within_1_agreement_lo": float("nan"), "within_1_agreement_hi": float("nan"), "mean_pairwise_kappa": 0.65,
    }  # fmt: skip
    return pd.DataFrame([row], columns=agreement.METRIC_COLUMNS)


def test_reliability_bars_carry_the_bootstrap_interval_as_error_bars() -> None:
    fig = reliability_figure(metrics_frame())
    alpha = next(t for t in fig.data if t.name == "Krippendorff's α")
    assert list(alpha.y) == [0.7]
    assert list(alpha.error_y.array) == [pytest.approx(0.15)]
    assert list(alpha.error_y.arrayminus) == [pytest.approx(0.2)]
    kappa = next(t for t in fig.data if t.name == "Mean pairwise kappa")
    assert kappa.error_y.array is None  # no interval for the mean of pairs: none drawn


def test_pairs_heatmap_is_mirrored_and_names_are_shown_literally() -> None:
    pairs = pd.DataFrame(
        [
            {"reviewer_a": "ana", "reviewer_b": HOSTILE, "items": 12, "kappa": 0.4, "exact_agreement": 0.5},
            {
                "reviewer_a": "ana",
                "reviewer_b": "ben",
                "items": 3,
                "kappa": float("nan"),
                "exact_agreement": 1.0,
            },
        ]
    )
    fig = pairs_heatmap(pairs)
    heat = fig.data[0]
    names = list(heat.x)
    assert "&lt;b&gt;eve&lt;/b&gt;%{x}" in names and HOSTILE not in names
    i, j = names.index("ana"), names.index("&lt;b&gt;eve&lt;/b&gt;%{x}")
    assert heat.z[i][j] == heat.z[j][i] == 0.4
    assert heat.text[names.index("ben")][i] == "n/a<br>n=3"


def test_anchoring_shares_of_each_reviewer_add_up_to_one() -> None:
    row = {
        "reviewer": HOSTILE, "metric_name": agreement.ALL_METRICS, "labels": 10, "changed": 6,
        "moved_toward_judge": 4, "moved_away": 1,
    }  # fmt: skip
    fig = anchoring_figure(pd.DataFrame([row]))
    assert [t.name for t in fig.data] == [
        "Moved toward the judge", "Moved away from the judge", "Changed, no closer", "Kept their blind label",
    ]  # fmt: skip
    assert [float(t.x[0]) for t in fig.data] == [0.4, 0.1, 0.1, 0.4]
    assert list(fig.data[0].y) == ["&lt;b&gt;eve&lt;/b&gt;%{x}"]


def test_calibration_axis_is_symmetric_around_zero() -> None:
    row = dict.fromkeys(agreement.CALIBRATION_COLUMNS, 0)
    row |= {
        "reviewer": "ana", "metric_name": agreement.ALL_METRICS, "decided": 9,
        "mean_signed_difference_rescaled": 0.8, "mean_signed_difference_rescaled_lo": 0.2,
        "mean_signed_difference_rescaled_hi": 1.4, "adjudicated": 4, "adjudicated_against": 1,
        "adjudicated_against_share": 0.25, "adjudicated_against_share_lo": 0.05, "adjudicated_against_share_hi": 0.7,
    }  # fmt: skip
    fig = calibration_figure(pd.DataFrame([row]))
    low, high = fig.layout.xaxis.range
    assert low == -high and high >= 1.4


@pytest.mark.parametrize("draw", [reliability_figure, pairs_heatmap, calibration_figure, anchoring_figure])
def test_empty_tables_draw_a_message_not_an_error(draw) -> None:
    fig = draw(pd.DataFrame(columns=["reviewer", "metric_name", "product"]))
    assert fig.layout.annotations and not fig.data
