"""Analytics' Reviewers tab under AppTest: what a lead sees of agreement between reviewers, what the
filters change, the empty states, and the human-vs-human ceiling on the Judge vs human tab."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from lib.analytics_charts import CEILING_HALF, CEILING_NAME
from tests.conftest import DemoTemplate
from tests.pages.figures import figure_titled, values
from tests.test_agreement import SECTION_C, Label, add_queue, matrix_items
from tests.test_analytics import seed_analytics_data

PAGE = "pages/analytics.py"
KEY = "analytics_reviewers"


def table_with(at: AppTest, column: str) -> pd.DataFrame:
    """A shown table told by one of its columns (AppTest exposes no dataframe keys)."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def team_data(engine: Engine) -> None:
    add_queue(engine, "team", matrix_items(SECTION_C))
    blind_items = [
        (str(i), [Label("ana", final, blind=blind), Label("ben", "4", blind="4")])
        for i, (blind, final) in enumerate([("2", "4"), ("3", "3"), ("5", "4"), ("1", "2")])
    ]
    decided = [("resolved", "4"), ("adjudicated", "4"), ("resolved", "4"), ("adjudicated", "2")]
    add_queue(engine, "blind", blind_items, product="other", mode="blind", judge=["4"] * 4, resolved=decided)


def test_reviewers_tab_shows_alpha_with_its_interval_per_metric_and_queue(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    team_data(app_engine)
    at = open_page(PAGE)
    assert [t.label for t in at.tabs] == ["Judge vs human", "Judge versions", "Reviewers"]
    table = table_with(at, "mean_pairwise_kappa")
    acme = table[table["product"] == "acme"].iloc[0]
    assert acme["alpha"].startswith("0.82 [")  # Krippendorff (2011) section C, ordinal: 0.815
    assert (acme["items"], acme["reviewers"], acme["level"]) == (11, 4, "ordinal")
    assert "Agreement per metric" in [s.value for s in at.subheader]
    assert "queue" in table_with(at, "queue").columns  # two queues: a per-queue table too
    assert not at.exception


def test_reviewers_tab_filters_by_queue_and_switches_to_blind_labels(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    team_data(app_engine)
    at = open_page(PAGE)
    queue = at.selectbox(key=f"{KEY}_queue")
    assert queue.options == ["All queues", "blind", "team"]
    queue.select_index(1).run()
    table = table_with(at, "mean_pairwise_kappa")
    assert list(table["product"]) == ["other"]
    assert table.iloc[0]["exact_agreement"].startswith("50 %")  # final pairs (4,4) (3,4) (4,4) (2,4)
    at.radio(key=f"{KEY}_basis").set_value("blind").run()
    table = table_with(at, "mean_pairwise_kappa")
    assert table.iloc[0]["exact_agreement"].startswith("0 %")  # blind pairs (2,4) (3,4) (5,4) (1,4)
    assert not at.exception


def test_reviewers_tab_shows_calibration_and_anchoring_with_downloads(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    team_data(app_engine)
    at = open_page(PAGE)
    anchoring = table_with(at, "moved_toward_judge")
    ana = anchoring[(anchoring["reviewer"] == "ana") & (anchoring["metric_name"] == "(all metrics)")].iloc[0]
    assert (ana["labels"], ana["moved_toward_judge"], ana["moved_away"]) == (4, 3, 0)
    calibration = table_with(at, "adjudicated_against")
    totals = calibration[calibration["metric_name"] == "(all metrics)"].set_index("reviewer")
    assert (totals.loc["ana", "adjudicated"], totals.loc["ana", "adjudicated_against"]) == (2, 1)  # 3 vs 4
    assert (totals.loc["ben", "adjudicated"], totals.loc["ben", "adjudicated_against"]) == (2, 1)  # 4 vs 2
    assert totals.loc["ana", "adjudicated_against_share"].startswith("50 % [")
    # Per metric, per queue, reviewer pairs, calibration, anchoring: each table has its CSV.
    assert len(at.get("download_button")) == 5
    assert not at.exception


def test_reviewers_tab_without_labels_says_how_to_get_them(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    at = open_page(PAGE)
    assert any("No team-queue labels yet" in i.value for i in at.info)
    assert not at.exception


def test_judge_tab_draws_the_human_ceiling_over_the_bars_and_lists_it(
    app_engine: Engine, open_page: Callable[..., AppTest]
) -> None:
    seed_analytics_data(app_engine)
    items = [
        ("1", [Label("ana", "3"), Label("ben", "3")]),
        ("2", [Label("ana", "4"), Label("ben", "5")]),
    ]
    add_queue(app_engine, "truth", items, product="alpha", metric="truthfulness")
    at = open_page(PAGE)
    ceiling = table_with(at, "human_exact_agreement").iloc[0]
    assert (ceiling["product"], ceiling["metric"], ceiling["items"]) == ("alpha", "truthfulness", 2)
    assert ceiling["human_exact_agreement"] == 0.5
    figure = figure_titled(at, "Judge vs human agreement per metric")
    ticks = [t for t in figure["data"] if t.get("name") == CEILING_NAME]
    assert len(ticks) == 4 and ticks[0]["showlegend"] is True  # one per measure, one legend entry
    at_truthfulness = list(ticks[0]["x"]).index("Truthfulness")
    assert ticks[0]["customdata"][at_truthfulness] == [2, 0.5]  # n items, the exact agreement
    assert values(ticks[0]["base"])[at_truthfulness] == pytest.approx(0.5 - CEILING_HALF)
    assert ticks[0]["offsetgroup"] == "exact_agreement"  # drawn over the exact-agreement bar
    assert not at.exception


def test_reviewers_tab_on_the_demo_shows_real_figures_on_first_start(
    app_engine: Engine, open_page: Callable[..., AppTest], sqlite_demo: DemoTemplate
) -> None:
    app_engine.dispose()  # the page's database becomes a copy of a first demo load
    sqlite_demo.copy_to(Path(app_engine.url.database or ""))
    at = open_page(PAGE)
    table = table_with(at, "mean_pairwise_kappa")
    assert len(table) >= 1 and (table["items"] > 0).all()
    assert table["alpha"].str.match(r"^-?\d\.\d\d( \[|$)").all()  # a number, not "–"
    anchoring = table_with(at, "moved_toward_judge")
    assert (anchoring["labels"] > 0).all()  # the demo's blind-first queue was revealed and labelled
    calibration = table_with(at, "adjudicated_against")
    everyone = calibration[calibration["reviewer"] == "(all reviewers)"].iloc[0]
    assert everyone["adjudicated"] > 0  # the demo's lead adjudicated some disputes
    assert not at.exception
