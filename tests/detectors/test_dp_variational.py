"""Federated VB (``FederatedVB``, ``FedVBDetector``) under differential privacy: the public box
maps back exactly (checked against scikit-learn's ``BayesianGaussianMixture`` on the pooled
rows), the prior round's clipping and central noise (checked against numpy by hand), the
budget a fit spends (against the closed form of composed Gaussian mechanisms), what is
refused, and what the noise costs on a task where the non-private detector is near perfect.
What every private estimator owes (fresh noise, privacy_spent_ saved and dropped, the
refusal of the one-shot merges) is in ``test_privacy_contract.py``."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.stats import norm
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import roc_auc_score
from sklearn.mixture import BayesianGaussianMixture

from fednovelty import FedVBDetector
from fednovelty.detectors.options import Initialisation, Privacy, Robustness
from fednovelty.federated import PrivacyPolicy
from fednovelty.federated.bayesian.variational import FederatedVB, VBConfig, VBState
from fednovelty.federated.bayesian.vb_prior_step import private_prior_moments
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_split import BLOCK_SPLIT
from fednovelty.mixture import MixtureParams, predict_proba
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.runtime import run_simulation

D = 3
BOUNDS = (np.full(D, -8.0), np.full(D, 10.0))
NO_FLOOR = PrivacyPolicy(min_rows=1)


# ----------------------------------------------------------------------------- the box
def _rough_start(X: np.ndarray, covariance_type: str, k: int = 4) -> MixtureParams:
    rng = np.random.default_rng(1)
    means = torch.as_tensor(X[rng.choice(len(X), k, replace=False)])
    cov = torch.as_tensor(np.cov(X.T))
    covariances = {
        "full": cov.expand(k, D, D).clone(),
        "tied": cov,
        "diag": torch.diagonal(cov).expand(k, D).clone(),
        "spherical": torch.diagonal(cov).mean().expand(k).clone(),
    }[covariance_type]
    return MixtureParams(
        torch.full((k,), 1.0 / k, dtype=torch.float64),
        means,
        precisions_cholesky_from_covariances(covariances, covariance_type),
        covariance_type,
    )


def _sklearn_from(X: np.ndarray, params: MixtureParams, **kwargs) -> BayesianGaussianMixture:
    """scikit-learn's VB loop from the posterior of ``params``' responsibilities."""
    bgm = BayesianGaussianMixture(
        n_components=params.n_components,
        covariance_type=params.covariance_type,
        warm_start=True,
        **kwargs,
    )
    bgm._check_parameters(X)
    bgm._initialize(X, predict_proba(params, torch.as_tensor(X)).numpy())
    bgm.converged_, bgm.lower_bound_ = False, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bgm.fit(X)


@pytest.mark.parametrize("given_priors", [False, True])
@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_a_public_box_maps_the_posterior_back_to_the_users_units(covariance_type, given_priors):
    """Rows fitted in the box's units ``[-1, 1]`` (default priors from the box-unit
    moments, or the user's priors mapped to them) and mapped back give scikit-learn's
    posterior of the raw rows: VB is affine-equivariant (``reg_covar=0``; one width for
    spherical)."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0, 0.0], [4.0, 1.0, 0.0], [-2.0, 4.0, 1.0]])
    X = np.concatenate([c + rng.normal(size=(80, D)) * [1.0, 0.6, 0.8] for c in centers])
    params = _rough_start(X, covariance_type)
    priors = {}
    if given_priors:
        wishart = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.2], [0.0, 0.2, 1.5]])
        priors = {
            "mean_prior": np.array([1.0, 2.0, -1.0]),
            "covariance_prior": {
                "full": wishart,
                "tied": wishart,
                "diag": np.diag(wishart).copy(),
                "spherical": 1.3,
            }[covariance_type],
        }
    reference = _sklearn_from(X, params, tol=0.0, max_iter=25, reg_covar=0.0, **priors)
    low, high = (-8.0, -7.0, -9.0), (10.0, 9.0, 6.0)
    if covariance_type == "spherical":
        low, high = (-8.0,) * D, (10.0,) * D
    p = params.precisions_cholesky
    precisions = p @ p.transpose(-1, -2) if covariance_type in ("full", "tied") else p.square()
    algorithm = FederatedVB(
        4,
        covariance_type=covariance_type,
        bounds=(low, high),
        reg_covar=0.0,
        tol=0.0,
        max_iter=25,
        weights_init=params.weights,
        means_init=params.means,
        precisions_init=precisions,
        **priors,
    )
    clients = [torch.as_tensor(X[i::4]) for i in range(4)]
    posterior = run_simulation(algorithm, clients, privacy=NO_FLOOR).state.posterior
    assert_close_scaled(posterior.weights, reference.weights_, 1e-7, "weights")
    assert_close_scaled(posterior.means, reference.means_, 1e-7, "means")
    assert_close_scaled(posterior.covariances, reference.covariances_, 1e-7, "covariances")
    assert_close_scaled(posterior.degrees_of_freedom, reference.degrees_of_freedom_, 1e-7, "dof")


