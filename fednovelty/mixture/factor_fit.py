"""Fitting a mixture of factor analysers: the start from a partition and the EM loop.

The start is one pass over a partition (k-means labels): per component the scatter's top
``n_factors`` eigenpairs from a randomized one-pass Nystrom sketch ``sum r (x - c)(x - c)^T
Omega`` with a Gaussian ``Omega`` (n_features, n_factors + oversample)
(:func:`sketch_stats`), then probabilistic PCA's closed form (Tipping & Bishop 1999;
:func:`factor_params_from_sketch`). The sketch is summable too (:class:`SketchStats` add), so
a federation starts from the same point as one machine. :func:`fit_factor_em` runs the EM
steps of :mod:`fednovelty.mixture.factor` from a start with scikit-learn's stopping rule;
:func:`fit_mfa` is k-means, the sketch start and EM on one machine.

All functions are pure and take dtype and device from their inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from fednovelty.mixture.containers import SummableStats
from fednovelty.mixture.em import EMResult, iterate_em, moment_shift
from fednovelty.mixture.factor import (
    FactorParams,
    FactorStats,
    check_n_factors,
    check_rows,
    factor_e_step,
    factor_m_step,
    shrink_psi,
)
from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.stats import CovariancePrior


# ----------------------------------------------------------------------------- start
def sketch_matrix(n_features: int, width: int, generator: torch.Generator, like: Tensor) -> Tensor:
    """A Gaussian test matrix ``Omega`` (n_features, width) drawn in float64 on the CPU from
    ``generator`` (the same numbers on any device), then in ``like``'s dtype and device."""
    omega = torch.randn(n_features, width, generator=generator, dtype=torch.float64)
    return omega.to(like.device, like.dtype)


@dataclass(frozen=True)
class SketchStats(SummableStats):
    """Summable statistics of a partition that start a mixture of factor analysers.

    Attributes:
        counts: ``sum_i r_ik``, (n_components,).
        sums: ``sum_i r_ik (x_i - shift)``, (n_components, n_features).
        second: ``sum_i r_ik (x_i - shift)^2``, (n_components, n_features).
        sketch: ``sum_i r_ik (x_i - shift)(x_i - shift)^T Omega``,
            (n_components, n_features, width).
        shift: (n_features,).
    """

    counts: Tensor
    sums: Tensor
    second: Tensor
    sketch: Tensor
    shift: Tensor = field(repr=False)

    SUMMED = ("counts", "sums", "second", "sketch")
    SHAPED = ("sketch",)
    AXES = "(n_components, n_features, width)"
    WHAT = "sketch statistics"


def sketch_stats(X: Tensor, resp: Tensor, omega: Tensor, shift: Tensor) -> SketchStats:
    """:class:`SketchStats` of rows ``X`` (n, d) with responsibilities ``resp`` (n, K)
    (one-hot labels of a partition) and test matrix ``omega`` (d, width): O(N K d width)."""
    check_rows(X, omega.shape[0])
    n, d = X.shape
    k, p = resp.shape[1], omega.shape[1]
    centered = X - shift
    projected = centered @ omega  # (n, p)
    weighted = (resp.unsqueeze(2) * projected.unsqueeze(1)).reshape(n, k * p)
    sketch = (centered.T @ weighted).view(d, k, p).transpose(0, 1).contiguous()
    return SketchStats(resp.sum(0), resp.T @ centered, resp.T @ centered.square(), sketch, shift)


