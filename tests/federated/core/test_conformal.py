"""Split-conformal thresholds and p-values (``federated.core.conformal``) against exact
references.

The guarantee is checked by simulation: over ``R`` independent repetitions (a fresh
calibration set and one fresh test point from a continuous distribution each), the number of
alarms is Binomial(R, (n + 1 - k) / (n + 1)) exactly, ``k = ceil((1 - alpha)(n + 1))``
computed here in integers; it must fall in that law's two-sided 1e-6 interval (SciPy), and so
must the count of p-values at or below ``u``, Binomial(R, floor(u (n + 1)) / (n + 1)). An
anti-conservative rank (``k - 1``) fails the same check. Benjamini-Hochberg is checked
against hand-worked examples and the definition; the binned forms against the exact ones;
the shrunk threshold at its limits and on a hand-worked case; bad input by message.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from fednovelty.federated.core.conformal import (
    CALIBRATION_BINS,
    benjamini_hochberg,
    calibration_edges,
    conformal_p_values,
    conformal_rank,
    conformal_threshold,
    histogram_counts,
    histogram_p_values,
    histogram_threshold,
    min_calibration_rows,
    shrunk_threshold,
)

#: the levels, exactly (the reference ranks are computed in integers from these).
LEVELS = {0.01: Fraction(1, 100), 0.05: Fraction(1, 20), 0.1: Fraction(1, 10)}
REPETITIONS = 20000
TAIL = 1e-6  # the binomial interval's two tails together


def exact_rank(n: int, alpha: Fraction) -> int:
    """``ceil((1 - alpha)(n + 1))`` in exact arithmetic (may exceed ``n``)."""
    return math.ceil((1 - alpha) * (n + 1))


def binomial_interval(trials: int, p: float) -> tuple[int, int]:
    """The counts outside which Binomial(trials, p) falls with probability <= TAIL."""
    return int(binom.ppf(TAIL / 2, trials, p)), int(binom.isf(TAIL / 2, trials, p))


def simulate(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``REPETITIONS`` calibration sets (R, n) and test points (R,), i.i.d. log-normal."""
    rng = np.random.default_rng(seed)
    draws = rng.lognormal(0.0, 1.0, (REPETITIONS, n + 1))
    return draws[:, :n], draws[:, n]


@pytest.fixture(scope="module", params=[19, 99, 500])
def repetitions(request):
    n = request.param
    return n, *simulate(n, seed=n)


# ----------------------------------------------------------------------------- the guarantee
@pytest.mark.parametrize("alpha", sorted(LEVELS))
def test_the_alarm_rate_of_an_inlier_is_the_exact_binomial_rate(repetitions, alpha) -> None:
    n, calibration, test = repetitions
    k = exact_rank(n, LEVELS[alpha])
    rate = (n + 1 - k) / (n + 1) if k <= n else 0.0
    assert rate <= alpha and (k > n or rate >= alpha - 1 / (n + 1))  # the stated bounds
    alarms = sum(
        bool(x > conformal_threshold(cal, alpha)) for cal, x in zip(calibration, test, strict=True)
    )
    low, high = binomial_interval(REPETITIONS, rate)
    assert low <= alarms <= high, (n, alpha, alarms, (low, high), rate)


def test_the_check_fails_for_a_threshold_one_rank_too_low() -> None:
    """The k-1-th order statistic (an off-by-one) alarms at (n + 2 - k) / (n + 1): outside
    the interval of the exact rate at n = 19 (alpha 0.05 and 0.1). At n = 99 one rank moves
    the rate by 0.01, about five standard deviations at R = 20,000: the interval does not
    resolve it there, and the hand-counted order statistics below pin the rank instead."""
    calibration, test = simulate(19, seed=1019)
    for alpha in (0.05, 0.1):
        n, k = 19, exact_rank(19, LEVELS[alpha])
        low_threshold = np.sort(calibration, axis=1)[:, k - 2]
        alarms = int((test > low_threshold).sum())
        low, high = binomial_interval(REPETITIONS, (n + 1 - k) / (n + 1))
        assert not low <= alarms <= high


