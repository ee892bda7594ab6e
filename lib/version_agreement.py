"""Agreement by judge version (issue 28): did this version agree with our reviewers more than the last?

For every judge version (and each product's "unversioned" rows) and metric: exact agreement,
within-1 agreement, Cohen's kappa and the mean gap between the version's decision and the
reviewers' resolved decision (`Judgment.user_decision`; with team queues only a resolved or
adjudicated decision sets it), each with a seeded percentile bootstrap interval; the difference
between two chosen versions with its interval; a caution when the two were judged on different kinds
of items (products, languages, weeks), and a "same items only" comparison on the judgments both
versions judged; a weekly timeline with version changes marked.

Definitions are `lib.analytics`' (one rule each): the within-1 rule and the gap rescaled to the
1–5 span (`analytics.rescaled_gaps`, `analytics.within_one`); kappa is `lib.reliability`'s, with
quadratic weights on whole-number scales and unweighted on labels (INCLUDE/EXCLUDE), undefined on
continuous scales. A scale is the version's own rubric (as it was), else the product's rubric.

Everything is read from `judge_version_totals` and `judge_version_counts` (`lib.version_counts`):
every measure is a function of a version's (decision, reviewer decision) cell counts, and a
bootstrap that resamples items is a multinomial draw over those cells (`reliability.resample_counts`),
so the cost follows versions × metrics × cells, never judgments. What needs no week (the cells, the
choices, the filters' values, a version's languages) reads the totals, whose rows do not grow with
the weeks; only the weeks themselves (first and last week, the timeline) read the weekly counts,
with as few grouped statements as the timeline allows. A render reads the cells and the weekly pairs
once (`read_counts`) and passes them to the table, the comparison and the timeline. "Same items only" is a function of the joint (A's decision, B's
decision, reviewer decision) cells of the judgments both versions judged, read likewise from
`judge_version_pair_counts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Table, case, func, literal, select
from sqlmodel import Session

from lib import analytics, reliability
from lib.bulk import among_rows
from lib.corrections import parse_score
from lib.judge_versions import UNVERSIONED_NAME, JudgeConfig, VersionError, require_version, versions_by_id
from lib.metrics import MetricSpec, metrics_for_product
from lib.models import UNVERSIONED
from lib.version_counts import COUNTS, PAIRS, TOTALS

MEASURES = ("exact_agreement", "within_1_agreement", "kappa", "mean_gap")
MEASURE_LABELS = {
    "exact_agreement": "Exact agreement",
    "within_1_agreement": "Within 1",
    "kappa": "Kappa",
    "mean_gap": "Mean gap",
}
PERCENT_MEASURES = ("exact_agreement", "within_1_agreement")
BOOTSTRAP_RESAMPLES = reliability.BOOTSTRAP_RESAMPLES
_EPSILON = 1e-9  # analytics' within-1 float allowance
# Languages' shares of two versions' pairs further apart than this are a different mix of items.
LANGUAGE_SHARE_GAP = 0.2

VERSION_COLUMNS = [
    "product", "version_id", "version", "metric", "metric_name", "scale", "pairs",
    *[f"{m}{s}" for m in MEASURES for s in ("", "_lo", "_hi")], "kappa_weights", "first_week", "last_week",
]  # fmt: skip
COMPARE_COLUMNS = [
    "metric", "metric_name", "pairs_a", "pairs_b",
    *[f"{m}_{s}" for m in MEASURES for s in ("a", "b", "difference", "difference_lo", "difference_hi")],
]  # fmt: skip
TIMELINE_COLUMNS = [
    "product",
    "version_id",
    "version",
    "week",
    "pairs",
    "exact_agreement",
    "within_1_agreement",
]


@dataclass(frozen=True)
class VersionFilters:
    """Which reviewed judgments count: products (empty = all), a language, and the bootstrap's draws."""

    products: tuple[str, ...] = ()
    language: str | None = None
    resamples: int = BOOTSTRAP_RESAMPLES
    seed: int = 0


@dataclass(frozen=True)
class VersionKey:
    """A version of one product; id `UNVERSIONED` (0) is the product's rows without a version."""

    product: str
    version_id: int


