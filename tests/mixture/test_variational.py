"""Variational Bayes Gaussian mixtures against scikit-learn's ``BayesianGaussianMixture``.

Every comparison starts both sides from the same responsibilities (scikit-learn's
``init_params="random"``: uniform draws of ``RandomState(seed)``, row-normalised), so the
paths must agree to round-off.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.stats import multivariate_t
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

from fednovelty.mixture.model import score_samples
from fednovelty.mixture.stats import merge_stats, stats_from_resp
from fednovelty.mixture.variational import (
    VBPosterior,
    expected_log_weights,
    fit_vb,
    resp_entropy,
    resp_entropy_from_stats,
    vb_e_step_stats,
    vb_log_prob,
    vb_log_resp,
    vb_lower_bound,
    vb_m_step,
)
from fednovelty.mixture.vb_predictive import (
    active_components,
    effective_n_components,
    vb_plugin_params,
    vb_predictive_log_prob,
)
from fednovelty.mixture.vb_prior import (
    InvalidPriorError,
    VBPrior,
    default_prior,
    prior_from_moments,
)

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
WEIGHT_TYPES = ("dirichlet_process", "dirichlet_distribution")
RTOL = 1e-8


def t(a) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=torch.float64)


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request) -> str:
    return request.param


@pytest.fixture(params=WEIGHT_TYPES)
def weight_type(request) -> str:
    return request.param


def random_resp(n: int, k: int, seed: int) -> np.ndarray:
    """scikit-learn's ``init_params="random"`` responsibilities."""
    resp = np.random.RandomState(seed).uniform(size=(n, k))
    return resp / resp.sum(1, keepdims=True)


def make_bgm(covariance_type: str, weight_type: str, **kwargs) -> BayesianGaussianMixture:
    return BayesianGaussianMixture(
        n_components=kwargs.pop("n_components", 4),
        covariance_type=covariance_type,
        weight_concentration_prior_type=weight_type,
        init_params="random",
        **kwargs,
    )


def sklearn_initialised(X, covariance_type, weight_type, resp, **kwargs):
    """A ``BayesianGaussianMixture`` whose posterior is the M-step from ``resp``."""
    bgm = make_bgm(covariance_type, weight_type, n_components=resp.shape[1], **kwargs)
    bgm._check_parameters(X)
    bgm._initialize(X, resp)
    return bgm


def our_prior(X, bgm: BayesianGaussianMixture) -> VBPrior:
    return default_prior(
        t(X),
        bgm.n_components,
        bgm.covariance_type,
        weight_concentration_prior_type=bgm.weight_concentration_prior_type,
        weight_concentration_prior=bgm.weight_concentration_prior,
        mean_precision_prior=bgm.mean_precision_prior,
        mean_prior=None if bgm.mean_prior is None else t(bgm.mean_prior),
        degrees_of_freedom_prior=bgm.degrees_of_freedom_prior,
        covariance_prior=None if bgm.covariance_prior is None else t(bgm.covariance_prior),
    )


def assert_posterior_equal(ours: VBPosterior, bgm: BayesianGaussianMixture, rtol=RTOL):
    wc = bgm.weight_concentration_
    if bgm.weight_concentration_prior_type == "dirichlet_process":
        wc = np.stack(wc)
    assert_close_scaled(ours.weight_concentration, wc, rtol, "weight_concentration")
    assert_close_scaled(ours.mean_precision, bgm.mean_precision_, rtol, "mean_precision")
    assert_close_scaled(ours.means, bgm.means_, rtol, "means")
    assert_close_scaled(
        ours.degrees_of_freedom, bgm.degrees_of_freedom_, rtol, "degrees_of_freedom"
    )
    assert_close_scaled(ours.covariances, bgm.covariances_, rtol, "covariances")
    assert_close_scaled(
        ours.precisions_cholesky, bgm.precisions_cholesky_, rtol, "precisions_cholesky"
    )


# ----------------------------------------------------------------------------- prior


def test_default_prior_matches_sklearn(aniso, covariance_type, weight_type):
    X = aniso
    bgm = sklearn_initialised(X, covariance_type, weight_type, random_resp(len(X), 4, 0))
    prior = our_prior(X, bgm)
    assert prior.weight_concentration == pytest.approx(bgm.weight_concentration_prior_)
    assert prior.mean_precision == bgm.mean_precision_prior_
    assert prior.degrees_of_freedom == bgm.degrees_of_freedom_prior_
    assert_close_scaled(prior.mean, bgm.mean_prior_, 1e-12)
    assert_close_scaled(prior.covariance, bgm.covariance_prior_, 1e-12)


