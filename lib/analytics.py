"""Judge-vs-human agreement analytics (SPEC §4 "Analytics"), aggregated in DuckDB (SPEC §8).

The human side is the snapshot's own user scores (`user_scores_json`), compared with the judge's
(`judge_scores_json`) metric by metric, on each metric's own scale (its product's rubric from
`lib.metrics`). Pairs are extracted and aggregated in DuckDB SQL; Python only ever sees small frames
(one row per product × metric, per gap bucket, or per week), and kappa is computed with numpy from
the tiny per-(user, judge) count table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from lib.duck import fetch_frame, table_ref, with_duck
from lib.metrics import MetricSpec, metrics_for_product
from lib.models import EvaluationSnapshot

SNAPSHOTS = "evaluation_snapshots"
SPEC_VIEW = "analytics_metric_specs"
# A gap equal to one step on the 1-5 span is "within 1"; float noise must not push it out.
_EPSILON = 1e-9
GAP_BUCKET = 0.5  # histogram bucket width on the rescaled 1-5 span

METRIC_COLUMNS = [
    "product",
    "metric",
    "metric_name",
    "scale",
    "pairs",
    "exact_agreement",
    "within_1_agreement",
    "weighted_kappa",
    "spearman",
    "mean_rescaled_gap",
]
GAP_COLUMNS = ["product", "metric", "metric_name", "gap_bucket", "pairs"]
WEEK_COLUMNS = ["product", "week", "pairs", "exact_agreement", "within_1_agreement"]


@dataclass(frozen=True)
class AnalyticsFilters:
    """What the reviewer narrowed the analytics to; empty means everything."""

    products: tuple[str, ...] = ()
    language: str | None = None
    start: date | None = None  # inclusive, UTC day
    end: date | None = None  # inclusive, UTC day


@dataclass(frozen=True)
class FilterOptions:
    """The choices the filters offer: what live snapshots actually contain."""

    products: list[str]
    languages: list[str]
    first_day: date | None
    last_day: date | None


@dataclass
class AgreementReport:
    """Every table the Analytics page shows, already aggregated."""

    metrics: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=METRIC_COLUMNS))
    gaps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=GAP_COLUMNS))
    weekly: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=WEEK_COLUMNS))

    @property
    def empty(self) -> bool:
        return self.metrics.empty


def filter_options(con: duckdb.DuckDBPyConnection) -> FilterOptions:
    """Products, languages and the date span of live (not archived) snapshots."""
    snaps = table_ref(SNAPSHOTS)
    products = fetch_frame(
        con, f"SELECT DISTINCT product FROM {snaps} WHERE deleted_at IS NULL ORDER BY product"
    )
    languages = fetch_frame(
        con, f"SELECT DISTINCT language FROM {snaps} WHERE deleted_at IS NULL ORDER BY language"
    )
    span = con.execute(
        f"SELECT CAST(min(created_at) AS DATE)::VARCHAR, CAST(max(created_at) AS DATE)::VARCHAR "
        f"FROM {snaps} WHERE deleted_at IS NULL"
    ).fetchone()
    first, last = span if span else (None, None)
    return FilterOptions(
        products=[str(p) for p in products["product"]],
        languages=[str(lang) for lang in languages["language"]],
        first_day=date.fromisoformat(first) if first else None,
        last_day=date.fromisoformat(last) if last else None,
    )


def metric_specs_frame(*, session: Session, products: Sequence[str]) -> pd.DataFrame:
    """One row per (product, metric) of each product's rubric: the scales pairs are compared on."""
    rows = [
        _spec_row(product, position, spec)
        for product in products
        for position, spec in enumerate(metrics_for_product(session, product))
    ]
    return pd.DataFrame(
        rows,
        columns=["product", "position", "slug", "display_name", "min_value", "max_value", "integer_scale"],
    )


