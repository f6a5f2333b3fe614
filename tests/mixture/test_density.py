"""Component log-densities and responsibilities against scikit-learn and scipy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.mixture import _gaussian_mixture as skgm

from fednovelty.mixture.covariance import COVARIANCE_TYPES
from fednovelty.mixture.density import default_chunk_size, log_gaussian_prob, log_responsibilities


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=dtype)


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request) -> str:
    return request.param


def test_log_gaussian_prob_matches_sklearn_fitted(sklearn_fit, covariance_type, dataset):
    gm = sklearn_fit(dataset, covariance_type)
    # Training rows plus points well outside the data.
    rng = np.random.default_rng(5)
    X = np.concatenate([dataset, rng.uniform(-15, 15, size=(50, 3))])
    expected = skgm._estimate_log_gaussian_prob(
        X, gm.means_, gm.precisions_cholesky_, covariance_type
    )
    actual = log_gaussian_prob(t(X), t(gm.means_), t(gm.precisions_cholesky_), covariance_type)
    assert actual.shape == (X.shape[0], 3)
    assert actual.dtype == torch.float64
    # log-densities of far rows under a narrow component reach -2e6; compare them relative
    # to their scale: another BLAS or thread count changes the last bits
    assert_close_scaled(actual, expected, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_log_gaussian_prob_matches_sklearn_random_parameters(
    covariance_type, seed, random_covariances
):
    rng = np.random.default_rng(seed)
    k, d = 4, 5
    covs = random_covariances(rng, covariance_type, k, d)
    prec_chol = skgm._compute_precision_cholesky(covs, covariance_type)
    means = rng.normal(scale=3.0, size=(k, d))
    X = rng.normal(scale=3.0, size=(300, d))
    expected = skgm._estimate_log_gaussian_prob(X, means, prec_chol, covariance_type)
    actual = log_gaussian_prob(t(X), t(means), t(prec_chol), covariance_type)
    assert_close_scaled(actual, expected, rtol=1e-12)  # two implementations: round-off apart


def test_log_gaussian_prob_matches_scipy_logpdf(covariance_type, random_covariances):
    """An independent reference: scipy's multivariate normal on the dense covariances."""
    rng = np.random.default_rng(11)
    k, d = 3, 4
    covs = random_covariances(rng, covariance_type, k, d)
    dense = {
        "full": lambda: covs,
        "tied": lambda: np.stack([covs] * k),
        "diag": lambda: np.stack([np.diag(c) for c in covs]),
        "spherical": lambda: np.stack([c * np.eye(d) for c in covs]),
    }[covariance_type]()
    means = rng.normal(size=(k, d))
    X = rng.normal(scale=2.0, size=(100, d))
    expected = np.stack(
        [multivariate_normal(means[j], dense[j]).logpdf(X) for j in range(k)], axis=1
    )
    prec_chol = skgm._compute_precision_cholesky(covs, covariance_type)
    actual = log_gaussian_prob(t(X), t(means), t(prec_chol), covariance_type)
    # scipy goes through an eigendecomposition: round-off apart, relative to the scale
    assert_close_scaled(actual, expected, rtol=1e-11)


def test_log_gaussian_prob_empty_and_single_row(covariance_type, random_covariances):
    rng = np.random.default_rng(0)
    covs = random_covariances(rng, covariance_type, 2, 3)
    prec_chol = t(skgm._compute_precision_cholesky(covs, covariance_type))
    means = t(rng.normal(size=(2, 3)))
    assert log_gaussian_prob(
        torch.zeros(0, 3, dtype=torch.float64), means, prec_chol, covariance_type
    ).shape == (0, 2)
    x = rng.normal(size=(1, 3))
    one = log_gaussian_prob(t(x), means, prec_chol, covariance_type)
    expected = skgm._estimate_log_gaussian_prob(
        x, means.numpy(), prec_chol.numpy(), covariance_type
    )
    assert_close_scaled(one, expected, rtol=1e-12)  # two implementations: round-off apart


def test_log_gaussian_prob_does_not_modify_inputs(covariance_type, random_covariances):
    rng = np.random.default_rng(0)
    covs = random_covariances(rng, covariance_type, 2, 3)
    X, means = t(rng.normal(size=(20, 3))), t(rng.normal(size=(2, 3)))
    prec_chol = t(skgm._compute_precision_cholesky(covs, covariance_type))
    copies = [X.clone(), means.clone(), prec_chol.clone()]
    log_gaussian_prob(X, means, prec_chol, covariance_type)
    for before, after in zip(copies, [X, means, prec_chol], strict=True):
        assert torch.equal(before, after)


def test_log_gaussian_prob_float32(sklearn_fit, covariance_type, dataset):
    gm = sklearn_fit(dataset, covariance_type)
    args64 = [t(dataset), t(gm.means_), t(gm.precisions_cholesky_)]
    args32 = [a.float() for a in args64]
    lp64 = log_gaussian_prob(*args64, covariance_type)
    lp32 = log_gaussian_prob(*args32, covariance_type)
    assert lp32.dtype == torch.float32
    np.testing.assert_allclose(lp32.double().numpy(), lp64.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bad", ["FULL", "diagonal"])
def test_log_gaussian_prob_unknown_type(bad):
    with pytest.raises(ValueError, match="'full', 'tied', 'diag', 'spherical'"):
        log_gaussian_prob(torch.zeros(2, 3), torch.zeros(1, 3), torch.ones(1), bad)


# --- responsibilities -----------------------------------------------------------------


def test_log_responsibilities_matches_sklearn(sklearn_fit, covariance_type, dataset):
    gm = sklearn_fit(dataset, covariance_type)
    weighted = (
        log_gaussian_prob(t(dataset), t(gm.means_), t(gm.precisions_cholesky_), covariance_type)
        + t(gm.weights_).log()
    )
    log_norm, log_resp = log_responsibilities(weighted)
    sk_norm, sk_log_resp = gm._estimate_log_prob_resp(dataset)
    # log_resp reaches -6e4 for rows far from a component: relative to the scale
    assert_close_scaled(log_norm, sk_norm, rtol=1e-12)
    assert_close_scaled(log_resp, sk_log_resp, rtol=1e-12)
    np.testing.assert_allclose(log_resp.exp().sum(1).numpy(), 1.0, rtol=0, atol=1e-12)


def test_log_responsibilities_is_stable_far_in_the_tail():
    rng = np.random.default_rng(0)
    weighted = rng.normal(size=(50, 4)) - 1e5  # exp underflows to 0 without log-sum-exp
    weighted[0, 2] = -np.inf  # a component with zero weight
    log_norm, log_resp = log_responsibilities(t(weighted))
    np.testing.assert_allclose(log_norm.numpy(), logsumexp(weighted, axis=1), rtol=1e-14)
    assert bool(torch.isfinite(log_norm).all())
    assert log_resp[0, 2] == -np.inf
    # log_resp = weighted - log_norm loses eps * 1e5 ~ 2e-11 to cancellation (as sklearn).
    np.testing.assert_allclose(log_resp.exp().sum(1).numpy(), 1.0, rtol=0, atol=1e-9)


def test_default_chunk_size_bounds_memory():
    assert default_chunk_size(1, 1) == (1 << 25) // 8
    assert default_chunk_size(50, 1000) == 256  # floor
    rows = default_chunk_size(10, 20)
    assert rows * 10 * 20 * 8 <= 1 << 25
