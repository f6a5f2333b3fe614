"""Feature moments merge exactly; the affine map of a mixture is exact for every covariance type."""

import numpy as np
import pytest
import torch

from fednovelty.mixture import (
    MixtureParams,
    affine_params,
    feature_moments,
    merge_moments,
    mixture_moments,
    precisions_cholesky_from_covariances,
    sample,
    score_samples,
    standardization,
)


def _rows(seed=0, n=200, d=4):
    rng = np.random.default_rng(seed)
    return torch.as_tensor(
        rng.normal(size=(n, d)) * [1.0, 100.0, 1e-3, 5.0] + [3.0, -1e4, 7.0, 0.0]
    )


@pytest.mark.parametrize("cuts", [(50,), (1, 2, 150), (0, 0, 199)])
def test_merged_moments_equal_the_pooled_ones_for_any_split(cuts):
    X = _rows()
    parts = torch.tensor_split(X, list(cuts))  # includes empty clients
    merged = merge_moments(feature_moments(p) for p in parts)
    assert float(merged.n_samples) == X.shape[0]
    np.testing.assert_allclose(merged.mean, X.mean(0), rtol=1e-12)
    np.testing.assert_allclose(merged.variance, X.var(0, unbiased=False), rtol=1e-10)


def test_merge_moments_needs_input():
    with pytest.raises(ValueError, match="at least one"):
        merge_moments([])


def test_standardization_keeps_constant_features_and_spherical_scale():
    X = _rows()
    X[:, 2] = 7.0
    offset, scale = standardization(feature_moments(X))
    assert scale[2] == 1.0
    np.testing.assert_allclose(scale[[0, 1, 3]], X[:, [0, 1, 3]].std(0, unbiased=False))
    np.testing.assert_allclose(offset, X.mean(0))
    _, common = standardization(feature_moments(X), "spherical")
    assert torch.all(common == common[0])
    expected = X[:, [0, 1, 3]].var(0, unbiased=False).mean().sqrt()
    np.testing.assert_allclose(common[0], expected)


def _mixture(covariance_type, d=3, k=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(k, d, generator=g, dtype=torch.float64)
    a = torch.randn(k, d, d, generator=g, dtype=torch.float64)
    full = a @ a.transpose(1, 2) + torch.eye(d, dtype=torch.float64)
    cov = {
        "full": full,
        "tied": full[0],
        "diag": torch.diagonal(full, dim1=1, dim2=2),
        "spherical": torch.tensor([0.5, 2.0], dtype=torch.float64),
    }[covariance_type]
    prec = precisions_cholesky_from_covariances(cov, covariance_type)
    return MixtureParams(
        torch.tensor([0.3, 0.7], dtype=torch.float64), means, prec, covariance_type
    )


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_affine_params_is_the_density_of_the_mapped_rows(covariance_type):
    params = _mixture(covariance_type)
    offset = torch.tensor([1.0, -50.0, 3.0], dtype=torch.float64)
    if covariance_type == "spherical":
        scale = torch.full((3,), 2.5, dtype=torch.float64)
    else:
        scale = torch.tensor([0.01, 100.0, 2.0], dtype=torch.float64)
    Z = torch.randn(50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mapped = affine_params(params, offset, scale)
    expected = score_samples(params, Z) - scale.log().sum()
    np.testing.assert_allclose(score_samples(mapped, offset + Z * scale), expected, rtol=1e-10)


def test_affine_params_refuses_per_feature_scales_for_spherical():
    scale = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="one common scale"):
        affine_params(_mixture("spherical"), torch.zeros(3, dtype=torch.float64), scale)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_mixture_moments_match_a_large_sample(covariance_type):
    params = _mixture(covariance_type)
    m = mixture_moments(params, 100.0)
    draws, _ = sample(params, 200_000, generator=torch.Generator().manual_seed(0))
    np.testing.assert_allclose(m.mean, draws.mean(0), atol=0.03)
    np.testing.assert_allclose(m.variance, draws.var(0), rtol=0.03)
    assert float(m.n_samples) == 100.0
