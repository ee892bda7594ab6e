"""Judge-vs-human agreement analytics (SPEC §4 "Analytics"), computed from maintained counts.

The human side is the snapshot's own user scores (`user_scores_json`), compared with the judge's
(`judge_scores_json`) metric by metric, on each metric's own scale (its product's rubric from
`lib.metrics`). `lib.scores` extracts those pairs once, when a snapshot is written, and counts them
per (product, language, metric, week, user score, judge score); this module reads those counts with
plain SQL aggregates through the app's own engine (no DuckDB, so no second SQLite library and no
worker round trip) and computes every measure from the small count table: a pair's gap, exactness
and within-1 depend only on its two scores, kappa and Spearman only on the (user, judge) counts.
Kappa is `lib.reliability`'s, the one the reviewer-agreement figures use too.
Date filters that cut a week in two read the cut days from the narrow `metric_scores` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Float, Integer, Select, Subquery, and_, case, func, literal, union_all
from sqlmodel import Session, col, select

from lib import reliability
from lib.metrics import MetricSpec, metrics_for_product
from lib.models import AgreementCount, AgreementTotal, EvaluationSnapshot, MetricScore
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


def report_from_cells(
    cells: Sequence[tuple[str, str, float, float, int]],
    weeks: Sequence[tuple[str, date, int, int, int]],
    specs: Mapping[str, Sequence[MetricSpec]],
) -> AgreementReport:
    """The report from (product, metric, user, judge, n) cells and (product, week, pairs, exact, within-1) sums.

    Only metrics of each product's rubric (`specs`) count, on the rubric's scale; a cell's gap,
    exactness and within-1 are functions of its two scores, so each measure is a count-weighted sum.
    """
    by_metric: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for product, metric, u, j, n in cells:
        if n > 0:
            by_metric.setdefault((str(product), str(metric)), []).append((float(u), float(j), int(n)))
    metric_rows: list[dict[str, object]] = []
    gap_rows: list[dict[str, object]] = []
    for product in sorted({p for p, _ in by_metric}):
        for spec in specs.get(product, ()):
            found = by_metric.get((product, spec.slug))
            if found:
                metric_row, gaps = _metric_measures(product, spec, np.array(found, dtype=float))
                metric_rows.append(metric_row)
                gap_rows.extend(gaps)
    if not metric_rows:
        return AgreementReport()
    weekly = pd.DataFrame(
        [
            {
                "product": str(product),
                "week": week,
                "pairs": int(pairs),
                "exact_agreement": int(exact) / int(pairs),
                "within_1_agreement": int(within) / int(pairs),
            }
            for product, week, pairs, exact, within in sorted(weeks, key=lambda r: (str(r[0]), r[1]))
            if pairs
        ],
        columns=WEEK_COLUMNS,
    )
    return AgreementReport(
        metrics=pd.DataFrame(metric_rows, columns=METRIC_COLUMNS),
        gaps=pd.DataFrame(gap_rows, columns=GAP_COLUMNS).astype({"pairs": "int64", "gap_bucket": "float64"}),
        weekly=weekly.astype({"pairs": "int64"}),
    )


def _metric_measures(
    product: str, spec: MetricSpec, cells: np.ndarray
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """One metric's table row and its gap-histogram rows from its (user, judge, n) cells."""
    u, j, n = cells[:, 0], cells[:, 1], cells[:, 2]
    pairs = int(n.sum())
    gap = _rescaled(u, j, float(spec.max_value - spec.min_value))
    rated = ~np.isnan(gap)
    buckets = np.minimum(np.floor(gap[rated] / GAP_BUCKET) * GAP_BUCKET, 4.0)
    bucket_values, bucket_index = np.unique(buckets, return_inverse=True)
    bucket_pairs = np.bincount(bucket_index, weights=n[rated], minlength=len(bucket_values))
    integer = bool(spec.integer_scale)
    row: dict[str, object] = {
        "product": product,
        "metric": spec.slug,
        "metric_name": spec.display_name,
        "scale": f"{_fmt(spec.min_value)}–{_fmt(spec.max_value)}" + ("" if integer else " (continuous)"),
        "pairs": pairs,
        "exact_agreement": float(n[u == j].sum()) / pairs,
        "within_1_agreement": float(n[within_one(gap) > 0].sum()) / pairs,
        "weighted_kappa": reliability.kappa(u, j, n, weights="quadratic") if integer else float("nan"),
        "spearman": spearman_of_counts(u, j, n),
        "mean_rescaled_gap": float((gap[rated] * n[rated]).sum() / n[rated].sum())
        if rated.any()
        else float("nan"),
    }
    gaps = [
        {"product": product, "metric": spec.slug, "metric_name": spec.display_name, "gap_bucket": float(b),
         "pairs": round(float(c))}
        for b, c in zip(bucket_values, bucket_pairs, strict=True)
    ]  # fmt: skip
    return row, gaps


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


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

    The rows are summed into one contingency table over the scores both sides used (`spearman_of_tables`).
    """
    u, j = np.asarray(user, dtype=float), np.asarray(judge, dtype=float)
    categories = np.unique(np.concatenate([u, j]))
    table = np.zeros((1, len(categories), len(categories)))
    np.add.at(
        table[0], (np.searchsorted(categories, u), np.searchsorted(categories, j)), np.asarray(counts, float)
    )
    return float(spearman_of_tables(table)[0])


def spearman_of_tables(tables: np.ndarray) -> np.ndarray:
    """Spearman's rho of each (k x k) contingency table in a stack (rows: one side's scores, columns:
    the other's, both in ascending order; bootstrap resamples of one sample), NaN where fewer than
    two pairs or a side is constant.

    A score's average rank is the number of pairs ranked below it plus (its own count + 1) / 2, so
    the ranks need only the marginal counts; rho is then the count-weighted Pearson correlation of
    the ranks. A score nobody used has no count and changes nothing.
    """
    tables = np.asarray(tables, dtype=float)
    total = tables.sum(axis=(1, 2))
    rows, cols = tables.sum(axis=2), tables.sum(axis=1)
    rank_u = np.cumsum(rows, axis=1) - rows + (rows + 1) / 2
    rank_j = np.cumsum(cols, axis=1) - cols + (cols + 1) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        du = rank_u - ((rows * rank_u).sum(axis=1) / total)[:, None]
        dj = rank_j - ((cols * rank_j).sum(axis=1) / total)[:, None]
        var_u, var_j = (rows * du * du).sum(axis=1), (cols * dj * dj).sum(axis=1)
        rho = np.einsum("rab,ra,rb->r", tables, du, dj) / np.sqrt(var_u * var_j)
    return np.where((total >= 2) & (var_u > 0) & (var_j > 0), rho, np.nan)


def _pair_filters(
    table: type[AgreementCount] | type[AgreementTotal] | type[MetricScore], filters: AnalyticsFilters
) -> list[Any]:
    where: list[Any] = []
    if filters.products:
        where.append(col(table.product).in_(filters.products))
    if filters.language:
        where.append(col(table.language) == filters.language)
    return where


def _week_split(
    filters: AnalyticsFilters,
) -> tuple[tuple[date | None, date | None] | None, list[tuple[date, date]]]:
    """The whole weeks inside the date filter (read from counts) and the cut days (read from rows).

    Returns ((first Monday, last Monday) or None when no whole week fits, [(first day, last day)]).
    """
    start, end = filters.start, filters.end
    first = start + timedelta(days=(7 - start.weekday()) % 7) if start else None  # first whole week's Monday
    last = end - timedelta(days=(end.weekday() + 1) % 7 + 6) if end else None  # last whole week's Monday
    if start is not None and end is not None and (first is None or last is None or first > last):
        return None, [(start, end)] if start <= end else []
    cuts = []
    if start is not None and first is not None and start < first:
        cuts.append((start, first - timedelta(days=1)))
    if end is not None and last is not None and last + timedelta(days=6) < end:
        cuts.append((last + timedelta(days=7), end))
    return (first, last), cuts


def _pair_source(filters: AnalyticsFilters) -> Subquery | None:
    """Live (product, metric, week, user, judge, n) counts matching the filters, as one subquery.

    Whole weeks come from `agreement_counts`; the days of a week the date filter cuts come from the
    narrow `metric_scores` rows (at most six days at each end), so the read never grows with
    evaluations, only with products x metrics x weeks x score cells.
    """
    weeks, cuts = _week_split(filters)
    parts: list[Select[Any]] = []
    c = AgreementCount
    if weeks is not None:
        where = [col(c.n) > 0, *_pair_filters(c, filters)]
        if weeks[0] is not None:
            where.append(col(c.week) >= weeks[0])
        if weeks[1] is not None:
            where.append(col(c.week) <= weeks[1])
        parts.append(select(c.product, c.metric, c.week, c.user_score, c.judge_score, c.n).where(*where))
    s = MetricScore
    for first_day, last_day in cuts:
        where = [
            col(s.live).is_(True),
            col(s.day) >= first_day,
            col(s.day) <= last_day,
            *_pair_filters(s, filters),
        ]
        one = literal(1, Integer).label("n")
        parts.append(select(s.product, s.metric, s.week, s.user_score, s.judge_score, one).where(*where))
    if not parts:
        return None
    return (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("pairs")


def _span_of(pairs: Subquery, specs: Mapping[str, Sequence[MetricSpec]]) -> Any:
    """Each pair's scale width from its product's rubric (NULL off the rubric), as one CASE.

    A CASE over a few dozen (product, metric) branches costs the database less than joining a
    literal table per count row; the weekly within-1 needs each metric's own scale.
    """
    p = pairs.c
    return case(
        *[
            (
                and_(p.product == product, p.metric == spec.slug),
                literal(float(spec.max_value - spec.min_value), Float),
            )
            for product, metric_specs in specs.items()
            for spec in metric_specs
        ],
        else_=None,
    )


def load_report(*, session: Session, filters: AnalyticsFilters) -> AgreementReport:
    """The whole report for the page: two small aggregates of the counts and the products' rubrics."""
    filters = _without_idle_bounds(session, filters)
    pairs = _pair_source(filters)
    if pairs is None:
        return AgreementReport()
    p = pairs.c
    if filters.start is None and filters.end is None:
        # All weeks: the totals hold the same sums without the week dimension (far fewer rows).
        t = AgreementTotal
        key = (t.product, t.metric, t.user_score, t.judge_score)
        where = [col(t.n) > 0, *_pair_filters(t, filters)]
        cells = session.execute(select(*key, func.sum(t.n)).where(*where).group_by(*key)).all()
    else:
        key = (p.product, p.metric, p.user_score, p.judge_score)
        cells = session.execute(select(*key, func.sum(p.n)).group_by(*key)).all()
    specs = {
        product: metrics_for_product(session=session, product=product) for product in {r[0] for r in cells}
    }
    specs = {product: metric_specs for product, metric_specs in specs.items() if metric_specs}
    if not specs:
        return AgreementReport()
    span = _span_of(pairs, specs)
    # The same arithmetic as `_rescaled` and `within_one`, in double precision on both backends.
    gap = func.abs(p.user_score - p.judge_score) * literal(4.0, Float) / func.nullif(span, 0.0)
    weeks = session.execute(
        select(
            p.product,
            p.week,
            func.sum(p.n),
            func.sum(case((p.user_score == p.judge_score, p.n), else_=0)),
            func.sum(case((gap <= literal(1.0 + _EPSILON, Float), p.n), else_=0)),
        )
        .where(span.is_not(None))
        .group_by(p.product, p.week)
    ).all()
    return report_from_cells([tuple(r) for r in cells], [tuple(r) for r in weeks], specs)