def test_prior_from_summed_client_moments(aniso, covariance_type):
    """The default prior needs pooled moments only: clients' one-component stats add."""
    X = t(aniso)
    shift = X[:5].mean(0)
    ones = torch.ones(len(X), 1, dtype=X.dtype)
    parts = [stats_from_resp(X[i::3], ones[i::3], "full", shift) for i in range(3)]
    federated = prior_from_moments(merge_stats(parts), 3, covariance_type)
    pooled = default_prior(X, 3, covariance_type)
    assert_close_scaled(federated.mean, pooled.mean, 1e-12)
    assert_close_scaled(federated.covariance, pooled.covariance, 1e-12)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("weight_concentration", 0.0, "weight_concentration"),
        ("weight_concentration", -1.0, "weight_concentration"),
        ("mean_precision", 0.0, "mean_precision"),
        ("degrees_of_freedom", 2.0, "n_features - 1"),
        ("weight_concentration_prior_type", "pitman_yor", "weight_concentration_prior_type"),
    ],
)
def test_invalid_prior_raises(aniso, field, value, match):
    prior = default_prior(t(aniso), 3, "full")
    kwargs = {
        "weight_concentration_prior_type": prior.weight_concentration_prior_type,
        "weight_concentration": prior.weight_concentration,
        "mean_precision": prior.mean_precision,
        "mean": prior.mean,
        "degrees_of_freedom": prior.degrees_of_freedom,
        "covariance": prior.covariance,
        "covariance_type": "full",
        field: value,
    }
    with pytest.raises(InvalidPriorError, match=match):
        VBPrior(**kwargs)


def test_invalid_covariance_prior_raises(aniso):
    X = t(aniso)
    with pytest.raises(InvalidPriorError, match="positive definite"):
        default_prior(X, 3, "full", covariance_prior=-torch.eye(3, dtype=X.dtype))
    with pytest.raises(InvalidPriorError, match="shape"):
        default_prior(X, 3, "diag", covariance_prior=torch.ones(2, dtype=X.dtype))
    with pytest.raises(InvalidPriorError, match="> 0"):
        default_prior(X, 3, "spherical", covariance_prior=0.0)


def test_degrees_of_freedom_just_above_bound_is_valid(aniso):
    prior = default_prior(t(aniso), 3, "full", degrees_of_freedom_prior=2.0001)
    assert prior.degrees_of_freedom == 2.0001


# ----------------------------------------------------------------------------- M-step


CUSTOM_PRIORS = {
    "full": {"covariance_prior": np.diag([0.5, 1.0, 2.0]) + 0.1},
    "tied": {"covariance_prior": np.diag([0.5, 1.0, 2.0]) + 0.1},
    "diag": {"covariance_prior": np.array([0.5, 1.0, 2.0])},
    "spherical": {"covariance_prior": 0.7},
}


@pytest.mark.parametrize("custom", [False, True])
def test_m_step_matches_sklearn(aniso, covariance_type, weight_type, custom):
    X = aniso
    kwargs = {}
    if custom:
        kwargs = {
            "weight_concentration_prior": 2.5,
            "mean_precision_prior": 0.3,
            "mean_prior": np.array([1.0, -1.0, 0.5]),
            "degrees_of_freedom_prior": 5.5,
            **CUSTOM_PRIORS[covariance_type],
        }
    resp = random_resp(len(X), 4, 3)
    bgm = sklearn_initialised(X, covariance_type, weight_type, resp, **kwargs)
    prior = our_prior(X, bgm)
    stats = stats_from_resp(t(X), t(resp), covariance_type, t(X).mean(0) + 1.0)
    assert_posterior_equal(vb_m_step(stats, prior, bgm.reg_covar), bgm)


def test_m_step_partition_invariance(aniso, covariance_type, weight_type):
    """Statistics of disjoint clients, summed, give the pooled posterior: federated VB is
    exact under a shared prior."""
    X = t(aniso)
    resp = t(random_resp(len(X), 4, 5))
    prior = default_prior(X, 4, covariance_type, weight_concentration_prior_type=weight_type)
    shift = X.mean(0)
    pooled = vb_m_step(stats_from_resp(X, resp, covariance_type, shift), prior)
    rng = np.random.default_rng(0)
    client = torch.as_tensor(rng.integers(0, 5, size=len(X)))
    parts = [
        stats_from_resp(X[client == c], resp[client == c], covariance_type, shift) for c in range(5)
    ]
    federated = vb_m_step(merge_stats(parts[::-1]), prior)
    for name, value in pooled.tensors().items():
        assert_close_scaled(federated.tensors()[name], value, 1e-12, name)


