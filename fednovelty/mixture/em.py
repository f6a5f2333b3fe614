"""Expectation-maximisation on one machine, built from the same statistics kernels.

Local EM is what a FedGenGMM client and the FedGenGMM server run, and what the local-only
baseline fits. Federated EM (``fednovelty.federated``) runs the same ``e_step_stats`` on each
client and the same ``params_from_stats`` on the server; with one client both reduce to this
loop, which follows scikit-learn's ``GaussianMixture.fit`` iteration for iteration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.model import MixtureParams, bic
from fednovelty.mixture.stats import SufficientStats, e_step_stats, m_step, stats_from_resp


@dataclass(frozen=True)
class EMResult:
    """Outcome of an EM run.

    Attributes:
        params: final parameters (after the last M-step).
        n_iter: EM iterations run.
        converged: whether the change in mean log-likelihood fell below ``tol``.
        lower_bounds: mean log-likelihood before each M-step, one per iteration.
    """

    params: MixtureParams
    n_iter: int
    converged: bool
    lower_bounds: list[float] = field(default_factory=list)


def moment_shift(params: MixtureParams) -> Tensor:
    """The point statistics are taken about: the mixture mean ``sum_k pi_k mu_k``, (n_features,)."""
    return params.weights @ params.means


def params_from_stats(stats: SufficientStats, reg_covar: float) -> MixtureParams:
    """M-step from (summed) statistics to parameters with Cholesky-of-precision storage."""
    weights, means, covariances = m_step(stats, reg_covar)
    return MixtureParams.from_covariances(weights, means, covariances, stats.covariance_type)


def check_n_samples(n_samples: int, n_components: int, what: str = "X") -> None:
    """Raise a ``ValueError`` if there are fewer rows than components."""
    if n_samples < n_components:
        raise ValueError(
            f"{what} has {n_samples} sample(s) but n_components={n_components}; "
            "need n_samples >= n_components. Lower n_components or provide more data."
        )


def em_step(
    X: Tensor, params: MixtureParams, reg_covar: float, chunk_size: int | None = None
) -> tuple[MixtureParams, SufficientStats]:
    """One EM iteration: E-step statistics of ``X`` (n_samples, n_features) under ``params``,
    then the M-step. Returns the new parameters and the statistics (whose
    ``log_likelihood`` is taken under the old parameters)."""
    stats = e_step_stats(
        X,
        params.weights.log(),
        params.means,
        params.precisions_cholesky,
        params.covariance_type,
        moment_shift(params),
        chunk_size,
    )
    return params_from_stats(stats, reg_covar), stats


def fit_em(
    X: Tensor,
    init: MixtureParams,
    *,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    chunk_size: int | None = None,
) -> EMResult:
    """EM from given initial parameters (scikit-learn's loop and stopping rule).

    Args:
        X: rows, shape (n_samples, n_features).
        init: initial parameters (dtype/device of ``X``).
        reg_covar, tol, max_iter: as scikit-learn's ``GaussianMixture``.

    Returns:
        ``EMResult``; ``lower_bounds[t]`` is the mean log-likelihood under the parameters
        before M-step ``t``, and convergence is ``|lb[t] - lb[t-1]| < tol``.
    """
    params = init
    lower_bounds: list[float] = []
    previous = -float("inf")
    converged = False
    for _ in range(max_iter):
        params, stats = em_step(X, params, reg_covar, chunk_size)
        lower_bound = float(stats.log_likelihood / stats.n_samples)
        lower_bounds.append(lower_bound)
        if abs(lower_bound - previous) < tol:
            converged = True
            break
        previous = lower_bound
    return EMResult(params, len(lower_bounds), converged, lower_bounds)


def kmeans_init(
    X: Tensor,
    n_components: int,
    covariance_type: str,
    *,
    reg_covar: float,
    generator: torch.Generator,
) -> MixtureParams:
    """Initial parameters from k-means labels used as hard responsibilities (sklearn's default)."""
    check_n_samples(X.shape[0], n_components)
    _, labels = kmeans(X, n_components, generator=generator)
    shift = X.mean(0)
    stats = stats_from_resp(X, one_hot(labels, n_components, X), covariance_type, shift)
    return params_from_stats(stats, reg_covar)


def fit_gmm(
    X: Tensor,
    n_components: int,
    *,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    generator: torch.Generator,
    chunk_size: int | None = None,
) -> EMResult:
    """k-means initialisation followed by EM."""
    init = kmeans_init(X, n_components, covariance_type, reg_covar=reg_covar, generator=generator)
    return fit_em(X, init, reg_covar=reg_covar, tol=tol, max_iter=max_iter, chunk_size=chunk_size)


def fit_gmm_bic(
    X: Tensor,
    candidates: Iterable[int],
    *,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    generator: torch.Generator,
) -> tuple[EMResult, dict[int, float]]:
    """Fit one mixture per candidate number of components and keep the lowest BIC.

    Candidates larger than ``n_samples`` are skipped.

    Returns:
        ``(best, bics)``: the best ``EMResult`` and the BIC of every candidate fitted.
    """
    bics: dict[int, float] = {}
    best: EMResult | None = None
    best_bic = float("inf")
    for k in candidates:
        if k > X.shape[0]:
            continue
        result = fit_gmm(
            X,
            k,
            covariance_type=covariance_type,
            reg_covar=reg_covar,
            tol=tol,
            max_iter=max_iter,
            generator=generator,
        )
        bics[k] = bic(result.params, X)
        if best is None or bics[k] < best_bic:
            best, best_bic = result, bics[k]
    if best is None:
        raise ValueError(
            f"No candidate number of components fits {X.shape[0]} sample(s); "
            "give candidates <= n_samples."
        )
    return best, bics
