"""MAP M-steps under the covariance prior, and fits on standardised rows."""

import numpy as np
import pytest
import torch

from fednovelty.mixture import CovariancePrior, fit_gmm, fit_gmm_scaled, m_step, stats_from_resp


def _stats(covariance_type, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(40, 3, generator=g, dtype=torch.float64)
    resp = torch.softmax(torch.randn(40, 2, generator=g, dtype=torch.float64), 1)
    return X, resp, stats_from_resp(X, resp, covariance_type, X.mean(0))


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_map_covariance_is_the_pseudo_row_average(covariance_type):
    _, _, stats = _stats(covariance_type)
    psi = torch.tensor([0.5, 2.0, 4.0], dtype=torch.float64)
    prior = CovariancePrior(7.0, psi)
    w0, mu0, ml = m_step(stats, 0.0)
    w, mu, cov = m_step(stats, 1e-6, prior)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(mu, mu0)
    nk = stats.counts + 10 * torch.finfo(torch.float64).eps
    if covariance_type == "full":
        a = (nk / (nk + 7)).view(-1, 1, 1)
        expected = a * ml + (1 - a) * torch.diag(psi) + 1e-6 * torch.eye(3, dtype=torch.float64)
    elif covariance_type == "tied":
        a = nk.sum() / (nk.sum() + 7)
        expected = a * ml + (1 - a) * torch.diag(psi) + 1e-6 * torch.eye(3, dtype=torch.float64)
    elif covariance_type == "diag":
        a = (nk / (nk + 7)).unsqueeze(1)
        expected = a * ml + (1 - a) * psi + 1e-6
    else:
        a = nk / (nk + 7)
        expected = a * ml + (1 - a) * psi.mean() + 1e-6
    np.testing.assert_allclose(cov, expected, rtol=1e-12)


def test_prior_arguments_are_checked():
    with pytest.raises(ValueError, match="strength must be > 0"):
        CovariancePrior(0.0, torch.ones(2))
    with pytest.raises(ValueError, match="positive variances"):
        CovariancePrior(1.0, torch.tensor([1.0, 0.0]))


def _spiky(seed=0):
    """Rows with a discrete feature: 90% of them repeat one value (a spike for plain EM)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 2))
    X[:270, 1] = 0.0
    return torch.as_tensor(X)


def test_the_prior_keeps_components_off_spikes():
    X = _spiky()
    g = torch.Generator().manual_seed(0)
    plain = fit_gmm(X, 3, generator=g).params
    g = torch.Generator().manual_seed(0)
    psi = X.var(0, unbiased=False)
    prior = CovariancePrior(4.0, psi)
    robust = fit_gmm(X, 3, generator=g, prior=prior).params
    smallest = lambda p: float(torch.linalg.eigvalsh(p.covariances).min())  # noqa: E731
    assert smallest(plain) < 1e-4  # plain EM puts a component on the repeated value
    # every MAP covariance is at least strength / (n_k + strength) times the prior's scale
    assert smallest(robust) > 4.0 / (300 + 4.0) * float(psi.min()) * 0.99


def test_fit_gmm_scaled_without_remedies_is_fit_gmm():
    X = _spiky()
    a = fit_gmm(X, 2, generator=torch.Generator().manual_seed(3))
    b, bics = fit_gmm_scaled(
        X, [2], standardize=False, prior_strength=None, generator=torch.Generator().manual_seed(3)
    )
    np.testing.assert_array_equal(a.params.means, b.params.means)
    np.testing.assert_array_equal(a.params.precisions_cholesky, b.params.precisions_cholesky)
    assert bics == {}


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_standardised_fits_are_equivariant_to_feature_units(covariance_type):
    """Changing the units of the features changes nothing but the units of the result.

    (Powers of two keep the standardised rows bit-identical: k-means and BIC are then
    compared on the same numbers, not on numbers a rounding apart.)"""
    X = _spiky()
    unit = torch.tensor([1024.0, 1 / 64], dtype=torch.float64)
    if covariance_type == "spherical":
        unit = torch.tensor([32.0, 32.0], dtype=torch.float64)
    shift = torch.zeros(2, dtype=torch.float64)
    settings = {"standardize": True, "prior_strength": 4.0, "prior_scale": 2.0}
    settings["covariance_type"] = covariance_type
    a, bics_a = fit_gmm_scaled(X, [1, 2, 3], generator=torch.Generator().manual_seed(0), **settings)
    b, bics_b = fit_gmm_scaled(
        X * unit + shift, [1, 2, 3], generator=torch.Generator().manual_seed(0), **settings
    )
    np.testing.assert_allclose(b.params.means, a.params.means * unit + shift, rtol=1e-8)
    np.testing.assert_allclose(b.params.weights, a.params.weights, rtol=1e-8)
    log_unit = float(unit.log().sum())
    np.testing.assert_allclose(b.lower_bounds, np.array(a.lower_bounds) - log_unit, rtol=1e-9)
    assert min(bics_a, key=bics_a.get) == min(bics_b, key=bics_b.get)