def _nystrom_eig(cov_sketch: Tensor, omega: Tensor, shift_value: Tensor) -> tuple[Tensor, Tensor]:
    """Eigenpairs of the one-pass Nystrom approximation ``Y (Omega^T Y)^+ Y^T`` of PSD
    matrices ``C_k`` from ``Y_k = C_k Omega`` (K, d, p), stabilised by the shift
    ``nu_k`` (K,) (Tropp, Yurtsever, Udell & Cevher 2017, Alg. 3, with a pseudo-inverse
    square root of the (p, p) core in place of its Cholesky factor): eigenvalues (K, p) in
    decreasing order and eigenvectors (K, d, p)."""
    Y = cov_sketch + shift_value.view(-1, 1, 1) * omega
    core = omega.T @ Y  # (K, p, p), Omega^T (C + nu I) Omega
    values, vectors = torch.linalg.eigh(0.5 * (core + core.transpose(1, 2)))
    # a pseudo-inverse square root: directions the sketch did not reach (a part with fewer
    # rows than columns, an empty part, round-off) are dropped instead of failing
    info = torch.finfo(values.dtype)
    relative = max(1e-10, 100 * info.eps)
    floor = relative * values.amax(1, keepdim=True).clamp_min(info.tiny)
    inv_sqrt = torch.where(values > floor, values.clamp_min(floor).rsqrt(), 0.0)
    E = Y @ (vectors * inv_sqrt.unsqueeze(1))
    U, S, _ = torch.linalg.svd(E, full_matrices=False)
    return (S.square() - shift_value.unsqueeze(1)).clamp_min(0), U


def factor_params_from_sketch(
    stats: SketchStats,
    omega: Tensor,
    n_factors: int,
    *,
    reg_covar: float = 1e-6,
    prior: CovariancePrior | None = None,
    isotropic: bool = False,
) -> FactorParams:
    """Per-component probabilistic PCA from summed :class:`SketchStats`.

    With ``C_k`` the component's covariance (``n_k`` weighted rows about their mean), its
    top ``n_factors`` eigenpairs ``(lambda_j, u_j)`` come from the Nystrom approximation of
    the centred sketch ``C_k Omega``; ``sigma_k^2 = (tr C_k - sum_j lambda_j) / (d - q)``
    and ``W_k = U_q diag(sqrt(max(lambda_j - sigma_k^2, 0)))`` (Tipping & Bishop's
    maximum-likelihood PPCA when the eigenpairs are exact); ``psi_k`` is ``sigma_k^2``
    (``isotropic``) or ``max(diag C_k - rowsum W_k^2, sigma_k^2 / 10)``, then as in
    :func:`~fednovelty.mixture.factor.factor_m_step` (prior, ``reg_covar``).

    Args:
        stats: summed statistics of the partition.
        omega: the test matrix the sketch was taken with, (n_features, width), width >= q.
    """
    d, width = omega.shape
    check_n_factors(n_factors, d)
    if width < n_factors:
        raise ValueError(
            f"the sketch has {width} columns; it needs at least n_factors={n_factors} "
            "(use n_factors + an oversampling of about 10)."
        )
    eps = torch.finfo(stats.counts.dtype).eps
    nk = stats.counts + 10 * eps
    mean_offset = stats.sums / nk.unsqueeze(1)
    variances = (stats.second / nk.unsqueeze(1) - mean_offset.square()).clamp_min(0)
    cov_sketch = stats.sketch / nk.view(-1, 1, 1)
    cov_sketch = cov_sketch - mean_offset.unsqueeze(2) * (mean_offset @ omega).unsqueeze(1)
    trace = variances.sum(1)
    nu = 1e-6 * trace / d + torch.finfo(trace.dtype).tiny
    values, vectors = _nystrom_eig(cov_sketch, omega, nu)
    top = values[:, :n_factors]
    sigma2 = ((trace - top.sum(1)) / (d - n_factors)).clamp_min(1e-6 * trace / d + eps)
    factors = vectors[:, :, :n_factors] * (top - sigma2.unsqueeze(1)).clamp_min(0).sqrt().unsqueeze(
        1
    )
    if isotropic:
        psi = sigma2.unsqueeze(1).expand_as(variances)
    else:
        psi = torch.maximum(variances - factors.square().sum(2), 0.1 * sigma2.unsqueeze(1))
    psi = shrink_psi(psi, nk, prior, isotropic) + reg_covar
    return FactorParams(
        nk / nk.sum(), stats.shift + mean_offset, factors.contiguous(), psi.contiguous()
    )