@dataclass(frozen=True)
class Scale:
    """How a metric's decisions compare: whole numbers, a continuous range, or labels."""

    kind: str  # "integer" | "continuous" | "labels"
    min_value: float = 1.0
    max_value: float = 5.0
    label: str = ""
    name: str = ""

    @property
    def numeric(self) -> bool:
        return self.kind != "labels"

    @property
    def kappa_weights(self) -> str | None:
        return {"integer": "quadratic", "labels": "none"}.get(self.kind)


def _scale_of(spec: MetricSpec | None, metric: str, values: Iterable[str]) -> Scale:
    numbers = [parse_score(v) for v in values]
    if any(n is None for n in numbers) or not metric:
        return Scale("labels", label="labels", name=spec.display_name if spec else (metric or "decision"))
    if spec is None:
        found = [float(n) for n in numbers if n is not None]
        low, high = (min(found), max(found)) if found else (1.0, 5.0)
        integer = all(float(n).is_integer() for n in found)
        spec = MetricSpec(metric, metric, low, high if high > low else low + 1, integer)
    return Scale(
        "integer" if spec.integer_scale else "continuous",
        float(spec.min_value),
        float(spec.max_value),
        spec.scale_label(),
        spec.display_name,
    )


def measure_tables(tables: np.ndarray, categories: np.ndarray, scale: Scale) -> dict[str, np.ndarray]:
    """Each measure of each (judge × reviewer) count table in a stack; NaN where undefined.

    The one arithmetic of this module: the observed table is a stack of one, a bootstrap's
    resamples a stack of many.
    """
    tables = np.asarray(tables, dtype=float)
    total = tables.sum(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        exact = np.trace(tables, axis1=1, axis2=2) / total
        out = {"exact_agreement": exact}
        if scale.numeric:
            values = categories.astype(float)
            gaps = analytics.rescaled_gaps(
                values[:, None].repeat(len(values), 1), values[None, :].repeat(len(values), 0),
                scale.min_value, scale.max_value,
            )  # fmt: skip
            gaps = np.nan_to_num(gaps, nan=0.0)
            close = analytics.within_one(gaps)
            out["within_1_agreement"] = (tables * close).sum(axis=(1, 2)) / total
            out["mean_gap"] = (tables * gaps).sum(axis=(1, 2)) / total
        else:
            out["within_1_agreement"] = np.full(len(tables), np.nan)
            out["mean_gap"] = np.full(len(tables), np.nan)
    weights = scale.kappa_weights
    out["kappa"] = (
        reliability.kappas(tables, categories, weights)  # type: ignore[arg-type]
        if weights is not None
        else np.full(len(tables), np.nan)
    )
    return {m: np.where(total > 0, out[m], np.nan) for m in MEASURES}


def _categories(values: Iterable[str], scale: Scale) -> np.ndarray:
    distinct = sorted(set(values), key=lambda v: (parse_score(v) or 0.0, v) if scale.numeric else v)
    if scale.numeric:
        return np.array([float(parse_score(v) or 0.0) for v in distinct], dtype=float)
    return np.array(distinct, dtype=object)


def _index(values: Sequence[str], scale: Scale, categories: np.ndarray) -> np.ndarray:
    keys = [float(parse_score(v) or 0.0) for v in values] if scale.numeric else list(values)
    lookup = {c: i for i, c in enumerate(categories.tolist())}
    return np.array([lookup[k] for k in keys], dtype=int)


@dataclass
class _Cells:
    """One version's one metric: its (decision, reviewer decision, n) cells."""

    key: VersionKey
    metric: str
    decisions: list[str] = field(default_factory=list)
    humans: list[str] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def table(self, scale: Scale) -> tuple[np.ndarray, np.ndarray]:
        categories = _categories([*self.decisions, *self.humans], scale)
        k = len(categories)
        i, j = _index(self.decisions, scale, categories), _index(self.humans, scale, categories)
        table = np.bincount(i * k + j, weights=np.asarray(self.counts, dtype=float), minlength=k * k)
        return table.reshape(k, k), categories


def estimates(
    table: np.ndarray, categories: np.ndarray, scale: Scale, *, resamples: int, seed: int
) -> dict[str, reliability.Estimate]:
    """Every measure of one count table with its percentile bootstrap interval."""
    values = measure_tables(table[None], categories, scale)
    draws = _draws(table, categories, scale, resamples, seed)
    return {
        m: reliability.Estimate(float(values[m][0]), *reliability.percentile_interval(draws[m]))
        if len(draws[m])
        else reliability.Estimate(float(values[m][0]))
        for m in MEASURES
    }


def _draws(
    table: np.ndarray, categories: np.ndarray, scale: Scale, resamples: int, seed: int
) -> dict[str, np.ndarray]:
    k = len(categories)
    resampled = reliability.resample_counts(table, resamples, seed).reshape(-1, k, k)
    return measure_tables(resampled, categories, scale)


# ---------------------------------------------------------------------------------------------
# Reading the counts


def _count_filters(filters: VersionFilters, table: Table = TOTALS) -> list[Any]:
    where: list[Any] = [table.c.n > 0]
    if filters.products:
        where.append(table.c.product.in_(list(filters.products)))
    if filters.language:
        where.append(table.c.language == filters.language)
    return where


def _cells(session: Session, filters: VersionFilters) -> dict[tuple[VersionKey, str], _Cells]:
    c = TOTALS.c
    rows = session.execute(
        select(c.judge_version_id, c.product, c.metric, c.decision, c.human, func.sum(c.n))
        .where(*_count_filters(filters))
        .group_by(c.judge_version_id, c.product, c.metric, c.decision, c.human)
    ).all()
    out: dict[tuple[VersionKey, str], _Cells] = {}
    for vid, product, metric, decision, human, n in rows:
        if int(n) <= 0:
            continue
        key = VersionKey(str(product), int(vid))
        cells = out.setdefault((key, str(metric)), _Cells(key, str(metric)))
        cells.decisions.append(str(decision))
        cells.humans.append(str(human))
        cells.counts.append(int(n))
    return out


def _weekly(session: Session, filters: VersionFilters) -> dict[tuple[VersionKey, date], int]:
    """Reviewed pairs per version and week judged (weeks with some pair only)."""
    c = COUNTS.c
    week_key = (c.judge_version_id, c.product, c.week)
    rows = session.execute(
        select(*week_key, func.sum(c.n)).where(*_count_filters(filters, COUNTS)).group_by(*week_key)
    ).all()
    return {(VersionKey(str(p), int(v)), _as_date(week)): int(n) for v, p, week, n in rows if int(n) > 0}


@dataclass(frozen=True)
class Counts:
    """What one render of the tab reads from the count tables under its filters, read once
    (`read_counts`) and shared by the table, the choices, the comparison and the timeline: each
    version's cells (from the totals), and its pairs per week (from the weekly counts)."""

    filters: VersionFilters
    cells: dict[tuple[VersionKey, str], _Cells]
    weekly: dict[tuple[VersionKey, date], int]

    def weeks(self) -> dict[VersionKey, tuple[date, date]]:
        """Each version's first and last week judged."""
        out: dict[VersionKey, tuple[date, date]] = {}
        for key, week in self.weekly:
            first, last = out.get(key, (week, week))
            out[key] = (min(first, week), max(last, week))
        return out


def read_counts(session: Session, filters: VersionFilters) -> Counts:
    """The cells and weekly pairs under these filters (two grouped statements)."""
    return Counts(filters, _cells(session, filters), _weekly(session, filters))


def _read(session: Session, filters: VersionFilters, counts: Counts | None) -> Counts:
    if counts is None:
        return read_counts(session, filters)
    if _unsampled(counts.filters) != _unsampled(filters):
        raise ValueError("counts read under other filters")
    return counts


def _unsampled(filters: VersionFilters) -> VersionFilters:
    """The filters that choose counts (the bootstrap's draws and seed do not)."""
    return replace(filters, resamples=0, seed=0)


def _as_date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value)[:10])