# ----------------------------------------------------------------------------- prior round
def _prior_of(clients, z: float, seed: int = 0):
    """The ``vb_prior`` round's prior under a central DP policy of multiplier ``z``."""
    clip = 1.5 * math.sqrt(D)
    algorithm = FederatedVB(
        2,
        bounds=BOUNDS,
        dp_mode="central",
        dp_noise_multiplier=z,
        dp_clip=clip,
        max_iter=1,
        kmeans_rounds=1,
        random_state=seed,
    )
    policy = PrivacyPolicy(dp=DPPolicy(z, clip, "central", len(clients), insecure_seed=seed))
    return run_simulation(algorithm, clients, privacy=policy).state.vb_prior


def test_the_prior_round_takes_moments_of_the_clipped_box_rows():
    """Without noise the prior is scikit-learn's default prior of the rows mapped to the box
    and clipped to the ball of radius ``dp_clip`` (numpy by hand); a client's far outlier
    moves the prior mean by at most ``clip / n``."""
    rng = np.random.default_rng(2)
    X = rng.normal(1.0, 2.0, (600, D))
    X[0] = 1e6  # clipped onto the sphere
    offset, scale = (BOUNDS[0] + BOUNDS[1]) / 2, (BOUNDS[1] - BOUNDS[0]) / 2
    U = (X - offset) / scale
    clip = 1.5 * math.sqrt(D)
    norms = np.linalg.norm(U, axis=1, keepdims=True)
    U = np.where(norms > clip, U * clip / norms, U)
    prior = _prior_of([torch.as_tensor(X[i::3]) for i in range(3)], 0.0)
    assert_close_scaled(prior.mean, U.mean(0), 1e-10, "mean_prior")
    assert_close_scaled(prior.covariance, np.cov(U.T), 1e-10, "covariance_prior")
    inside = U[1:].mean(0)
    assert np.linalg.norm(prior.mean.numpy() - inside) <= 2 * clip / len(X)


def test_the_central_noise_on_the_prior_is_the_scatter_release():
    """``private_prior_moments`` in central mode adds to the sum of rows noise of standard
    deviation ``z * BLOCK_SPLIT['sums'] * clip`` per coordinate (the ``"scatter"`` release
    of :mod:`fednovelty.federated.trust.dp`), a fresh draw each round; far from the floors the
    post-processing leaves it as it is."""
    z, clip, n = 2.0, 1.5 * math.sqrt(D), torch.tensor(5000.0, dtype=torch.float64)
    config = VBConfig(
        n_components=2, bounds=BOUNDS, dp_mode="central", dp_noise_multiplier=z, dp_clip=clip
    )
    mean = torch.tensor([0.1, -0.2, 0.05], dtype=torch.float64)
    scatter = n * 0.04 * torch.eye(D, dtype=torch.float64)
    totals = []
    for rounds in range(400):
        state = VBState(phase="vb_prior", rounds=rounds)
        m, mu, _ = private_prior_moments(n, mean, scatter, config, 4, state)
        totals.append((m * mu).numpy())
    errors = np.asarray(totals) - (n * mean).numpy()
    expected = z * BLOCK_SPLIT["sums"] * clip
    assert np.std(errors) == pytest.approx(expected, rel=0.1)
    assert abs(np.mean(errors)) < 4 * expected / math.sqrt(errors.size)


# ----------------------------------------------------------------------------- detector
@pytest.fixture(scope="module")
def task():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (8000, D)), rng.normal(4, 1, (8000, D))])
    groups = rng.integers(0, 8, len(X))
    inliers = np.vstack([rng.normal(0, 1, (300, D)), rng.normal(4, 1, (300, D))])
    novel = rng.uniform(-5, 9, (300, D))
    return X, groups, np.vstack([inliers, novel]), np.r_[np.zeros(600), np.ones(300)]


