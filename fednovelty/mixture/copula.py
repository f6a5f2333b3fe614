"""A Gaussian copula with 1-D mixture marginals: normal scores, Jacobian, density.

Each feature ``x_j`` goes through its own fitted 1-D Gaussian mixture ``f_j`` (CDF ``F_j``)
to a normal score ``u_j = Phi^-1(F_j(x_j))``; a joint mixture ``p_u`` models the scores, and
the change of variables gives the density of ``x``::

    log p(x) = log p_u(u) + sum_j [log f_j(x_j) - log phi(u_j)]

The marginals carry each feature's shape (skew, several modes, long tails) and the joint
mixture its dependence on the others. Every marginal is a ``MixtureParams`` with one
feature, so the model is two kinds of ordinary mixture parameters and travels, and is
stored, like any other. All functions are pure; dtype and device come from the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from fednovelty.mixture.em import fit_gmm_scaled
from fednovelty.mixture.model import MixtureParams, score_samples

#: Normal scores are clipped to ``[-CLIP, CLIP]``: past it ``Phi`` is 1 in float64 up to
#: rounding, and the marginal density (in the Jacobian) still ranks the far tail.
CLIP = 8.0
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _one_feature_parts(marginal: MixtureParams) -> tuple[Tensor, Tensor, Tensor]:
    """``(log weights, means, standard deviations)``, each (K,), of a 1-D mixture."""
    if marginal.n_features != 1:
        raise ValueError(f"a marginal must have one feature, got {marginal.n_features}.")
    if marginal.covariance_type == "tied":
        sd = (1 / marginal.precisions_cholesky.reshape(())).expand(marginal.n_components)
    else:
        sd = 1 / marginal.precisions_cholesky.reshape(-1)
    return marginal.weights.log(), marginal.means[:, 0], sd


def marginal_log_pdf_cdf(marginal: MixtureParams, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(log f(x), log F(x), log (1 - F(x)))`` of a 1-D mixture at values ``x`` (n,).

    The two tails are computed separately (``log_ndtr`` of each component), so neither
    underflows to ``-inf`` or rounds to 0 in the other's tail.
    """
    log_w, mean, sd = _one_feature_parts(marginal)
    z = (x.unsqueeze(1) - mean) / sd  # (n, K)
    log_f = torch.logsumexp(log_w - 0.5 * z.square() - sd.log() - _HALF_LOG_2PI, dim=1)
    log_cdf = torch.logsumexp(log_w + torch.special.log_ndtr(z), dim=1)
    log_sf = torch.logsumexp(log_w + torch.special.log_ndtr(-z), dim=1)
    return log_f, log_cdf, log_sf


def normal_scores(marginals: Sequence[MixtureParams], X: Tensor) -> tuple[Tensor, Tensor]:
    """Normal scores of ``X`` (n, d) and the log-Jacobian of the map ``x -> u``.

    Args:
        marginals: ``d`` one-feature mixtures, ``marginals[j]`` for column ``j``.
        X: rows to transform, (n, d).

    Returns:
        ``(U, log_jacobian)``: ``U`` (n, d) with ``u_j = Phi^-1(F_j(x_j))``, taken from the
        nearer tail and clipped at ``+-CLIP``; ``log_jacobian`` (n,) is
        ``sum_j log f_j(x_j) - log phi(u_j)``.
    """
    if X.ndim != 2 or X.shape[1] != len(marginals):
        raise ValueError(
            f"X must have shape (n_samples, {len(marginals)}) to match the marginals, "
            f"got {tuple(X.shape)}."
        )
    columns, log_jacobian = [], X.new_zeros(X.shape[0])
    for j, marginal in enumerate(marginals):
        log_f, log_cdf, log_sf = marginal_log_pdf_cdf(marginal, X[:, j])
        u = torch.where(
            log_cdf < log_sf,
            torch.special.ndtri(log_cdf.exp()),
            -torch.special.ndtri(log_sf.exp()),
        ).clamp(-CLIP, CLIP)
        columns.append(u)
        log_jacobian = log_jacobian + log_f + 0.5 * u.square() + _HALF_LOG_2PI
    return torch.stack(columns, dim=1), log_jacobian


def copula_score_samples(
    marginals: Sequence[MixtureParams], joint: MixtureParams, X: Tensor
) -> Tensor:
    """``log p(x)`` (n,) of the copula model: ``log p_u(u) + log-Jacobian``."""
    U, log_jacobian = normal_scores(marginals, X)
    return score_samples(joint, U) + log_jacobian


def fit_marginals(
    X: Tensor,
    n_components: int,
    *,
    prior_scale: float,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    generator: torch.Generator,
) -> list[MixtureParams]:
    """One 1-D mixture per column of ``X`` (n, d).

    Each has ``min(n_components, distinct values)`` components, fitted on the column's
    z-scores with the MAP covariance prior of :func:`fit_gmm_scaled` (3 pseudo-rows:
    ``n_features + 2`` for one feature), and mapped back to ``X``'s units. A constant
    column gets one component whose variance is the prior's pull on it (plus ``reg_covar``).
    """
    marginals = []
    for j in range(X.shape[1]):
        column = X[:, j : j + 1]
        k = max(1, min(int(n_components), int(torch.unique(column).numel())))
        result, _ = fit_gmm_scaled(
            column,
            [k],
            covariance_type="full",
            reg_covar=reg_covar,
            tol=tol,
            max_iter=max_iter,
            generator=generator,
            standardize=True,
            prior_strength=3.0,
            prior_scale=prior_scale,
        )
        marginals.append(result.params)
    return marginals
