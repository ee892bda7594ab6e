"""Analytics page under AppTest: the agreement table and charts, filters that change the numbers,
the empty states, and hostile names shown literally."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date

import pandas as pd
import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from lib.db import session_scope
from lib.models import EvaluationSnapshot
from tests.pages.figures import figure_titled
from tests.test_analytics import seed_analytics_data

PAGE = "pages/analytics.py"


def metrics_table(at: AppTest) -> pd.DataFrame:
    """The per-metric table (AppTest exposes no dataframe keys, so it is told by its columns)."""
    return next(d.value for d in at.dataframe if "weighted_kappa" in d.value.columns)


def pairs_by_metric(at: AppTest) -> dict[tuple[str, str], int]:
    table = metrics_table(at)
    return {(r.product, r.metric): int(r.pairs) for r in table.itertuples()}


@pytest.fixture
def seeded(app_engine: Engine) -> Engine:
    seed_analytics_data(app_engine)
    return app_engine


def test_page_shows_metric_table_three_charts_and_downloads(
    seeded: Engine, open_page: Callable[..., AppTest]
) -> None:
    at = open_page(PAGE)
    table = metrics_table(at)
    truth = table[(table["product"] == "alpha") & (table["metric"] == "truthfulness")].iloc[0]
    assert (truth["pairs"], truth["exact_agreement"], truth["within_1_agreement"]) == (6, "0.500", "0.833")
    assert table.loc[table["metric"] == "fluency", "weighted_kappa"].item() == "n/a"
    assert len(at.get("plotly_chart")) == 3
    assert len(at.get("download_button")) == 3
    assert not at.exception


@pytest.mark.parametrize(
    ("widget", "key", "value", "expected"),
    [
        ("selectbox", "analytics_language", "tr", {("beta", "fluency"): 4}),
        (
            "multiselect",
            "analytics_products",
            ["alpha"],
            {("alpha", "truthfulness"): 6, ("alpha", "helpfulness"): 6},
        ),
        (
            "date_input",
            "analytics_dates",
            (date(2026, 1, 5), date(2026, 1, 11)),
            {("alpha", "truthfulness"): 3, ("alpha", "helpfulness"): 3},
        ),
    ],
)
def test_filters_change_the_numbers(
    seeded: Engine, open_page: Callable[..., AppTest], widget: str, key: str, value: object, expected: dict
) -> None:
    at = open_page(PAGE)
    getattr(at, widget)(key=key).set_value(value).run()
    assert pairs_by_metric(at) == expected
    assert not at.exception


def test_empty_database_shows_an_empty_state(app_engine: Engine, open_page: Callable[..., AppTest]) -> None:
    at = open_page(PAGE)
    assert "No evaluations yet" in at.info[0].value
    assert not at.get("plotly_chart")
    assert not at.exception


def test_evaluations_without_pairs_show_the_no_pairs_state(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    with session_scope(app_engine) as s:
        s.add(
            EvaluationSnapshot(
                id="one_sided",
                question="q",
                model_answer="a",
                product="p",
                user_scores_json={"truthfulness": 4},
                judge_scores_json={},
            )
        )
    at = open_page(PAGE)
    assert "No metric was scored by both" in at.info[0].value
    assert not at.dataframe
    assert not at.exception


def test_hostile_product_name_is_escaped_in_chart_labels(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    hostile = "<img src=x onerror=alert(1)>"
    with session_scope(app_engine) as s:
        for i, (u, j) in enumerate([(1, 2), (3, 3)]):
            s.add(
                EvaluationSnapshot(
                    id=f"h{i}",
                    question="q",
                    model_answer="a",
                    product=hostile,
                    user_scores_json={"truthfulness": u},
                    judge_scores_json={"truthfulness": j},
                )
            )
    at = open_page(PAGE)
    weekly = json.loads(at.get("plotly_chart")[2].proto.spec)
    assert weekly["data"][0]["name"] == "&lt;img src=x onerror=alert(1)&gt;"
    assert not at.exception


def test_gap_histogram_shows_one_panel_per_metric_of_the_picked_product(
    seeded: Engine, open_page: Callable[..., AppTest]
) -> None:
    at = open_page(PAGE)
    picker = at.selectbox(key="analytics_gaps_product")
    assert picker.options == ["alpha", "beta"] and picker.value == "alpha"
    gaps = figure_titled(at, "Gap distribution")
    panels = [a["text"] for a in gaps["layout"]["annotations"]]
    assert panels == ["Truthfulness (n = 6)", "Helpfulness (n = 6)"]
    assert {t["xaxis"] for t in gaps["data"]} == {"x", "x2"}  # two panels, not overlaid series
    picker.set_value("beta").run()
    gaps = figure_titled(at, "Gap distribution")
    assert [a["text"] for a in gaps["layout"]["annotations"]] == [
        f"{name} (n = {n})" for name, n in [("Fluency", 4)]
    ]
    assert not at.exception


def test_agreement_axis_and_trend_show_the_real_range_and_the_sample_size(
    seeded: Engine, open_page: Callable[..., AppTest]
) -> None:
    at = open_page(PAGE)
    agreement = figure_titled(at, "Judge vs human agreement")
    low, high = agreement["layout"]["yaxis"]["range"]
    assert -1 < low <= 0 and high == pytest.approx(1.02)
    trend = figure_titled(at, "Exact agreement per week")
    bars = [t for t in trend["data"] if t["type"] == "bar"]
    lines = [t for t in trend["data"] if t["type"] == "scatter"]
    assert len(bars) == len(lines) == 2 and all(b["yaxis"] == "y2" for b in bars)
    assert all("n = %{customdata[0]} pairs" in t["hovertemplate"] for t in lines)
    assert not at.exception
