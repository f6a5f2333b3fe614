"""How one release's budget is split over counts, first and second moments: whatever split is
proposed, a release stays the Gaussian mechanism of three blocks of multiplier ``z``; the
first-order error of a noisy M-step (checked by Monte Carlo against the exact M-step) and
its minimiser (checked against a brute-force search)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fednovelty.federated.trust.dp_mechanism import noisy_stats
from fednovelty.federated.trust.dp_split import (
    BLOCK_SPLIT,
    STAT_BLOCKS,
    block_multipliers,
    normalised_split,
    optimal_split,
    split_coefficients,
    split_error,
    stats_split,
)
from fednovelty.federated.trust.noise import SeededNoise


def _gdp_mu(multipliers: dict[str, float]) -> float:
    """The mu of a release whose block ``b`` gets noise of multiplier ``multipliers[b]``
    times its sensitivity: the concatenation's Gaussian mechanism, sqrt(sum_b 1 / z_b^2)."""
    return math.sqrt(sum(1 / m**2 for m in multipliers.values()))


@pytest.mark.parametrize(
    "proposal",
    [
        {"counts": 1.0, "sums": 1.0, "second": 1.0},
        {"counts": 1e-9, "sums": 1e-9, "second": 1e-9},  # asks for (almost) no noise at all
        {"counts": 1e9, "sums": 1e-6, "second": 3.0},  # all the budget on one block
        {"counts": 8.0, "sums": 2.5, "second": 0.1},
    ],
)
def test_any_proposed_split_spends_what_three_blocks_of_multiplier_z_do(proposal):
    z = 7.3
    multipliers = block_multipliers(z, proposal)
    # the same mu as three blocks of multiplier z, whatever the proposal asked for
    assert _gdp_mu(multipliers) == pytest.approx(math.sqrt(3) / z, rel=1e-12)
    # and the proposal's ratios are kept
    ratio = multipliers["counts"] / proposal["counts"]
    for block in STAT_BLOCKS:
        assert multipliers[block] / proposal[block] == pytest.approx(ratio, rel=1e-12)


def test_random_proposals_keep_the_budget():
    rng = np.random.default_rng(0)
    for _ in range(200):
        proposal = dict(zip(STAT_BLOCKS, np.exp(rng.uniform(-12, 12, 3)).tolist(), strict=True))
        shares = normalised_split(proposal)
        assert sum(1 / s**2 for s in shares.values()) == pytest.approx(3, rel=1e-10)


def test_the_default_split_is_the_fixed_one_and_spends_three_blocks():
    assert block_multipliers(2.0) == {b: 2.0 * s for b, s in BLOCK_SPLIT.items()}
    assert _gdp_mu(block_multipliers(2.0)) == pytest.approx(math.sqrt(3) / 2.0, rel=1e-12)


@pytest.mark.parametrize(
    "proposal, message",
    [
        ({"counts": 1.0, "sums": 1.0}, "exactly the blocks"),
        ({"counts": 1.0, "sums": 1.0, "second": 1.0, "extra": 1.0}, "exactly the blocks"),
        ({"counts": 0.0, "sums": 1.0, "second": 1.0}, "split\\['counts'\\]"),
        ({"counts": 1.0, "sums": -1.0, "second": 1.0}, "split\\['sums'\\]"),
        ({"counts": 1.0, "sums": 1.0, "second": math.nan}, "split\\['second'\\]"),
        ({"counts": 1.0, "sums": 1.0, "second": math.inf}, "split\\['second'\\]"),
        ({"counts": True, "sums": 1.0, "second": 1.0}, "split\\['counts'\\]"),
    ],
)
def test_a_malformed_split_is_refused_naming_the_block(proposal, message):
    with pytest.raises(ValueError, match=message):
        normalised_split(proposal)


def _kl_gaussians(mu, cov, mu_hat, cov_hat):
    """KL(N(mu, cov) || N(mu_hat, cov_hat)) for batches: mu (T, d), cov (d, d) fixed."""
    d = mu.shape[-1]
    inv = np.linalg.inv(cov_hat)
    diff = mu_hat - mu
    trace = np.einsum("tij,ji->t", inv, cov)
    quad = np.einsum("ti,tij,tj->t", diff, inv, diff)
    logdet = np.linalg.slogdet(cov_hat)[1] - np.linalg.slogdet(cov)[1]
    return 0.5 * (trace + quad - d + logdet)


