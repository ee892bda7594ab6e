"""lib.reliability against reference implementations and published worked examples.

References (test-only dependencies, requirements-dev.txt): the `krippendorff` package for alpha at
every level of measurement, scikit-learn's `cohen_kappa_score` for kappa, unweighted and weighted.
Published examples: Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability" (Annenberg
School for Communication, Departmental Papers 43), sections A-C; the Wikipedia article's example
(also the package's doctest); textbook two-rater kappa tables whose arithmetic is worked out below.
"""

from __future__ import annotations

import math

import krippendorff
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lib import reliability
from lib.reliability import Crosstab, ValueCounts
from tests.kappa import cohen_kappa_score

NAN = float("nan")


def _same(a: float, b: float, *, abs_tol: float = 1e-9) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=abs_tol)


def _reference_alpha(data: np.ndarray, level: str) -> float:
    """The package's alpha, NaN where it refuses (one value in the domain, no pairable unit) or divides by 0."""
    try:
        with np.errstate(divide="ignore", invalid="ignore"):
            value = float(krippendorff.alpha(reliability_data=data, level_of_measurement=level))
    except ValueError:
        return NAN
    return value if math.isfinite(value) else NAN


# ---------------------------------------------------------------------------------------------
# Published examples

# Krippendorff (2011) section C: four observers, twelve units, values 1-5, missing data (None).
SECTION_C = [
    [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
    [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
]


@pytest.mark.parametrize(
    ("level", "published"),
    [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849), ("ratio", 0.797)],
)
def test_krippendorff_2011_section_c_every_level(level: reliability.Level, published: float) -> None:
    data = np.array(SECTION_C, dtype=float)
    counts = ValueCounts.from_matrix(data)
    assert round(reliability.alpha(counts, level), 3) == published
    # Unit 12 has one value only (observer B's 3): it cannot be paired; n = 40 pairable values.
    assert counts.single_units == 1
    assert counts.pairable_units == 11 and counts.pairable_values == 40


def test_krippendorff_2011_section_a_binary_two_observers() -> None:
    # o_00 = 10, o_01 = o_10 = 4, o_11 = 2; n_0 = 14, n_1 = 6: alpha = 1 - 19 * 4 / (14 * 6) = 0.095.
    data = [[0, 1, 0, 0, 0, 0, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]]
    value = reliability.alpha(ValueCounts.from_matrix(data), "nominal")
    assert value == pytest.approx(1 - 19 * 4 / (14 * 6))
    assert round(value, 3) == 0.095


def test_krippendorff_2011_section_b_nominal_labels_two_observers() -> None:
    # Ben and Gerry code twelve units a-e; sum of o_cc = 18, n = 24, sum n_c (n_c - 1) = 104:
    # alpha = (23 * 18 - 104) / (24 * 23 - 104) = 310 / 448 = 0.692.
    ben = list("aabbdcccedda")
    gerry = list("babbbccceddd")
    value = reliability.alpha(ValueCounts.from_matrix([ben, gerry]), "nominal")
    assert value == pytest.approx(310 / 448)
    assert round(value, 3) == 0.692


def test_wikipedia_example_three_coders_fifteen_units() -> None:
    nan = np.nan
    data = [
        [nan, nan, nan, nan, nan, 3, 4, 1, 2, 1, 1, 3, 3, nan, 3],
        [1, nan, 2, 1, 3, 3, 4, 3, nan, nan, nan, nan, nan, nan, nan],
        [nan, nan, 2, 1, 3, 4, 4, nan, 2, 1, 1, 3, 3, nan, 4],
    ]
    counts = ValueCounts.from_matrix(data)
    assert round(reliability.alpha(counts, "nominal"), 3) == 0.691
    assert round(reliability.alpha(counts, "interval"), 3) == 0.811


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # 50 grant proposals read by A and B: p_o = 0.7, p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5, kappa = 0.4.
        ([[20, 5], [10, 15]], 0.4),
        # The same p_o = 0.6 with different marginals: p_e = 0.54 -> 0.1304, p_e = 0.46 -> 0.2593.
        ([[45, 15], [25, 15]], (0.6 - 0.54) / (1 - 0.54)),
        ([[25, 35], [5, 35]], (0.6 - 0.46) / (1 - 0.46)),
        # Three diagnoses of 100 patients (psychotic, neurotic, organic): p_o = 0.89,
        # p_e = 0.8 * 0.8 + 0.1 * 0.05 + 0.1 * 0.15 = 0.66, kappa = 0.23 / 0.34 = 0.676.
        ([[75, 1, 4], [5, 4, 1], [0, 0, 10]], 0.23 / 0.34),
    ],
)
def test_textbook_cohen_kappa_tables(table: list[list[int]], expected: float) -> None:
    crosstab = Crosstab(np.arange(len(table)), np.array(table, dtype=float))
    assert reliability.cohen_kappa(crosstab) == pytest.approx(expected)
    assert round(reliability.cohen_kappa(crosstab), 4) in {0.4, 0.1304, 0.2593, 0.6765}


