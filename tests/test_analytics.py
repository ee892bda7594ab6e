"""Judge-vs-human analytics on a small hand-made data set with known answers, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from lib import analytics
from lib.analytics import AnalyticsFilters
from lib.db import session_scope
from lib.models import EvaluationSnapshot, MetricDefinition
from lib.reliability import kappa

WEEK_1 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)  # a Monday
WEEK_2 = datetime(2026, 1, 12, 9, 0, tzinfo=UTC)
# alpha uses the default 1-5 rubric; each pair is (user, judge); the first three fall in week 1.
ALPHA_TRUTH = [(5, 5), (4, 5), (3, 1), (2, 2), (1, 2), (4, 4)]
ALPHA_HELP = [(5, 4), (4, 4), (3, 3), (2, 4), (1, 1), (5, 5)]
# beta defines one continuous 0-1 metric: within-1 means |u - j| <= 0.25 there.
BETA_FLUENCY = [(0.5, 0.5), (0.5, 0.7), (0.2, 0.9), (1.0, 0.8)]


def _entry(value: float, bare: bool) -> object:
    return value if bare else {"score": value, "reason": "<b>why</b>"}


def seed_analytics_data(engine: Engine) -> None:
    """The hand-made set: alpha (en, two weeks), beta (tr), plus rows that must not count."""
    with session_scope(engine) as s:
        s.add(
            MetricDefinition(
                product="beta",
                slug="fluency",
                display_name="Fluency",
                min_value=0.0,
                max_value=1.0,
                integer_scale=False,
            )
        )
        for i, ((tu, tj), (hu, hj)) in enumerate(zip(ALPHA_TRUTH, ALPHA_HELP, strict=True)):
            s.add(
                EvaluationSnapshot(
                    id=f"alpha_{i}",
                    question="q",
                    model_answer="a",
                    product="alpha",
                    language="en",
                    created_at=(WEEK_1 if i < 3 else WEEK_2) + timedelta(hours=i),
                    user_scores_json={
                        "truthfulness": _entry(tu, i % 2 == 0),
                        "helpfulness": _entry(hu, False),
                    },
                    judge_scores_json={
                        "truthfulness": _entry(tj, False),
                        "helpfulness": _entry(hj, i % 2 == 1),
                    },
                )
            )
        for i, (u, j) in enumerate(BETA_FLUENCY):
            s.add(
                EvaluationSnapshot(
                    id=f"beta_{i}",
                    question="q",
                    model_answer="a",
                    product="beta",
                    language="tr",
                    created_at=WEEK_2 + timedelta(days=1, hours=i),
                    user_scores_json={"fluency": {"score": u}},
                    judge_scores_json={"fluency": {"score": j}},
                )
            )
        # Archived, one-sided, boolean and string scores never form pairs.
        s.add(
            EvaluationSnapshot(
                id="alpha_archived",
                question="q",
                model_answer="a",
                product="alpha",
                created_at=WEEK_1,
                deleted_at=WEEK_2,
                user_scores_json={"truthfulness": 1},
                judge_scores_json={"truthfulness": 5},
            )
        )
        s.add(
            EvaluationSnapshot(
                id="alpha_odd",
                question="q",
                model_answer="a",
                product="alpha",
                created_at=WEEK_1,
                user_scores_json={"truthfulness": {"score": True}, "helpfulness": 3, "safety": "5"},
                judge_scores_json={"truthfulness": {"score": 1}, "safety": {"score": 5}},
            )
        )


def _report(engine: Engine, **filters: object) -> analytics.AgreementReport:
    with Session(engine) as session:
        return analytics.load_report(session=session, filters=AnalyticsFilters(**filters))


def _row(report: analytics.AgreementReport, product: str, metric: str) -> pd.Series:
    rows = report.metrics[(report.metrics["product"] == product) & (report.metrics["metric"] == metric)]
    assert len(rows) == 1
    return rows.iloc[0]


def _kappa_from_pairs(pairs: list[tuple[int, int]], low: int = 1, high: int = 5) -> float:
    """Quadratic weighted kappa written out over the whole scale, independent of the count table."""
    size = high - low + 1
    observed = np.zeros((size, size))
    for u, j in pairs:
        observed[u - low, j - low] += 1
    observed /= len(pairs)
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    weights = np.array([[(a - b) ** 2 / (size - 1) ** 2 for b in range(size)] for a in range(size)])
    return 1 - (weights * observed).sum() / (weights * expected).sum()


def _spearman(pairs: list[tuple[float, float]]) -> float:
    frame = pd.DataFrame(pairs, columns=["u", "j"])
    # DataFrame.corr ranks in pandas itself (Series.corr would need scipy, which is not installed).
    return float(frame.corr(method="spearman").loc["u", "j"])


@pytest.fixture
def seeded(engine: Engine) -> Iterator[Engine]:
    seed_analytics_data(engine)
    yield engine


@pytest.mark.pg_repeats("statements and lines of test_weekly_trend_is_exact_agreement_per_week_and_product")
@pytest.mark.parametrize(
    ("product", "metric", "pairs", "exact", "within_1"),
    [
        ("alpha", "truthfulness", 6, 3 / 6, 5 / 6),
        ("alpha", "helpfulness", 6, 4 / 6, 5 / 6),
        ("beta", "fluency", 4, 1 / 4, 3 / 4),
    ],
)
def test_agreement_rates_match_hand_counts(
    seeded: Engine, product: str, metric: str, pairs: int, exact: float, within_1: float
) -> None:
    row = _row(_report(seeded), product, metric)
    assert (row["pairs"], row["exact_agreement"], row["within_1_agreement"]) == (
        pairs,
        pytest.approx(exact),
        pytest.approx(within_1),
    )


def test_only_metrics_with_pairs_are_listed(seeded: Engine) -> None:
    metrics = _report(seeded).metrics
    assert list(zip(metrics["product"], metrics["metric"], strict=True)) == [
        ("alpha", "truthfulness"),
        ("alpha", "helpfulness"),
        ("beta", "fluency"),
    ]


@pytest.mark.pg_repeats("statements and lines of test_weekly_trend_is_exact_agreement_per_week_and_product")
@pytest.mark.parametrize(("metric", "pairs"), [("truthfulness", ALPHA_TRUTH), ("helpfulness", ALPHA_HELP)])
def test_weighted_kappa_matches_direct_formula(seeded: Engine, metric: str, pairs: list) -> None:
    assert _row(_report(seeded), "alpha", metric)["weighted_kappa"] == pytest.approx(_kappa_from_pairs(pairs))


@pytest.mark.pg_repeats("statements and lines of test_weekly_trend_is_exact_agreement_per_week_and_product")
def test_kappa_is_not_computed_on_a_continuous_scale(seeded: Engine) -> None:
    report = _report(seeded)
    assert math.isnan(_row(report, "beta", "fluency")["weighted_kappa"])
    shown = analytics.display_frame(report)
    assert shown.loc[shown["metric"] == "fluency", "weighted_kappa"].item() == "n/a"


@pytest.mark.pg_repeats("statements and lines of test_weekly_trend_is_exact_agreement_per_week_and_product")
@pytest.mark.parametrize(
    ("product", "metric", "pairs"),
    [
        ("alpha", "truthfulness", ALPHA_TRUTH),
        ("alpha", "helpfulness", ALPHA_HELP),
        ("beta", "fluency", BETA_FLUENCY),
    ],
)
def test_spearman_matches_pandas_rank_correlation(
    seeded: Engine, product: str, metric: str, pairs: list
) -> None:
    assert _row(_report(seeded), product, metric)["spearman"] == pytest.approx(_spearman(pairs))


@pytest.mark.pg_repeats("statements and lines of test_weekly_trend_is_exact_agreement_per_week_and_product")
def test_gap_histogram_counts_rescaled_gaps(seeded: Engine) -> None:
    gaps = _report(seeded).gaps
    counts = {
        (r.metric, float(r.gap_bucket)): int(r.pairs) for r in gaps.itertuples() if r.metric != "helpfulness"
    }
    assert counts == {
        ("truthfulness", 0.0): 3,
        ("truthfulness", 1.0): 2,
        ("truthfulness", 2.0): 1,
        ("fluency", 0.0): 1,
        ("fluency", 0.5): 2,  # |0.2| on a 0-1 span is 0.8 on 1-5
        ("fluency", 2.5): 1,  # |0.7| -> 2.8
    }


def test_weekly_trend_is_exact_agreement_per_week_and_product(seeded: Engine) -> None:
    weekly = _report(seeded).weekly
    got = {(r.product, r.week, int(r.pairs)): round(float(r.exact_agreement), 6) for r in weekly.itertuples()}
    assert got == {
        ("alpha", date(2026, 1, 5), 6): 0.5,
        ("alpha", date(2026, 1, 12), 6): round(4 / 6, 6),
        ("beta", date(2026, 1, 12), 4): 0.25,
    }


@pytest.mark.parametrize(
    ("filters", "expected_pairs"),
    [
        ({"language": "tr"}, {("beta", "fluency"): 4}),
        ({"products": ("alpha",)}, {("alpha", "truthfulness"): 6, ("alpha", "helpfulness"): 6}),
        (
            {"start": date(2026, 1, 12)},
            {("alpha", "truthfulness"): 3, ("alpha", "helpfulness"): 3, ("beta", "fluency"): 4},
        ),
        ({"end": date(2026, 1, 11)}, {("alpha", "truthfulness"): 3, ("alpha", "helpfulness"): 3}),
        ({"language": "de"}, {}),
    ],
)
def test_filters_narrow_the_pairs(seeded: Engine, filters: dict, expected_pairs: dict) -> None:
    metrics = _report(seeded, **filters).metrics
    assert {(r.product, r.metric): int(r.pairs) for r in metrics.itertuples()} == expected_pairs


@pytest.mark.pg_repeats("statements and lines of test_weekly_trend_is_exact_agreement_per_week_and_product")
def test_empty_database_gives_an_empty_report(engine: Engine) -> None:
    report = _report(engine)
    assert report.empty and report.gaps.empty and report.weekly.empty


def test_filter_options_list_live_products_languages_and_days(seeded: Engine) -> None:
    with Session(seeded) as session:
        options = analytics.load_filter_options(session=session)
    assert (options.products, options.languages, options.first_day, options.last_day) == (
        ["alpha", "beta"],
        ["en", "tr"],
        date(2026, 1, 5),
        date(2026, 1, 13),
    )


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([(1, 1, 3), (5, 5, 2)], 1.0),
        ([(3, 3, 4)], float("nan")),  # one shared score: undefined, not perfect
        ([(1, 5, 1), (5, 1, 1)], -1.0),
    ],
)
def test_quadratic_kappa_edge_cases(rows: list[tuple[int, int, int]], expected: float) -> None:
    u, j, n = zip(*rows, strict=True)
    result = kappa(u, j, n, weights="quadratic")
    assert (math.isnan(result) and math.isnan(expected)) or result == pytest.approx(expected)
