"""Membership inference: the likelihood-ratio attack on released statistics reaches AUC 1
without noise and the Gaussian-DP bound with calibrated noise (no more, within sampling
error); the loss attack on an overfit detector leaks and on a well-fed one does not.

References are independent of the module: the GDP tradeoff curve and the (epsilon, delta)
region integrated numerically from SciPy's normal, ``mu = sqrt(blocks) / z`` by hand,
responsibilities from SciPy's multivariate normal, and the Hanley-McNeil standard error
written out here for the sampling margins."""

import functools
import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import multivariate_normal, norm
from sklearn.mixture import GaussianMixture

from fednovelty.detectors import FedGMMDetector
from fednovelty.detectors.options import Prior, Privacy
from fednovelty.evaluation.membership import score_attack, stats_attack
from fednovelty.evaluation.membership_audit import auc_interval, auc_standard_error, membership_auc
from fednovelty.evaluation.membership_bounds import (
    dp_auc_bound,
    dp_heldout_auc_bound,
    gdp_auc_bound,
    gdp_heldout_auc_bound,
    gdp_mu,
    gdp_mu_for_epsilon,
)
from fednovelty.federated.trust import dp_calibration
from fednovelty.mixture import MixtureParams, precisions_cholesky_from_covariances

POPULATION = np.random.default_rng(0).normal(size=(4000, 2))
CLIP = 2.0
#: a worst-case target: beyond the clip radius along a feature axis, so that every block
#: (the second moments' upper triangle included) moves by its full sensitivity.
CANARY = np.array([3.0, 0.0])


@functools.cache
def calibrate_noise(epsilon, delta, rounds, blocks):
    """dp-accounting's calibration (slow: one bisection of accountant calls), once per case."""
    return dp_calibration.calibrate_noise(epsilon, delta, rounds=rounds, blocks=blocks)


