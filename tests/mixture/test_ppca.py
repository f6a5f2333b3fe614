"""The probabilistic-PCA pieces against scikit-learn's PCA and densities written by hand."""

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal
from sklearn.decomposition import PCA

from fednovelty.mixture.ppca import (
    choose_n_components,
    ppca_log_likelihood,
    residual_log_density,
    variance_axes,
)


def _rows(n=300, d=12, seed=0):
    rng = np.random.default_rng(seed)
    scales = np.linspace(3.0, 0.2, d)
    mixing = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return (rng.normal(size=(n, d)) * scales) @ mixing + rng.normal(size=d) * 5


@pytest.mark.parametrize("q", [1, 4, 11])
def test_ppca_log_likelihood_is_sklearn_pca_score_samples(q):
    X = _rows()
    pca = PCA(n_components=q).fit(X)
    ours = ppca_log_likelihood(
        torch.as_tensor(X),
        torch.as_tensor(pca.mean_),
        torch.as_tensor(pca.components_),
        torch.as_tensor(pca.explained_variance_),
        pca.noise_variance_,
    ).numpy()
    reference = pca.score_samples(X)
    np.testing.assert_allclose(ours, reference, rtol=1e-9, atol=1e-9 * np.abs(reference).max())


def test_residual_is_an_isotropic_gaussian_on_the_orthogonal_complement():
    X = _rows(d=9)
    q, sigma2 = 3, 0.7
    pca = PCA(n_components=9).fit(X)
    kept, rest = pca.components_[:q], pca.components_[q:]  # rest: an orthonormal complement
    coordinates = (X - pca.mean_) @ rest.T  # (n, d - q)
    reference = multivariate_normal(np.zeros(9 - q), sigma2 * np.eye(9 - q)).logpdf(coordinates)
    ours = residual_log_density(
        torch.as_tensor(X), torch.as_tensor(pca.mean_), torch.as_tensor(kept), sigma2
    ).numpy()
    np.testing.assert_allclose(ours, reference, rtol=1e-10)


def test_residual_integrates_to_one_over_the_discarded_directions():
    # in d=2 with one kept axis the residual density is a 1-D Gaussian along the other axis
    grid = np.linspace(-8, 8, 4001)
    rows = np.column_stack([np.zeros_like(grid), grid])  # walk along the discarded axis
    density = (
        residual_log_density(
            torch.as_tensor(rows),
            torch.zeros(2, dtype=torch.float64),
            torch.tensor([[1.0, 0.0]], dtype=torch.float64),
            1.3,
        )
        .exp()
        .numpy()
    )
    assert abs(np.trapezoid(density, grid) - 1.0) < 1e-6


def test_residual_is_zero_when_nothing_is_discarded_and_checks_the_variance():
    X = torch.randn(5, 3, dtype=torch.float64)
    axes = torch.eye(3, dtype=torch.float64)
    assert torch.equal(residual_log_density(X, X.mean(0), axes, 0.0), torch.zeros(5).double())
    with pytest.raises(ValueError, match="noise_variance"):
        residual_log_density(X, X.mean(0), axes[:2], 0.0)


def test_variance_axes_counts_the_leading_share():
    values = torch.tensor([5.0, 3.0, 1.0, 0.5, 0.5])  # cumulative shares .5 .8 .9 .95 1
    assert variance_axes(values, 0.5) == 1
    assert variance_axes(values, 0.85) == 3
    assert variance_axes(values, 0.9) == 3
    assert variance_axes(values, 1.0) == 5
    with pytest.raises(ValueError, match="share"):
        variance_axes(values, 0.0)


def test_choose_n_components_takes_the_smallest_of_its_terms():
    flat = torch.ones(512)  # 90 % of the variance needs 461 axes
    assert choose_n_components(flat, 4000) == 64  # the ceiling
    assert choose_n_components(flat, 200) == 20  # 10 pooled rows per axis
    assert choose_n_components(flat, 219) == 21
    steep = torch.tensor([10.0, 0.5, 0.1, 0.1] + [0.01] * 100)  # sum 11.7; 10.6 / 11.7 > 0.9
    assert choose_n_components(steep, 1000) == variance_axes(steep, 0.9) == 3
    assert choose_n_components(flat, 7) == 1  # never below one axis
    assert choose_n_components(torch.ones(3), 1000) == 2  # one direction stays discarded
    assert choose_n_components(flat, 300, rows_per_axis=5, max_axes=100) == 60
    with pytest.raises(ValueError, match="n_samples"):
        choose_n_components(flat, 0)