class _Scales:
    """Each (version, metric)'s scale: the version's rubric as it was, else the product's rubric."""

    def __init__(self, session: Session, keys: Iterable[VersionKey]) -> None:
        self.session = session
        self.versions = versions_by_id(session, {k.version_id for k in keys})
        self._products: dict[str, dict[str, MetricSpec]] = {}

    def spec(self, key: VersionKey, metric: str) -> MetricSpec | None:
        version = self.versions.get(key.version_id)
        if version is not None and version.rubric:
            for spec in JudgeConfig.of(version).specs():
                if spec.slug == metric:
                    return spec
        if key.product not in self._products:
            self._products[key.product] = {
                m.slug: m for m in metrics_for_product(session=self.session, product=key.product)
            }
        return self._products[key.product].get(metric)

    def name(self, key: VersionKey) -> str:
        version = self.versions.get(key.version_id)
        return version.name if version is not None else UNVERSIONED_NAME

    def order(self, key: VersionKey) -> tuple[str, int]:
        return key.product, key.version_id


def agreement_by_version(
    *, session: Session, filters: VersionFilters | None = None, counts: Counts | None = None
) -> pd.DataFrame:
    """One row per product × version × metric with every measure and its interval (`VERSION_COLUMNS`).

    `counts`: this render's (`read_counts`, under the same filters), else read here."""
    filters = filters or VersionFilters()
    read = _read(session, filters, counts)
    cells = read.cells
    weeks = read.weeks()
    scales = _Scales(session, {k for k, _ in cells})
    rows = []
    for (key, metric), found in sorted(
        cells.items(), key=lambda item: (scales.order(item[0][0]), item[0][1])
    ):
        spec = scales.spec(key, metric)
        scale = _scale_of(spec, metric, [*found.decisions, *found.humans])
        table, categories = found.table(scale)
        est = estimates(table, categories, scale, resamples=filters.resamples, seed=filters.seed)
        first, last = weeks.get(key, (None, None))
        row: dict[str, Any] = {
            "product": key.product,
            "version_id": key.version_id,
            "version": scales.name(key),
            "metric": metric,
            "metric_name": scale.name or metric,
            "scale": scale.label,
            "pairs": int(table.sum()),
            "kappa_weights": scale.kappa_weights,
            "first_week": first,
            "last_week": last,
        }
        for m in MEASURES:
            row.update(est[m].as_dict(m))
        rows.append(row)
    return pd.DataFrame(rows, columns=VERSION_COLUMNS)


