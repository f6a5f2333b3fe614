"""Expectation-maximisation on one machine, built from the same statistics kernels.

Local EM is what a FedGenGMM client and the FedGenGMM server run, and what the local-only
baseline fits. Federated EM (``fednovelty.federated``) runs the same ``e_step_stats`` on each
client and the same ``params_from_stats`` on the server; with one client both reduce to this
loop, which follows scikit-learn's ``GaussianMixture.fit`` iteration for iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch
from torch import Tensor

from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.model import MixtureParams, bic
from fednovelty.mixture.scaling import affine_params, feature_moments, standardization
from fednovelty.mixture.stats import (
    CovariancePrior,
    SufficientStats,
    e_step_stats,
    m_step,
    stats_from_resp,
)

if TYPE_CHECKING:
    from fednovelty.mixture.factor import FactorParams

#: the parameter type an EM run fits (:class:`MixtureParams`, or ``FactorParams`` for
#: mixtures of factor analysers).
P = TypeVar("P")


@dataclass(frozen=True)
class EMResult(Generic[P]):
    """Outcome of an EM run (of a Gaussian mixture, or of factor analysers).

    Attributes:
        params: final parameters (after the last M-step), a :class:`MixtureParams` or a
            :class:`~fednovelty.mixture.factor.FactorParams`.
        n_iter: EM iterations run.
        converged: whether the change in mean log-likelihood fell below ``tol``.
        lower_bounds: mean log-likelihood before each M-step, one per iteration.
    """

    params: P
    n_iter: int
    converged: bool
    lower_bounds: list[float] = field(default_factory=list)


def moment_shift(params: MixtureParams | FactorParams) -> Tensor:
    """The point statistics are taken about: the mixture mean ``sum_k pi_k mu_k``, (n_features,),
    of weights (n_components,) and means (n_components, n_features)."""
    return params.weights @ params.means


def params_from_stats(
    stats: SufficientStats, reg_covar: float, prior: CovariancePrior | None = None
) -> MixtureParams:
    """M-step from (summed) statistics to parameters with Cholesky-of-precision storage
    (MAP covariances with ``prior``; see :class:`CovariancePrior`)."""
    weights, means, covariances = m_step(stats, reg_covar, prior)
    return MixtureParams.from_covariances(weights, means, covariances, stats.covariance_type)


def check_n_samples(n_samples: int, n_components: int, what: str = "X") -> None:
    """Raise a ``ValueError`` if there are fewer rows than components."""
    if n_samples < n_components:
        raise ValueError(
            f"{what} has {n_samples} sample(s) but n_components={n_components}; "
            "need n_samples >= n_components. Lower n_components or provide more data."
        )


def em_step(
    X: Tensor,
    params: MixtureParams,
    reg_covar: float,
    chunk_size: int | None = None,
    prior: CovariancePrior | None = None,
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
    return params_from_stats(stats, reg_covar, prior), stats


def iterate_bound(
    step: Callable[[P], tuple[P, float]], params: P, max_iter: int, tol: float
) -> tuple[P, int, bool, list[float]]:
    """scikit-learn's stopping rule: ``params, bound = step(params)`` at most ``max_iter``
    times, until ``|bound[t] - bound[t-1]| < tol``. Returns ``(params, n_iter, converged,
    bounds)``, the fields of :class:`EMResult` (and of the variational ``VBResult``) in
    order; ``max_iter=0`` returns ``params`` unchanged."""
    bounds: list[float] = []
    previous, converged = -math.inf, False
    for _ in range(max_iter):
        params, bound = step(params)
        bounds.append(bound)
        if abs(bound - previous) < tol:
            converged = True
            break
        previous = bound
    return params, len(bounds), converged, bounds


def iterate_em(
    step: Callable[[P], tuple[P, Any]], params: P, max_iter: int, tol: float
) -> EMResult[P]:
    """scikit-learn's EM loop: ``params, stats = step(params)`` at most ``max_iter`` times,
    until ``|lb[t] - lb[t-1]| < tol``, where ``lb[t]`` is the mean log-likelihood
    ``stats.log_likelihood / stats.n_samples`` under the parameters before update ``t``
    (the statistics of that step's E-step); :func:`iterate_bound` on ``lb``."""

    def bounded(params: P) -> tuple[P, float]:
        params, stats = step(params)
        return params, float(stats.log_likelihood / stats.n_samples)

    return EMResult(*iterate_bound(bounded, params, max_iter, tol))


def fit_em(
    X: Tensor,
    init: MixtureParams,
    *,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    chunk_size: int | None = None,
    prior: CovariancePrior | None = None,
) -> EMResult[MixtureParams]:
    """EM from given initial parameters (scikit-learn's loop and stopping rule).

    Args:
        X: rows, shape (n_samples, n_features).
        init: initial parameters (dtype/device of ``X``).
        reg_covar, tol, max_iter: as scikit-learn's ``GaussianMixture``.
        prior: optional :class:`CovariancePrior` (MAP M-steps).

    Returns:
        ``EMResult``; ``lower_bounds[t]`` is the mean log-likelihood under the parameters
        before M-step ``t``, and convergence is ``|lb[t] - lb[t-1]| < tol``.
    """
    return iterate_em(
        lambda params: em_step(X, params, reg_covar, chunk_size, prior), init, max_iter, tol
    )


def kmeans_init(
    X: Tensor,
    n_components: int,
    covariance_type: str,
    *,
    reg_covar: float,
    generator: torch.Generator,
    prior: CovariancePrior | None = None,
) -> MixtureParams:
    """Initial parameters from k-means labels used as hard responsibilities (sklearn's default)."""
    check_n_samples(X.shape[0], n_components)
    _, labels = kmeans(X, n_components, generator=generator)
    shift = X.mean(0)
    stats = stats_from_resp(X, one_hot(labels, n_components, X), covariance_type, shift)
    return params_from_stats(stats, reg_covar, prior)


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
    prior: CovariancePrior | None = None,
) -> EMResult[MixtureParams]:
    """k-means initialisation followed by EM (MAP M-steps with ``prior``)."""
    init = kmeans_init(
        X, n_components, covariance_type, reg_covar=reg_covar, generator=generator, prior=prior
    )
    return fit_em(
        X, init, reg_covar=reg_covar, tol=tol, max_iter=max_iter, chunk_size=chunk_size, prior=prior
    )


