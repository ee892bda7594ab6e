"""Judge-vs-human agreement analytics (SPEC §4 "Analytics"), computed from maintained counts.

The human side is the snapshot's own user scores (`user_scores_json`), compared with the judge's
(`judge_scores_json`) metric by metric, on each metric's own scale (its product's rubric from
`lib.metrics`). `lib.scores` extracts those pairs once, when a snapshot is written, and counts them
per (product, language, metric, week, user score, judge score); this module reads those counts with
plain SQL aggregates through the app's own engine (no DuckDB, so no second SQLite library and no
worker round trip) and computes every measure from the small count table: a pair's gap, exactness
and within-1 depend only on its two scores, kappa and Spearman only on the (user, judge) counts.
Date filters that cut a week in two read the cut days from the narrow `metric_scores` rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import numpy as np
import pandas as pd
from sqlalchemy import func, select
from sqlmodel import Session

from lib.metrics import MetricSpec, metrics_for_product
from lib.models import AgreementCount, EvaluationSnapshot, MetricScore
from lib.scores import utc_day

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
    """The choices the filters offer: products and languages with live scored pairs, the live date span.

    `first_day` is None exactly when there is no live evaluation at all.
    """

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


CELL_COLUMNS = ["product", "metric", "week", "user_score", "judge_score", "n"]


def report_from_cells(cells: pd.DataFrame, specs: pd.DataFrame) -> AgreementReport:
    """Per-metric agreement, gap histograms and weekly trends from (product, metric, week, u, j, n) counts.

    Only metrics of each product's rubric (`specs`) count, on the rubric's scale: a cell's gap,
    exactness and within-1 are functions of its two scores, so each measure is a count-weighted sum.
    """
    if cells.empty or specs.empty:
        return AgreementReport()
    spec_cols = ["product", "slug", "display_name", "position", "min_value", "max_value", "integer_scale"]
    frame = cells[cells["n"] > 0].merge(
        specs[spec_cols], left_on=["product", "metric"], right_on=["product", "slug"]
    )
    if frame.empty:
        return AgreementReport()
    frame = frame.rename(columns={"display_name": "metric_name"})
    u = frame["user_score"].to_numpy(dtype=float)
    j = frame["judge_score"].to_numpy(dtype=float)
    span = (frame["max_value"] - frame["min_value"]).to_numpy(dtype=float)
    gap = _rescaled(u, j, span)
    n = frame["n"].to_numpy(dtype=np.int64)
    frame["rescaled_gap"] = gap
    frame["exact_n"] = np.where(u == j, n, 0)
    frame["within_n"] = np.where(within_one(gap) > 0, n, 0)
    frame["gap_n"] = np.where(np.isnan(gap), 0, n)
    frame["gap_sum"] = np.where(np.isnan(gap), 0.0, gap * n)
    return AgreementReport(metrics=_metric_rows(frame), gaps=_gap_rows(frame), weekly=_week_rows(frame))


def _metric_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per product x metric, in rubric order; kappa on integer scales only."""
    rows = []
    for (product, metric), group in frame.groupby(["product", "metric"], sort=False):
        first = group.iloc[0]
        pairs = int(group["n"].sum())
        cells = group.groupby(["user_score", "judge_score"], as_index=False)["n"].sum()
        integer = bool(group["integer_scale"].all())
        gap_n = int(group["gap_n"].sum())
        rows.append(
            {
                "product": product,
                "metric": metric,
                "metric_name": first["metric_name"],
                "scale": f"{_fmt(first['min_value'])}–{_fmt(first['max_value'])}"
                + ("" if integer else " (continuous)"),
                "pairs": pairs,
                "exact_agreement": int(group["exact_n"].sum()) / pairs,
                "within_1_agreement": int(group["within_n"].sum()) / pairs,
                "weighted_kappa": (
                    quadratic_weighted_kappa(cells["user_score"], cells["judge_score"], cells["n"])
                    if integer
                    else float("nan")
                ),
                "spearman": spearman_of_counts(cells["user_score"], cells["judge_score"], cells["n"]),
                "mean_rescaled_gap": float(group["gap_sum"].sum()) / gap_n if gap_n else float("nan"),
                "_position": int(first["position"]),
            }
        )
    metrics = pd.DataFrame(rows).sort_values(["product", "_position"], kind="stable")
    return metrics[METRIC_COLUMNS].reset_index(drop=True)