def _standard_error(auc, n_pos, n_neg):
    """Hanley and McNeil's standard error of an AUC, written out independently."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    var = auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)
    return math.sqrt(var / (n_pos * n_neg))


def _binormal_auc(mu):
    """Phi(mu / sqrt 2): P(X > Y) for X ~ N(mu^2/2, mu^2), Y ~ N(-mu^2/2, mu^2)."""
    return norm.cdf(mu / math.sqrt(2))


def test_bounds_match_numerical_integration():
    fpr = np.linspace(0, 1, 400_001)
    for mu in (0.1, 0.5, 1.0, 3.0):
        roc = norm.cdf(mu - norm.ppf(1 - fpr))
        assert gdp_auc_bound(mu) == pytest.approx(np.trapezoid(roc, fpr), abs=1e-6)
    for eps, delta in ((0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-3)):
        roc = np.minimum.reduce(
            [np.ones_like(fpr), math.exp(eps) * fpr + delta, 1 - math.exp(-eps) * (1 - delta - fpr)]
        )
        assert dp_auc_bound(eps, delta) == pytest.approx(np.trapezoid(roc, fpr), abs=1e-6)
        # the GDP bound of the Gaussian mechanism spending (eps, delta) lies inside it
        assert gdp_auc_bound(gdp_mu_for_epsilon(eps, delta)) < dp_auc_bound(eps, delta)
    assert gdp_auc_bound(math.inf) == 1.0 and dp_auc_bound(math.inf, 1e-5) == 1.0
    # mu of a Gaussian mechanism at (eps, delta) = sqrt(blocks) / z of dp-accounting's calibration
    for eps in (0.5, 1.0):
        z = calibrate_noise(eps, 1e-5, 1, 3)
        assert gdp_mu(z, 1, 3) == pytest.approx(math.sqrt(3) / z)
        assert gdp_mu_for_epsilon(eps, 1e-5) == pytest.approx(math.sqrt(3) / z, rel=3e-3)
    assert auc_standard_error(0.7, 300, 500) == pytest.approx(_standard_error(0.7, 300, 500))


def test_heldout_bounds_are_the_symmetric_points_of_the_replacement_curves():
    # the members-vs-held-out AUC A puts (1 - A, A) on the replace-one curve: solve for A
    for mu in (0.1, 0.27, 1.0, 2.5):
        a = brentq(lambda a, mu=mu: norm.cdf(2 * mu - norm.ppf(a)) - a, 0.5, 1 - 1e-12)
        assert gdp_heldout_auc_bound(mu) == pytest.approx(a, abs=1e-9)
        assert gdp_heldout_auc_bound(mu) > gdp_auc_bound(mu)
    for eps, delta in ((0.5, 1e-5), (1.0, 1e-5), (3.0, 1e-3)):
        e2, d2 = 2 * eps, (1 + math.exp(eps)) * delta

        def gap(a, e2=e2, d2=d2):
            fpr = 1 - a
            tpr = min(1.0, math.exp(e2) * fpr + d2, 1 - math.exp(-e2) * (1 - d2 - fpr))
            return tpr - a

        a = brentq(gap, 0.5, 1 - 1e-12)
        assert dp_heldout_auc_bound(eps, delta) == pytest.approx(a, abs=1e-9)
    assert gdp_heldout_auc_bound(math.inf) == 1.0 and dp_heldout_auc_bound(math.inf, 1e-5) == 1.0


def test_noiseless_release_gives_membership_away():
    result = stats_attack(
        POPULATION, n_rows=20, clip_bound=CLIP, noise_multiplier=0.0, n_trials=400, seed=1
    )
    assert result.members.sum() == 200
    assert result.auc == 1.0
    assert np.all(result.scores[result.members] > 0) and np.all(result.scores[~result.members] < 0)


def test_calibrated_noise_keeps_the_attack_under_the_gdp_bound():
    eps, delta, n_trials = 1.0, 1e-5, 2000
    z = calibrate_noise(eps, delta, 1, 3)
    mu = math.sqrt(3) / z
    bound = _binormal_auc(mu)
    canary = stats_attack(POPULATION, 30, CLIP, z, n_trials=n_trials, target=CANARY, seed=2)
    typical = stats_attack(POPULATION, 30, CLIP, z, n_trials=n_trials, seed=3)
    margin = 3 * _standard_error(bound, n_trials // 2, n_trials // 2)
    assert canary.auc <= bound + margin
    assert typical.auc <= bound + margin
    # the canary moves every block by its sensitivity: the attack reaches the bound
    np.testing.assert_allclose(canary.signal, mu, rtol=1e-9)
    assert canary.auc >= bound - margin
    # typical rows (mostly inside the ball) move the statistics less
    assert np.all(typical.signal <= mu * (1 + 1e-9)) and np.median(typical.signal) < 0.9 * mu
    # the product target AUC <= 0.55: at eps = 1 the worst case exceeds it (bound 0.575);
    # at eps = 0.5 the bound is below it and the attack stays there
    assert bound > 0.55
    z_half = calibrate_noise(0.5, delta, 1, 3)
    assert _binormal_auc(math.sqrt(3) / z_half) < 0.55
    half = stats_attack(POPULATION, 30, CLIP, z_half, n_trials=n_trials, target=CANARY, seed=4)
    assert half.auc <= 0.55 + 3 * _standard_error(0.55, n_trials // 2, n_trials // 2)


@pytest.mark.parametrize(
    ("blocks", "z", "rounds"), [(("sums",), 1.0, 1), (("counts", "sums", "second"), 2.0, 2)]
)
def test_attack_matches_the_gaussian_mechanism_closed_form(blocks, z, rounds):
    n_trials = 2000
    result = stats_attack(
        POPULATION,
        25,
        CLIP,
        z,
        n_trials=n_trials,
        rounds=rounds,
        blocks=blocks,
        target=CANARY,
        seed=5,
    )
    mu = math.sqrt(rounds * len(blocks)) / z
    expected = _binormal_auc(mu)
    margin = 3.5 * _standard_error(expected, n_trials // 2, n_trials // 2)
    assert abs(result.auc - expected) <= margin
    # the log-likelihood ratio is N(+-mu^2/2, mu^2): checks the noise's spread directly
    for scores, sign in ((result.scores[result.members], 1), (result.scores[~result.members], -1)):
        n = scores.size
        assert abs(scores.mean() - sign * mu**2 / 2) <= 4 * mu / math.sqrt(n)
        assert abs(scores.std(ddof=1) / mu - 1) <= 4 / math.sqrt(2 * (n - 1))


def test_signal_with_public_mixture_responsibilities():
    weights = np.array([0.3, 0.7])
    means = np.array([[-1.0, 0.0], [1.5, 0.5]])
    covs = np.array([np.eye(2) * 0.5, [[1.0, 0.3], [0.3, 0.8]]])
    mixture = MixtureParams(
        torch.as_tensor(weights),
        torch.as_tensor(means),
        precisions_cholesky_from_covariances(torch.as_tensor(covs), "full"),
        "full",
    )
    target = np.array([0.4, -0.9])  # inside the ball: not clipped
    z = 1.5
    result = stats_attack(
        POPULATION, 10, CLIP, z, n_trials=50, mixture=mixture, target=target, seed=6
    )
    dens = np.array(
        [
            w * multivariate_normal(m, c).pdf(target)
            for w, m, c in zip(weights, means, covs, strict=True)
        ]
    )
    r = dens / dens.sum()
    outer = np.outer(target, target)[np.triu_indices(2)]
    power = (r @ r) * (1 + (target @ target) / CLIP**2 + (outer @ outer) / CLIP**4) / z**2
    np.testing.assert_allclose(result.signal, math.sqrt(power), rtol=1e-9)
    assert np.all(result.signal < result.mu)


def test_score_attack_leaks_from_an_overfit_mixture_not_from_a_well_fed_one():
    rng = np.random.default_rng(7)
    overfit, calibrated = [], []
    for seed in range(6):
        X_in, X_out, X_ref = (
            rng.normal(size=(30, 2)),
            rng.normal(size=(30, 2)),
            rng.normal(size=(300, 2)),
        )
        result = score_attack(
            lambda: GaussianMixture(10, reg_covar=1e-3, random_state=0),
            X_in,
            X_out,
            X_ref,
            n_reference=4,
            seed=seed,
        )
        overfit.append(result.auc)
        calibrated.append(result.calibrated_auc)
    assert np.mean(overfit) > 0.75 and np.mean(calibrated) > 0.65
    # the project's federated EM without its prior and privacy floor overfits too
    fed = score_attack(
        lambda: FedGMMDetector(
            n_components=8, random_state=0, prior=Prior(strength=None), privacy=Privacy(min_rows=1)
        ),
        rng.normal(size=(40, 2)),
        rng.normal(size=(40, 2)),
        fit_kwargs={"groups": np.repeat([0, 1], 20)},
    )
    assert fed.auc > 0.7 and fed.calibrated_auc is None
    n = 3000
    big = score_attack(
        lambda: GaussianMixture(2, random_state=0), rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
    )
    assert abs(big.auc - 0.5) <= 3 * _standard_error(0.5, n, n)


def test_auc_interval_covers_and_helpers_agree():
    rng = np.random.default_rng(8)
    pos, neg = rng.normal(0.5, 1, 400), rng.normal(0, 1, 400)
    auc, low, high = auc_interval(pos, neg, n_boot=400)
    assert low < auc < high and high - low < 6 * _standard_error(auc, 400, 400)
    assert auc == pytest.approx(np.mean(pos[:, None] > neg[None, :]))
    assert membership_auc(pos, neg) == auc


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="blocks must be"):
        stats_attack(POPULATION, 10, CLIP, 1.0, n_trials=4, blocks=("means",))
    with pytest.raises(ValueError, match="population must be"):
        stats_attack(POPULATION[:5], 10, CLIP, 1.0, n_trials=4)
    with pytest.raises(ValueError, match="clip_bound"):
        stats_attack(POPULATION, 10, -1.0, 1.0, n_trials=4)
    with pytest.raises(ValueError, match="target must"):
        stats_attack(POPULATION, 10, CLIP, 1.0, n_trials=4, target=np.zeros(3))
    with pytest.raises(ValueError, match="n_reference"):
        score_attack(
            lambda: GaussianMixture(1),
            POPULATION[:20],
            POPULATION[20:40],
            POPULATION[40:100],
            n_reference=1,
        )