def fit_gmm_bic(
    X: Tensor,
    candidates: Iterable[int],
    *,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    generator: torch.Generator,
    prior: CovariancePrior | None = None,
) -> tuple[EMResult[MixtureParams], dict[int, float]]:
    """Fit one mixture per candidate number of components and keep the lowest BIC.

    Candidates larger than ``n_samples`` are skipped.

    Returns:
        ``(best, bics)``: the best ``EMResult`` and the BIC of every candidate fitted.
    """
    bics: dict[int, float] = {}
    best: EMResult[MixtureParams] | None = None
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
            prior=prior,
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


@dataclass(frozen=True)
class WeightsFit:
    """Result of :func:`fit_weights`.

    Attributes:
        log_weights: fitted log mixture weights, the shape of ``log_weights_init``.
        trace: weights after each iteration, (n_iter + 1, *weights shape); row 0 is the start.
        mean_log_likelihoods: mean log-likelihood of the rows before each update, (n_iter,).
        n_iter: iterations run.
        converged: whether the change in mean log-likelihood fell below ``tol``.
    """

    log_weights: Tensor
    trace: Tensor
    mean_log_likelihoods: Tensor
    n_iter: int
    converged: bool


def _weights_em(
    log_components: Tensor, log_g: Tensor, tau: float, max_iter: int, tol: float
) -> WeightsFit:
    """EM over the weights from ``log_g`` (shape K) under ``tau`` pseudo-rows spread as
    ``g`` (0: maximum likelihood); the loop of :func:`fit_weights` and
    :func:`fit_weights_map`, whose checks have run."""
    shape, n = log_g.shape, log_components.shape[0]
    log_prior_mass = log_g + math.log(tau) if tau > 0 else torch.full_like(log_g, -math.inf)
    log_w = log_g
    trace, lls = [log_w.exp()], []
    previous, converged = None, False
    for _ in range(max_iter):
        joint = (log_components + log_w).reshape(n, -1)
        log_norm = torch.logsumexp(joint, dim=1, keepdim=True)
        ll = float(log_norm.mean())
        lls.append(ll)
        objective = ll
        if tau > 0:  # every w_k with g_k > 0 is then > 0
            kept = torch.where(log_g.isneginf(), 0.0, log_w)
            objective += tau * float((log_g.exp() * kept).sum()) / n
        log_counts = torch.logsumexp(joint - log_norm, dim=0).reshape(shape)
        log_w = torch.logaddexp(log_counts, log_prior_mass) - math.log(n + tau)
        trace.append(log_w.exp())
        if previous is not None and abs(objective - previous) < tol:
            converged = True
            break
        previous = objective
    return WeightsFit(
        log_weights=log_w,
        trace=torch.stack(trace),
        mean_log_likelihoods=torch.as_tensor(lls, dtype=log_w.dtype),
        n_iter=len(lls),
        converged=converged,
    )