def load_filter_options(*, session: Session) -> FilterOptions:
    """Products and languages that have live scored pairs (from the counts) and the live date span.

    The span's min/max read the live-snapshot index (`ix_snapshot_live_created`): two index probes.
    """
    c = AgreementTotal  # the smallest count table: products x languages x metrics x cells
    products = session.execute(select(c.product).where(c.n > 0).distinct().order_by(c.product)).scalars()
    languages = session.execute(select(c.language).where(c.n > 0).distinct().order_by(c.language)).scalars()
    first, last = _live_days(session)
    return FilterOptions(
        products=sorted(str(p) for p in products),
        languages=sorted(str(lang) for lang in languages),
        first_day=first,
        last_day=last,
    )


def _live_days(session: Session) -> tuple[date | None, date | None]:
    """First and last UTC day of a live snapshot: two probes of `ix_snapshot_live_created`."""
    live = col(EvaluationSnapshot.deleted_at).is_(None)
    created = EvaluationSnapshot.created_at
    first = session.execute(select(func.min(created)).where(live)).scalar()
    last = session.execute(select(func.max(created)).where(live)).scalar()
    return _utc_day(first), _utc_day(last)


def _without_idle_bounds(session: Session, filters: AnalyticsFilters) -> AnalyticsFilters:
    """The filters with a date bound dropped where no live snapshot lies beyond it.

    The page's default range is exactly the live span; read literally it would cut the first and
    last weeks and send those days to the narrow table. Dropping such bounds changes no pair.
    """
    if filters.start is None and filters.end is None:
        return filters
    first, last = _live_days(session)
    start = None if filters.start and first and filters.start <= first else filters.start
    end = None if filters.end and last and filters.end >= last else filters.end
    if filters.start and filters.end and filters.start > filters.end:
        start, end = filters.start, filters.end  # an empty range stays empty
    return replace(filters, start=start, end=end)


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