def test_weighted_kappa_worked_example() -> None:
    # Scores 1-3, quadratic weights (0, 1, 4). Disagreements (1, 2), (2, 3), (3, 1): observed
    # sum w * p = (1 + 1 + 4) / 10 = 0.6; both marginals (0.4, 0.3, 0.3): expected
    # 2 * (1 * 0.12 + 1 * 0.09 + 4 * 0.12) = 1.38; kappa = 1 - 0.6 / 1.38 = 0.565.
    a = [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    b = [1, 1, 1, 2, 2, 2, 3, 3, 3, 1]
    assert reliability.kappa(a, b, weights="quadratic") == pytest.approx(1 - 0.6 / 1.38)


# ---------------------------------------------------------------------------------------------
# Random data against the reference


def _random_reliability_data(rng: np.random.Generator, *, missing: float, continuous: bool) -> np.ndarray:
    coders, units = int(rng.integers(2, 7)), int(rng.integers(2, 60))
    if continuous:
        domain = np.round(rng.normal(5, 3, size=int(rng.integers(2, 40))), 2)
    else:
        low = int(rng.integers(-2, 3))
        domain = np.arange(low, low + int(rng.integers(2, 9)), dtype=float)
    truth = rng.choice(domain, size=units)
    noise = rng.random((coders, units)) < rng.uniform(0.05, 0.9)
    data = np.where(noise, rng.choice(domain, size=(coders, units)), truth[None, :])
    data[rng.random((coders, units)) < missing] = np.nan
    return data


@pytest.mark.parametrize("level", reliability.LEVELS)
@pytest.mark.parametrize("missing", [0.0, 0.35])
@pytest.mark.parametrize("continuous", [False, True])
def test_alpha_equals_the_krippendorff_package_on_random_data(
    level: reliability.Level, missing: float, continuous: bool
) -> None:
    rng = np.random.default_rng(abs(hash((level, missing, continuous))) % 2**32)
    compared = 0
    for _ in range(60):
        data = _random_reliability_data(rng, missing=missing, continuous=continuous)
        if level == "ratio":
            data = np.abs(data)  # ratio data have a meaningful zero; negative values are not ratio data
        expected = _reference_alpha(data, level)
        assert _same(reliability.alpha(ValueCounts.from_matrix(data), level), expected), data
        compared += not math.isnan(expected)
    assert compared >= 50  # the comparisons were real numbers, not NaN == NaN


def test_nominal_alpha_on_text_labels_equals_the_package() -> None:
    rng = np.random.default_rng(7)
    labels = np.array(["INCLUDE", "EXCLUDE", "UNCERTAIN"])
    for _ in range(30):
        data = rng.choice(labels, size=(int(rng.integers(2, 5)), int(rng.integers(3, 40)))).astype(object)
        data[rng.random(data.shape) < 0.25] = None
        reference_input = np.where(data == None, "nan", data).astype(str)  # noqa: E711 (element-wise)
        expected = _reference_alpha(reference_input, "nominal")
        assert _same(reliability.alpha(ValueCounts.from_matrix(data), "nominal"), expected)


@given(
    st.lists(
        st.lists(st.one_of(st.none(), st.integers(1, 5)), min_size=8, max_size=8), min_size=2, max_size=4
    ),
    st.sampled_from(reliability.LEVELS),
)
def test_alpha_equals_the_package_on_any_small_table(rows: list[list[int | None]], level: str) -> None:
    data = np.array([[np.nan if v is None else v for v in row] for row in rows], dtype=float)
    assert _same(reliability.alpha(ValueCounts.from_matrix(data), level), _reference_alpha(data, level))


def test_long_form_labels_in_any_order_give_the_same_patterns_as_the_matrix() -> None:
    rng = np.random.default_rng(3)
    data = _random_reliability_data(rng, missing=0.3, continuous=False)
    _coders, units = np.indices(data.shape)
    order = rng.permutation(data.size)
    long_form = ValueCounts.from_labels(units.ravel()[order], data.ravel()[order])
    for level in reliability.LEVELS:
        assert _same(reliability.alpha(long_form, level), _reference_alpha(data, level))
    assert long_form.pairable_values == int(sum(c for c in (~np.isnan(data)).sum(axis=0) if c >= 2))


@pytest.mark.parametrize("weights", reliability.WEIGHTS)
def test_kappa_equals_scikit_learn_on_random_pairs(weights: reliability.Weights) -> None:
    rng = np.random.default_rng(len(weights))
    compared = 0
    for _ in range(100):
        scale = np.arange(1, int(rng.integers(2, 8)) + 1)
        n = int(rng.integers(2, 200))
        a = rng.choice(scale, size=n)
        b = np.where(rng.random(n) < rng.uniform(0, 1), a, rng.choice(scale, size=n))
        # sklearn weights by position in `labels`; passing the whole scale makes position = score - 1.
        with np.errstate(divide="ignore", invalid="ignore"):
            expected = float(
                cohen_kappa_score(a, b, labels=scale, weights=None if weights == "none" else weights)
            )
        got = reliability.kappa(a, b, weights=weights)
        assert _same(got, expected if math.isfinite(expected) else NAN)
        compared += math.isfinite(expected)
    assert compared >= 90


def test_kappa_from_counts_equals_kappa_of_the_expanded_pairs() -> None:
    a, b, n = [1, 1, 2, 3, 3], [1, 2, 2, 3, 1], [4, 1, 6, 2, 3]
    expanded_a, expanded_b = np.repeat(a, n), np.repeat(b, n)
    for weights in reliability.WEIGHTS:
        assert reliability.kappa(a, b, n, weights=weights) == pytest.approx(
            cohen_kappa_score(expanded_a, expanded_b, weights=None if weights == "none" else weights)
        )


def test_labels_take_unweighted_kappa_only() -> None:
    assert reliability.kappa(["A", "B", "A"], ["A", "B", "B"]) == pytest.approx(
        cohen_kappa_score(["A", "B", "A"], ["A", "B", "B"])
    )
    with pytest.raises(ValueError, match="labels take unweighted kappa"):
        reliability.kappa(["A", "B"], ["A", "A"], weights="quadratic")


# ---------------------------------------------------------------------------------------------
# Undefined cases say so


@pytest.mark.parametrize("level", reliability.LEVELS)
def test_alpha_is_nan_when_every_value_is_the_same_or_nothing_is_pairable(level: reliability.Level) -> None:
    assert math.isnan(reliability.alpha(ValueCounts.from_matrix([[3, 3, 3], [3, 3, np.nan]]), level))
    lonely = ValueCounts.from_matrix([[1, np.nan, 3], [np.nan, 2, np.nan]])
    assert lonely.pairable_units == 0 and lonely.single_units == 3
    assert math.isnan(reliability.alpha(lonely, level))
    estimate = reliability.alpha_estimate(lonely, level)
    assert all(math.isnan(x) for x in (estimate.value, estimate.low, estimate.high))


def test_kappa_is_nan_when_both_raters_used_one_category() -> None:
    assert math.isnan(reliability.kappa([2, 2, 2], [2, 2, 2]))
    assert math.isnan(reliability.cohen_kappa(Crosstab(np.array([1.0]), np.zeros((1, 1)))))


def test_numeric_levels_refuse_labels() -> None:
    counts = ValueCounts.from_matrix([["a", "b"], ["a", "a"]])
    with pytest.raises(ValueError, match="labels are nominal"):
        reliability.alpha(counts, "ordinal")
    with pytest.raises(ValueError, match="unknown level"):
        reliability.alpha(counts, "circular")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Percent agreement


def test_percent_agreement_counts_agreeing_pairs_within_units() -> None:
    # Unit 1: (1, 1, 2) -> 1 of 3 pairs agree; unit 2: (4, 4) -> 1 of 1; unit 3: (5) alone -> left out.
    counts = ValueCounts.from_labels([1, 1, 1, 2, 2, 3], [1, 1, 2, 4, 4, 5])
    assert reliability.percent_agreement(counts) == pytest.approx(2 / 4)
    assert reliability.percent_agreement(counts, tolerance=1.0) == pytest.approx(4 / 4)


def test_crosstab_agreement_exact_and_within_tolerance() -> None:
    crosstab = Crosstab.of([0.1, 0.5, 0.9, 0.3], [0.1, 0.6, 0.2, 0.3])
    assert reliability.crosstab_agreement(crosstab) == pytest.approx(0.5)
    assert reliability.crosstab_agreement(crosstab, tolerance=0.1) == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------
# Bootstrap


@pytest.mark.parametrize("level", reliability.LEVELS)
def test_each_resample_alpha_equals_the_package_on_the_resampled_units(level: reliability.Level) -> None:
    """The batch formula (per-resample ranks for ordinal) is alpha of the units each resample holds."""
    rng = np.random.default_rng(11)
    data = np.abs(_random_reliability_data(rng, missing=0.2, continuous=False)) + 1
    counts = ValueCounts.from_matrix(data)
    weights = rng.multinomial(counts.pairable_units, counts.units / counts.units.sum(), size=20)
    batch = reliability.alphas(counts, level, weights.astype(float))
    dense = counts.dense()
    for row, value in zip(weights, batch, strict=True):
        value_counts = np.repeat(dense, row, axis=0)
        expected = float(
            krippendorff.alpha(
                value_counts=value_counts, value_domain=counts.values, level_of_measurement=level
            )
        )
        assert _same(value, expected)


def test_bootstrap_interval_is_seeded_and_brackets_the_estimate() -> None:
    rng = np.random.default_rng(5)
    data = _random_reliability_data(rng, missing=0.1, continuous=False)
    counts = ValueCounts.from_matrix(data)
    first = reliability.alpha_estimate(counts, "ordinal", seed=1)
    assert first == reliability.alpha_estimate(counts, "ordinal", seed=1)
    assert first != reliability.alpha_estimate(counts, "ordinal", seed=2)
    assert first.low < first.value < first.high


def test_pattern_bootstrap_matches_resampling_units_one_by_one() -> None:
    """Multinomial draws over patterns and index resampling of units give the same interval."""
    rng = np.random.default_rng(8)
    units = 300
    truth = rng.integers(1, 6, size=units)
    data = np.vstack([truth, np.clip(truth + rng.integers(-1, 2, size=units), 1, 5)]).astype(float)
    counts = ValueCounts.from_matrix(data)
    estimate = reliability.alpha_estimate(counts, "interval", resamples=1000, seed=3)
    draws = []
    for idx in rng.integers(0, units, size=(1000, units)):
        draws.append(reliability.alpha(ValueCounts.from_matrix(data[:, idx]), "interval"))
    low, high = reliability.percentile_interval(draws)
    assert estimate.low == pytest.approx(low, abs=0.02)
    assert estimate.high == pytest.approx(high, abs=0.02)


def test_kappa_interval_narrows_with_more_items() -> None:
    small = Crosstab(np.arange(2), np.array([[20.0, 5], [10, 15]]))
    large = Crosstab(np.arange(2), small.table * 20)
    a, b = reliability.kappa_estimate(small), reliability.kappa_estimate(large)
    assert a.value == pytest.approx(b.value) == pytest.approx(0.4)
    assert (b.high - b.low) < (a.high - a.low) / 3
    assert a.low < 0.4 < a.high


def test_percentile_interval_ignores_undefined_draws() -> None:
    assert reliability.percentile_interval([NAN, 1.0, 2.0, 3.0, NAN], confidence=1.0) == (1.0, 3.0)
    low, high = reliability.percentile_interval([NAN, NAN])
    assert math.isnan(low) and math.isnan(high)


def test_a_million_labels_take_a_handful_of_patterns() -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(1, 6, size=500_000)
    second = np.clip(truth + rng.integers(-1, 2, size=truth.size), 1, 5)
    counts = ValueCounts.from_labels(
        np.repeat(np.arange(truth.size), 2), np.column_stack([truth, second]).ravel()
    )
    assert counts.pairable_units == 500_000 and counts.patterns <= 15
    estimate = reliability.alpha_estimate(counts, "ordinal")
    assert estimate.low < estimate.value < estimate.high and estimate.high - estimate.low < 0.01


def test_share_estimate_is_the_wilson_interval() -> None:
    # Wilson (1927) for 0 of 10 at 95 %: [0, 0.2775]; for 5 of 10: [0.2366, 0.7634].
    zero = reliability.share_estimate(0, 10)
    assert (zero.value, zero.low) == (0.0, 0.0) and zero.high == pytest.approx(0.2775, abs=1e-4)
    half = reliability.share_estimate(5, 10)
    assert (half.low, half.high) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    assert math.isnan(reliability.share_estimate(0, 0).value)


def test_mean_estimate_from_sums_equals_the_normal_interval_of_the_values() -> None:
    values = np.array([-1.0, 0.0, 0.0, 1.0, 2.0, -0.5])
    estimate = reliability.mean_estimate(len(values), values.sum(), (values**2).sum())
    half = 1.959963984540054 * values.std(ddof=1) / math.sqrt(len(values))
    assert estimate.value == pytest.approx(values.mean())
    assert (estimate.low, estimate.high) == (
        pytest.approx(values.mean() - half),
        pytest.approx(values.mean() + half),
    )