def _fit(task, **settings):
    X, groups, _, _ = task
    options = {"max_iter": 8, "initialisation": Initialisation(kmeans_rounds=2), "random_state": 0}
    return FedVBDetector(4, **{**options, **settings}).fit(X, groups=groups)


def _gdp_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of a mu-GDP mechanism (Dong, Roth and Su, Corollary 2.13)."""
    return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


def test_the_fit_spends_its_budget_and_no_more(task):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # fixed rounds: no warning
        det = _fit(task, privacy=Privacy(epsilon=1.0, bounds=BOUNDS))
    spent = det.privacy_spent_
    # moments (standardisation), prior moments, Lloyd rounds, the initial posterior's
    # round, VB rounds
    assert spent["releases"] == spent["planned_releases"] == 1 + 1 + 2 + 1 + 8
    assert [r["kind"] for r in det.history_].count("vb") == 8
    assert 0.99 < spent["epsilon"] <= 1.0
    mu = math.sqrt(3 * spent["releases"]) / spent["noise_multiplier"]
    rounds = spent["epsilon"] - spent["threshold_epsilon"]  # the threshold's share apart
    assert _gdp_delta(rounds, mu) == pytest.approx(1e-5, rel=0.05)
    # z-scores after the private standardisation: 1.5 sqrt(d) (a few rows are clipped)
    assert spent["clip"] == pytest.approx(1.5 * math.sqrt(D))
    assert det.lower_bounds_ == [] and det.n_iter_ == 8 and not det.converged_
    assert np.isfinite(det.decision_function(task[2])).all()


def test_the_replies_are_noisy(task):
    """Same public start, clipping and rounds, the clients' noise of multiplier 0 against
    3: the posterior moves (each client's reply carries noise)."""
    X, groups, _, _ = task
    clients = [torch.as_tensor(X[groups == g]) for g in range(8)]
    clip = 1.5 * math.sqrt(D)
    bounds = tuple(tuple(b.tolist()) for b in BOUNDS)
    fits = []
    for z in (0.0, 3.0):
        algorithm = FederatedVB(
            4, bounds=bounds, dp_mode="local", dp_noise_multiplier=z, dp_clip=clip,
            max_iter=4, kmeans_rounds=2, random_state=0,
        )  # fmt: skip
        policy = PrivacyPolicy(dp=DPPolicy(z, clip, "local", 8, insecure_seed=0))
        fits.append(run_simulation(algorithm, clients, privacy=policy).state.posterior)
    quiet, noisy = fits
    assert float((quiet.means - noisy.means).abs().max()) > 1e-3


def test_the_noise_costs_little_on_a_large_federation(task):
    _, _, X_test, y_test = task
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = _fit(task, tol=0.0)
    reference = roc_auc_score(y_test, plain.decision_function(X_test))
    assert reference > 0.95
    for mode in ("central", "local"):
        private = _fit(task, privacy=Privacy(epsilon=8.0, bounds=BOUNDS, mode=mode))
        score = roc_auc_score(y_test, private.decision_function(X_test))
        assert score > reference - 0.01, mode


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"bounds": (np.zeros(D), np.ones(D + 1))}, "shape \\(2, 3\\)"),
        (
            {
                "bounds": BOUNDS,
                "mode": "distributed",
                "robustness": Robustness(aggregation="trimmed"),
            },
            'aggregation="sum"',
        ),
        ({"bounds": BOUNDS, "init_params": "subset"}, "raw rows"),
    ],
)
def test_settings_without_a_private_form_are_refused_before_any_round(task, settings, match):
    fields = {k: settings.pop(k) for k in ("bounds", "mode") if k in settings}
    det = FedVBDetector(4, **settings, privacy=Privacy(epsilon=1.0, **fields))
    with pytest.raises(ValueError, match=match):
        det.fit(task[0], groups=task[1])
    assert not hasattr(det, "history_")


def test_a_private_client_refuses_a_kind_without_a_private_form(task):
    """A server that does not run the private protocol asks for k-means centroids; every
    client under a differential-privacy policy refuses them (the client gate), so no
    round can go on."""
    X, groups, _, _ = task
    clients = [torch.as_tensor(X[groups == g]) for g in range(3)]
    policy = PrivacyPolicy(dp=DPPolicy(1.0, 1.0, "local", 3, insecure_seed=0))
    with pytest.raises(Exception, match="centroids"):
        run_simulation(FederatedVB(4, random_state=0), clients, privacy=policy)
