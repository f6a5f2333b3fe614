"""MixtureParams, scoring, BIC and sampling against scikit-learn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.mixture import GaussianMixture
from sklearn.mixture import _gaussian_mixture as skgm

from fednovelty.exceptions import SingularCovarianceError
from fednovelty.mixture.covariance import COVARIANCE_TYPES, covariance_shape
from fednovelty.mixture.model import (
    MixtureParams,
    bic,
    n_parameters,
    predict_proba,
    sample,
    score_samples,
    weighted_log_prob,
)


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=dtype)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def from_sklearn(gm: GaussianMixture, dtype=torch.float64) -> MixtureParams:
    return MixtureParams(
        t(gm.weights_, dtype),
        t(gm.means_, dtype),
        t(gm.precisions_cholesky_, dtype),
        gm.covariance_type,
    )


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request) -> str:
    return request.param


@pytest.fixture
def fitted(sklearn_fit, covariance_type, dataset) -> tuple[GaussianMixture, np.ndarray]:
    return sklearn_fit(dataset, covariance_type), dataset


# --- MixtureParams validation ---------------------------------------------------------


def test_params_validate_weights_shape(covariance_type):
    prec = torch.ones(covariance_shape(covariance_type, 3, 2))
    with pytest.raises(ValueError, match=r"weights must have shape \(3,\), got \(2,\)"):
        MixtureParams(torch.ones(2) / 2, torch.zeros(3, 2), prec, covariance_type)
    with pytest.raises(ValueError, match=r"got \(3, 1\)"):
        MixtureParams(torch.ones(3, 1) / 3, torch.zeros(3, 2), prec, covariance_type)


@pytest.mark.parametrize(
    ("covariance_type", "bad"),
    [
        ("full", (3, 2)),
        ("full", (2, 2, 2)),
        ("tied", (3, 2, 2)),
        ("diag", (3,)),
        ("diag", (2, 3)),
        ("spherical", (3, 2)),
        ("spherical", ()),
    ],
)
def test_params_validate_precisions_cholesky_shape(covariance_type, bad):
    expected = covariance_shape(covariance_type, 3, 2)
    with pytest.raises(ValueError) as info:
        MixtureParams(torch.ones(3) / 3, torch.zeros(3, 2), torch.ones(bad), covariance_type)
    message = str(info.value)
    assert str(expected) in message and str(bad) in message
    assert repr(covariance_type) in message


def test_params_reject_unknown_covariance_type():
    with pytest.raises(ValueError, match="'full', 'tied', 'diag', 'spherical'"):
        MixtureParams(torch.ones(2) / 2, torch.zeros(2, 3), torch.ones(2), "sphere")


@pytest.mark.parametrize("means_shape", [(3,), (3, 2, 1)])
def test_params_reject_means_that_are_not_a_matrix(means_shape):
    with pytest.raises(ValueError):
        MixtureParams(torch.ones(3) / 3, torch.zeros(means_shape), torch.ones(3), "spherical")


def test_params_means_error_names_the_shape():
    with pytest.raises(ValueError, match=r"\(3,\)"):
        MixtureParams(torch.ones(3) / 3, torch.zeros(3), torch.ones(3), "spherical")


def test_params_from_covariances_and_back(fitted):
    gm, _ = fitted
    params = MixtureParams.from_covariances(
        t(gm.weights_), t(gm.means_), t(gm.covariances_), gm.covariance_type
    )
    np.testing.assert_allclose(
        params.precisions_cholesky.numpy(), gm.precisions_cholesky_, atol=1e-9
    )
    np.testing.assert_allclose(params.covariances.numpy(), gm.covariances_, atol=1e-10)
    assert params.n_components == 3 and params.n_features == 3


def test_params_from_singular_covariances():
    covs = torch.zeros(2, 2, 2, dtype=torch.float64)
    covs[0] = torch.eye(2)
    with pytest.raises(SingularCovarianceError, match=r"\[1\].*reg_covar"):
        MixtureParams.from_covariances(
            torch.ones(2) / 2, torch.zeros(2, 2, dtype=torch.float64), covs, "full"
        )


def test_params_to_dtype_and_tensors(fitted):
    gm, _ = fitted
    p64 = from_sklearn(gm)
    p32 = p64.to(dtype=torch.float32)
    assert p32.covariance_type == p64.covariance_type
    for name, tensor in p32.tensors().items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor.double(), p64.tensors()[name], rtol=1e-6, atol=1e-6)
    assert set(p64.tensors()) == {"weights", "means", "precisions_cholesky"}
    assert p64.weights.dtype == torch.float64  # the original is unchanged


def test_params_are_frozen(fitted):
    params = from_sklearn(fitted[0])
    with pytest.raises(AttributeError):
        params.weights = params.weights * 2


# --- scoring --------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [None, 1, 97])
def test_score_samples_matches_sklearn(fitted, chunk_size):
    gm, X = fitted
    rng = np.random.default_rng(0)
    X_eval = np.concatenate([X, rng.uniform(-15, 15, size=(40, 3))])
    ours = score_samples(from_sklearn(gm), t(X_eval), chunk_size=chunk_size)
    assert ours.shape == (X_eval.shape[0],) and ours.dtype == torch.float64
    # log-densities of the far rows reach -1e4: two implementations agree relative to the scale
    assert_close_scaled(ours, gm.score_samples(X_eval), rtol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 1, 97])
def test_predict_proba_matches_sklearn(fitted, chunk_size):
    gm, X = fitted
    ours = predict_proba(from_sklearn(gm), t(X), chunk_size=chunk_size)
    assert ours.shape == (X.shape[0], 3)
    np.testing.assert_allclose(ours.numpy(), gm.predict_proba(X), rtol=0, atol=1e-10)
    np.testing.assert_allclose(ours.sum(1).numpy(), 1.0, rtol=0, atol=1e-12)


def test_weighted_log_prob_matches_sklearn(fitted):
    gm, X = fitted
    # reaches -6e4 (a row far from a narrow component): relative to the scale
    assert_close_scaled(
        weighted_log_prob(from_sklearn(gm), t(X)), gm._estimate_weighted_log_prob(X), rtol=1e-12
    )


def test_log_weights_override(fitted):
    gm, X = fitted
    params = from_sklearn(gm)
    other = t([0.6, 0.3, 0.1])
    swapped = MixtureParams(other, params.means, params.precisions_cholesky, params.covariance_type)
    torch.testing.assert_close(
        score_samples(params, t(X), log_weights=other.log()), score_samples(swapped, t(X))
    )
    torch.testing.assert_close(
        predict_proba(params, t(X), log_weights=other.log()), predict_proba(swapped, t(X))
    )


def test_scoring_empty_input(fitted):
    params = from_sklearn(fitted[0])
    empty = torch.zeros(0, 3, dtype=torch.float64)
    assert score_samples(params, empty).shape == (0,)
    assert predict_proba(params, empty).shape == (0, 3)


def test_scoring_float32(fitted):
    gm, X = fitted
    ours = score_samples(from_sklearn(gm, torch.float32), t(X, torch.float32))
    assert ours.dtype == torch.float32
    np.testing.assert_allclose(ours.double().numpy(), gm.score_samples(X), rtol=1e-4, atol=1e-3)


def test_scoring_does_not_change_params(fitted):
    gm, X = fitted
    params = from_sklearn(gm)
    before = {k: v.clone() for k, v in params.tensors().items()}
    score_samples(params, t(X))
    predict_proba(params, t(X))
    bic(params, t(X))
    for name, tensor in params.tensors().items():
        assert torch.equal(tensor, before[name]), name


# --- BIC and parameter count ----------------------------------------------------------


def test_bic_matches_sklearn(fitted):
    gm, X = fitted
    ours = bic(from_sklearn(gm), t(X))
    assert isinstance(ours, float)
    assert ours == pytest.approx(gm.bic(X), rel=1e-12, abs=1e-8)


@pytest.mark.parametrize("n_components", [1, 2, 5])
@pytest.mark.parametrize("n_features", [1, 3, 10])
def test_n_parameters_matches_sklearn(covariance_type, n_components, n_features):
    gm = GaussianMixture(n_components, covariance_type=covariance_type)
    gm.means_ = np.zeros((n_components, n_features))
    assert n_parameters(covariance_type, n_components, n_features) == gm._n_parameters()


# --- sampling -------------------------------------------------------------------------


@pytest.fixture
def sampling_params(covariance_type, random_covariances) -> tuple[MixtureParams, np.ndarray]:
    rng = np.random.default_rng(8)
    covs = random_covariances(rng, covariance_type, 3, 3)
    params = MixtureParams.from_covariances(
        t([0.2, 0.5, 0.3]), t(rng.normal(scale=4.0, size=(3, 3))), t(covs), covariance_type
    )
    dense = {
        "full": lambda: covs,
        "tied": lambda: np.stack([covs] * 3),
        "diag": lambda: np.stack([np.diag(c) for c in covs]),
        "spherical": lambda: np.stack([c * np.eye(3) for c in covs]),
    }[covariance_type]()
    return params, dense


def test_sample_moments(sampling_params):
    params, dense = sampling_params
    X, labels = sample(params, 200_000, generator=gen(0))
    assert X.shape == (200_000, 3) and X.dtype == torch.float64
    assert labels.shape == (200_000,) and labels.dtype == torch.int64
    freq = torch.bincount(labels, minlength=3).double() / 200_000
    np.testing.assert_allclose(freq.numpy(), params.weights.numpy(), atol=5e-3)
    for k in range(3):
        Xk = X[labels == k].numpy()
        # Standard error of a mean is <= sqrt(3 / 40_000) ~ 0.009; of a covariance entry ~ 0.02.
        np.testing.assert_allclose(Xk.mean(0), params.means[k].numpy(), atol=0.05)
        np.testing.assert_allclose(np.cov(Xk.T), dense[k], atol=0.1)
    # The whole sample has the mixture's mean.
    np.testing.assert_allclose(
        X.mean(0).numpy(), (params.weights @ params.means).numpy(), atol=0.05
    )


def test_sample_deterministic_per_seed(sampling_params):
    params, _ = sampling_params
    a = sample(params, 500, generator=gen(1))
    b = sample(params, 500, generator=gen(1))
    c = sample(params, 500, generator=gen(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_sample_float32(sampling_params):
    params, _ = sampling_params
    X64, labels64 = sample(params, 1000, generator=gen(3))
    X32, labels32 = sample(params.to(dtype=torch.float32), 1000, generator=gen(3))
    assert X32.dtype == torch.float32
    assert torch.equal(labels32, labels64)
    torch.testing.assert_close(X32.double(), X64, rtol=1e-4, atol=1e-4)


def test_sample_with_an_empty_component():
    params = MixtureParams.from_covariances(
        t([1.0, 0.0]), t([[0.0, 0.0], [9.0, 9.0]]), t(np.stack([np.eye(2)] * 2)), "full"
    )
    X, labels = sample(params, 50, generator=gen(0))
    assert X.shape == (50, 2) and bool((labels == 0).all())


def test_sample_of_fitted_model_scores_like_training_data(sklearn_fit, blobs):
    X, _ = blobs
    gm = sklearn_fit(X, "full")
    drawn, _ = sample(from_sklearn(gm), 20_000, generator=gen(0))
    ours = score_samples(from_sklearn(gm), drawn).mean().item()
    assert ours == pytest.approx(gm.score(X), abs=0.05)
    # And sklearn scores our draws the same way.
    assert gm.score(drawn.numpy()) == pytest.approx(ours, abs=1e-10)


def test_sklearn_log_prob_of_our_samples_matches(sampling_params):
    params, _ = sampling_params
    X, _ = sample(params, 300, generator=gen(4))
    expected = skgm._estimate_log_gaussian_prob(
        X.numpy(), params.means.numpy(), params.precisions_cholesky.numpy(), params.covariance_type
    )
    np.testing.assert_allclose(
        (weighted_log_prob(params, X) - params.weights.log()).numpy(), expected, atol=1e-10
    )