def display_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The per-version table as people read it: each measure "value [low, high]" in one cell."""
    return reliability.with_interval_text(
        frame.drop(columns=["version_id", "kappa_weights"]), MEASURES, percent=PERCENT_MEASURES
    )


# ---------------------------------------------------------------------------------------------
# Choices


@dataclass(frozen=True)
class VersionChoice:
    """A version with reviewed pairs, as a selector offers it."""

    key: VersionKey
    name: str
    pairs: int
    created_at: Any = None

    @property
    def label(self) -> str:
        return f"{self.key.product} · {self.name} ({self.pairs:,} pairs)"


def version_choices(
    *, session: Session, filters: VersionFilters | None = None, counts: Counts | None = None
) -> list[VersionChoice]:
    """Versions with reviewed pairs under the filters, per product oldest first (unversioned first)."""
    filters = filters or VersionFilters()
    pairs: dict[VersionKey, int] = {}
    cells = _cells(session, filters) if counts is None else _read(session, filters, counts).cells
    for (key, _metric), found_cells in cells.items():
        pairs[key] = pairs.get(key, 0) + sum(found_cells.counts)
    found = versions_by_id(session, [k.version_id for k in pairs])
    out = []
    for key, n in pairs.items():
        version = found.get(key.version_id)
        out.append(
            VersionChoice(
                key,
                version.name if version else UNVERSIONED_NAME,
                n,
                version.created_at if version else None,
            )
        )
    return sorted(out, key=lambda ch: (ch.key.product, ch.key.version_id))


def version_products(*, session: Session) -> list[str]:
    """Products with reviewed pairs by any version (or unversioned)."""
    c = TOTALS.c
    return [
        str(p)
        for p in session.execute(select(c.product).where(c.n > 0).distinct().order_by(c.product)).scalars()
    ]


def version_languages(*, session: Session) -> list[str]:
    """Languages of those pairs ('' stand-alone judgments left out)."""
    c = TOTALS.c
    stmt = select(c.language).where(c.n > 0, c.language != "").distinct().order_by(c.language)
    return [str(v) for v in session.execute(stmt).scalars()]


# ---------------------------------------------------------------------------------------------
# Two versions compared


@dataclass
class Comparison:
    """Version B against version A, per metric: each side's measures and B − A with its interval."""

    a: VersionChoice
    b: VersionChoice
    same_items: bool
    frame: pd.DataFrame
    cautions: list[str]
    shared_items: int  # reviewed judgments both versions judged (under the filters)

    @property
    def empty(self) -> bool:
        return self.frame.empty