def _gap_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Pairs per bucket of rescaled gap (width GAP_BUCKET, the last bucket holding the 4.0 gaps)."""
    rated = frame[~np.isnan(frame["rescaled_gap"])].copy()
    rated["gap_bucket"] = np.minimum(np.floor(rated["rescaled_gap"] / GAP_BUCKET) * GAP_BUCKET, 4.0)
    gaps = (
        rated.groupby(["product", "metric", "metric_name", "gap_bucket"], as_index=False, sort=False)
        .agg(pairs=("n", "sum"), position=("position", "first"))
        .sort_values(["product", "position", "gap_bucket"], kind="stable")
    )
    gaps["pairs"] = gaps["pairs"].astype("int64")
    return gaps[GAP_COLUMNS].reset_index(drop=True)


def _week_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Exact and within-1 agreement per product and week over all its metrics' pairs."""
    weekly = frame.groupby(["product", "week"], as_index=False, sort=True).agg(
        pairs=("n", "sum"), exact=("exact_n", "sum"), within=("within_n", "sum")
    )
    weekly["pairs"] = weekly["pairs"].astype("int64")
    weekly["exact_agreement"] = weekly["exact"] / weekly["pairs"]
    weekly["within_1_agreement"] = weekly["within"] / weekly["pairs"]
    return weekly[WEEK_COLUMNS].reset_index(drop=True)


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
    """|user - judge| on the 1-5 span, for one metric's pairs (NaN on a zero-width scale)."""
    return _rescaled(
        np.asarray(user, dtype=float), np.asarray(judge, dtype=float), float(max_value - min_value)
    )


def _rescaled(user: np.ndarray, judge: np.ndarray, span: np.ndarray | float) -> np.ndarray:
    """The rescaled gap, element-wise; `span` may differ per pair (cells of several metrics)."""
    span = np.broadcast_to(np.asarray(span, dtype=float), np.shape(user))
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(span != 0, np.abs(user - judge) * 4.0 / np.where(span != 0, span, 1.0), np.nan)


def within_one(gaps: np.ndarray) -> np.ndarray:
    """1.0 where a rescaled gap is at most one step (the SQL's within-1 rule, same epsilon)."""
    return (gaps <= 1.0 + _EPSILON).astype(float)


def spearman_rho(user: np.ndarray, judge: np.ndarray) -> float:
    """Spearman's rho of raw pairs: `spearman_of_counts` with a count of one per pair."""
    return spearman_of_counts(user, judge, np.ones(len(user)))


def spearman_of_counts(
    user: Sequence[float] | pd.Series, judge: Sequence[float] | pd.Series, counts: Sequence[int] | pd.Series
) -> float:
    """Spearman's rho from (user, judge, count) rows, with average ranks for ties; NaN when a side is constant.

    A score's average rank is the number of pairs ranked below it plus (its own count + 1) / 2, so
    the ranks need only the marginal counts; rho is then the count-weighted Pearson correlation.
    """
    n = np.asarray(counts, dtype=float)
    total = n.sum()
    if total < 2:
        return float("nan")
    ru = _average_ranks(np.asarray(user, dtype=float), n)
    rj = _average_ranks(np.asarray(judge, dtype=float), n)
    du = ru - (n * ru).sum() / total
    dj = rj - (n * rj).sum() / total
    var_u, var_j = (n * du * du).sum(), (n * dj * dj).sum()
    if var_u <= 0 or var_j <= 0:
        return float("nan")
    return float((n * du * dj).sum() / np.sqrt(var_u * var_j))


