"""SQUAREM on the server of federated EM (``fednovelty.federated.mixtures.accelerate``).

References: the S3 step written out by hand in numpy (Varadhan & Roland 2008), a linear
fixed-point map whose fixed point S3 lands on in one step, and scikit-learn's
``GaussianMixture`` run to a tight tolerance from the same start (the EM fixed point an
accelerated run must reach).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.mixture import GaussianMixture

from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.mixtures.accelerate import Squarem, extrapolate
from fednovelty.mixture import MixtureParams, precisions_cholesky_from_covariances, score_samples
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)


def diag_mixture(weights, means, variances) -> MixtureParams:
    """A diag mixture from plain lists: weights (K,), means (K, d), variances (K, d)."""
    variances = torch.tensor(variances, dtype=torch.float64)
    return MixtureParams(
        torch.tensor(weights, dtype=torch.float64),
        torch.tensor(means, dtype=torch.float64),
        precisions_cholesky_from_covariances(variances, "diag"),
        "diag",
    )


def test_extrapolate_is_the_s3_step_written_by_hand():
    theta = [
        ([0.5, 0.5], [[0.0, 0.0], [1.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]),
        ([0.55, 0.45], [[0.2, 0.1], [1.1, 1.3]], [[0.9, 1.1], [1.2, 0.8]]),
        ([0.58, 0.42], [[0.3, 0.15], [1.15, 1.45]], [[0.85, 1.15], [1.3, 0.7]]),
    ]
    point, alpha = extrapolate(*(diag_mixture(*t) for t in theta), alpha_max=100.0)
    # by hand: coordinates (log w, means, variances) stacked in one vector
    vectors = [np.concatenate([np.log(w), np.ravel(m), np.ravel(v)]) for w, m, v in theta]
    r = vectors[1] - vectors[0]
    v = vectors[2] - 2 * vectors[1] + vectors[0]
    expected_alpha = -np.linalg.norm(r) / np.linalg.norm(v)
    assert expected_alpha < -1
    expected = vectors[0] - 2 * expected_alpha * r + expected_alpha**2 * v
    assert alpha == pytest.approx(expected_alpha, rel=1e-12)
    log_w = expected[:2]
    np.testing.assert_allclose(point.weights.numpy(), np.exp(log_w) / np.exp(log_w).sum())
    np.testing.assert_allclose(point.means.numpy().ravel(), expected[2:6], rtol=1e-12)
    variances = point.precisions_cholesky.numpy() ** -2
    np.testing.assert_allclose(variances.ravel(), expected[6:], rtol=1e-10)


def test_extrapolate_lands_on_the_fixed_point_of_a_linear_map():
    # M(theta) = star + 0.7 (theta - star): S3's alpha = -1 / (1 - 0.7) gives star exactly
    star = np.array([[1.0, -2.0], [3.0, 0.5]])
    means = [np.array([[0.0, 0.0], [0.0, 0.0]])]
    for _ in range(2):
        means.append(star + 0.7 * (means[-1] - star))
    thetas = [diag_mixture([0.5, 0.5], m.tolist(), [[1.0, 1.0]] * 2) for m in means]
    point, alpha = extrapolate(*thetas, alpha_max=10.0)
    assert alpha == pytest.approx(-1 / 0.3, rel=1e-10)
    np.testing.assert_allclose(point.means.numpy(), star, rtol=1e-10, atol=1e-12)
    # the bound on the step length holds it back
    _, clamped = extrapolate(*thetas, alpha_max=2.0)
    assert clamped == -2.0


def test_extrapolate_without_curvature_or_step_returns_theta2():
    theta = diag_mixture([0.5, 0.5], [[0.0], [1.0]], [[1.0], [1.0]])
    point, alpha = extrapolate(theta, theta, theta, alpha_max=4.0)
    assert point is theta and alpha == -1.0
    # a step that would make a variance negative is pulled back to theta2
    thetas = [diag_mixture([0.5, 0.5], [[0.0], [1.0]], [[v], [1.0]]) for v in (1.0, 0.2, 0.19)]
    point, alpha = extrapolate(*thetas, alpha_max=1000.0)
    assert float((point.precisions_cholesky**-2).min()) > 0


def test_squarem_refuses_a_worse_point_and_falls_back_to_theta2():
    thetas = [diag_mixture([0.5, 0.5], [[x], [1.0]], [[1.0], [1.0]]) for x in (0.0, 0.5, 0.8)]
    squarem = Squarem(alpha_max=4.0)
    following, best = squarem.step(thetas[0], thetas[1], log_likelihood=-3.0)  # start
    assert following is thetas[1] and best is thetas[1]
    point, best = squarem.step(thetas[1], thetas[2], log_likelihood=-2.0)  # second: extrapolate
    assert squarem.stage == "check" and best is thetas[2]
    assert float(point.means[0, 0]) > 0.8  # beyond theta2, along the path
    following, best = squarem.step(point, point, log_likelihood=-2.5)  # worse than theta1
    assert following is thetas[2] and best is thetas[2]
    assert squarem.rejected == 1 and squarem.alpha_max == 1.0 and squarem.stage == "start"


def overlapping(seed: int = 0, n: int = 300) -> np.ndarray:
    """Two overlapping anisotropic clouds: plain EM needs tens of iterations."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, 2)) @ np.array([[2.0, 0.6], [0.0, 0.7]])
    b = rng.normal(size=(n, 2)) * 0.9 + np.array([1.2, 0.8])
    return np.concatenate([a, b])