def _profile(session: Session, key: VersionKey, filters: VersionFilters) -> dict[str, int]:
    c = TOTALS.c
    rows = session.execute(
        select(c.language, func.sum(c.n))
        .where(*_count_filters(filters), c.judge_version_id == key.version_id, c.product == key.product)
        .group_by(c.language)
    ).all()
    return {str(lang): int(n) for lang, n in rows if int(n) > 0}


def _shares(profile: Mapping[str, int]) -> dict[str, float]:
    total = sum(profile.values())
    return {k: v / total for k, v in profile.items()} if total else {}


def _fmt_week(span: tuple[date, date] | None) -> str:
    if span is None:
        return "no weeks"
    first, last = span
    return f"week of {first:%Y-%m-%d}" if first == last else f"{first:%Y-%m-%d} to {last:%Y-%m-%d}"


def cautions_for(
    session: Session,
    a: VersionChoice,
    b: VersionChoice,
    filters: VersionFilters,
    shared: int,
    counts: Counts | None = None,
) -> list[str]:
    """Why A and B may not have been judged on the same kind of items: products, languages, weeks."""
    out: list[str] = []
    if a.key.product != b.key.product:
        out.append(
            f"They judged different products ({a.key.product} and {b.key.product}): a difference may be "
            "the products', not the judges'."
        )
    pa, pb = _shares(_profile(session, a.key, filters)), _shares(_profile(session, b.key, filters))
    languages = sorted(set(pa) | set(pb))
    if any(abs(pa.get(lang, 0.0) - pb.get(lang, 0.0)) > LANGUAGE_SHARE_GAP for lang in languages):

        def mix(shares: Mapping[str, float]) -> str:
            return (
                ", ".join(f"{lang or 'none'} {share:.0%}" for lang, share in sorted(shares.items())) or "none"
            )

        out.append(f"They judged different languages ({a.name}: {mix(pa)}; {b.name}: {mix(pb)}).")
    weeks = _read(session, filters, counts).weeks()
    wa, wb = weeks.get(a.key), weeks.get(b.key)
    if wa and wb and (wa[1] < wb[0] or wb[1] < wa[0]):
        out.append(
            f"They judged in different weeks ({a.name}: {_fmt_week(wa)}; {b.name}: {_fmt_week(wb)}): the "
            "items may differ in kind."
        )
    if out:
        out.append(
            f"Tick “Same items only” to compare them on the {shared:,} reviewed judgments both judged."
            if shared
            else f"No reviewed judgment was judged by both; re-judge a sample of {a.name}'s items with "
            f"{b.name} (Judge versions page) to compare them on the same items."
        )
    return out


def _paired_cells(
    session: Session, a: VersionKey, b: VersionKey, filters: VersionFilters
) -> list[tuple[str, str, str, str, int]]:
    """(metric, A's decision, B's decision, reviewer decision, n) over the live reviewed judgments both judged.

    Read from `judge_version_pair_counts`, which keeps each pair once with the lower version id
    first: A and B are swapped back when A's id is the higher. A judgment has one product, so two
    versions of different products share none.
    """
    if a == b or a.product != b.product:
        return []
    p = PAIRS.c
    first, second = (a, b) if a.version_id < b.version_id else (b, a)
    da, db = (p.decision_a, p.decision_b) if first == a else (p.decision_b, p.decision_a)
    where = [p.version_a == first.version_id, p.version_b == second.version_id, p.product == a.product]
    if filters.products:
        where.append(p.product.in_(list(filters.products)))
    if filters.language:
        where.append(p.language == filters.language)
    rows = session.execute(
        select(p.metric, da, db, p.human, func.sum(p.n)).where(*where).group_by(p.metric, da, db, p.human)
    ).all()
    return [(str(m), str(x), str(y), str(h), int(n)) for m, x, y, h, n in rows if int(n) > 0]


