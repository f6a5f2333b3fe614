"""The Gaussian copula with mixture marginals (``fednovelty.mixture.copula``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from fednovelty.mixture import MixtureParams, precisions_cholesky_from_covariances
from fednovelty.mixture.copula import (
    CLIP,
    copula_score_samples,
    fit_marginals,
    marginal_log_pdf_cdf,
    normal_scores,
)

DT = torch.float64


def one_feature(weights, means, sds) -> MixtureParams:
    """A 1-D mixture with the given weights, means and standard deviations."""
    sds = torch.tensor(sds, dtype=DT)
    return MixtureParams(
        torch.tensor(weights, dtype=DT),
        torch.tensor(means, dtype=DT).unsqueeze(1),
        (1 / sds).reshape(-1, 1, 1),
        "full",
    )


def gaussian(mean, cov) -> MixtureParams:
    """One full-covariance Gaussian as a mixture."""
    cov = torch.as_tensor(cov, dtype=DT)
    return MixtureParams(
        torch.ones(1, dtype=DT),
        torch.as_tensor(mean, dtype=DT).unsqueeze(0),
        precisions_cholesky_from_covariances(cov.unsqueeze(0), "full"),
        "full",
    )


def test_marginal_pdf_and_both_tails_match_scipy() -> None:
    marginal = one_feature([0.3, 0.7], [-2.0, 1.0], [0.5, 2.0])
    x = torch.linspace(-40, 40, 161, dtype=DT)
    log_f, log_cdf, log_sf = marginal_log_pdf_cdf(marginal, x)
    xs = x.numpy()
    pdf = 0.3 * stats.norm.pdf(xs, -2, 0.5) + 0.7 * stats.norm.pdf(xs, 1, 2)
    log_cdf_ref = np.logaddexp(
        np.log(0.3) + stats.norm.logcdf(xs, -2, 0.5), np.log(0.7) + stats.norm.logcdf(xs, 1, 2)
    )
    log_sf_ref = np.logaddexp(
        np.log(0.3) + stats.norm.logsf(xs, -2, 0.5), np.log(0.7) + stats.norm.logsf(xs, 1, 2)
    )
    np.testing.assert_allclose(log_f.exp().numpy(), pdf, rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(log_cdf.numpy(), log_cdf_ref, rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(log_sf.numpy(), log_sf_ref, rtol=1e-9, atol=1e-14)
    assert torch.isfinite(log_cdf).all() and torch.isfinite(log_sf).all()  # no tail underflows


def test_gaussian_marginals_give_z_scores_and_the_gaussian_density() -> None:
    """With one-component marginals N(m_j, s_j^2) the scores are z-scores, and a Gaussian
    joint with correlation R gives the multivariate normal with covariance S R S."""
    m, s = np.array([1.0, -3.0, 0.5]), np.array([2.0, 0.5, 1.5])
    marginals = [one_feature([1.0], [m[j]], [s[j]]) for j in range(3)]
    R = np.array([[1.0, 0.6, -0.2], [0.6, 1.0, 0.3], [-0.2, 0.3, 1.0]])
    X = torch.as_tensor(np.random.default_rng(0).normal(size=(50, 3)) * s + m)
    U, log_jacobian = normal_scores(marginals, X)
    np.testing.assert_allclose(U.numpy(), (X.numpy() - m) / s, atol=1e-9)
    np.testing.assert_allclose(log_jacobian.numpy(), -np.log(s).sum(), atol=1e-9)
    log_p = copula_score_samples(marginals, gaussian(np.zeros(3), R), X)
    reference = stats.multivariate_normal(m, np.diag(s) @ R @ np.diag(s)).logpdf(X.numpy())
    np.testing.assert_allclose(log_p.numpy(), reference, rtol=1e-9)


def test_independent_joint_gives_the_product_of_the_marginals() -> None:
    marginals = [one_feature([0.5, 0.5], [-1.0, 2.0], [0.3, 1.0]), one_feature([1.0], [0], [3])]
    X = torch.as_tensor(np.random.default_rng(1).normal(size=(40, 2)) * 2)
    log_p = copula_score_samples(marginals, gaussian(np.zeros(2), np.eye(2)), X)
    product = sum(marginal_log_pdf_cdf(marginals[j], X[:, j])[0] for j in range(2))
    np.testing.assert_allclose(log_p.numpy(), product.numpy(), rtol=1e-9)


def test_copula_density_integrates_to_one() -> None:
    """Skewed, bimodal marginals and a two-component joint: a proper density in x."""
    marginals = [one_feature([0.4, 0.6], [-2.0, 1.0], [0.5, 1.0]), one_feature([1.0], [0], [1])]
    joint = MixtureParams(
        torch.tensor([0.5, 0.5], dtype=DT),
        torch.tensor([[-1.0, -1.0], [1.0, 1.0]], dtype=DT),
        precisions_cholesky_from_covariances(
            torch.tensor([[[0.5, 0.2], [0.2, 0.5]], [[0.5, -0.2], [-0.2, 0.5]]], dtype=DT), "full"
        ),
        "full",
    )
    grid = torch.linspace(-8, 8, 641, dtype=DT)
    xx, yy = torch.meshgrid(grid, grid, indexing="ij")
    X = torch.stack([xx.reshape(-1), yy.reshape(-1)], 1)
    mass = copula_score_samples(marginals, joint, X).exp().sum() * (grid[1] - grid[0]) ** 2
    assert float(mass) == pytest.approx(1.0, abs=1e-3)


def test_far_tails_stay_finite_and_ranked() -> None:
    marginals = [one_feature([1.0], [0.0], [1.0])]
    x = torch.tensor([[0.0], [7.0], [50.0], [1e6], [-1e6]], dtype=DT)
    U, log_jacobian = normal_scores(marginals, x)
    assert torch.isfinite(U).all() and torch.isfinite(log_jacobian).all()
    assert float(U.abs().max()) == CLIP
    log_p = copula_score_samples(marginals, gaussian([0.0], [[1.0]]), x)
    assert torch.isfinite(log_p).all()
    assert log_p[0] > log_p[1] > log_p[2] > log_p[3]  # farther out, less dense


def test_fit_marginals_follows_each_column_and_survives_a_constant_one() -> None:
    rng = np.random.default_rng(0)
    X = np.column_stack(
        [
            np.concatenate([rng.normal(-4, 1, 400), rng.normal(2, 1.5, 600)]),  # bimodal
            rng.exponential(2.0, 1000),  # skewed
            np.full(1000, 7.0),  # constant
            rng.integers(0, 2, 1000).astype(float),  # two values only
        ]
    )
    marginals = fit_marginals(
        torch.as_tensor(X), 5, prior_scale=4.0, generator=torch.Generator().manual_seed(0)
    )
    assert [m.n_features for m in marginals] == [1, 1, 1, 1]
    assert [m.n_components for m in marginals] == [5, 5, 1, 2]
    U, log_jacobian = normal_scores(marginals, torch.as_tensor(X))
    assert torch.isfinite(U).all() and torch.isfinite(log_jacobian).all()
    # the scores of a fitted continuous column are close to standard normal (the prior's
    # 3 pseudo-rows widen each component a little), and increase with the column
    for j in (0, 1):
        u = U[:, j].numpy()
        assert abs(u.mean()) < 0.1 and abs(u.std() - 1) < 0.1
        assert stats.kstest(u, "norm").statistic < 0.1
        assert (np.diff(u[np.argsort(X[:, j])]) >= 0).all()


def test_normal_scores_reject_another_width() -> None:
    marginals = [one_feature([1.0], [0.0], [1.0])] * 2
    with pytest.raises(ValueError, match=r"shape \(n_samples, 2\)"):
        normal_scores(marginals, torch.zeros(4, 3, dtype=DT))
    with pytest.raises(ValueError, match="one feature"):
        normal_scores([gaussian([0.0, 0.0], np.eye(2))], torch.zeros(4, 1, dtype=DT))