def test_squarem_reaches_sklearns_em_fixed_point_in_fewer_rounds():
    X = overlapping()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = GaussianMixture(2, max_iter=1, random_state=0).fit(X)
    inits = {
        "weights_init": start.weights_,
        "means_init": start.means_,
        "precisions_init": start.precisions_,
    }
    reference = GaussianMixture(2, tol=1e-12, max_iter=5000, **inits).fit(X)
    assert reference.converged_ and reference.n_iter_ > 30
    clients = [torch.as_tensor(part) for part in np.array_split(X, 4)]

    def fit(acceleration: str):
        algorithm = FederatedEM(
            2, tol=1e-9, max_iter=2000, acceleration=acceleration, random_state=0, **inits
        )
        return run_simulation(algorithm, clients, privacy=NO_FLOOR).state

    plain, fast = fit("none"), fit("squarem")
    assert fast.converged and plain.converged
    assert fast.n_iter < 0.6 * plain.n_iter
    assert fast.squarem.accepted > 0
    order = np.argsort(reference.means_[:, 0])
    fast_order = np.argsort(fast.params.means[:, 0].numpy())
    scale = float(np.abs(reference.means_).max())
    np.testing.assert_allclose(
        fast.params.means.numpy()[fast_order], reference.means_[order], atol=1e-4 * scale
    )
    np.testing.assert_allclose(
        fast.params.weights.numpy()[fast_order], reference.weights_[order], atol=1e-4
    )
    # its recorded log-likelihood ends at sklearn's (per-row mean, to the tolerance's scale)
    assert fast.lower_bounds[-1] == pytest.approx(reference.score(X), abs=1e-6)


def test_a_capped_accelerated_run_never_ends_below_the_best_mixture_it_saw():
    # plain maximum likelihood (no prior): EM never lowers the likelihood, so the mixture a
    # run ends with (an EM step from a checked point, or theta2 while a point waits for its
    # check) is at least as likely as every broadcast the clients scored
    X = overlapping(1)
    clients = [torch.as_tensor(part) for part in np.array_split(X, 3)]
    for max_iter in (2, 3, 4, 5, 6, 7):
        state = run_simulation(
            FederatedEM(2, acceleration="squarem", max_iter=max_iter, tol=0.0, random_state=0),
            clients,
            privacy=NO_FLOOR,
        ).state
        assert state.n_iter == max_iter
        final = float(score_samples(state.params, torch.as_tensor(X)).mean())
        best = max(state.lower_bounds)
        assert final >= best - 1e-9 * abs(best)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"acceleration": "anderson"}, "acceleration"),
        ({"acceleration": "squarem", "mixture_weights": "personal"}, "mixture_weights='global'"),
        ({"acceleration": "squarem", "dp_mode": "local"}, "dp_mode"),
    ],
)
def test_bad_acceleration_settings_are_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=message):
        FederatedEM(2, **settings)