def compare_versions(
    *,
    session: Session,
    a: VersionChoice,
    b: VersionChoice,
    filters: VersionFilters | None = None,
    same_items: bool = False,
    counts: Counts | None = None,
) -> Comparison:
    """B against A per metric, with B − A and its percentile bootstrap interval.

    Independent samples (default): each side's own reviewed judgments, resampled separately (seeds
    `seed` and `seed + 1`). Same items: only the judgments both versions judged, resampled as
    triples (A's decision, B's decision, reviewer decision), so the interval is the paired one.
    `counts` as in `agreement_by_version`.
    """
    filters = filters or VersionFilters()
    paired = _paired_cells(session, a.key, b.key, filters)
    shared = sum(n for *_, n in paired)
    scales = _Scales(session, [a.key, b.key])
    rows = []
    if same_items:
        by_metric: dict[str, list[tuple[str, str, str, int]]] = {}
        for metric, da, db, h, n in paired:
            by_metric.setdefault(metric, []).append((da, db, h, n))
        for metric in sorted(by_metric):
            rows.append(_paired_row(scales, a.key, b.key, metric, by_metric[metric], filters))
    else:
        counts = _read(session, filters, counts)  # read once for the cells and the cautions' weeks
        cells = counts.cells
        metrics = sorted({m for (k, m) in cells if k == a.key} & {m for (k, m) in cells if k == b.key})
        for metric in metrics:
            rows.append(_independent_row(scales, cells[(a.key, metric)], cells[(b.key, metric)], filters))
    cautions = [] if same_items else cautions_for(session, a, b, filters, shared, counts)
    return Comparison(a, b, same_items, pd.DataFrame(rows, columns=COMPARE_COLUMNS), cautions, shared)


def choice_by_name(
    session: Session, product: str, name: str, filters: VersionFilters | None = None
) -> VersionChoice:
    """The product's version of this name ("unversioned" for rows without one) with its pairs."""
    for choice in version_choices(
        session=session, filters=replace(filters or VersionFilters(), products=(product,))
    ):
        if choice.name == name.strip():
            return choice
    if name.strip() != UNVERSIONED_NAME:
        require_version(session, product, name)  # an unknown name: the error lists the known ones
    raise VersionError(
        f"version {name!r} of product {product!r} has no reviewed judgments under these filters"
    )


def compare_by_names(
    *,
    session: Session,
    product: str,
    a: str,
    b: str,
    filters: VersionFilters | None = None,
    same_items: bool = False,
) -> Comparison:
    """`compare_versions` for two versions of one product named as people name them."""
    filters = filters or VersionFilters()
    return compare_versions(
        session=session,
        a=choice_by_name(session, product, a, filters),
        b=choice_by_name(session, product, b, filters),
        filters=filters,
        same_items=same_items,
    )


def _common_scale(scales: _Scales, a: VersionKey, b: VersionKey, metric: str, values: Sequence[str]) -> Scale:
    # B's rubric decides (the newer rubric when B is the later version), else A's.
    spec = scales.spec(b, metric) or scales.spec(a, metric)
    return _scale_of(spec, metric, values)


def _independent_row(scales: _Scales, ca: _Cells, cb: _Cells, filters: VersionFilters) -> dict[str, Any]:
    scale = _common_scale(
        scales, ca.key, cb.key, ca.metric, [*ca.decisions, *ca.humans, *cb.decisions, *cb.humans]
    )
    ta, cats_a = ca.table(scale)
    tb, cats_b = cb.table(scale)
    va, vb = measure_tables(ta[None], cats_a, scale), measure_tables(tb[None], cats_b, scale)
    da = _draws(ta, cats_a, scale, filters.resamples, filters.seed)
    db = _draws(tb, cats_b, scale, filters.resamples, filters.seed + 1)
    return _compare_row(ca.metric, scale, int(ta.sum()), int(tb.sum()), va, vb, da, db)


