"""The Gaussian mechanism on summed statistics: clipping bounds what one row changes, the noise
has the calibrated spread, and the budget read from dp-accounting matches the closed form of
composed Gaussian mechanisms (Gaussian differential privacy, Dong, Roth and Su 2022)."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import chi2, norm

from fednovelty.federated.trust.dp import noise_std
from fednovelty.federated.trust.dp_calibration import calibrate_noise, epsilon_spent
from fednovelty.federated.trust.dp_mechanism import clip_rows, gaussian_noise, stats_sensitivities
from fednovelty.federated.trust.dp_postprocess import nearest_psd, positive_counts
from fednovelty.federated.trust.noise import SeededNoise, add_gaussian

RNG = np.random.default_rng(0)


def test_clipped_rows_lie_in_the_ball_and_keep_their_direction():
    X = torch.as_tensor(RNG.normal(0, 3, (200, 4)))
    centre = torch.as_tensor([1.0, -1.0, 0.5, 0.0])
    clipped = clip_rows(X, centre, 2.0)
    norms = torch.linalg.vector_norm(clipped - centre, dim=1)
    assert float(norms.max()) <= 2.0 * (1 + 1e-12)
    inside = torch.linalg.vector_norm(X - centre, dim=1) <= 2.0
    assert torch.equal(clipped[inside], X[inside]) and int((~inside).sum()) > 50
    cosine = torch.nn.functional.cosine_similarity(clipped - centre, X - centre, dim=1)
    torch.testing.assert_close(cosine, torch.ones_like(cosine))
    with pytest.raises(ValueError, match="bound must be a positive"):
        clip_rows(X, centre, 0.0)
    with pytest.raises(ValueError, match="centre must have shape"):
        clip_rows(X, centre[:2], 1.0)


def _stats(X, resp, centre):
    """Summed statistics about ``centre`` (numpy, by hand): counts, sums, second moments."""
    Z = X - centre
    return resp.sum(0), resp.T @ Z, np.einsum("nk,ni,nj->kij", resp, Z, Z)


def test_one_row_moves_each_block_by_at_most_its_sensitivity():
    bound, centre = 1.5, np.array([0.5, -0.5, 2.0])
    sens = stats_sensitivities(bound)
    for _ in range(200):
        X = clip_rows(torch.as_tensor(RNG.normal(0, 4, (31, 3))), torch.as_tensor(centre), bound)
        X = X.numpy()
        resp = RNG.dirichlet(np.full(4, 0.3), size=31)  # any responsibilities, summing to 1
        with_row = _stats(X, resp, centre)
        without = _stats(X[:-1], resp[:-1], centre)
        moved = [np.linalg.norm((a - b).ravel()) for a, b in zip(with_row, without, strict=True)]
        assert moved[0] <= sens["counts"] + 1e-12
        assert moved[1] <= sens["sums"] + 1e-12
        assert moved[2] <= sens["second"] + 1e-12


def _std_interval(samples: np.ndarray, level: float = 1e-6) -> tuple[float, float]:
    """A (1 - level) confidence interval of a zero-mean normal's standard deviation."""
    n = samples.size
    s2 = float((samples**2).mean())
    return math.sqrt(n * s2 / chi2.ppf(1 - level / 2, n)), math.sqrt(
        n * s2 / chi2.ppf(level / 2, n)
    )


def test_the_noise_has_the_calibrated_spread_in_every_mode():
    like = torch.zeros((), dtype=torch.float64)
    generator = SeededNoise(0)
    central = noise_std(2.0, 3.0, "central")
    assert central == noise_std(2.0, 3.0, "local") == 6.0
    draws = gaussian_noise((20000,), central, like, generator).numpy()
    low, high = _std_interval(draws)
    assert low <= central <= high and abs(draws.mean()) < 6 * central / math.sqrt(draws.size)
    # distributed: ten clients' shares sum to the central noise
    share = noise_std(2.0, 3.0, "distributed", n_clients=10)
    summed = sum(gaussian_noise((20000,), share, like, generator) for _ in range(10)).numpy()
    low, high = _std_interval(summed)
    assert low <= central <= high
    with pytest.raises(ValueError, match="mode must be one of"):
        noise_std(1.0, 1.0, "secure")


def test_symmetric_noise_is_symmetric_with_the_spread_on_the_upper_triangle():
    like = torch.zeros((4000, 3, 3), dtype=torch.float64)
    noise = add_gaussian(like, 0.7, SeededNoise(1), symmetric=True)
    assert torch.equal(noise, noise.transpose(-1, -2))  # mirrored copies, not recomputed
    upper = noise[:, *np.triu_indices(3)].numpy()
    for column in upper.T:
        low, high = _std_interval(column)
        assert low <= 0.7 <= high
    correlation = np.corrcoef(upper.T)
    assert np.abs(correlation - np.eye(6)).max() < 0.1  # independent entries


def _gdp_epsilon(mu: float, delta: float) -> float:
    """epsilon of a mu-GDP mechanism at delta (Dong, Roth and Su 2022, Corollary 2.13)."""

    def gap(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2) - delta

    return brentq(gap, 0.0, 200.0)


@pytest.mark.parametrize(("z", "rounds", "blocks"), [(1.0, 1, 1), (4.0, 10, 3), (20.0, 60, 3)])
def test_the_accountant_matches_the_closed_form_of_composed_gaussians(z, rounds, blocks):
    """Composing ``rounds`` x ``blocks`` Gaussian mechanisms of multiplier z is
    sqrt(rounds * blocks) / z - GDP exactly; the PLD accountant's epsilon is an upper bound
    within its discretisation."""
    exact = _gdp_epsilon(math.sqrt(rounds * blocks) / z, 1e-5)
    spent = epsilon_spent(z, rounds, 1e-5, blocks)
    assert exact <= spent <= exact * 1.02 + 1e-3


def test_calibrated_noise_spends_the_budget_and_no_less_noise_would():
    z = calibrate_noise(1.0, 1e-5, rounds=20, tolerance=1e-3)
    assert epsilon_spent(z, 20, 1e-5) <= 1.0
    assert epsilon_spent(z * (1 - 3e-3), 20, 1e-5) > 1.0
    assert epsilon_spent(0.0, 5, 1e-5) == math.inf and epsilon_spent(3.0, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="epsilon must be in \\(0, 100\\]"):
        calibrate_noise(math.inf, 1e-5, rounds=3)
    with pytest.raises(ValueError, match="delta must be in"):
        epsilon_spent(1.0, 3, 0.0)


def test_post_processing_keeps_counts_positive_and_covariances_positive_definite():
    counts = torch.tensor([3.0, -0.4, 0.0], dtype=torch.float64)
    assert positive_counts(counts, 1e-3).tolist() == [3.0, 1e-3, 1e-3]
    A = torch.as_tensor(RNG.normal(0, 1, (5, 4, 4)))
    noisy = (A + A.transpose(-1, -2)) / 2  # symmetric, indefinite
    fixed = nearest_psd(noisy, 1e-2)
    assert float(torch.linalg.eigvalsh(fixed).min()) >= 1e-2 * (1 - 1e-9)
    spd = A @ A.transpose(-1, -2) + torch.eye(4)
    torch.testing.assert_close(nearest_psd(spd, 1e-2), spd)