def _spec_row(product: str, position: int, spec: MetricSpec) -> dict[str, object]:
    return {
        "product": product,
        "position": position,
        "slug": spec.slug,
        "display_name": spec.display_name,
        "min_value": float(spec.min_value),
        "max_value": float(spec.max_value),
        "integer_scale": bool(spec.integer_scale),
    }


def _score_sql(column: str) -> str:
    """SQL for the numeric score of one metric in a scores JSON column, like `lib.metrics.score_of`."""
    entry = f"json_extract(s.{column}, '/' || m.slug)"
    value = f"CASE WHEN json_type({entry}) = 'OBJECT' THEN json_extract({entry}, '/score') ELSE {entry} END"
    # Booleans and strings are not scores (score_of agrees); only JSON numbers count.
    return (
        f"CASE WHEN json_type({value}) IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
        f"THEN CAST(CAST({value} AS VARCHAR) AS DOUBLE) END"
    )


def _pairs_sql(filters: AnalyticsFilters) -> tuple[str, list[object]]:
    """A CTE `pairs` of (product, metric, scale, created_at, u, j) where both sides scored the metric."""
    where = ["s.deleted_at IS NULL"]
    params: list[object] = []
    if filters.products:
        where.append(f"s.product IN ({', '.join('?' for _ in filters.products)})")
        params.extend(filters.products)
    if filters.language:
        where.append("s.language = ?")
        params.append(filters.language)
    if filters.start:
        where.append("s.created_at >= CAST(? AS TIMESTAMPTZ)")
        params.append(f"{filters.start.isoformat()} 00:00:00+00")
    if filters.end:
        where.append("s.created_at < CAST(? AS TIMESTAMPTZ)")
        params.append(f"{(filters.end + timedelta(days=1)).isoformat()} 00:00:00+00")
    sql = f"""
    WITH scored AS (
        SELECT s.product, m.slug AS metric, m.display_name AS metric_name, m.position,
               m.min_value, m.max_value, m.integer_scale, s.created_at,
               {_score_sql("user_scores_json")} AS u,
               {_score_sql("judge_scores_json")} AS j
        FROM {table_ref(SNAPSHOTS)} AS s
        JOIN {SPEC_VIEW} AS m ON m.product = s.product
        WHERE {" AND ".join(where)}
    ),
    pairs AS (
        SELECT *, abs(u - j) * 4.0 / nullif(max_value - min_value, 0) AS rescaled_gap
        FROM scored WHERE u IS NOT NULL AND j IS NOT NULL
    )
    """
    return sql, params


def agreement_report(
    con: duckdb.DuckDBPyConnection, *, specs: pd.DataFrame, filters: AnalyticsFilters
) -> AgreementReport:
    """Per-metric agreement, gap histograms and weekly trends for the filtered live snapshots."""
    if specs.empty:
        return AgreementReport()
    cursor = con.cursor()  # the spec view is registered on this cursor only
    try:
        cursor.register(SPEC_VIEW, pa.Table.from_pandas(specs, preserve_index=False))
        pairs_sql, params = _pairs_sql(filters)
        metrics = _metric_rows(cursor, pairs_sql, params)
        if metrics.empty:
            return AgreementReport()
        gaps = fetch_frame(
            cursor,
            pairs_sql
            + f"""
            SELECT product, metric, metric_name,
                   least(floor(rescaled_gap / {GAP_BUCKET}) * {GAP_BUCKET}, 4.0) AS gap_bucket,
                   count(*) AS pairs
            FROM pairs GROUP BY ALL ORDER BY product, any_value(position), gap_bucket
            """,
            params,
        )
        weekly = fetch_frame(
            cursor,
            pairs_sql
            + f"""
            SELECT product, CAST(date_trunc('week', created_at) AS DATE) AS week, count(*) AS pairs,
                   avg(CASE WHEN u = j THEN 1.0 ELSE 0.0 END) AS exact_agreement,
                   avg(CASE WHEN rescaled_gap <= 1.0 + {_EPSILON} THEN 1.0 ELSE 0.0 END)
                       AS within_1_agreement
            FROM pairs GROUP BY ALL ORDER BY product, week
            """,
            params,
        )
    finally:
        cursor.close()
    return AgreementReport(metrics=metrics, gaps=gaps[GAP_COLUMNS], weekly=weekly[WEEK_COLUMNS])