def fit_weights(
    log_components: Tensor,
    log_weights_init: Tensor,
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> WeightsFit:
    """EM over the mixture weights alone, every component density frozen.

    The E-step is ``q_i(k) ∝ w_k p_k(x_i)`` and the M-step ``w_k = mean_i q_i(k)``; each
    iteration cannot lower the mean log-likelihood ``mean_i log sum_k w_k p_k(x_i)``. Used to
    personalise a trained mixture to a new client without touching shared parameters.
    Components whose weight starts at zero stay at zero, so ``log_weights_init`` also fixes
    any structure the caller wants kept (e.g. the learner split of an x-only adaptation).

    Args:
        log_components: ``log p_k(x_i)``, shape (n_samples, *K) for any component shape K
            (e.g. (M1,) or (M1, M2)); broadcasting over trailing size-1 axes is allowed.
        log_weights_init: starting log weights, shape K, summing to one in probability.
        max_iter: maximum iterations (>= 1).
        tol: stop when the mean log-likelihood changes by less than this.

    Returns:
        :class:`WeightsFit`; ``log_weights`` has the shape of ``log_weights_init``.
    """
    if log_components.ndim < 1 or log_components.shape[0] == 0:
        raise ValueError("fit_weights needs at least one row in log_components.")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}.")
    return _weights_em(log_components, log_weights_init, 0.0, max_iter, tol)


def check_prior_rows(prior_rows) -> float:
    """``prior_rows`` as a float, or a ``ValueError`` saying what is accepted."""
    if (
        isinstance(prior_rows, bool)
        or not isinstance(prior_rows, Real)
        or not math.isfinite(prior_rows)
        or prior_rows < 0
    ):
        raise ValueError(
            f"prior_rows must be a finite number >= 0 (pseudo-rows of the Dirichlet prior "
            f"centred on the global weights; 0 is maximum likelihood); got {prior_rows!r}."
        )
    return float(prior_rows)


def fit_weights_map(
    log_components: Tensor,
    log_prior_weights: Tensor,
    prior_rows: float,
    *,
    max_iter: int = 100,
    tol: float = 1e-6,
) -> WeightsFit:
    """Mixture weights by MAP EM under a Dirichlet prior centred on ``g``, every component
    density frozen.

    The prior on ``w`` is ``Dirichlet(1 + prior_rows * g)`` with ``g = exp(log_prior_weights)``
    (a new client's global weights): ``prior_rows`` pseudo-rows spread as ``g``. EM from
    ``g`` maximises ``sum_i log sum_k w_k p_k(x_i) + prior_rows * sum_k g_k log w_k``; its
    M-step is ``w_k = (sum_i q_i(k) + prior_rows * g_k) / (n + prior_rows)`` with
    ``q_i(k) ∝ w_k p_k(x_i)``. So ``n`` rows move the weights by at most
    ``n / (n + prior_rows)`` of the way to their own maximum-likelihood weights: 5 rows
    against 10 pseudo-rows a third of the way, 500 rows 98 %. ``prior_rows = 0`` is
    maximum likelihood (:func:`fit_weights`). Components of weight 0 in
    ``g`` stay at 0 (an x-only adaptation keeps the learner split within each Gaussian).

    Args:
        log_components: ``log p_k(x_i)``, shape (n_samples, *K) (e.g. (n, M1) or
            (n, M1, M2)); trailing size-1 axes broadcast against the weights.
        log_prior_weights: ``log g``, shape K, summing to one in probability; the start.
        prior_rows: the prior's strength in pseudo-rows, a finite number >= 0.
        max_iter: maximum iterations (>= 1).
        tol: stop when the penalised objective per row changes by less than this.

    Returns:
        :class:`WeightsFit`; ``mean_log_likelihoods`` are the rows' mean
        log-likelihoods (without the prior) before each update.
    """
    tau = check_prior_rows(prior_rows)
    if log_components.ndim < 1 or log_components.shape[0] == 0:
        raise ValueError("fit_weights_map needs at least one row in log_components.")
    if isinstance(max_iter, bool) or not isinstance(max_iter, Integral) or max_iter < 1:
        raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}.")
    total = float(torch.logsumexp(log_prior_weights.reshape(-1), dim=0).exp())
    if not math.isfinite(total) or abs(total - 1.0) > 1e-6:
        raise ValueError(
            f"log_prior_weights must be log-probabilities summing to 1; they sum to {total:.6g} "
            "in probability. Pass the global weights' logarithm."
        )
    return _weights_em(log_components, log_prior_weights, tau, max_iter, tol)