@pytest.mark.parametrize("u", [0.01, 0.05, 0.1, 0.37, 0.9])
def test_p_values_are_valid_and_uniform_on_their_grid(repetitions, u) -> None:
    n, calibration, test = repetitions
    p = np.array(
        [conformal_p_values([x], cal)[0] for cal, x in zip(calibration, test, strict=True)]
    )
    rate = math.floor(u * (n + 1)) / (n + 1)  # P(p <= u) for continuous scores, <= u
    low, high = binomial_interval(REPETITIONS, rate)
    assert low <= int((p <= u).sum()) <= high
    assert set(np.unique(np.round(p * (n + 1)))) <= set(range(1, n + 2))


def test_with_ties_the_alarm_rate_stays_below_alpha() -> None:
    """Scores on five values: many ties, and the alarm (score > threshold) stays at most
    the exact rate (one-sided check)."""
    rng = np.random.default_rng(7)
    n, alpha = 99, 0.1
    draws = rng.integers(0, 5, (REPETITIONS, n + 1)).astype(float)
    alarms = sum(bool(row[n] > conformal_threshold(row[:n], alpha)) for row in draws)
    k = exact_rank(n, LEVELS[alpha])
    assert alarms <= binom.isf(TAIL, REPETITIONS, (n + 1 - k) / (n + 1))


def test_the_threshold_is_the_hand_counted_order_statistic() -> None:
    scores = np.arange(1.0, 20.0)[::-1]  # 19 scores 19 .. 1
    assert conformal_rank(19, 0.1) == 18  # ceil(0.9 * 20)
    assert conformal_threshold(scores, 0.1) == 18.0
    assert conformal_rank(19, 0.05) == 19 and conformal_threshold(scores, 0.05) == 19.0
    assert conformal_rank(18, 0.05) == 19 and conformal_threshold(scores[:18], 0.05) == math.inf
    # exact decimals: ceil(0.3 * 10) = 3 and ceil(0.55 * 100) = 55, where float arithmetic
    # gives 4 and 56
    assert conformal_rank(9, 0.7) == 3 and conformal_rank(99, 0.45) == 55
    assert conformal_threshold([], 0.5) == math.inf
    # p = (1 + #{cal >= s}) / (n + 1), by hand: 19 scores, s = 18 -> (1 + 2) / 20
    np.testing.assert_array_equal(
        conformal_p_values([18.0, 0.5, 25.0], scores), [3 / 20, 20 / 20, 1 / 20]
    )


@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.1, 0.3, 0.25, 0.5, 0.9])
def test_min_calibration_rows_is_the_first_n_with_a_finite_threshold(alpha) -> None:
    m = min_calibration_rows(alpha)
    exact = Fraction(repr(alpha))
    assert m == math.ceil(1 / exact) - 1
    assert exact_rank(m, exact) <= m and (m == 0 or exact_rank(m - 1, exact) > m - 1)
    assert conformal_rank(m, alpha) <= m
    assert conformal_threshold(np.ones(m), alpha) == (1.0 if m else math.inf)


# ----------------------------------------------------------------------------- BH
def bh_by_definition(p: np.ndarray, q: float) -> np.ndarray:
    """Reject H_(1..i*), i* = max{i : p_(i) <= i q / m}, from the definition, by a loop."""
    m = len(p)
    ranked = sorted(range(m), key=lambda i: (p[i], i))
    last = 0
    for i in range(1, m + 1):
        if p[ranked[i - 1]] <= i * q / m:
            last = i
    out = np.zeros(m, dtype=bool)
    out[ranked[:last]] = True
    return out