def _metric_rows(cursor: duckdb.DuckDBPyConnection, pairs_sql: str, params: list[object]) -> pd.DataFrame:
    """One row per product × metric: rates and Spearman in SQL, kappa from the (u, j) count table."""
    summary = fetch_frame(
        cursor,
        pairs_sql
        + f"""
        , ranked AS (
            -- Average ranks for ties (rank + (ties - 1) / 2), as Spearman's rho requires.
            SELECT product, metric, u, j,
                   rank() OVER (PARTITION BY product, metric ORDER BY u)
                     + (count(*) OVER (PARTITION BY product, metric, u) - 1) / 2.0 AS ru,
                   rank() OVER (PARTITION BY product, metric ORDER BY j)
                     + (count(*) OVER (PARTITION BY product, metric, j) - 1) / 2.0 AS rj
            FROM pairs
        ),
        rho AS (
            SELECT product, metric,
                   CASE WHEN var_pop(ru) > 0 AND var_pop(rj) > 0 THEN corr(ru, rj) END AS spearman
            FROM ranked GROUP BY ALL
        )
        SELECT p.product, p.metric, any_value(p.metric_name) AS metric_name,
               any_value(p.position) AS position, any_value(p.min_value) AS min_value,
               any_value(p.max_value) AS max_value, bool_and(p.integer_scale) AS integer_scale,
               count(*) AS pairs,
               avg(CASE WHEN p.u = p.j THEN 1.0 ELSE 0.0 END) AS exact_agreement,
               avg(CASE WHEN p.rescaled_gap <= 1.0 + {_EPSILON} THEN 1.0 ELSE 0.0 END)
                   AS within_1_agreement,
               avg(p.rescaled_gap) AS mean_rescaled_gap,
               any_value(r.spearman) AS spearman
        FROM pairs AS p JOIN rho AS r USING (product, metric)
        GROUP BY p.product, p.metric ORDER BY p.product, position
        """,
        params,
    )
    if summary.empty:
        return pd.DataFrame(columns=METRIC_COLUMNS)
    counts = fetch_frame(
        cursor,
        pairs_sql + "SELECT product, metric, u, j, count(*) AS n FROM pairs WHERE integer_scale GROUP BY ALL",
        params,
    )
    kappas = {
        (str(product), str(metric)): quadratic_weighted_kappa(group["u"], group["j"], group["n"])
        for (product, metric), group in counts.groupby(["product", "metric"], sort=False)
    }
    summary["weighted_kappa"] = [
        kappas.get((str(r.product), str(r.metric)), float("nan")) if r.integer_scale else float("nan")
        for r in summary.itertuples()
    ]
    summary["scale"] = [
        f"{_fmt(r.min_value)}–{_fmt(r.max_value)}" + ("" if r.integer_scale else " (continuous)")
        for r in summary.itertuples()
    ]
    summary["spearman"] = summary["spearman"].astype(float)
    return summary[METRIC_COLUMNS].reset_index(drop=True)


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def quadratic_weighted_kappa(
    user: Sequence[float] | pd.Series, judge: Sequence[float] | pd.Series, counts: Sequence[int] | pd.Series
) -> float:
    """Cohen's kappa with quadratic weights from (user, judge, count) rows; NaN when undefined.

    Weights use the score distance itself, so a category nobody used still counts as a step.
    """
    u = np.asarray(user, dtype=float)
    j = np.asarray(judge, dtype=float)
    n = np.asarray(counts, dtype=float)
    if n.sum() <= 0:
        return float("nan")
    categories = np.unique(np.concatenate([u, j]))
    index = {value: i for i, value in enumerate(categories)}
    observed = np.zeros((len(categories), len(categories)))
    for a, b, c in zip(u, j, n, strict=True):
        observed[index[a], index[b]] += c
    observed /= observed.sum()
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    weights = (categories[:, None] - categories[None, :]) ** 2
    disagreement_expected = float((weights * expected).sum())
    if disagreement_expected == 0:
        return float("nan")  # both raters used one and the same score: chance explains everything
    return 1.0 - float((weights * observed).sum()) / disagreement_expected


