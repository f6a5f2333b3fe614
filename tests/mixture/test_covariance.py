"""Covariance parameterisations against scikit-learn's private reference functions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.mixture import _gaussian_mixture as skgm

from fednovelty.exceptions import SingularCovarianceError
from fednovelty.mixture.covariance import (
    COVARIANCE_TYPES,
    check_covariance_type,
    covariance_shape,
    covariances_from_precisions_cholesky,
    log_det_cholesky,
    n_covariance_parameters,
    precisions_cholesky_from_covariances,
    precisions_cholesky_from_precisions,
    precisions_from_precisions_cholesky,
)

# Two implementations of the same factorisations agree to round-off relative to the values'
# scale (precision factors of fitted covariances reach 95); another LAPACK changes the last bits.
RTOL = 1e-12


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=dtype)


def close(actual: torch.Tensor, expected, rtol: float = RTOL) -> None:
    assert_close_scaled(actual.double(), expected, rtol=rtol)


def sklearn_precisions(covariances: np.ndarray, covariance_type: str) -> np.ndarray:
    if covariance_type == "full":
        return np.linalg.inv(covariances)
    if covariance_type == "tied":
        return np.linalg.inv(covariances)
    return 1.0 / covariances


@pytest.fixture(params=COVARIANCE_TYPES)
def covariance_type(request) -> str:
    return request.param


@pytest.fixture
def covs(covariance_type, random_covariances) -> np.ndarray:
    return random_covariances(np.random.default_rng(3), covariance_type, 4, 5)


def test_covariance_types_are_sklearns():
    assert set(COVARIANCE_TYPES) == {"full", "tied", "diag", "spherical"}


def test_precisions_cholesky_from_covariances_matches_sklearn(covariance_type, covs):
    expected = skgm._compute_precision_cholesky(covs, covariance_type)
    actual = precisions_cholesky_from_covariances(t(covs), covariance_type)
    assert actual.dtype == torch.float64
    assert tuple(actual.shape) == covariance_shape(covariance_type, 4, 5) == expected.shape
    close(actual, expected)


def test_precisions_cholesky_from_fitted_covariances_matches_sklearn(
    sklearn_fit, covariance_type, dataset
):
    gm = sklearn_fit(dataset, covariance_type)
    actual = precisions_cholesky_from_covariances(t(gm.covariances_), covariance_type)
    close(actual, gm.precisions_cholesky_, rtol=1e-11)


def test_precisions_cholesky_is_upper_factor_of_precision(covariance_type, covs):
    prec_chol = precisions_cholesky_from_covariances(t(covs), covariance_type)
    if covariance_type in ("full", "tied"):
        assert torch.equal(prec_chol, torch.triu(prec_chol))
        assert bool((torch.diagonal(prec_chol, dim1=-2, dim2=-1) > 0).all())
    close(
        precisions_from_precisions_cholesky(prec_chol, covariance_type),
        sklearn_precisions(covs, covariance_type),
        rtol=1e-11,
    )


def test_precisions_cholesky_from_precisions_matches_sklearn(covariance_type, covs):
    precisions = sklearn_precisions(covs, covariance_type)
    expected = skgm._compute_precision_cholesky_from_precisions(precisions, covariance_type, xp=np)
    actual = precisions_cholesky_from_precisions(t(precisions), covariance_type)
    close(actual, expected)
    # Both routes to the factor agree: U is unique (upper, positive diagonal).
    close(actual, precisions_cholesky_from_covariances(t(covs), covariance_type), rtol=1e-11)


def test_precisions_cholesky_from_precisions_rejects_non_positive(covariance_type, covs):
    precisions = sklearn_precisions(covs, covariance_type)
    if covariance_type == "full":
        precisions[2] = -precisions[2]
    elif covariance_type == "tied":
        precisions = -precisions
    elif covariance_type == "diag":
        precisions[1, 3] = 0.0
    else:
        precisions[0] = -1.0
    with pytest.raises(ValueError, match="precisions_init"):
        precisions_cholesky_from_precisions(t(precisions), covariance_type)


def test_covariances_from_precisions_cholesky_inverts(covariance_type, covs):
    prec_chol = precisions_cholesky_from_covariances(t(covs), covariance_type)
    close(covariances_from_precisions_cholesky(prec_chol, covariance_type), covs, rtol=1e-11)


def test_covariances_from_sklearn_precisions_cholesky(sklearn_fit, covariance_type, dataset):
    gm = sklearn_fit(dataset, covariance_type)
    actual = covariances_from_precisions_cholesky(t(gm.precisions_cholesky_), covariance_type)
    close(actual, gm.covariances_, rtol=1e-11)


def test_log_det_cholesky_matches_slogdet(covariance_type, covs):
    prec_chol = precisions_cholesky_from_covariances(t(covs), covariance_type)
    actual = log_det_cholesky(prec_chol, covariance_type, 5)
    if covariance_type in ("full", "tied"):
        sign, logdet = np.linalg.slogdet(covs)
        assert np.all(sign > 0)
        expected = -0.5 * logdet
    elif covariance_type == "diag":
        expected = -0.5 * np.log(covs).sum(1)
    else:
        expected = -0.5 * 5 * np.log(covs)
    assert actual.shape == (() if covariance_type == "tied" else (4,))
    close(actual, expected)
    sk = skgm._compute_log_det_cholesky(prec_chol.numpy(), covariance_type, 5)
    close(actual, sk)


def test_n_covariance_parameters():
    assert n_covariance_parameters("full", 3, 4) == 30
    assert n_covariance_parameters("tied", 3, 4) == 10
    assert n_covariance_parameters("diag", 3, 4) == 12
    assert n_covariance_parameters("spherical", 3, 4) == 3


# --- singular covariances -------------------------------------------------------------


def _singular(covariance_type: str, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A covariance tensor with one bad component, and the index text the error names."""
    d = 3
    good = np.stack([np.eye(d) * 2.0 for _ in range(3)])
    v = rng.normal(size=(d, 1))
    if covariance_type == "full":
        good[1] = v @ v.T  # rank one
        return good, "[1]"
    if covariance_type == "tied":
        return v @ v.T, "tied"
    if covariance_type == "diag":
        diag = np.full((3, d), 2.0)
        diag[2, 1] = 0.0
        return diag, "[2]"
    return np.array([1.0, 0.0, 2.0]), "[1]"