def test_m_step_rejects_mismatched_prior(aniso):
    X = t(aniso)
    stats = stats_from_resp(X, t(random_resp(len(X), 3, 0)), "diag", X.mean(0))
    with pytest.raises(ValueError, match="covariance_type"):
        vb_m_step(stats, default_prior(X, 3, "full"))


# ----------------------------------------------------------------------------- E-step, ELBO


def test_e_step_and_lower_bound_match_sklearn(aniso, covariance_type, weight_type):
    X = aniso
    bgm = sklearn_initialised(X, covariance_type, weight_type, random_resp(len(X), 4, 1))
    prior = our_prior(X, bgm)
    posterior = vb_m_step(
        stats_from_resp(t(X), t(random_resp(len(X), 4, 1)), covariance_type, t(X).mean(0)),
        prior,
    )
    assert_close_scaled(expected_log_weights(posterior), bgm._estimate_log_weights(), RTOL)
    assert_close_scaled(vb_log_prob(t(X), posterior), bgm._estimate_log_prob(X), RTOL)
    log_prob_norm, log_resp = vb_log_resp(t(X), posterior)
    ref_norm, ref_log_resp = bgm._estimate_log_prob_resp(X)
    assert_close_scaled(log_prob_norm, ref_norm, RTOL)
    assert_close_scaled(log_resp, ref_log_resp, RTOL)

    # One sklearn iteration: E-step, M-step, lower bound.
    stats = vb_e_step_stats(t(X), posterior, t(X).mean(0) - 0.5)
    assert_close_scaled(stats.log_likelihood, ref_norm.sum(), RTOL)
    entropy = resp_entropy_from_stats(stats, posterior)
    assert_close_scaled(entropy, resp_entropy(t(ref_log_resp)), RTOL)
    new = vb_m_step(stats, prior, bgm.reg_covar)
    bgm._m_step(X, ref_log_resp)
    assert_posterior_equal(new, bgm)
    expected = bgm._compute_lower_bound(ref_log_resp, ref_norm.mean())
    assert_close_scaled(vb_lower_bound(new, entropy), expected, RTOL)


