"""Adapting a new client's mixture weights under a Dirichlet prior centred on the global ones.

References are independent of the code's EM: closed forms where every row belongs to one
component, and SciPy's optimiser on the penalised log-likelihood
``sum_i log sum_k w_k p_k(x_i) + tau * sum_k g_k log w_k`` over the simplex otherwise, with
the densities from ``scipy.stats``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.optimize import minimize
from scipy.special import logsumexp, softmax
from scipy.stats import multivariate_normal

from fednovelty.detectors import JointFedGMMDetector
from fednovelty.detectors.options import Training
from fednovelty.mixture.em import fit_weights_map


def map_weights_by_scipy(log_p: np.ndarray, g: np.ndarray, tau: float) -> np.ndarray:
    """The maximiser of the penalised log-likelihood, found by L-BFGS on softmax logits."""

    def loss(theta):
        log_w = theta - logsumexp(theta)
        return -(logsumexp(log_p + log_w, axis=1).sum() + tau * float(g @ log_w))

    theta = minimize(loss, np.log(g), method="L-BFGS-B", options={"gtol": 1e-10}).x
    return softmax(theta)


def overlapping_log_densities(n: int, seed: int) -> np.ndarray:
    """``log N(x_i; mu_k, 1)`` of rows from a lopsided mixture of 3 overlapping Gaussians."""
    rng = np.random.default_rng(seed)
    means = np.array([-1.0, 0.0, 1.5])
    x = rng.normal(means[rng.choice(3, size=n, p=[0.7, 0.2, 0.1])], 1.0)
    return -0.5 * (x[:, None] - means) ** 2 - 0.5 * np.log(2 * np.pi)


def run_map(log_p: np.ndarray, g: np.ndarray, tau: float, **kwargs) -> np.ndarray:
    fit = fit_weights_map(
        torch.as_tensor(log_p), torch.as_tensor(np.log(g)), tau, max_iter=5000, tol=1e-13, **kwargs
    )
    return fit.log_weights.exp().numpy()


G = np.array([0.5, 0.3, 0.2])


def test_rows_of_one_component_each_give_the_closed_form():
    # 2 rows of component 0 and 1 of component 2: counts (2, 0, 1), n = 3
    log_p = np.array([[0.0, -np.inf, -np.inf], [0.0, -np.inf, -np.inf], [-np.inf, -np.inf, 0.0]])
    # (counts + 10 * g) / 13 = (2 + 5, 0 + 3, 1 + 2) / 13
    assert_close_scaled(run_map(log_p, G, 10.0), np.array([7, 3, 3]) / 13, 1e-12)
    # no prior: the rows' own proportions
    assert_close_scaled(run_map(log_p, G, 0.0), np.array([2, 0, 1]) / 3, 1e-12)
    # a strong prior: the global weights, up to n / (n + tau) = 3 / 3003
    far = run_map(log_p, G, 3000.0)
    assert_close_scaled(far, (np.array([2, 0, 1]) + 3000 * G) / 3003, 1e-12)
    assert np.abs(far - G).sum() < 2 * 3 / 3003


@pytest.mark.parametrize("tau", [1.0, 3.0, 10.0])
def test_overlapping_components_match_the_penalised_maximum(tau):
    log_p = overlapping_log_densities(40, seed=1)
    assert_close_scaled(run_map(log_p, G, tau), map_weights_by_scipy(log_p, G, tau), 1e-5)


def test_no_prior_reaches_the_maximum_likelihood():
    # here the maximum lies on the simplex's edge (w_3 -> 0), where the weights themselves
    # are poorly determined: compare the log-likelihoods reached
    log_p = overlapping_log_densities(40, seed=1)

    def log_likelihood(w):
        with np.errstate(divide="ignore"):
            return logsumexp(log_p + np.log(w), axis=1).sum()

    reached, best = (
        log_likelihood(run_map(log_p, G, 0.0)),
        log_likelihood(map_weights_by_scipy(log_p, G, 0.0)),
    )
    assert reached >= best - 1e-6 * abs(best)


def test_few_rows_stay_near_the_global_weights_and_many_reach_their_own():
    tau = 10.0
    few = overlapping_log_densities(5, seed=2)
    w_few = run_map(few, G, tau)
    # w - g = n / (n + tau) * (mean responsibility - g): L1 distance at most 2 n / (n + tau)
    assert np.abs(w_few - G).sum() <= 2 * 5 / 15
    ml_few = map_weights_by_scipy(few, G, 0.0)
    assert np.abs(w_few - G).sum() < np.abs(ml_few - G).sum()
    many = overlapping_log_densities(4000, seed=3)
    w_many, ml_many = run_map(many, G, tau), map_weights_by_scipy(many, G, 0.0)
    assert_close_scaled(w_many, map_weights_by_scipy(many, G, tau), 1e-5)
    # the rows' own weights (about 0.7, 0.2, 0.1) are 0.4 from G in L1; 10 pseudo-rows
    # against 4000 rows leave the MAP weights within a few 1e-3 of them
    assert np.abs(ml_many - G).sum() > 0.3
    assert np.abs(w_many - ml_many).sum() < 0.02 * np.abs(ml_many - G).sum()


@pytest.mark.parametrize("tau", [0.5, 10.0, 1000.0])
def test_the_rows_never_fit_the_map_weights_worse_than_the_global_ones(tau):
    # MAP from g: LL(w) + tau g.log w >= LL(g) + tau g.log g, and g.log g >= g.log w (Gibbs)
    for seed in range(5):
        log_p = overlapping_log_densities(6, seed=10 + seed)
        w = run_map(log_p, G, tau)
        adapted = logsumexp(log_p + np.log(w), axis=1).sum()
        assert adapted >= logsumexp(log_p + np.log(G), axis=1).sum() - 1e-9


def test_zero_global_weights_stay_zero_and_broadcast_over_a_learner_axis():
    # joint (M1, M2) weights with an x-only E-step: (n, M1, 1) densities
    g = np.array([[0.3, 0.1], [0.0, 0.2], [0.25, 0.15]])
    log_p = overlapping_log_densities(30, seed=4)[:, :, None]
    with np.errstate(divide="ignore"):
        fit = fit_weights_map(
            torch.as_tensor(log_p), torch.as_tensor(np.log(g)), 4.0, max_iter=5000, tol=1e-13
        )
    w = fit.log_weights.exp().numpy()
    assert w[1, 0] == 0.0
    # the learner split within each Gaussian keeps the global one
    assert_close_scaled(w / w.sum(1, keepdims=True), g / g.sum(1, keepdims=True), 1e-10)
    assert_close_scaled(w.sum(1), map_weights_by_scipy(log_p[:, :, 0], g.sum(1), 4.0), 1e-5)


@pytest.fixture(scope="module")
def joint():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0.0, 1.0, (150, 2)), rng.normal(5.0, 1.0, (150, 2))])
    y = (X[:, 0] + rng.normal(0.0, 1.0, 300) > 2.5).astype(int)
    groups = np.repeat([0, 1, 2], 100)
    det = JointFedGMMDetector(
        2,
        n_learners=1,
        max_iter=5,
        random_state=0,
        dtype="float64",
        training=Training(local_epochs=1),
    )
    return det.fit(X, y, groups), X


def frozen_log_densities(det, X: np.ndarray) -> np.ndarray:
    return np.column_stack(
        [
            multivariate_normal(m, c).logpdf(X)
            for m, c in zip(det.means_, det.covariances_, strict=True)
        ]
    )


def test_detector_adapts_by_the_dirichlet_formula(joint):
    det, X = joint
    counts = det.joint_state_.joint_counts.numpy()
    g = (counts / counts.sum()).sum(1)  # the global Gaussian weights
    rows = np.vstack([X[:2], X[150:153]])  # 5 rows
    handle = det.adapt(rows)  # "auto": one pseudo-row per Gaussian
    reference = map_weights_by_scipy(frozen_log_densities(det, rows), g, 2.0)
    assert_close_scaled(handle.weights.sum(1), reference, 1e-4)
    assert np.abs(handle.weights.sum(1) - g).sum() <= 2 * 5 / 7
    many = X[150:]  # 150 rows of the second Gaussian: their own weights, not the global ones
    ml = map_weights_by_scipy(frozen_log_densities(det, many), g, 0.0)
    assert_close_scaled(det.adapt(many, prior_rows=0).weights.sum(1), ml, 1e-4)
    auto = det.adapt(many).weights.sum(1)
    assert np.abs(auto - ml).sum() < 2 * 2 / 152
    assert np.abs(auto - g).sum() > 0.5


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "many", True, None])
def test_bad_prior_rows_are_refused(joint, bad):
    det, X = joint
    with pytest.raises(ValueError, match="prior_rows must be a finite number >= 0"):
        det.adapt(X[:10], prior_rows=bad)
    with pytest.raises(ValueError, match="prior_rows must be a finite number >= 0"):
        fit_weights_map(torch.zeros(4, 3), torch.as_tensor(np.log(G)), bad)


def test_bad_weights_and_iterations_are_refused():
    log_p = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="log_prior_weights must be log-probabilities"):
        fit_weights_map(log_p, torch.log(torch.tensor([0.5, 0.5, 0.5])), 1.0)
    with pytest.raises(ValueError, match="max_iter must be an integer >= 1"):
        fit_weights_map(log_p, torch.as_tensor(np.log(G)), 1.0, max_iter=0)
    with pytest.raises(ValueError, match="at least one row"):
        fit_weights_map(torch.zeros(0, 3), torch.as_tensor(np.log(G)), 1.0)


def test_fedgmm_detector_adapts_by_the_same_formula():
    """``FedGMMDetector.adapt`` (no labels): the same MAP weights, ``"auto"`` = K pseudo-rows;
    ``prior_rows=0`` is the paper's maximum-likelihood EM."""
    from fednovelty import FedGMMDetector

    rng = np.random.default_rng(1)
    X = np.vstack([rng.normal(0.0, 1.0, (150, 2)), rng.normal(5.0, 1.0, (150, 2))])
    det = FedGMMDetector(2, mixture_weights="global", random_state=0).fit(
        X, groups=np.repeat([0, 1, 2], 100)
    )
    g = det.weights_
    rows = np.vstack([X[:2], X[150:153]])
    reference = map_weights_by_scipy(frozen_log_densities(det, rows), g, 2.0)
    assert_close_scaled(det.adapt(rows).weights, reference, 1e-4)
    ml = map_weights_by_scipy(frozen_log_densities(det, X[150:]), g, 0.0)
    assert_close_scaled(det.adapt(X[150:], prior_rows=0).weights, ml, 1e-4)
    with pytest.raises(ValueError, match="prior_rows must be a finite number >= 0"):
        det.adapt(rows, prior_rows=-1)