def test_singular_covariance_error(covariance_type):
    covs, where = _singular(covariance_type, np.random.default_rng(0))
    with pytest.raises(SingularCovarianceError, match="reg_covar") as info:
        precisions_cholesky_from_covariances(t(covs), covariance_type)
    assert isinstance(info.value, ValueError)
    assert where in str(info.value)
    assert "float64" not in str(info.value)


def test_singular_covariance_error_float32_suggests_float64(covariance_type):
    covs, _ = _singular(covariance_type, np.random.default_rng(0))
    with pytest.raises(SingularCovarianceError, match="float64"):
        precisions_cholesky_from_covariances(t(covs, torch.float32), covariance_type)


@pytest.mark.parametrize("covariance_type", ["diag", "spherical"])
def test_negative_variance_raises(covariance_type):
    covs = np.full((2, 3), 1.0) if covariance_type == "diag" else np.ones(2)
    covs[1] = -0.5
    with pytest.raises(SingularCovarianceError, match=r"component\(s\) \[1\].*reg_covar"):
        precisions_cholesky_from_covariances(t(covs), covariance_type)


def test_non_finite_covariance_raises(covariance_type):
    shape = covariance_shape(covariance_type, 2, 3)
    covs = torch.full(shape, float("nan"), dtype=torch.float64)
    with pytest.raises(SingularCovarianceError, match="reg_covar"):
        precisions_cholesky_from_covariances(covs, covariance_type)


def test_indefinite_full_covariance_raises():
    cov = np.array([[[1.0, 2.0], [2.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]]])  # eigenvalue -1
    with pytest.raises(SingularCovarianceError, match=r"\[0\]"):
        precisions_cholesky_from_covariances(t(cov), "full")


# --- bad covariance type --------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda ct: check_covariance_type(ct),
        lambda ct: covariance_shape(ct, 2, 3),
        lambda ct: precisions_cholesky_from_covariances(torch.ones(2), ct),
        lambda ct: precisions_cholesky_from_precisions(torch.ones(2), ct),
        lambda ct: covariances_from_precisions_cholesky(torch.ones(2), ct),
        lambda ct: precisions_from_precisions_cholesky(torch.ones(2), ct),
        lambda ct: log_det_cholesky(torch.ones(2), ct, 3),
        lambda ct: n_covariance_parameters(ct, 2, 3),
    ],
)
@pytest.mark.parametrize("bad", ["Full", "diagonal", ""])
def test_unknown_covariance_type(call, bad):
    with pytest.raises(ValueError, match="covariance_type") as info:
        call(bad)
    for name in COVARIANCE_TYPES:
        assert repr(name) in str(info.value)
    assert repr(bad) in str(info.value)


# --- float32 --------------------------------------------------------------------------


def test_float32_in_float32_out(covariance_type, covs):
    p64 = precisions_cholesky_from_covariances(t(covs), covariance_type)
    p32 = precisions_cholesky_from_covariances(t(covs, torch.float32), covariance_type)
    assert p32.dtype == torch.float32
    close(p32, p64.numpy(), rtol=1e-4)

    c32 = covariances_from_precisions_cholesky(p32, covariance_type)
    assert c32.dtype == torch.float32
    close(c32, covs, rtol=1e-4)

    precisions = sklearn_precisions(covs, covariance_type)
    q32 = precisions_cholesky_from_precisions(t(precisions, torch.float32), covariance_type)
    assert q32.dtype == torch.float32
    close(q32, p64.numpy(), rtol=1e-4)

    ld32 = log_det_cholesky(p32, covariance_type, 5)
    assert ld32.dtype == torch.float32
    close(ld32, log_det_cholesky(p64, covariance_type, 5).numpy(), rtol=1e-4)