def prior_target(variance: Tensor, scale: Tensor, prior_scale: float) -> Tensor:
    """The :class:`CovariancePrior` target variances in working units ``z = x / scale``:
    ``prior_scale`` times each feature's variance ``variance / scale^2`` (both
    (n_features,)). A feature without spread (variance 0) gets the mean target of the
    others (1 times ``prior_scale`` if every feature is constant)."""
    working = variance / scale.square()
    live = working > 0
    fill = working[live].mean() if bool(live.any()) else working.new_tensor(1.0)
    return prior_scale * torch.where(live, working, fill)


def fit_gmm_scaled(
    X: Tensor,
    candidates: Iterable[int],
    *,
    standardize: bool,
    prior_strength: float | None,
    prior_scale: float = 1.0,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    generator: torch.Generator,
) -> tuple[EMResult[MixtureParams], dict[int, float]]:
    """:func:`fit_gmm_bic` on standardised rows, with a covariance prior, mapped back.

    With ``standardize`` the rows are fitted as ``z = (X - mean) / sd`` (scaling from
    ``X``'s own moments; see :func:`fednovelty.mixture.scaling.standardization`), so
    k-means, ``reg_covar`` and the prior see every feature on one scale. With
    ``prior_strength`` (pseudo-rows; ``None`` for none) every M-step is MAP towards
    ``prior_scale`` times the variance of each feature. The result is returned in ``X``'s
    units: parameters by :func:`~fednovelty.mixture.scaling.affine_params`, ``lower_bounds``
    and BICs shifted by the log-Jacobian, so they are those of ``X``.

    Returns:
        ``(best, bics)`` as :func:`fit_gmm_bic` (one candidate: a plain fit).
    """
    moments = feature_moments(X)
    if standardize:
        offset, scale = standardization(moments, covariance_type)
    else:
        offset, scale = torch.zeros_like(moments.mean), torch.ones_like(moments.mean)
    Z = (X - offset) / scale if standardize else X
    prior = None
    if prior_strength is not None:
        prior = CovariancePrior(
            float(prior_strength), prior_target(moments.variance, scale, prior_scale)
        )
    settings = {
        "covariance_type": covariance_type,
        "reg_covar": reg_covar,
        "tol": tol,
        "max_iter": max_iter,
        "generator": generator,
        "prior": prior,
    }
    candidates = list(candidates)
    if len(candidates) == 1:
        result, bics = fit_gmm(Z, candidates[0], **settings), {}
    else:
        result, bics = fit_gmm_bic(Z, candidates, **settings)
    if not standardize:
        return result, bics
    log_jacobian = float(scale.log().sum())
    n = X.shape[0]
    result = EMResult(
        affine_params(result.params, offset, scale),
        result.n_iter,
        result.converged,
        [lb - log_jacobian for lb in result.lower_bounds],
    )
    return result, {k: v + 2 * n * log_jacobian for k, v in bics.items()}
