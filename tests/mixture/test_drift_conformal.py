"""Conformal drift tests: the window's permutation p-value against exact enumeration and
its false-alarm rate, online per-row p-values against hand counts, the simple jumper by
hand and Ville's bound."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import binom

from fednovelty.mixture.drift_conformal import (
    jumper_martingale,
    row_p_values,
    smoothed_p_value,
    window_p_value,
)


def _within_binomial(count: int, n: int, rate: float, level: float = 1e-4) -> bool:
    low, high = binom.interval(1.0 - level, n, rate)
    return low <= count <= high


def test_smoothed_p_value_counts_above_and_ties_by_hand():
    # 1 of 4 above 3, 1 tied: (1 + u * 2) / 5
    assert smoothed_p_value(3.0, [1.0, 2.0, 4.0, 3.0], 0.0) == pytest.approx(0.2)
    assert smoothed_p_value(3.0, [1.0, 2.0, 4.0, 3.0], 1.0) == pytest.approx(0.6)
    assert smoothed_p_value(9.0, [], 0.25) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="u must be"):
        smoothed_p_value(1.0, [1.0], 1.5)


def test_window_p_value_tends_to_the_exact_permutation_p_value():
    window, reference = np.array([3.1, 2.0]), np.array([0.5, 2.5, 1.0, 4.0])
    pooled = np.r_[window, reference]
    means = np.array([pooled[list(s)].mean() for s in itertools.combinations(range(6), 2)])
    above = float((means > window.mean() + 1e-9).mean())  # 15 splits enumerated
    tied = float((np.abs(means - window.mean()) <= 1e-9).mean())
    assert tied == pytest.approx(1 / 15)  # the window's own split only
    rng = np.random.default_rng(0)
    p = window_p_value(window, reference, n_resamples=40_000, rng=rng)
    slack = 4 * np.sqrt(0.25 / 40_000)
    assert above - slack <= p <= above + tied + slack


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_window_p_value_alarms_at_the_exact_rate_on_exchangeable_rows(alpha):
    rng = np.random.default_rng(1)
    reps = 3000
    p = [
        window_p_value(rng.exponential(size=5), rng.exponential(size=20), n_resamples=99, rng=rng)
        for _ in range(reps)
    ]
    count = int((np.asarray(p) <= alpha).sum())
    assert _within_binomial(count, reps, alpha), count


def test_window_p_value_is_small_for_a_shifted_window_and_checks_its_input():
    rng = np.random.default_rng(2)
    p = window_p_value(
        rng.normal(1.0, 1.0, 50), rng.normal(0.0, 1.0, 200), n_resamples=999, rng=rng
    )
    assert p < 0.01  # a shift of 1 sd over 50 rows: z = 6.3
    with pytest.raises(ValueError, match="window must hold"):
        window_p_value([], [1.0], n_resamples=9, rng=rng)
    with pytest.raises(ValueError, match="reference holds NaN"):
        window_p_value([1.0], [np.nan], n_resamples=9, rng=rng)
    with pytest.raises(ValueError, match="n_resamples"):
        window_p_value([1.0], [1.0], n_resamples=-1, rng=rng)


def test_row_p_values_rank_each_row_against_the_reference_and_earlier_rows():
    scores, reference = np.array([2.0, 5.0, 2.0, 0.0]), np.array([1.0, 2.0, 3.0])
    p = row_p_values(scores, reference, rng=np.random.default_rng(3))
    # by hand: (#above, #tied) among the reference and the rows before, over (m + j + 1)
    counts = [(1, 1), (0, 0), (2, 2), (6, 0)]
    for j, (above, tied) in enumerate(counts):
        size = len(reference) + j + 1
        assert above / size <= p[j] <= (above + tied + 1) / size


def test_row_p_values_are_uniform_on_exchangeable_rows():
    rng = np.random.default_rng(4)
    reps, n = 2000, 10
    p = np.concatenate(
        [row_p_values(rng.normal(size=n), rng.normal(size=5), rng=rng) for _ in range(reps)]
    )
    for alpha in (0.1, 0.5):
        assert _within_binomial(int((p <= alpha).sum()), reps * n, alpha)


def test_simple_jumper_by_hand():
    # epsilons (-1, 0, 1), J = 0.01, capital 1/3 each; p = 0.1 twice
    _, path = jumper_martingale([0.1, 0.1])
    assert np.exp(path) == pytest.approx([1.0, (1.396 * 1.4 + 1.0 + 0.604 * 0.6) / 3], rel=1e-12)
    # one-sided (-1, 0): (0.7, 0.5), then 0.99 C + 0.006 and x (1.4, 1)
    log_c, path = jumper_martingale([0.1, 0.1], epsilons=(-1.0, 0.0))
    assert np.exp(path) == pytest.approx([1.2, 0.699 * 1.4 + 0.501], rel=1e-12)
    _, more = jumper_martingale([0.1], log_c, epsilons=(-1.0, 0.0))  # it carries on
    joined = jumper_martingale([0.1, 0.1, 0.1], epsilons=(-1.0, 0.0))[1]
    assert more[0] == pytest.approx(joined[2], rel=1e-12)


def test_simple_jumper_keeps_villes_bound_and_grows_on_small_p_values():
    rng = np.random.default_rng(5)
    alpha, streams = 0.1, 1000
    crossed = sum(
        jumper_martingale(rng.random(300), epsilons=(-1.0, 0.0))[1].max() >= np.log(1 / alpha)
        for _ in range(streams)
    )
    assert crossed <= binom.ppf(1 - 1e-4, streams, alpha)  # P(ever >= 1/alpha) <= alpha
    _, path = jumper_martingale(rng.beta(0.5, 1.0, 300), epsilons=(-1.0, 0.0))
    assert path.max() >= np.log(100)
    for bad, match in (
        ({"epsilons": (2.0,)}, "epsilons"),
        ({"jump": 1.5}, "jump"),
        ({"log_capital": [0.0]}, "log_capital"),
    ):
        with pytest.raises(ValueError, match=match):
            jumper_martingale([0.5], **bad)
    with pytest.raises(ValueError, match="p_values"):
        jumper_martingale([1.5])