def _paired_row(
    scales: _Scales, a: VersionKey, b: VersionKey, metric: str, cells: list[tuple[str, str, str, int]],
    filters: VersionFilters,
) -> dict[str, Any]:  # fmt: skip
    scale = _common_scale(scales, a, b, metric, [v for c in cells for v in c[:3]])
    categories = _categories([v for c in cells for v in c[:3]], scale)
    k = len(categories)
    ia = _index([c[0] for c in cells], scale, categories)
    ib = _index([c[1] for c in cells], scale, categories)
    ih = _index([c[2] for c in cells], scale, categories)
    flat = np.bincount((ia * k + ib) * k + ih, weights=[float(c[3]) for c in cells], minlength=k**3)
    cube = flat.reshape(k, k, k)
    ta, tb = cube.sum(axis=1), cube.sum(axis=0)
    va, vb = measure_tables(ta[None], categories, scale), measure_tables(tb[None], categories, scale)
    resampled = reliability.resample_counts(flat, filters.resamples, filters.seed).reshape(-1, k, k, k)
    da = measure_tables(resampled.sum(axis=2), categories, scale)
    db = measure_tables(resampled.sum(axis=1), categories, scale)
    return _compare_row(metric, scale, int(ta.sum()), int(tb.sum()), va, vb, da, db)


def _compare_row(
    metric: str, scale: Scale, pairs_a: int, pairs_b: int,
    va: Mapping[str, np.ndarray], vb: Mapping[str, np.ndarray],
    da: Mapping[str, np.ndarray], db: Mapping[str, np.ndarray],
) -> dict[str, Any]:  # fmt: skip
    row: dict[str, Any] = {
        "metric": metric,
        "metric_name": scale.name or metric,
        "pairs_a": pairs_a,
        "pairs_b": pairs_b,
    }
    for m in MEASURES:
        a_value, b_value = float(va[m][0]), float(vb[m][0])
        n = min(len(da[m]), len(db[m]))
        low, high = (
            reliability.percentile_interval(db[m][:n] - da[m][:n]) if n else (float("nan"), float("nan"))
        )
        row.update(
            {
                f"{m}_a": a_value,
                f"{m}_b": b_value,
                f"{m}_difference": b_value - a_value,
                f"{m}_difference_lo": low,
                f"{m}_difference_hi": high,
            }
        )
    return row


def comparison_display(frame: pd.DataFrame) -> pd.DataFrame:
    """The comparison as people read it: A, B and "B − A [low, high]" per measure."""
    out = frame[["metric_name", "pairs_a", "pairs_b"]].copy()
    for m in MEASURES:
        percent = m in PERCENT_MEASURES
        out[f"{m}_a"] = [reliability.Estimate(float(v)).text(3, percent=percent) for v in frame[f"{m}_a"]]
        out[f"{m}_b"] = [reliability.Estimate(float(v)).text(3, percent=percent) for v in frame[f"{m}_b"]]
        out[f"{m}_difference"] = [
            reliability.Estimate(float(v), float(lo), float(hi)).text(3, percent=percent)
            for v, lo, hi in zip(
                frame[f"{m}_difference"],
                frame[f"{m}_difference_lo"],
                frame[f"{m}_difference_hi"],
                strict=True,
            )
        ]
    return out


# ---------------------------------------------------------------------------------------------
# Timeline


@dataclass
class Timeline:
    """Weekly agreement per version, and where each version started (the change markers)."""

    weekly: pd.DataFrame
    starts: pd.DataFrame  # product, version_id, version, first_week, created_at


