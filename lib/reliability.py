"""Agreement statistics (issue 26 point 5): Krippendorff's alpha, Cohen's kappa, percent agreement
and their seeded bootstrap intervals; plain numpy, no database and no streamlit.

Both agreement views use these: judge vs human (`lib.analytics`, the alignment lab) and reviewer vs
reviewer (`lib.agreement`). There is one kappa and one alpha in the code base, and they are
checked against the `krippendorff` package and scikit-learn in the tests.

Large label sets stay cheap because nothing here touches one unit at a time:

- Reliability data are held as *patterns* (`ValueCounts`): the distinct multisets of values that a
  unit received, each with the number of units that received it. Two reviewers on a 1–5 scale give
  at most 15 patterns however many items they labelled, so alpha costs the same at 1M items as at 1k.
- A bootstrap that resamples units with replacement is a multinomial draw over the patterns (units
  sharing a pattern are interchangeable), so each resample costs O(patterns), not O(units), and
  every resample's alpha comes from a few matrix products. Kappa's resamples are multinomial draws
  over the cells of the two raters' contingency table.

Alpha follows Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": alpha = 1 - D_o/D_e
over the coincidences of *pairable* values (units with at least two values; one value alone says
nothing about agreement). Every difference function used here can be computed without the V x V
coincidence matrix:

- interval: delta(c, k) = (c - k)^2, so a unit's within-unit sum is 2 (m sum x^2 - (sum x)^2);
- ordinal: delta(c, k) = (n_c/2 + sum of n_g strictly between + n_k/2)^2 = (r_k - r_c)^2 with r the
  mid-ranks of the pairable values' distribution, i.e. interval alpha on mid-ranks (the ranks
  depend on the data, so each bootstrap resample recomputes them);
- nominal: delta = [c != k], so a unit's sum is m^2 - sum n_v^2;
- ratio: ((c - k)/(c + k))^2, through the V x V matrix (offered for completeness).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

Level = Literal["nominal", "ordinal", "interval", "ratio"]
LEVELS: tuple[Level, ...] = ("nominal", "ordinal", "interval", "ratio")
Weights = Literal["none", "linear", "quadratic"]
WEIGHTS: tuple[Weights, ...] = ("none", "linear", "quadratic")

BOOTSTRAP_RESAMPLES = 1000
CONFIDENCE = 0.95
# Resamples are drawn in blocks of at most this many (resample x pattern) cells: bounded memory.
_BLOCK_CELLS = 4_000_000
# The ratio metric needs the V x V difference matrix; past this many distinct values it is refused.
_MAX_RATIO_VALUES = 2_000


@dataclass(frozen=True)
class Estimate:
    """A statistic with its percentile bootstrap interval (NaN bounds when it cannot be resampled)."""

    value: float
    low: float = float("nan")
    high: float = float("nan")

    def as_dict(self, name: str) -> dict[str, float]:
        """`{name: value, name_lo: low, name_hi: high}`: the columns a table or CSV shows."""
        return {name: self.value, f"{name}_lo": self.low, f"{name}_hi": self.high}

    def text(self, decimals: int = 2, *, percent: bool = False) -> str:
        """How a table shows it: "0.81 [0.62, 0.93]", "81 % [62 %, 93 %]", "–" when undefined."""
        if not np.isfinite(self.value):
            return "–"
        shown = (
            (lambda v: f"{v * 100:.{max(0, decimals - 2)}f} %")
            if percent
            else (lambda v: f"{v:.{decimals}f}")
        )
        if not (np.isfinite(self.low) and np.isfinite(self.high)):
            return shown(self.value)
        return f"{shown(self.value)} [{shown(self.low)}, {shown(self.high)}]"


def with_interval_text(
    frame: pd.DataFrame, names: Sequence[str], *, decimals: int = 2, percent: Sequence[str] = ()
) -> pd.DataFrame:
    """`frame` with each of `names` shown as "value [low, high]" text and its `_lo`/`_hi` columns dropped.

    The CSV keeps the numbers; this is the table a person reads, one cell per measure.
    """
    out = frame.copy()
    for name in names:
        out[name] = [
            Estimate(float(v), float(lo), float(hi)).text(decimals, percent=name in percent)
            for v, lo, hi in zip(frame[name], frame[f"{name}_lo"], frame[f"{name}_hi"], strict=True)
        ]
    return out.drop(columns=[f"{n}{s}" for n in names for s in ("_lo", "_hi")])


# ---------------------------------------------------------------------------------------------
# Reliability data as patterns


@dataclass(frozen=True)
class ValueCounts:
    """Reliability data grouped into patterns: which values a unit received, and how many units did.

    `values` is the sorted value domain (numbers, or labels for nominal data); pattern `p` holds
    `count[e]` values `values[code[e]]` for every entry `e` with `pattern[e] == p`, and `units[p]`
    units received exactly that multiset. Only pairable units (two values or more) are kept;
    `single_units` counts the others, which no agreement statistic can use.
    """

    values: np.ndarray
    pattern: np.ndarray
    code: np.ndarray
    count: np.ndarray
    units: np.ndarray
    single_units: int = 0

    @property
    def pairable_units(self) -> int:
        return int(self.units.sum())

    @property
    def pairable_values(self) -> int:
        """n in Krippendorff's notation: every value in a unit with at least two values."""
        return int((self.count * self.units[self.pattern]).sum())

    @property
    def patterns(self) -> int:
        return len(self.units)

    def unit_sizes(self) -> np.ndarray:
        """m_u per pattern: how many values each unit of that pattern received."""
        return np.bincount(self.pattern, weights=self.count, minlength=self.patterns)

    def dense(self) -> np.ndarray:
        """The patterns x values count matrix (the package's `value_counts`, one row per pattern)."""
        out = np.zeros((self.patterns, len(self.values)))
        out[self.pattern, self.code] = self.count  # one entry per (pattern, value)
        return out

    def value_totals(self, weights: np.ndarray | None = None) -> np.ndarray:
        """n_v: pairable values per domain value, with `weights` units per pattern (default: the data's).

        `weights` may be a (resamples x patterns) matrix; the result is then (resamples x values).
        """
        w = self.units if weights is None else weights
        return (
            w @ self.dense()
            if np.ndim(w) == 2
            else np.bincount(self.code, weights=self.count * w[self.pattern], minlength=len(self.values))
        )

    @classmethod
    def from_labels(cls, units: ArrayLike, values: ArrayLike) -> ValueCounts:
        """From one row per label: the unit it belongs to and its value (NaN or None = missing)."""
        unit_arr = np.asarray(units)
        value_arr = np.asarray(values)
        if unit_arr.shape != value_arr.shape or unit_arr.ndim != 1:
            raise ValueError("units and values must be one-dimensional and of the same length")
        present = ~_missing(value_arr)
        unit_arr, value_arr = unit_arr[present], value_arr[present]
        if value_arr.dtype == object:
            value_arr = _homogeneous(value_arr)
        domain, codes = _codes(value_arr)
        _, unit_codes = _codes(unit_arr)
        return cls._from_codes(domain, unit_codes, codes)

    @classmethod
    def from_matrix(cls, reliability_data: ArrayLike) -> ValueCounts:
        """From a coders x units matrix with NaN where a coder did not code a unit (the package's form)."""
        data = np.asarray(reliability_data)
        if data.ndim != 2:
            raise ValueError("reliability data must be a coders x units matrix")
        units = np.broadcast_to(np.arange(data.shape[1]), data.shape)
        return cls.from_labels(units.ravel(), data.ravel())

    @classmethod
    def _from_codes(cls, domain: np.ndarray, unit_codes: np.ndarray, codes: np.ndarray) -> ValueCounts:
        """Group units by the sorted codes they received: one `np.unique` per unit size m."""
        if len(codes) == 0:
            return cls(domain, *(np.zeros(0, np.int64) for _ in range(4)))
        order = np.argsort(unit_codes, kind="stable")  # a no-op pass when already ordered by unit
        unit_codes, codes = unit_codes[order], codes[order]
        starts = np.flatnonzero(np.r_[True, unit_codes[1:] != unit_codes[:-1]])
        sizes = np.diff(np.r_[starts, len(codes)])
        entries_pattern: list[np.ndarray] = []
        entries_code: list[np.ndarray] = []
        units: list[np.ndarray] = []
        next_pattern = 0
        for m in np.unique(sizes[sizes >= 2]):
            rows = np.sort(codes[starts[sizes == m][:, None] + np.arange(m)], axis=1)  # units x m
            distinct, counts = _unique_rows(rows, len(domain))
            entries_pattern.append(next_pattern + np.repeat(np.arange(len(distinct)), m))
            entries_code.append(distinct.ravel())
            units.append(counts)
            next_pattern += len(distinct)
        if not units:
            return cls(domain, *(np.zeros(0, np.int64) for _ in range(4)), single_units=len(sizes))
        # Merge repeated codes within a pattern into one entry with a count.
        pattern = np.concatenate(entries_pattern)
        code = np.concatenate(entries_code)
        key, count = np.unique(pattern * len(domain) + code, return_counts=True)
        return cls(
            values=domain,
            pattern=key // len(domain),
            code=key % len(domain),
            count=count.astype(np.int64),
            units=np.concatenate(units).astype(np.int64),
            single_units=int((sizes < 2).sum()),
        )


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct values, each value's index among them): `np.unique(return_inverse=True)`,
    done as one sort and a binary search, several times faster on a million numbers."""
    ordered = np.sort(values)
    domain = ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered
    return domain, np.searchsorted(domain, values).astype(np.int64)


def _unique_rows(rows: np.ndarray, base: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a small-integer matrix with their counts; one integer key per row when the
    codes fit (base ** m < 2 ** 62), which `np.unique(axis=0)` is ten times slower than."""
    m = rows.shape[1]
    if m * np.log2(max(base, 2)) < 62:
        key = rows @ (base ** np.arange(m - 1, -1, -1, dtype=np.int64))
        _, first, counts = np.unique(key, return_index=True, return_counts=True)
        return rows[first], counts
    return np.unique(rows, axis=0, return_counts=True)