def test_benjamini_hochberg_on_hand_worked_examples() -> None:
    # m = 6, q = 0.1: bounds i q / m = .0167 .0333 .05 .0667 .0833 .1; sorted p
    # .005 .01 .03 .04 .2 .5: the first four are below theirs -> reject those four
    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2, 0.5])
    np.testing.assert_array_equal(benjamini_hochberg(p, 0.1), [1, 1, 1, 1, 0, 0])
    # m = 4, q = 0.05: bounds .0125 .025 .0375 .05; p_(1) = .02 and p_(2) = .03 are above
    # theirs but p_(3) = .035 is below: step-up rejects all three (step-down none)
    p = np.array([0.035, 0.02, 0.6, 0.03])
    np.testing.assert_array_equal(benjamini_hochberg(p, 0.05), [1, 1, 0, 1])
    assert not benjamini_hochberg(np.array([0.5, 0.5]), 0.1).any()
    np.testing.assert_array_equal(benjamini_hochberg(np.array([0.05, 0.05]), 0.1), [1, 1])
    assert benjamini_hochberg(np.array([]), 0.1).shape == (0,)


def test_benjamini_hochberg_equals_the_definition_and_statsmodels() -> None:
    rng = np.random.default_rng(3)
    for trial in range(200):
        m = int(rng.integers(1, 40))
        p = np.where(rng.random(m) < 0.3, rng.random(m) * 0.01, rng.random(m))
        p = np.round(p, 3) if trial % 2 else p  # ties on half the trials
        q = float(rng.choice([0.05, 0.1, 0.2]))
        np.testing.assert_array_equal(benjamini_hochberg(p, q), bh_by_definition(p, q))
        try:
            from statsmodels.stats.multitest import multipletests
        except ImportError:
            continue
        np.testing.assert_array_equal(
            benjamini_hochberg(p, q), multipletests(p, alpha=q, method="fdr_bh")[0]
        )