@pytest.mark.parametrize("max_iter", [1, 3, 200])
def test_fit_matches_sklearn(dataset, covariance_type, weight_type, max_iter):
    """The whole VB EM loop from sklearn's random init reproduces ``fit``."""
    X = dataset
    seed = 7
    bgm = make_bgm(covariance_type, weight_type, max_iter=max_iter, tol=1e-6, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        bgm.fit(X)
    prior = our_prior(X, bgm)
    resp = t(random_resp(len(X), bgm.n_components, seed))
    init = vb_m_step(stats_from_resp(t(X), resp, covariance_type, t(X).mean(0)), prior)
    result = fit_vb(t(X), init, prior, tol=1e-6, max_iter=max_iter)
    assert result.n_iter == bgm.n_iter_
    assert result.converged == bgm.converged_
    assert_posterior_equal(result.posterior, bgm)
    assert_close_scaled(result.posterior.weights, bgm.weights_, RTOL, "weights")
    # scikit-learn's tied lower bound is a (1,) array (its Wishart normaliser keeps an axis).
    expected_bounds = [float(np.ravel(b)[0]) for b in bgm.lower_bounds_]
    assert_close_scaled(result.lower_bounds, expected_bounds, RTOL, "lower_bounds")
    assert_close_scaled(result.lower_bounds[-1], np.ravel(bgm.lower_bound_)[0], RTOL)
    # scikit-learn's score_samples is the E-step normaliser (expected log weights and
    # log-densities), not a density.
    assert_close_scaled(vb_log_resp(t(X), result.posterior)[0], bgm.score_samples(X), RTOL)
    plugin = vb_plugin_params(result.posterior)
    assert_close_scaled(plugin.covariances, bgm.covariances_, RTOL)


def test_fit_prunes_components(blobs, weight_type):
    """A generous upper bound K = 8 on three separated blobs: the prior empties the rest."""
    X = t(blobs[0])
    prior = default_prior(
        X, 8, "full", weight_concentration_prior_type=weight_type, weight_concentration_prior=1e-3
    )
    resp = t(random_resp(len(X), 8, 0))
    init = vb_m_step(stats_from_resp(X, resp, "full", X.mean(0)), prior)
    result = fit_vb(X, init, prior, max_iter=500, tol=1e-8)
    assert effective_n_components(result.posterior) == 3
    assert int(active_components(result.posterior).sum()) == 3
    assert bool(torch.isfinite(vb_predictive_log_prob(X, result.posterior)).all())
    # ELBO never decreases.
    assert np.all(np.diff(result.lower_bounds) > -1e-6 * abs(result.lower_bounds[-1]))


# ----------------------------------------------------------------------------- scoring


def test_predictive_is_student_t_mixture(aniso, covariance_type, weight_type):
    X = aniso
    prior = default_prior(t(X), 3, covariance_type, weight_concentration_prior_type=weight_type)
    posterior = vb_m_step(
        stats_from_resp(t(X), t(random_resp(len(X), 3, 2)), covariance_type, t(X).mean(0)),
        prior,
    )
    d = X.shape[1]
    nu = np.broadcast_to(posterior.degrees_of_freedom.numpy(), (3,))
    beta = posterior.mean_precision.numpy()
    cov = posterior.covariances.numpy()
    full = {
        "full": cov,
        "tied": np.broadcast_to(cov, (3, d, d)),
        "diag": np.stack([np.diag(c) for c in cov]) if cov.ndim == 2 else None,
        "spherical": cov[:, None, None] * np.eye(d) if cov.ndim == 1 else None,
    }[covariance_type]
    dens = np.zeros(len(X))
    for k in range(3):
        v = nu[k] + 1 - d
        shape = full[k] * nu[k] * (1 + beta[k]) / (v * beta[k])
        dens += posterior.weights[k].item() * multivariate_t(
            posterior.means[k].numpy(), shape, df=v
        ).pdf(X)
    ours = vb_predictive_log_prob(t(X), posterior, chunk_size=37)
    assert_close_scaled(ours, np.log(dens), 1e-10)


def test_predictive_approaches_plugin_with_many_rows(covariance_type):
    """With many rows the Student-t components tend to the plug-in Gaussians."""
    rng = np.random.default_rng(0)
    X = t(rng.normal(size=(20000, 2)) @ np.array([[1.0, 0.3], [0.0, 0.5]]))
    prior = default_prior(X, 1, covariance_type)
    posterior = vb_m_step(
        stats_from_resp(X, torch.ones(len(X), 1, dtype=X.dtype), covariance_type, X.mean(0)),
        prior,
    )
    grid = X[:50]
    assert_close_scaled(
        vb_predictive_log_prob(grid, posterior),
        score_samples(vb_plugin_params(posterior), grid),
        1e-3,
    )


def test_a_constant_feature_gets_a_usable_default_prior() -> None:
    """scikit-learn's default covariance prior (the data covariance) is singular with a
    constant feature; the default here adds a small ridge and the fit runs."""
    from fednovelty.mixture import stats_from_resp
    from fednovelty.mixture.vb_prior import prior_from_moments

    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(size=(200, 2)), np.full(200, 3.0)]
    Xt = torch.as_tensor(X)
    moments = stats_from_resp(Xt, torch.ones(200, 1, dtype=Xt.dtype), "full", Xt.mean(0))
    for ct in ("full", "tied", "diag", "spherical"):
        prior = prior_from_moments(moments, 3, ct)
        assert bool(torch.isfinite(prior.covariance).all())
    full = prior_from_moments(moments, 3, "full").covariance
    assert float(torch.linalg.eigvalsh(full).min()) > 0
    assert_close_scaled(full[:2, :2], torch.as_tensor(np.cov(X[:, :2].T)), rtol=1e-4)
    # collinear features whose covariance still factorises in floating point: lifted too
    # (its posterior's Cholesky factorisation fails otherwise once a component empties)
    Z = np.c_[X[:, :2], X[:, 0] + X[:, 1]]
    Zt = torch.as_tensor(Z)
    collinear = stats_from_resp(Zt, torch.ones(200, 1, dtype=Zt.dtype), "full", Zt.mean(0))
    lifted = prior_from_moments(collinear, 3, "full").covariance
    mean_variance = float(torch.diagonal(lifted).mean())
    assert float(torch.linalg.eigvalsh(lifted).min()) >= 0.99e-6 * mean_variance
    assert_close_scaled(lifted, torch.as_tensor(np.cov(Z.T)), rtol=1e-5)