def _missing(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype == object:
        return np.array([v is None or (isinstance(v, float) and np.isnan(v)) for v in values], dtype=bool)
    return np.zeros(values.shape, dtype=bool)


def _homogeneous(values: np.ndarray) -> np.ndarray:
    """Object arrays (e.g. from a DataFrame) as numbers when they all are numbers, else as text."""
    try:
        return values.astype(float)
    except (TypeError, ValueError):
        return values.astype(str)


# ---------------------------------------------------------------------------------------------
# Krippendorff's alpha


def _check_level(counts: ValueCounts, level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"unknown level of measurement {level!r}; choose from {', '.join(LEVELS)}")
    if level != "nominal" and counts.values.dtype.kind not in "iuf":
        raise ValueError(f"{level} alpha needs numeric values; labels are nominal")


def alpha(counts: ValueCounts, level: Level) -> float:
    """Krippendorff's alpha of the data at this level of measurement; NaN when it is undefined.

    Undefined: fewer than two pairable values, or no expected disagreement (every pairable value
    the same, so chance alone explains the agreement).
    """
    if counts.patterns == 0:
        _check_level(counts, level)
        return float("nan")
    return float(alphas(counts, level, counts.units[None, :].astype(float))[0])


def alpha_estimate(
    counts: ValueCounts,
    level: Level,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """Alpha with a percentile interval from `resamples` bootstrap resamples of the pairable units."""
    value = alpha(counts, level)
    if counts.patterns == 0 or resamples <= 0:
        return Estimate(value)
    draws = np.concatenate(
        [alphas(counts, level, block) for block in _multinomial_blocks(counts.units, resamples, seed)]
    )
    return Estimate(value, *percentile_interval(draws, confidence))


def alphas(counts: ValueCounts, level: str, weights: np.ndarray) -> np.ndarray:
    """Alpha for each row of `weights` (rows x patterns: how many units of each pattern), e.g. one row
    per bootstrap resample; `counts.units` as the only row gives the data's own alpha."""
    _check_level(counts, level)
    sizes = counts.unit_sizes()
    n = weights @ sizes  # pairable values per resample
    if level == "interval":
        f = counts.values.astype(float)[None, :]  # the same for every resample
        within = _squared_spread(counts, f, sizes)[0]
        observed = weights @ within
        s1 = weights @ _pattern_sums(counts, f)[0]
        s2 = weights @ _pattern_sums(counts, f * f)[0]
        expected, scale = 2 * (n * s2 - s1 * s1), 2 * n * s2
    elif level == "ordinal":
        totals = counts.value_totals(weights)
        f = np.cumsum(totals, axis=1) - totals / 2  # mid-ranks of each resample's pairable values
        observed = (weights * _squared_spread(counts, f, sizes)).sum(axis=1)
        s1 = (totals * f).sum(axis=1)
        s2 = (totals * f * f).sum(axis=1)
        expected, scale = 2 * (n * s2 - s1 * s1), 2 * n * s2
    elif level == "nominal":
        dense = counts.dense()
        within = (sizes**2 - (dense**2).sum(axis=1)) / (sizes - 1)
        observed = weights @ within
        totals = weights @ dense
        expected, scale = n * n - (totals**2).sum(axis=1), n * n
    else:  # ratio
        if len(counts.values) > _MAX_RATIO_VALUES:
            raise ValueError(f"ratio alpha supports at most {_MAX_RATIO_VALUES} distinct values")
        v = counts.values.astype(float)
        total = v[:, None] + v[None, :]
        delta = np.divide(v[:, None] - v[None, :], total, out=np.zeros_like(total), where=total != 0) ** 2
        dense = counts.dense()
        within = ((dense @ delta) * dense).sum(axis=1) / (sizes - 1)
        observed = weights @ within
        totals = weights @ dense
        expected, scale = ((totals @ delta) * totals).sum(axis=1), n * n
    with np.errstate(divide="ignore", invalid="ignore"):
        result = 1.0 - (n - 1) * observed / expected
    # Float noise can leave a tiny positive "expected" where the values are all equal.
    degenerate = (n < 2) | ~(expected > 1e-12 * scale)
    return np.where(degenerate, np.nan, result)


def _pattern_sums(counts: ValueCounts, f: np.ndarray) -> np.ndarray:
    """sum over each pattern's values of f(value), for each row of f (rows x values -> rows x patterns).

    Entries are sorted by pattern and every pattern has one, so a `reduceat` over the entries does it.
    """
    contributions = f[:, counts.code] * counts.count  # rows x entries
    starts = np.flatnonzero(np.r_[True, counts.pattern[1:] != counts.pattern[:-1]])
    return np.add.reduceat(contributions, starts, axis=1)


def _squared_spread(counts: ValueCounts, f: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Within-unit sum over ordered value pairs of (f_i - f_j)^2, divided by m - 1, per pattern."""
    s1 = _pattern_sums(counts, f)
    s2 = _pattern_sums(counts, f * f)
    return 2 * (sizes * s2 - s1 * s1) / (sizes - 1)


# ---------------------------------------------------------------------------------------------
# Percent agreement within units


def percent_agreement(counts: ValueCounts, *, tolerance: float = 0.0) -> float:
    """The share of pairs of values on the same unit that agree (|a - b| <= tolerance for numbers)."""
    if counts.patterns == 0:
        return float("nan")
    return float(_agreements(counts, counts.units[None, :].astype(float), tolerance)[0])


def percent_agreement_estimate(
    counts: ValueCounts,
    *,
    tolerance: float = 0.0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """Percent agreement with a percentile interval from bootstrap resamples of the units."""
    value = percent_agreement(counts, tolerance=tolerance)
    if counts.patterns == 0 or resamples <= 0:
        return Estimate(value)
    draws = np.concatenate(
        [
            _agreements(counts, block, tolerance)
            for block in _multinomial_blocks(counts.units, resamples, seed)
        ]
    )
    return Estimate(value, *percentile_interval(draws, confidence))


def _agreements(counts: ValueCounts, weights: np.ndarray, tolerance: float) -> np.ndarray:
    dense = counts.dense()
    sizes = counts.unit_sizes()
    if tolerance > 0:
        if counts.values.dtype.kind not in "iuf":
            raise ValueError("a tolerance needs numeric values")
        v = counts.values.astype(float)
        close = (np.abs(v[:, None] - v[None, :]) <= tolerance + 1e-9).astype(float)
    else:
        close = np.eye(len(counts.values))
    agreeing = (((dense @ close) * dense).sum(axis=1) - sizes) / 2  # unordered pairs, self-pairs out
    pairs = sizes * (sizes - 1) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return (weights @ agreeing) / (weights @ pairs)


# ---------------------------------------------------------------------------------------------
# Cohen's kappa (two raters)


@dataclass(frozen=True)
class Crosstab:
    """Two raters' contingency table: `table[i, j]` items rated categories[i] by A and categories[j] by B."""

    categories: np.ndarray
    table: np.ndarray

    @property
    def items(self) -> int:
        return int(self.table.sum())

    @classmethod
    def of(cls, a: ArrayLike, b: ArrayLike, counts: ArrayLike | None = None) -> Crosstab:
        """From paired ratings (one row per item, or per distinct pair with its count)."""
        a_arr, b_arr = np.asarray(a), np.asarray(b)
        n = np.ones(len(a_arr)) if counts is None else np.asarray(counts, dtype=float)
        if not (len(a_arr) == len(b_arr) == len(n)):
            raise ValueError("ratings and counts must have the same length")
        if a_arr.dtype == object:
            a_arr = _homogeneous(a_arr)
        if b_arr.dtype == object:
            b_arr = _homogeneous(b_arr)
        categories, index = np.unique(np.concatenate([a_arr, b_arr]), return_inverse=True)
        k = len(categories)
        table = np.bincount(index[: len(a_arr)] * k + index[len(a_arr) :], weights=n, minlength=k * k)
        return cls(categories, table.reshape(k, k))


def kappa_weights(categories: np.ndarray, weights: Weights) -> np.ndarray:
    """Disagreement weights: 0 on the diagonal; 1 off it ("none"), |a - b| or (a - b)^2 on numbers.

    Weights use the score distance itself, so a category nobody used still counts as a step.
    """
    if weights not in WEIGHTS:
        raise ValueError(f"unknown kappa weights {weights!r}; choose from {', '.join(WEIGHTS)}")
    if weights == "none":
        return 1.0 - np.eye(len(categories))
    if categories.dtype.kind not in "iuf":
        raise ValueError(f"{weights} weights need numeric ratings; labels take unweighted kappa")
    distance = np.abs(categories.astype(float)[:, None] - categories.astype(float)[None, :])
    return distance if weights == "linear" else distance**2


def cohen_kappa(crosstab: Crosstab, weights: Weights = "none") -> float:
    """Cohen's kappa (weighted when asked) of a contingency table; NaN when undefined.

    Undefined: no items, or no expected disagreement (both raters used one and the same category).
    """
    return float(_kappas(crosstab.table[None], kappa_weights(crosstab.categories, weights))[0])


def kappa(a: ArrayLike, b: ArrayLike, counts: ArrayLike | None = None, *, weights: Weights = "none") -> float:
    """Cohen's kappa from paired ratings (or distinct pairs with counts)."""
    return cohen_kappa(Crosstab.of(a, b, counts), weights)


def kappa_estimate(
    crosstab: Crosstab,
    weights: Weights = "none",
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    confidence: float = CONFIDENCE,
) -> Estimate:
    """Kappa with a percentile interval from bootstrap resamples of the items (multinomial on cells)."""
    w = kappa_weights(crosstab.categories, weights)
    value = float(_kappas(crosstab.table[None], w)[0])
    cells = crosstab.table.ravel()
    if cells.sum() <= 0 or resamples <= 0:
        return Estimate(value)
    k = len(crosstab.categories)
    draws = np.concatenate(
        [_kappas(block.reshape(-1, k, k), w) for block in _multinomial_blocks(cells, resamples, seed)]
    )
    return Estimate(value, *percentile_interval(draws, confidence))


def kappas(tables: np.ndarray, categories: np.ndarray, weights: Weights = "none") -> np.ndarray:
    """Cohen's kappa of each (k x k) table in a stack (bootstrap resamples of one crosstab)."""
    return _kappas(np.asarray(tables, dtype=float), kappa_weights(np.asarray(categories), weights))


def _kappas(tables: np.ndarray, w: np.ndarray) -> np.ndarray:
    total = tables.sum(axis=(1, 2))
    with np.errstate(divide="ignore", invalid="ignore"):
        observed = tables / total[:, None, None]
        expected = observed.sum(axis=2)[:, :, None] * observed.sum(axis=1)[:, None, :]
        disagreement_observed = (w * observed).sum(axis=(1, 2))
        disagreement_expected = (w * expected).sum(axis=(1, 2))
        result = 1.0 - disagreement_observed / disagreement_expected
    return np.where((total > 0) & (disagreement_expected > 1e-12), result, np.nan)


def crosstab_agreement(crosstab: Crosstab, *, tolerance: float = 0.0) -> float:
    """The share of items on which the two raters agree (|a - b| <= tolerance for numbers)."""
    if crosstab.items == 0:
        return float("nan")
    if tolerance > 0:
        c = crosstab.categories.astype(float)
        close = np.abs(c[:, None] - c[None, :]) <= tolerance + 1e-9
    else:
        close = np.eye(len(crosstab.categories), dtype=bool)
    return float(crosstab.table[close].sum() / crosstab.table.sum())


# ---------------------------------------------------------------------------------------------
# Bootstrap


def _multinomial_blocks(counts: np.ndarray, resamples: int, seed: int) -> list[np.ndarray]:
    """`resamples` seeded bootstrap resamples of `counts.sum()` items over the categories of `counts`,
    as (resamples x categories) blocks of float counts.

    Drawing N items with replacement and counting them per category is one multinomial draw with
    the categories' shares, so a resample costs O(categories) however many items there are.
    """
    counts = np.asarray(counts, dtype=float)
    total = round(float(counts.sum()))
    rng = np.random.default_rng(seed)
    shares = counts / counts.sum()
    per_block = max(1, _BLOCK_CELLS // max(1, len(counts)))
    blocks = []
    for start in range(0, resamples, per_block):
        size = min(per_block, resamples - start)
        blocks.append(rng.multinomial(total, shares, size=size).astype(float))
    return blocks


def resample_counts(counts: ArrayLike, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """(resamples x categories) seeded bootstrap resamples of items counted per category.

    Any statistic of a contingency table (or of a table of three raters' joint ratings) is a
    function of its cell counts, so resampling items is resampling these counts.
    """
    flat = np.asarray(counts, dtype=float).ravel()
    if flat.sum() <= 0 or resamples <= 0:
        return np.zeros((0, len(flat)))
    return np.concatenate(_multinomial_blocks(flat, resamples, seed))


def percentile_interval(
    draws: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The central `confidence` share of the finite bootstrap draws; NaN bounds when none is finite.

    Draws where the statistic is undefined (a resample of identical values) are left out.
    """
    values = np.asarray(draws, dtype=float)
    finite = values[np.isfinite(values)]
    if not len(finite):
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


# ---------------------------------------------------------------------------------------------
# Shares and means: closed-form intervals (no resampling needed)

_Z = {0.9: 1.6448536269514722, 0.95: 1.959963984540054, 0.99: 2.5758293035489004}


def _z(confidence: float) -> float:
    try:
        return _Z[confidence]
    except KeyError:
        raise ValueError(f"confidence must be one of {', '.join(map(str, _Z))}") from None


def share_estimate(successes: float, trials: float, confidence: float = CONFIDENCE) -> Estimate:
    """A share k/n with its Wilson score interval (sound at 0 %, 100 % and small n, unlike k/n ± z·se)."""
    if trials <= 0:
        return Estimate(float("nan"))
    z = _z(confidence)
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * np.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return Estimate(float(p), float(max(0.0, centre - half)), float(min(1.0, centre + half)))


def mean_estimate(
    count: float, total: float, total_squares: float, confidence: float = CONFIDENCE
) -> Estimate:
    """A mean from its sufficient sums (n, sum x, sum x^2) with a normal interval mean ± z·sd/√n.

    Sums are what a SQL aggregate or a running count keeps, so the interval needs no rows.
    """
    if count <= 0:
        return Estimate(float("nan"))
    mean = total / count
    if count < 2:
        return Estimate(float(mean))
    variance = max(0.0, (total_squares - count * mean * mean) / (count - 1))
    half = _z(confidence) * np.sqrt(variance / count)
    return Estimate(float(mean), float(mean - half), float(mean + half))