# ----------------------------------------------------------------------------- binned forms
def counts_by_hand(scores: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(B + 2,): s <= e_0, e_{j-1} < s <= e_j for each j, s > e_B, by comparisons."""
    under = [(scores <= edges[0]).sum()]
    inner = [((scores > lo) & (scores <= hi)).sum() for lo, hi in itertools.pairwise(edges)]
    return np.array(under + inner + [(scores > edges[-1]).sum()], dtype=float)


def test_calibration_edges_are_the_public_grid() -> None:
    edges = calibration_edges(-3.5)
    assert edges.shape == (CALIBRATION_BINS + 1,)
    assert edges[0] == -3.5 and edges[1] == pytest.approx(-3.5 + 1e-4, rel=1e-12)
    assert edges[-1] == pytest.approx(-3.5 + 1e6, rel=1e-12)
    ratio = np.diff(edges[1:] + 3.5) / (edges[1:-1] + 3.5)
    np.testing.assert_allclose(ratio, 10 ** (10 / 4095) - 1, rtol=1e-6)  # about 0.56 %


def test_histogram_counts_are_the_hand_counts() -> None:
    rng = np.random.default_rng(0)
    edges = calibration_edges(-1.0)
    scores = np.concatenate(
        [rng.lognormal(0, 2, 500), edges[rng.integers(0, len(edges), 50)], [-5.0, 2e6]]
    )
    counts = histogram_counts(scores, edges)
    np.testing.assert_array_equal(counts, counts_by_hand(scores, edges))
    assert counts.dtype == np.float64 and counts.sum() == len(scores)


@pytest.mark.parametrize("n", [19, 99, 500])
@pytest.mark.parametrize("alpha", sorted(LEVELS))
def test_histogram_forms_are_conservative_within_one_bin(n, alpha) -> None:
    rng = np.random.default_rng(n)
    edges = calibration_edges(0.0)
    calibration = rng.lognormal(0.0, 1.5, n)
    counts = histogram_counts(calibration, edges)
    exact = conformal_threshold(calibration, alpha)
    binned = histogram_threshold(counts, edges, alpha)
    assert binned >= exact
    above = edges[edges >= exact]
    assert binned == (above[0] if above.size else math.inf)  # the next edge up
    tested = np.concatenate([rng.lognormal(0.0, 1.5, 300), calibration[:20], edges[::97]])
    exact_p = conformal_p_values(tested, calibration)
    binned_p = histogram_p_values(tested, counts, edges)
    assert (binned_p >= exact_p).all() and (binned_p <= 1).all()


@pytest.mark.parametrize("alpha", sorted(LEVELS))
def test_on_bin_edges_the_histogram_forms_are_exact(alpha) -> None:
    rng = np.random.default_rng(11)
    edges = calibration_edges(-2.0)
    calibration = edges[rng.integers(0, len(edges), 400)]
    counts = histogram_counts(calibration, edges)
    assert histogram_threshold(counts, edges, alpha) == conformal_threshold(calibration, alpha)
    tested = np.concatenate([rng.normal(0, 50, 300), calibration[:50], [-1e9, 1e9]])
    np.testing.assert_array_equal(
        histogram_p_values(tested, counts, edges), conformal_p_values(tested, calibration)
    )


def test_noisy_counts_are_clipped_at_zero() -> None:
    edges = np.array([0.0, 1.0, 2.0, 3.0])
    noisy = np.array([-0.7, 5.2, -1.0, 4.9, -0.2])
    clipped = np.clip(noisy, 0, None)  # n = 10.1 -> 10 rows, k = ceil(0.9 * 11) = 10
    assert histogram_threshold(noisy, edges, 0.1) == histogram_threshold(clipped, edges, 0.1)
    assert histogram_threshold(noisy, edges, 0.1) == 3.0  # cumulative 10.1 reaches 10 at bin 3
    # p at s = 1.5: bins with upper edge >= 1.5 hold 0 + 4.9 + 0 -> (1 + 4.9) / 11.1
    np.testing.assert_allclose(histogram_p_values([1.5], noisy, edges), [5.9 / 11.1])


# ----------------------------------------------------------------------------- shrinkage
def test_shrunk_threshold_at_its_limits() -> None:
    rng = np.random.default_rng(5)
    edges = calibration_edges(0.0)
    counts = histogram_counts(rng.lognormal(1.0, 1.0, 2000), edges)
    own = rng.lognormal(0.0, 1.0, 60)
    for alpha in (0.05, 0.1):
        hist = histogram_threshold(counts, edges, alpha)
        assert shrunk_threshold(own[:0], counts, edges, alpha, 19.0) == hist
        assert shrunk_threshold(own, counts, edges, alpha, 0.0) == conformal_threshold(own, alpha)
        assert shrunk_threshold(own, counts * 0, edges, alpha, 19.0) == conformal_threshold(
            own, alpha
        )


def test_shrunk_threshold_tends_to_the_clients_own() -> None:
    """A client whose scores sit lower than the federation's: with 19 prior rows, the gap
    to its own conformal threshold shrinks as its own rows grow, to within 1 % at 20,000."""
    rng = np.random.default_rng(6)
    edges = calibration_edges(0.0)
    counts = histogram_counts(rng.lognormal(2.0, 1.0, 5000), edges)
    gaps = []
    for n_own in (20, 200, 2000, 20000):
        own = rng.lognormal(0.0, 1.0, n_own)
        mine = conformal_threshold(own, 0.05)
        gaps.append(abs(shrunk_threshold(own, counts, edges, 0.05, 19.0) - mine) / mine)
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 0.01


def test_shrunk_threshold_on_a_hand_worked_case() -> None:
    # own [1, 2, 3]; histogram: 4 scores in (10, 20], read at 20; prior_rows 2 -> each binned
    # score weighs 2 / 4 = 0.5; own share 3 / 5, the new point 0.6 + 0.4 * 0.5 = 0.8;
    # total weight 3 + 2 + 0.8 = 5.8
    edges, counts = np.array([0.0, 10.0, 20.0]), np.array([0.0, 0.0, 4.0, 0.0])
    own = np.array([3.0, 1.0, 2.0])
    # alpha 0.5: target 2.9; weight at or below 3 is 3 -> t = 3
    assert shrunk_threshold(own, counts, edges, 0.5, 2.0) == 3.0
    # alpha 0.3: target 4.06; weight at 3 and at 10 is 3, at 20 is 3 + 4 * 0.5 = 5 -> t = 20
    assert shrunk_threshold(own, counts, edges, 0.3, 2.0) == 20.0
    # alpha 0.1: target 5.22 > 5, the most weight below +inf -> no finite threshold
    assert shrunk_threshold(own, counts, edges, 0.1, 2.0) == math.inf


# ----------------------------------------------------------------------------- bad input
EDGES = np.array([0.0, 1.0, 2.0])
COUNTS = np.array([0.0, 3.0, 2.0, 0.0])


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: conformal_threshold([1.0, 2.0], 0.0), "alpha must be in"),
        (lambda: conformal_threshold([1.0, 2.0], 1.0), "alpha must be in"),
        (lambda: conformal_threshold([1.0, 2.0], True), "alpha must be a number"),
        (lambda: conformal_threshold([1.0, 2.0], "0.1"), "alpha must be a number"),
        (lambda: conformal_threshold([[1.0, 2.0]], 0.1), r"calibration must be a 1-d .* \(1, 2\)"),
        (lambda: conformal_threshold([1.0, np.nan], 0.1), "calibration contains NaN"),
        (lambda: conformal_rank(-1, 0.1), "n must be an integer >= 0"),
        (lambda: conformal_rank(2.5, 0.1), "n must be an integer >= 0"),
        (lambda: min_calibration_rows(-0.1), "alpha must be in"),
        (lambda: conformal_p_values([[1.0]], [1.0]), "scores must be a 1-d"),
        (lambda: conformal_p_values([1.0], [np.nan]), "calibration contains NaN"),
        (lambda: benjamini_hochberg([0.1, 1.2], 0.1), r"p_values must lie in \[0, 1\]"),
        (lambda: benjamini_hochberg([0.1], 1.0), "q must be in"),
        (lambda: benjamini_hochberg([[0.1]], 0.1), "p_values must be a 1-d"),
        (lambda: calibration_edges(math.inf), "lowest must be a finite number"),
        (lambda: calibration_edges(1e13), "is too large in magnitude"),
        (lambda: histogram_counts([1.0], [0.0]), "edges must be a 1-d array of at least 2"),
        (lambda: histogram_counts([1.0], [0.0, 2.0, 1.0]), "edges must be finite and strictly"),
        (lambda: histogram_counts([np.nan], EDGES), "scores contains NaN"),
        (lambda: histogram_threshold(COUNTS[:3], EDGES, 0.1), r"counts must have shape .* \(4,\)"),
        (lambda: histogram_threshold(COUNTS * np.nan, EDGES, 0.1), "counts must be finite"),
        (lambda: histogram_threshold(COUNTS, EDGES, 2.0), "alpha must be in"),
        (lambda: histogram_p_values([[1.0]], COUNTS, EDGES), "scores must be a 1-d"),
        (lambda: shrunk_threshold([1.0], COUNTS, EDGES, 0.1, -1.0), "prior_rows must be"),
        (lambda: shrunk_threshold([1.0], COUNTS, EDGES, 0.1, math.nan), "prior_rows must be"),
        (lambda: shrunk_threshold([[1.0]], COUNTS, EDGES, 0.1, 1.0), "own must be a 1-d"),
    ],
)
def test_bad_input_is_named(call, match) -> None:
    with pytest.raises(ValueError, match=match):
        call()