@pytest.mark.parametrize(
    "d, k, mean_sq, variance, split",
    [
        (3, 2, 0.2, 0.05, {"counts": 2.0, "sums": 1.5, "second": 0.8}),
        (5, 4, 0.5, 0.02, {"counts": 8.0, "sums": 2.5, "second": 0.6}),
    ],
)
def test_the_first_order_error_matches_a_monte_carlo_of_the_noisy_m_step(
    d, k, mean_sq, variance, split
):
    """Exact M-step from noisy statistics about the clipping centre (B = 1): the mean is the
    noisy first moment over the noisy count, the covariance the noisy second moment over
    the noisy count minus the mean's outer product, the weights the noisy counts over their
    sum; the expected KL from the truth (weights plus the average component's) is the
    formula's ``(z / n)^2 sum_b A_b s_b^2`` while the noise is small."""
    rng = np.random.default_rng(1)
    shares = normalised_split(split)
    z, n, draws = 3.0, 2.0e4, 6000
    mu = np.full(d, math.sqrt(mean_sq / d))
    cov = variance * np.eye(d)
    e_counts = rng.normal(0, z * shares["counts"], (draws, k))
    e_sums = rng.normal(0, z * shares["sums"], (draws, d))
    upper = np.triu(rng.normal(0, z * shares["second"], (draws, d, d)))
    e_second = upper + np.swapaxes(upper, 1, 2) - upper * np.eye(d)
    count = n + e_counts[:, 0]  # the component under study is the first
    mean = (n * mu + e_sums) / count[:, None]
    second = (n * (cov + np.outer(mu, mu)) + e_second) / count[:, None, None]
    cov_hat = second - mean[:, :, None] * mean[:, None, :]
    weights = (n + e_counts) / (n + e_counts).sum(1, keepdims=True)
    kl_weights = (np.log((1 / k) / weights) / k).sum(1)
    measured = float(np.mean(_kl_gaussians(mu, cov, mean, cov_hat) + kl_weights))
    coefficients = split_coefficients(d, k, mean_sq, variance)
    predicted = (z / n) ** 2 * split_error(shares, coefficients)
    assert measured == pytest.approx(predicted, rel=0.04)  # (d + 1) -> d would be 9 % off
    # the weights' part alone: (z s_counts / n)^2 (k - 1) / (2 k)
    weights_part = (z * shares["counts"] / n) ** 2 * (k - 1) / (2 * k)
    assert float(np.mean(kl_weights)) == pytest.approx(weights_part, rel=0.06)


@pytest.mark.parametrize("d, k", [(2, 2), (10, 8), (32, 15), (166, 8)])
def test_the_optimal_split_is_the_brute_force_minimum_of_the_error(d, k):
    coefficients = split_coefficients(d, k)
    best = optimal_split(coefficients)
    assert sum(1 / s**2 for s in best.values()) == pytest.approx(3, rel=1e-12)
    # brute force over the constraint surface: budget fractions p_b > 0 summing to 1,
    # s_b = 1 / sqrt(3 p_b)
    grid = np.linspace(1e-4, 1 - 1e-4, 1201)
    p_counts, p_sums = np.meshgrid(grid, grid, indexing="ij")
    p_second = 1 - p_counts - p_sums
    ok = p_second > 1e-6
    errors = np.full(p_counts.shape, np.inf)
    errors[ok] = (
        coefficients["counts"] / (3 * p_counts[ok])
        + coefficients["sums"] / (3 * p_sums[ok])
        + coefficients["second"] / (3 * p_second[ok])
    )
    i, j = np.unravel_index(np.argmin(errors), errors.shape)
    brute = {"counts": p_counts[i, j], "sums": p_sums[i, j], "second": p_second[i, j]}
    for block in STAT_BLOCKS:
        assert 1 / (3 * best[block] ** 2) == pytest.approx(brute[block], abs=2e-3)
    assert split_error(best, coefficients) <= errors[i, j] * (1 + 1e-9)
    assert split_error(best, coefficients) == pytest.approx(
        sum(math.sqrt(a) for a in coefficients.values()) ** 2 / 3, rel=1e-12
    )


def test_the_row_free_reference_is_a_tiling_of_the_cube_in_the_ball():
    d, k = 6, 8
    coefficients = split_coefficients(d, k)
    v = k ** (-2 / d) / (3 * d)  # a uniform cell of side 2 k^(-1/d) / sqrt(d): side^2 / 12
    assert coefficients == pytest.approx(split_coefficients(d, k, 1 / 3, v), rel=1e-12)
    assert coefficients["second"] == pytest.approx(d * d / (4 * v * v), rel=1e-12)
    assert stats_split(d, k) == pytest.approx(optimal_split(coefficients), rel=1e-12)


@pytest.mark.parametrize("args", [(0, 3), (3, 0), (3, 3, -1.0, None), (3, 3, None, 0.0)])
def test_split_coefficients_refuse_bad_arguments(args):
    with pytest.raises(ValueError):
        split_coefficients(*args)


def test_noisy_stats_put_each_blocks_share_of_the_noise_on_it():
    """The spread of each block's noise is z * s_b * sensitivity_b for a proposed split."""
    k, d, z, bound = 3, 4, 2.0, 1.5
    split = {"counts": 3.0, "sums": 1.0, "second": 0.9}
    shares = normalised_split(split)
    zeros = {
        "counts": torch.zeros(k, dtype=torch.float64),
        "sums": torch.zeros(k, d, dtype=torch.float64),
        "second": torch.zeros(k, d, d, dtype=torch.float64),
        "n_samples": torch.zeros((), dtype=torch.float64),
        "log_likelihood": torch.zeros((), dtype=torch.float64),
    }
    shift = torch.zeros(d, dtype=torch.float64)
    generator = SeededNoise(0)
    draws = [
        noisy_stats(zeros, shift, "full", z, bound, generator, split=split) for _ in range(400)
    ]
    counts = torch.stack([out["counts"] for out in draws])
    sums = torch.stack([out["sums"] for out in draws])
    upper = torch.stack([out["second"].triu() for out in draws])
    upper = upper[upper != 0]
    expected = {
        "counts": z * shares["counts"],
        "sums": z * shares["sums"] * bound,
        "second": z * shares["second"] * bound**2,
    }
    assert float(counts.std()) == pytest.approx(expected["counts"], rel=0.06)
    assert float(sums.std()) == pytest.approx(expected["sums"], rel=0.06)
    assert float(upper.std()) == pytest.approx(expected["second"], rel=0.06)
