"""Mixtures of factor analysers (``fednovelty.mixture.factor``) against independent references.

References: scipy's dense ``multivariate_normal`` on the materialised covariance, posterior
moments of the latent factors written out in numpy from the dense covariance, scikit-learn's
``FactorAnalysis`` (one component) and ``PCA.score`` (probabilistic PCA's log-likelihood),
numpy's eigendecomposition for the start, and the statistics of the pooled rows for any split.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal
from sklearn.decomposition import PCA, FactorAnalysis

from fednovelty.mixture import CovariancePrior, score_samples
from fednovelty.mixture.factor import (
    FactorParams,
    affine_factor_params,
    factor_e_step,
    factor_log_prob,
    factor_m_step,
    factor_score_samples,
    n_factor_parameters,
)
from fednovelty.mixture.factor_fit import (
    factor_init,
    factor_params_from_sketch,
    fit_factor_em,
    fit_mfa,
    sketch_matrix,
    sketch_stats,
)
from fednovelty.mixture.kmeans import one_hot

DT = torch.float64


def random_params(seed: int, k: int = 3, d: int = 6, q: int = 2, isotropic: bool = False):
    gen = torch.Generator().manual_seed(seed)
    weights = torch.rand(k, generator=gen, dtype=DT) + 0.5
    psi = torch.rand(k, d, generator=gen, dtype=DT) + 0.2
    if isotropic:
        psi = psi[:, :1].expand(k, d).contiguous()
    return FactorParams(
        weights / weights.sum(),
        3 * torch.randn(k, d, generator=gen, dtype=DT),
        torch.randn(k, d, q, generator=gen, dtype=DT),
        psi,
    )


def sample_rows(params: FactorParams, n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    z = torch.multinomial(params.weights, n, replacement=True, generator=gen)
    latent = torch.randn(n, params.n_factors, generator=gen, dtype=DT)
    noise = torch.randn(n, params.n_features, generator=gen, dtype=DT) * params.psi[z].sqrt()
    return params.means[z] + torch.einsum("ndq,nq->nd", params.factors[z], latent) + noise


def dense_log_prob(X: torch.Tensor, params: FactorParams) -> np.ndarray:
    cov = (params.factors @ params.factors.transpose(1, 2)).numpy() + np.stack(
        [np.diag(p) for p in params.psi.numpy()]
    )
    return np.stack(
        [
            multivariate_normal(params.means[k].numpy(), cov[k]).logpdf(X.numpy())
            for k in range(params.n_components)
        ],
        axis=1,
    )


@pytest.mark.parametrize(("d", "q"), [(6, 2), (5, 4), (7, 1)])
def test_woodbury_log_density_equals_the_dense_gaussian(d, q):
    params = random_params(0, d=d, q=q)
    X = 2 * torch.randn(300, d, generator=torch.Generator().manual_seed(1), dtype=DT) + 1.0
    reference = dense_log_prob(X, params)
    got = factor_log_prob(X, params, chunk_size=37).numpy()  # several chunks
    np.testing.assert_allclose(got, reference, rtol=1e-10, atol=1e-10 * np.abs(reference).max())
    mixture = np.log(params.weights.numpy()) + reference
    np.testing.assert_allclose(
        factor_score_samples(X, params).numpy(), np.logaddexp.reduce(mixture, axis=1), rtol=1e-10
    )


def test_materialised_mixture_scores_as_the_library_full_mixture():
    params = random_params(2)
    X = sample_rows(params, 200, 3)
    full = params.to_mixture_params()
    assert full.covariance_type == "full"
    np.testing.assert_allclose(
        score_samples(full, X).numpy(), factor_score_samples(X, params).numpy(), rtol=1e-10
    )


def test_e_step_statistics_equal_the_dense_posterior_moments():
    params = random_params(4, k=2, d=5, q=2)
    X = sample_rows(params, 120, 5)
    shift = torch.tensor([0.3, -1.0, 2.0, 0.0, 0.5], dtype=DT)
    stats = factor_e_step(X, params, shift, chunk_size=50)
    # by hand: resp from the dense densities, E[z|x] = W^T Sigma^{-1}(x - mu),
    # Cov[z|x] = I - W^T Sigma^{-1} W
    x, c = X.numpy(), shift.numpy()
    log_joint = dense_log_prob(X, params) + np.log(params.weights.numpy())
    resp = np.exp(log_joint - np.logaddexp.reduce(log_joint, axis=1, keepdims=True))
    for k in range(2):
        W, mu = params.factors[k].numpy(), params.means[k].numpy()
        sigma = W @ W.T + np.diag(params.psi[k].numpy())
        beta = W.T @ np.linalg.inv(sigma)
        ez = (x - mu) @ beta.T
        post = np.eye(2) - beta @ W
        r = resp[:, k]
        np.testing.assert_allclose(stats.counts[k].item(), r.sum(), rtol=1e-10)
        np.testing.assert_allclose(stats.sums[k].numpy(), r @ (x - c), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(stats.second[k].numpy(), r @ (x - c) ** 2, rtol=1e-9)
        np.testing.assert_allclose(
            stats.xz[k].numpy(), (x - c).T @ (r[:, None] * ez), rtol=1e-9, atol=1e-8
        )
        np.testing.assert_allclose(stats.sum_z[k].numpy(), r @ ez, rtol=1e-9, atol=1e-9)
        zz = (r[:, None] * ez).T @ ez + r.sum() * post
        np.testing.assert_allclose(stats.zz[k].numpy(), zz, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        stats.log_likelihood.item(), np.logaddexp.reduce(log_joint, axis=1).sum(), rtol=1e-12
    )


def test_statistics_of_a_split_sum_to_those_of_the_whole():
    params = random_params(6)
    X = sample_rows(params, 250, 7)
    shift = params.weights @ params.means
    whole = factor_e_step(X, params, shift)
    order = torch.randperm(250, generator=torch.Generator().manual_seed(8))
    parts = [X[order[:17]], X[order[17:17]], X[order[17:140]], X[order[140:]]]  # one empty
    summed = factor_e_step(parts[0], params, shift)
    for part in parts[1:]:
        summed = summed + factor_e_step(part, params, shift)
    for name, value in whole.tensors().items():
        scale = value.abs().max().clamp_min(1.0)
        torch.testing.assert_close(getattr(summed, name), value, rtol=0, atol=1e-10 * scale)
    # and so the M-step of the sum is that of the whole
    a, b = factor_m_step(summed), factor_m_step(whole)
    for name, value in b.tensors().items():
        torch.testing.assert_close(getattr(a, name), value, rtol=1e-9, atol=1e-9)


def test_statistics_about_other_shifts_do_not_merge():
    params = random_params(6)
    X = sample_rows(params, 20, 7)
    a = factor_e_step(X, params, torch.zeros(6, dtype=DT))
    b = factor_e_step(X, params, torch.ones(6, dtype=DT))
    with pytest.raises(ValueError, match="different shifts"):
        _ = a + b


def fa_data(seed: int = 0, n: int = 2000, d: int = 8, q: int = 2):
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, q))
    psi = rng.uniform(0.1, 1.0, size=d)
    return (
        rng.normal(size=(n, q)) @ W.T
        + rng.normal(size=(n, d)) * np.sqrt(psi)
        + 5 * rng.normal(size=d)
    )


def test_one_component_equals_sklearn_factor_analysis():
    X = fa_data()
    fa = FactorAnalysis(2, tol=1e-8, max_iter=5000, svd_method="lapack").fit(X)
    at_sklearn = FactorParams(
        torch.ones(1, dtype=DT),
        torch.as_tensor(fa.mean_)[None],
        torch.as_tensor(fa.components_.T.copy())[None],
        torch.as_tensor(fa.noise_variance_)[None],
    )
    Xt = torch.as_tensor(X)
    np.testing.assert_allclose(
        factor_score_samples(Xt, at_sklearn).numpy(), fa.score_samples(X), rtol=1e-10
    )
    ours = fit_mfa(
        Xt,
        1,
        2,
        generator=torch.Generator().manual_seed(0),
        reg_covar=0.0,
        tol=1e-10,
        max_iter=2000,
    )
    mean_ll = float(factor_score_samples(Xt, ours.params).mean())
    assert abs(mean_ll - fa.score(X)) < 1e-7 * abs(fa.score(X))
    # the same model up to a rotation of the factors: covariances and means agree
    np.testing.assert_allclose(
        ours.params.covariances()[0].numpy(), fa.get_covariance(), rtol=1e-3, atol=1e-3
    )
    np.testing.assert_allclose(ours.params.means[0].numpy(), fa.mean_, atol=1e-8)


def test_isotropic_noise_equals_probabilistic_pca():
    X = fa_data(seed=1, d=7, q=3)
    ours = fit_mfa(
        torch.as_tensor(X),
        1,
        3,
        generator=torch.Generator().manual_seed(0),
        isotropic=True,
        reg_covar=0.0,
        tol=1e-11,
        max_iter=3000,
    )
    psi = ours.params.psi[0]
    torch.testing.assert_close(psi, psi[:1].expand_as(psi), rtol=1e-12, atol=0.0)
    reference = PCA(3).fit(X).score(X)  # PPCA's mean log-likelihood at its ML parameters
    assert abs(ours.lower_bounds[-1] - reference) < 1e-6 * abs(reference)


@pytest.mark.parametrize("isotropic", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_em_never_decreases_the_log_likelihood(isotropic, seed):
    truth = random_params(seed, k=3, d=6, q=2, isotropic=isotropic)
    X = sample_rows(truth, 400, seed + 10)
    result = fit_mfa(
        X,
        3,
        2,
        generator=torch.Generator().manual_seed(seed),
        isotropic=isotropic,
        reg_covar=0.0,
        tol=0.0,
        max_iter=60,
    )
    lb = np.asarray(result.lower_bounds)
    assert result.n_iter == 60 and lb[-1] > lb[0]
    assert np.diff(lb).min() >= -1e-10 * np.abs(lb).max()


def test_many_factors_equal_the_dense_density_and_still_fit():
    d = 5
    truth = random_params(3, k=2, d=d, q=d - 1)
    X = sample_rows(truth, 600, 4)
    result = fit_mfa(X, 2, d - 1, generator=torch.Generator().manual_seed(0), max_iter=30)
    np.testing.assert_allclose(
        factor_log_prob(X, result.params).numpy(), dense_log_prob(X, result.params), rtol=1e-9
    )
    assert np.isfinite(result.lower_bounds).all()


def test_prior_gives_the_map_noise_closed_form():
    params = random_params(5, k=2)
    X = sample_rows(params, 80, 6)
    stats = factor_e_step(X, params, params.weights @ params.means)
    scale = torch.linspace(0.5, 3.0, 6, dtype=DT)
    ml = factor_m_step(stats, reg_covar=0.0)
    strength = 7.0
    nk = stats.counts.unsqueeze(1)
    expected = (nk * ml.psi + strength * scale) / (nk + strength)
    got = factor_m_step(stats, reg_covar=0.0, prior=CovariancePrior(strength, scale))
    torch.testing.assert_close(got.psi, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.factors, ml.factors)  # the prior acts on psi only
    iso = factor_m_step(
        stats, reg_covar=0.0, prior=CovariancePrior(strength, scale), isotropic=True
    )
    expected = (nk * ml.psi.mean(1, keepdim=True) + strength * scale.mean()) / (nk + strength)
    torch.testing.assert_close(iso.psi, expected.expand(2, 6), rtol=1e-10, atol=1e-12)


def test_full_width_sketch_start_is_probabilistic_pca_of_each_part():
    """With a sketch as wide as the rows, Nystrom is exact: the start is Tipping & Bishop's
    closed form on each part's covariance (numpy's eigendecomposition)."""
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(300, 6, generator=gen, dtype=DT) @ torch.randn(6, 6, generator=gen, dtype=DT)
    labels = (X[:, 0] > 0).long()
    omega = sketch_matrix(6, 6, gen, X)
    q = 2
    start = factor_init(X, one_hot(labels, 2, X), q, omega, reg_covar=0.0, isotropic=True)
    for k in range(2):
        rows = X[labels == k].numpy()
        cov = np.cov(rows, rowvar=False, bias=True)
        values, vectors = np.linalg.eigh(cov)
        values, vectors = values[::-1], vectors[:, ::-1]
        sigma2 = values[q:].mean()
        W = vectors[:, :q] * np.sqrt(values[:q] - sigma2)
        np.testing.assert_allclose(
            start.covariances()[k].numpy(), W @ W.T + sigma2 * np.eye(6), rtol=1e-8, atol=1e-8
        )
        np.testing.assert_allclose(start.means[k].numpy(), rows.mean(0), atol=1e-10)
        assert start.weights[k].item() == pytest.approx(len(rows) / 300, rel=1e-12)


def test_sketch_statistics_of_a_split_sum_to_the_whole():
    gen = torch.Generator().manual_seed(1)
    X = torch.randn(90, 5, generator=gen, dtype=DT)
    resp = one_hot(torch.randint(0, 3, (90,), generator=gen), 3, X)
    omega, shift = sketch_matrix(5, 4, gen, X), X[:5].mean(0)
    whole = sketch_stats(X, resp, omega, shift)
    split = sketch_stats(X[:30], resp[:30], omega, shift) + sketch_stats(
        X[30:], resp[30:], omega, shift
    )
    for name in ("counts", "sums", "second", "sketch"):
        a, b = getattr(split, name), getattr(whole, name)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * float(b.abs().max()))
    start = factor_params_from_sketch(whole, omega, 2)
    assert start.factors.shape == (3, 5, 2) and bool((start.psi > 0).all())


def test_affine_map_shifts_the_log_density_by_the_jacobian():
    params = random_params(7)
    Z = sample_rows(params, 50, 8)
    offset, scale = torch.linspace(-2, 2, 6, dtype=DT), torch.linspace(0.5, 4, 6, dtype=DT)
    mapped = affine_factor_params(params, offset, scale)
    np.testing.assert_allclose(
        factor_score_samples(offset + scale * Z, mapped).numpy(),
        factor_score_samples(Z, params).numpy() - float(scale.log().sum()),
        rtol=1e-10,
    )


def test_fit_from_a_given_start_is_deterministic_and_float32_runs():
    truth = random_params(9)
    X = sample_rows(truth, 300, 10)
    a = fit_factor_em(X, truth, max_iter=5, tol=0.0)
    b = fit_factor_em(X, truth, max_iter=5, tol=0.0)
    assert a.lower_bounds == b.lower_bounds
    X32 = X.float()
    r = fit_mfa(X32, 3, 2, generator=torch.Generator().manual_seed(0), max_iter=10)
    assert r.params.means.dtype == torch.float32 and np.isfinite(r.lower_bounds).all()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda X: fit_mfa(X, 2, 6, generator=torch.Generator()), "n_factors <= n_features - 1"),
        (lambda X: fit_mfa(X, 2, 0, generator=torch.Generator()), "n_factors must be an integer"),
        (lambda X: fit_mfa(X[:1], 2, 2, generator=torch.Generator()), "lower n_components"),
        (lambda X: factor_log_prob(X[:, :4], random_params(0)), r"shape \(n_samples, 6\)"),
        (lambda X: factor_log_prob(X * float("nan"), random_params(0)), "NaN or infinite"),
        (
            lambda X: FactorParams(
                torch.ones(1, dtype=DT),
                X[:1],
                torch.zeros(1, 6, 2, dtype=DT),
                torch.zeros(1, 6, dtype=DT),
            ),
            "increase reg_covar",
        ),
        (
            lambda X: FactorParams(
                torch.ones(1, dtype=DT),
                X[:1],
                torch.zeros(1, 5, 2, dtype=DT),
                torch.ones(1, 6, dtype=DT),
            ),
            r"factors must be \(n_components, n_features, n_factors\)",
        ),
    ],
)
def test_bad_input_is_named(call, match):
    X = torch.randn(20, 6, generator=torch.Generator().manual_seed(0), dtype=DT)
    with pytest.raises(ValueError, match=match):
        call(X)


def test_a_start_with_an_empty_or_tiny_part_stays_finite():
    gen = torch.Generator().manual_seed(3)
    X = torch.randn(40, 30, generator=gen, dtype=DT)
    labels = torch.zeros(40, dtype=torch.long)
    labels[:3] = 1  # three rows for a 15-column sketch; part 2 empty
    omega = sketch_matrix(30, 15, gen, X)
    for dtype in (DT, torch.float32):
        start = factor_init(
            X.to(dtype), one_hot(labels, 3, X.to(dtype)), 5, omega.to(dtype), reg_covar=1e-6
        )
        for value in start.tensors().values():
            assert bool(torch.isfinite(value).all())
        assert bool((start.psi > 0).all())
        result = fit_factor_em(X.to(dtype), start, max_iter=3)
        assert np.isfinite(result.lower_bounds).all()


def test_free_parameters_counted_by_hand():
    # K=2, d=4, q=1: means 4, loadings 4 (no rotation freedom), noise 4 (or 1); weights 1
    assert n_factor_parameters(2, 4, 1, isotropic=False) == 2 * 12 + 1
    assert n_factor_parameters(2, 4, 1, isotropic=True) == 2 * 9 + 1
    # q=2: loadings 8 less one rotation angle
    assert n_factor_parameters(1, 4, 2, isotropic=False) == 4 + 7 + 4


def test_far_rows_get_the_dense_density_or_minus_inf_never_nan():
    """Rows so far out that the Woodbury difference ``e^T Psi^-1 e - |u|^2`` overflows
    (inf - inf) are taken again at a scale where it does not: the log-density matches the
    dense covariance's where that is finite and is -inf beyond, never NaN."""
    params = random_params(5, k=2, d=4, q=2)
    far = torch.tensor([[1e150, -1e150, 1e150, 0.0], [1.3e154] * 4], dtype=DT)
    out = factor_log_prob(far, params)
    assert not torch.isnan(out).any()
    reference = dense_log_prob(far[[0, 0]], params)[0]  # scipy squeezes a single row
    assert np.isfinite(reference).all()
    np.testing.assert_allclose(out[0].numpy(), reference, rtol=1e-9)
    assert torch.isinf(out[1]).all() and bool((out[1] < 0).all())
    assert not torch.isnan(factor_score_samples(far, params)).any()