def factor_init(
    X: Tensor,
    resp: Tensor,
    n_factors: int,
    omega: Tensor,
    *,
    reg_covar: float = 1e-6,
    prior: CovariancePrior | None = None,
    isotropic: bool = False,
) -> FactorParams:
    """The start from a partition: :func:`factor_params_from_sketch` of
    :func:`sketch_stats` of ``X`` (n, d) with ``resp`` (n, K) about ``X``'s mean."""
    stats = sketch_stats(X, resp, omega, X.mean(0))
    return factor_params_from_sketch(
        stats, omega, n_factors, reg_covar=reg_covar, prior=prior, isotropic=isotropic
    )


# ----------------------------------------------------------------------------- EM
#: the point factor statistics are taken about: ``sum_k pi_k mu_k``, (n_features,)
#: (:func:`~fednovelty.mixture.em.moment_shift`).
factor_shift = moment_shift


def fit_factor_em(
    X: Tensor,
    init: FactorParams,
    *,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    prior: CovariancePrior | None = None,
    isotropic: bool = False,
    chunk_size: int | None = None,
) -> EMResult[FactorParams]:
    """EM from ``init`` with scikit-learn's stopping rule (``|lb_t - lb_{t-1}| < tol`` on
    the mean log-likelihood before each M-step).

    Args:
        X: rows, (n_samples, n_features).
        init: the starting mixture (``X``'s dtype and device).
        reg_covar: added to every noise variance.
        prior: optional :class:`~fednovelty.mixture.stats.CovariancePrior` on ``psi``.
        isotropic: one noise variance per component (mixtures of PPCA).
    """
    check_rows(X, init.n_features)
    if X.shape[0] < init.n_components:
        raise ValueError(
            f"X has {X.shape[0]} rows but n_components={init.n_components}; lower "
            "n_components or provide more rows."
        )

    def step(params: FactorParams) -> tuple[FactorParams, FactorStats]:
        stats = factor_e_step(X, params, factor_shift(params), chunk_size=chunk_size)
        return factor_m_step(stats, reg_covar, prior=prior, isotropic=isotropic), stats

    return iterate_em(step, init, max_iter, tol)


def fit_mfa(
    X: Tensor,
    n_components: int,
    n_factors: int,
    *,
    generator: torch.Generator,
    isotropic: bool = False,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    prior: CovariancePrior | None = None,
    oversample: int = 10,
    chunk_size: int | None = None,
) -> EMResult[FactorParams]:
    """A mixture of factor analysers (``isotropic``: of probabilistic PCA) by EM from a
    k-means partition (:func:`factor_init` with a sketch of ``n_factors + oversample``
    columns, capped at ``n_features``).

    Args:
        X: rows, (n_samples, n_features), n_samples >= n_components.
        n_components: K; n_factors: q, 1 <= q <= n_features - 1.
        generator: seeds k-means++ and the sketch.
    """
    if X.ndim != 2:
        raise ValueError(f"X must be (n_samples, n_features); got shape {tuple(X.shape)}.")
    check_n_factors(n_factors, X.shape[1])
    check_rows(X, X.shape[1])
    if X.shape[0] < n_components:
        raise ValueError(
            f"X has {X.shape[0]} rows but n_components={n_components}; lower n_components "
            "or provide more rows."
        )
    _, labels = kmeans(X, n_components, generator=generator)
    omega = sketch_matrix(X.shape[1], min(X.shape[1], n_factors + oversample), generator, X)
    init = factor_init(
        X,
        one_hot(labels, n_components, X),
        n_factors,
        omega,
        reg_covar=reg_covar,
        prior=prior,
        isotropic=isotropic,
    )
    return fit_factor_em(
        X,
        init,
        reg_covar=reg_covar,
        tol=tol,
        max_iter=max_iter,
        prior=prior,
        isotropic=isotropic,
        chunk_size=chunk_size,
    )
