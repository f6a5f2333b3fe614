"""Federated variational Bayes against scikit-learn's ``BayesianGaussianMixture`` on the
pooled rows, from the same initial responsibilities."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

from fednovelty.federated import PrivacyPolicy
from fednovelty.federated.bayesian.variational import FederatedVB, VBConfig
from fednovelty.mixture import MixtureParams, predict_proba
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.vb_prior import InvalidPriorError
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
RTOL = 1e-8


def make_data(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0, 0.0], [4.0, 1.0, 0.0], [-2.0, 4.0, 1.0]])
    return np.concatenate([c + rng.normal(size=(80, 3)) * [1.0, 0.6, 0.8] for c in centers])


def init_params(X: np.ndarray, covariance_type: str, k: int = 4) -> MixtureParams:
    """A deliberately rough start: rows as means, the data covariance everywhere."""
    rng = np.random.default_rng(1)
    means = torch.as_tensor(X[rng.choice(len(X), k, replace=False)])
    cov = torch.as_tensor(np.cov(X.T))
    covariances = {
        "full": cov.expand(k, 3, 3).clone(),
        "tied": cov,
        "diag": torch.diagonal(cov).expand(k, 3).clone(),
        "spherical": torch.diagonal(cov).mean().expand(k).clone(),
    }[covariance_type]
    return MixtureParams(
        torch.full((k,), 1.0 / k, dtype=torch.float64),
        means,
        precisions_cholesky_from_covariances(covariances, covariance_type),
        covariance_type,
    )


def sklearn_reference(X, params: MixtureParams, weight_type: str, **kwargs):
    """``BayesianGaussianMixture.fit`` from the posterior of ``params``' responsibilities
    (warm start: sklearn's own loop, no re-initialisation)."""
    bgm = BayesianGaussianMixture(
        n_components=params.n_components,
        covariance_type=params.covariance_type,
        weight_concentration_prior_type=weight_type,
        warm_start=True,
        **kwargs,
    )
    bgm._check_parameters(X)
    resp = predict_proba(params, torch.as_tensor(X)).numpy()
    bgm._initialize(X, resp)
    bgm.converged_, bgm.lower_bound_ = False, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bgm.fit(X)


def given(params: MixtureParams) -> dict:
    return {
        "weights_init": params.weights,
        "means_init": params.means,
        "precisions_init": params.precisions_cholesky @ params.precisions_cholesky.transpose(-1, -2)
        if params.covariance_type in ("full", "tied")
        else params.precisions_cholesky.square(),
    }


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
@pytest.mark.parametrize("weight_type", ["dirichlet_process", "dirichlet_distribution"])
def test_federated_vb_matches_sklearn_on_pooled_rows(covariance_type, weight_type):
    X = make_data()
    params = init_params(X, covariance_type)
    reference = sklearn_reference(X, params, weight_type, tol=1e-6, max_iter=60)
    rng = np.random.default_rng(3)
    client = rng.integers(0, 4, size=len(X))
    clients = [torch.as_tensor(X[client == c]) for c in range(4)]
    algorithm = FederatedVB(
        4,
        covariance_type=covariance_type,
        weight_concentration_prior_type=weight_type,
        tol=1e-6,
        max_iter=60,
        **given(params),
    )
    state = run_simulation(algorithm, clients, privacy=NO_FLOOR).state
    posterior = state.posterior
    assert state.n_iter == reference.n_iter_
    assert state.converged == reference.converged_
    assert_close_scaled(posterior.weights, reference.weights_, RTOL, "weights")
    assert_close_scaled(posterior.means, reference.means_, RTOL, "means")
    assert_close_scaled(posterior.covariances, reference.covariances_, RTOL, "covariances")
    expected = [float(np.ravel(b)[0]) for b in reference.lower_bounds_]
    assert_close_scaled(state.lower_bounds, expected, RTOL, "lower_bounds")
    assert 1 <= state.effective_n_components <= 4


def test_federated_vb_with_kmeans_init_runs_and_prunes():
    X = make_data()
    clients = [torch.as_tensor(X[i::3]) for i in range(3)]
    algorithm = FederatedVB(
        8, weight_concentration_prior=1e-3, max_iter=300, tol=1e-6, random_state=0
    )
    result = run_simulation(algorithm, clients, privacy=NO_FLOOR)
    assert result.history[0].kind == "vb_prior"
    assert 3 <= result.state.effective_n_components < 8  # the prior empties the rest


def test_an_upper_bound_above_what_small_clients_can_seed_starts_the_rest_at_the_prior():
    """Ten clients of 8 rows (each from one or two of the three clusters) under a floor of 5
    send one k-means centroid each: VB seeds half as many centres and leaves the other
    components empty, at the prior (federated EM fits the seeded ones only:
    tests/federated/init/test_centroids.py)."""
    X = make_data()[::3]  # 80 rows, ordered by cluster
    clients = [torch.as_tensor(X[8 * i : 8 * i + 8]) for i in range(10)]
    floor = PrivacyPolicy(min_rows=5)
    result = run_simulation(FederatedVB(20, max_iter=300, random_state=0), clients, privacy=floor)
    state = result.state
    centroids = next(h for h in result.history if h.kind == "centroids")
    assert centroids.metrics["n_centroids"] == 10
    assert state.posterior.n_components == 20
    assert 1 <= state.effective_n_components <= 5
    # the 15 components never seeded hold no rows: their posterior counts are the prior's
    prior = state.vb_prior
    counts = state.posterior.mean_precision - prior.mean_precision
    assert float(counts[5:].abs().max()) <= 1e-9 * len(X)
    assert bool(torch.isfinite(state.posterior.covariances).all())


def test_config_rejects_invalid_priors():
    with pytest.raises(InvalidPriorError, match="weight_concentration_prior"):
        VBConfig(n_components=2, weight_concentration_prior=0.0)
    with pytest.raises(InvalidPriorError, match="mean_precision_prior"):
        VBConfig(n_components=2, mean_precision_prior=-1.0)
    with pytest.raises(ValueError, match="prior_strength"):
        VBConfig(n_components=2, prior_strength=0.0)
    # the robust options are off in the config (scikit-learn's priors on the raw features)
    config = VBConfig(n_components=2)
    assert (config.standardize, config.prior_strength, config.needs_moments) == (False, None, False)


def test_settings_travel_through_the_registry() -> None:
    from fednovelty.federated.registry import algorithm_name, algorithm_settings, build_algorithm

    algorithm = FederatedVB(
        3,
        weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=0.5,
        mean_prior=[0.0, 1.0, 2.0],
        covariance_type="diag",
    )
    rebuilt = build_algorithm(algorithm_name(algorithm), algorithm_settings(algorithm))
    assert algorithm_name(algorithm) == "FederatedVB"
    assert rebuilt.config == algorithm.config