def rescaled_gaps(user: np.ndarray, judge: np.ndarray, min_value: float, max_value: float) -> np.ndarray:
    """|user - judge| on the 1-5 span (the SQL's `rescaled_gap`), for measures outside DuckDB."""
    span = max_value - min_value
    return np.abs(user - judge) * 4.0 / span if span else np.full(len(user), np.nan)


def within_one(gaps: np.ndarray) -> np.ndarray:
    """1.0 where a rescaled gap is at most one step (the SQL's within-1 rule, same epsilon)."""
    return (gaps <= 1.0 + _EPSILON).astype(float)


def spearman_rho(user: np.ndarray, judge: np.ndarray) -> float:
    """Spearman's rho with average ranks for ties (the SQL's definition); NaN when a side is constant."""
    ru = pd.Series(user).rank(method="average").to_numpy()
    rj = pd.Series(judge).rank(method="average").to_numpy()
    if len(ru) < 2 or ru.var() == 0 or rj.var() == 0:
        return float("nan")
    return float(np.corrcoef(ru, rj)[0, 1])


def kappa_of_pairs(user: np.ndarray, judge: np.ndarray) -> float:
    """`quadratic_weighted_kappa` from raw pairs rather than a count table."""
    return quadratic_weighted_kappa(user, judge, np.ones(len(user)))


def load_report(*, engine: Engine, session: Session, filters: AnalyticsFilters) -> AgreementReport:
    """The whole report for the page: the products' rubrics from the session, the counting in DuckDB."""
    products = list(filters.products) or _live_products(session)
    specs = metric_specs_frame(session=session, products=products)
    return with_duck(engine, agreement_report, tables=[SNAPSHOTS], specs=specs, filters=filters)


def _live_products(session: Session) -> list[str]:
    """The products of live snapshots, read here rather than in a second DuckDB call (a worker round trip)."""
    column = EvaluationSnapshot.product
    query = select(column).where(col(EvaluationSnapshot.deleted_at).is_(None)).distinct().order_by(column)
    return list(session.exec(query).all())


def load_filter_options(engine: Engine) -> FilterOptions:
    """The filter choices, read through DuckDB like everything else on the page."""
    return with_duck(engine, filter_options, tables=[SNAPSHOTS])


def display_frame(report: AgreementReport) -> pd.DataFrame:
    """The metric table as shown: rounded, with "n/a" where kappa or Spearman is undefined."""
    frame = report.metrics.copy()
    for column in (
        "exact_agreement",
        "within_1_agreement",
        "weighted_kappa",
        "spearman",
        "mean_rescaled_gap",
    ):
        frame[column] = [
            "n/a" if pd.isna(value) else f"{float(value):.3f}" for value in frame[column].tolist()
        ]
    return frame


def filters_from_widgets(
    products: Sequence[str], language: str | None, days: Sequence[date] | date | None
) -> AnalyticsFilters:
    """Filters from the page's widgets; a date range still being picked (one day) means from that day."""
    if isinstance(days, date):
        days = (days,)
    picked = list(days or ())
    return AnalyticsFilters(
        products=tuple(products),
        language=language or None,
        start=picked[0] if picked else None,
        end=picked[1] if len(picked) > 1 else None,
    )