def timeline(
    *, session: Session, filters: VersionFilters | None = None, counts: Counts | None = None
) -> Timeline:
    """Per product, version and week judged: pairs, exact and within-1 agreement pooled over metrics.

    `counts` as in `agreement_by_version`."""
    filters = filters or VersionFilters()
    read = _read(session, filters, counts)
    c = COUNTS.c
    where = _count_filters(filters, COUNTS)
    # What a pair counts as (exact, within 1) depends only on its version's metric scale and its two
    # texts, so it is worked out here on the distinct (version, product, metric, decision, human)
    # combinations, the cells (about a thousand at 1M evaluations, read from the totals), and the
    # database sums each week's counts of the combinations that qualify. The (week x decision x
    # human) rows themselves fill up as evaluations grow (108k at 1M) and never reach Python.
    keys = {k for k, _ in read.cells}
    scales = _Scales(session, keys)
    within_keys: list[tuple[int, str, str, str, str]] = []
    exact_keys: set[tuple[int, str, str, str, str]] = set()
    for (key, metric), cells in read.cells.items():
        vid, product = key.version_id, key.product
        found = list(zip(cells.decisions, cells.humans, strict=True))
        values = {v for pair in found for v in pair}
        scale = _scale_of(scales.spec(key, metric), metric, values)
        if scale.numeric:
            parsed = {v: parse_score(v) for v in values}
            d = np.array([parsed[a] for a, _ in found], dtype=float)
            h = np.array([parsed[b] for _, b in found], dtype=float)
            exact = d == h
            within = analytics.within_one(
                np.nan_to_num(analytics.rescaled_gaps(d, h, scale.min_value, scale.max_value))
            ).astype(bool)
        else:
            exact = np.array([a == b for a, b in found], dtype=bool)
            within = exact
        for (decision, human), is_exact, is_within in zip(found, exact, within, strict=True):
            if is_within or is_exact:
                within_keys.append((vid, product, metric, decision, human))
            if is_exact:
                exact_keys.add((vid, product, metric, decision, human))
    week_key = (c.judge_version_id, c.product, c.week)
    sums: dict[tuple[int, str, date], list[float]] = {
        (key.version_id, key.product, week): [float(n), 0.0, 0.0] for (key, week), n in read.weekly.items()
    }
    if within_keys:
        combo = (c.judge_version_id, c.product, c.metric, c.decision, c.human)
        exact_list = [k for k in within_keys if k in exact_keys]
        # The combinations as one bound value each way (lib.bulk.among_rows): one statement whatever
        # their number, and a hashed lookup on PostgreSQL, where a row-value IN list took 1.5 s at 100k.
        exact_n = case((among_rows(session, combo, exact_list), c.n), else_=0) if exact_list else literal(0)
        for vid, product, week, within_n, exact_sum in session.execute(
            select(*week_key, func.sum(c.n), func.sum(exact_n))
            .where(*where, among_rows(session, combo, within_keys))
            .group_by(*week_key)
        ).all():
            total = sums.get((int(vid), str(product), _as_date(week)))
            if total is None:  # a week a concurrent write added after `counts` was read: the next render
                continue
            total[1] += float(exact_sum or 0)
            total[2] += float(within_n or 0)
    if sums:
        summed = pd.DataFrame(
            [(p, v, w, n, e, wi) for (v, p, w), (n, e, wi) in sums.items()],
            columns=["product", "version_id", "week", "pairs", "exact", "within"],
        )
        summed["version"] = [
            scales.name(VersionKey(p, int(v)))
            for p, v in zip(summed["product"], summed["version_id"], strict=True)
        ]
        summed["exact_agreement"] = summed["exact"] / summed["pairs"]
        summed["within_1_agreement"] = summed["within"] / summed["pairs"]
        summed["pairs"] = summed["pairs"].astype("int64")
        weekly = summed.sort_values(["product", "week", "version_id"])[TIMELINE_COLUMNS].reset_index(
            drop=True
        )
    else:
        weekly = pd.DataFrame(columns=TIMELINE_COLUMNS)
    starts = []
    for key in sorted(keys, key=lambda k: (k.product, k.version_id)):
        part = weekly[(weekly["product"] == key.product) & (weekly["version_id"] == key.version_id)]
        version = scales.versions.get(key.version_id)
        starts.append(
            {
                "product": key.product,
                "version_id": key.version_id,
                "version": scales.name(key),
                "first_week": part["week"].min() if len(part) else None,
                "created_at": version.created_at if version else None,
            }
        )
    return Timeline(
        weekly, pd.DataFrame(starts, columns=["product", "version_id", "version", "first_week", "created_at"])
    )


def version_key_of(product: str, version_id: int | None) -> VersionKey:
    """A judgment's version as a key (None → unversioned)."""
    return VersionKey(product, int(version_id) if version_id else UNVERSIONED)