def _average_ranks(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    categories, index = np.unique(values, return_inverse=True)
    per_category = np.bincount(index, weights=counts, minlength=len(categories))
    below = np.cumsum(per_category) - per_category
    return (below + (per_category + 1) / 2)[index]


def kappa_of_pairs(user: np.ndarray, judge: np.ndarray) -> float:
    """`quadratic_weighted_kappa` from raw pairs rather than a count table."""
    return quadratic_weighted_kappa(user, judge, np.ones(len(user)))


def _pair_filters(table: type[AgreementCount] | type[MetricScore], filters: AnalyticsFilters) -> list:
    where = []
    if filters.products:
        where.append(table.product.in_(filters.products))  # type: ignore[attr-defined]
    if filters.language:
        where.append(table.language == filters.language)
    return where


def _week_split(
    filters: AnalyticsFilters,
) -> tuple[tuple[date | None, date | None] | None, list[tuple[date, date]]]:
    """The whole weeks inside the date filter (read from counts) and the cut days (read from rows).

    Returns ((first Monday, last Monday) or None when no whole week fits, [(first day, last day)]).
    """
    start, end = filters.start, filters.end
    first = start + timedelta(days=(7 - start.weekday()) % 7) if start else None  # first whole week's Monday
    last = end - timedelta(days=(end.weekday() + 1) % 7) - timedelta(days=6) if end else None  # last one's
    if first is not None and last is not None and first > last:
        assert start is not None and end is not None
        return None, [(start, end)] if start <= end else []
    cuts = []
    if start is not None and first is not None and start < first:
        cuts.append((start, first - timedelta(days=1)))
    if end is not None and last is not None and last + timedelta(days=6) < end:
        cuts.append((last + timedelta(days=7), end))
    return (first, last), cuts


def agreement_cells(*, session: Session, filters: AnalyticsFilters) -> pd.DataFrame:
    """Live pair counts per (product, metric, week, user score, judge score) matching the filters.

    Reads `agreement_counts` for whole weeks and `metric_scores` only for the days of a week the
    date filter cuts, so the cost is bounded by products x metrics x weeks, not by evaluations.
    """
    weeks, cuts = _week_split(filters)
    frames = []
    c = AgreementCount
    if weeks is not None:
        where = [c.n > 0, *_pair_filters(c, filters)]
        if weeks[0] is not None:
            where.append(c.week >= weeks[0])
        if weeks[1] is not None:
            where.append(c.week <= weeks[1])
        key = (c.product, c.metric, c.week, c.user_score, c.judge_score)
        frames.append(session.execute(select(*key, func.sum(c.n)).where(*where).group_by(*key)).all())
    s = MetricScore
    for first_day, last_day in cuts:
        key = (s.product, s.metric, s.week, s.user_score, s.judge_score)
        where = [s.live.is_(True), s.day >= first_day, s.day <= last_day, *_pair_filters(s, filters)]  # type: ignore[attr-defined]
        frames.append(session.execute(select(*key, func.count()).where(*where).group_by(*key)).all())
    rows = [tuple(r) for frame in frames for r in frame]
    cells = pd.DataFrame(rows, columns=CELL_COLUMNS)
    if cells.empty:
        return cells
    cells["n"] = cells["n"].astype("int64")
    return cells.groupby(CELL_COLUMNS[:-1], as_index=False, sort=False)["n"].sum()


def load_report(*, session: Session, filters: AnalyticsFilters) -> AgreementReport:
    """The whole report for the page: counts through the app's session, the products' rubrics."""
    cells = agreement_cells(session=session, filters=filters)
    if cells.empty:
        return AgreementReport()
    products = sorted(set(cells["product"]))
    return report_from_cells(cells, metric_specs_frame(session=session, products=products))


def load_filter_options(*, session: Session) -> FilterOptions:
    """Products and languages that have live scored pairs (from the counts) and the live date span.

    The span's min/max read the live-snapshot index (`ix_snapshot_live_created`): two index probes.
    """
    c = AgreementCount
    products = session.execute(select(c.product).where(c.n > 0).distinct().order_by(c.product)).scalars()
    languages = session.execute(select(c.language).where(c.n > 0).distinct().order_by(c.language)).scalars()
    live = EvaluationSnapshot.deleted_at.is_(None)  # type: ignore[union-attr]
    created = EvaluationSnapshot.created_at
    first = session.execute(select(func.min(created)).where(live)).scalar()
    last = session.execute(select(func.max(created)).where(live)).scalar()
    return FilterOptions(
        products=[str(p) for p in products],
        languages=[str(lang) for lang in languages],
        first_day=_utc_day(first),
        last_day=_utc_day(last),
    )


def _utc_day(moment: object) -> date | None:
    """min()/max() come back as aware datetimes on PostgreSQL and as stored text on SQLite."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    assert isinstance(moment, datetime)
    return utc_day(moment)


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
