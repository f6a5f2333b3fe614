"""Variational EM on groups of rows known only by their statistics.

:func:`fit_vb_groups` runs :func:`~fednovelty.mixture.variational.fit_vb`'s iterations on
groups of rows (a client's local components, say) given by their counts, first and second
moments, every row of a group taking the group's responsibilities
(:func:`vb_group_log_prob`: the E-step's log-weights averaged over the group, a function of
its count, first and second moments; :func:`grouped_stats`: the statistics of the rows under
those responsibilities). Its bound is a lower bound on the rows' ELBO under those
responsibilities, and with one row per group it is
:func:`~fednovelty.mixture.variational.fit_vb`.

All functions are pure and take dtype and device from their inputs.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from fednovelty.mixture.covariance import log_det_cholesky
from fednovelty.mixture.density import log_responsibilities
from fednovelty.mixture.em import iterate_bound
from fednovelty.mixture.stats import SufficientStats
from fednovelty.mixture.variational import (
    VBPosterior,
    VBResult,
    vb_log_offset,
    vb_lower_bound,
    vb_m_step,
)
from fednovelty.mixture.vb_prior import VBPrior


def _pairwise_quadratic(groups: SufficientStats, posterior: VBPosterior) -> Tensor:
    """``sum_i r_ig (x_i - m_k)^T P_k (x_i - m_k)`` for every group ``g`` of ``groups``
    and every component ``k`` of ``posterior``, (n_groups, n_components), from the groups'
    counts, first and second moments (``P_k`` the precision of ``covariances_k``; full,
    diag or spherical)."""
    ct = groups.covariance_type
    U = posterior.precisions_cholesky
    m = posterior.means - groups.shift  # (K, d), about the shift
    if ct == "full":
        P = U @ U.transpose(-1, -2)
        Pm = torch.einsum("kde,ke->kd", P, m)
        trace = torch.einsum("kde,ged->gk", P, groups.second)
    elif ct == "diag":
        P = U.square()
        Pm = P * m
        trace = groups.second @ P.T
    else:
        P = U.square()
        Pm = P.unsqueeze(1) * m
        trace = groups.second.unsqueeze(1) * P
    n = groups.counts.unsqueeze(1)
    return trace - 2 * groups.sums @ Pm.T + n * (m * Pm).sum(1)


def _check_grouped(groups: SufficientStats) -> None:
    if groups.covariance_type not in ("full", "diag", "spherical"):
        raise ValueError(
            "grouped rows need second moments per group: covariance_type 'full', 'diag' or "
            f"'spherical', got {groups.covariance_type!r}."
        )


def vb_group_log_prob(groups: SufficientStats, posterior: VBPosterior) -> Tensor:
    """``E[log pi_k] + E[log N(x | mu_k, Lambda_k)]`` averaged over each group's rows,
    (n_groups, n_components): the variational E-step's log-weights when every row of a
    group must take the group's responsibilities.

    Args:
        groups: one "component" per group of rows (its count, first and second moments:
            e.g. a client's local components), full, diag or spherical, every count > 0.
        posterior: of the same covariance type and width.
    """
    _check_grouped(groups)
    d = groups.n_features
    log_det = log_det_cholesky(posterior.precisions_cholesky, posterior.covariance_type, d)
    const = vb_log_offset(posterior) + log_det - 0.5 * d * math.log(2 * math.pi)
    quadratic = _pairwise_quadratic(groups, posterior)
    return const - 0.5 * quadratic / groups.counts.unsqueeze(1)


def grouped_stats(groups: SufficientStats, resp: Tensor) -> SufficientStats:
    """Statistics of the rows when group ``g``'s rows take responsibilities ``resp[g]``
    ((n_groups, n_components), rows summing to one): ``sum_g resp_gk`` times the group's
    count, first and second moments."""
    ct = groups.covariance_type
    if ct == "full":
        second = torch.einsum("gk,gde->kde", resp, groups.second)
    else:
        second = resp.T @ groups.second
    counts = resp.T @ groups.counts
    return SufficientStats(
        counts=counts,
        sums=resp.T @ groups.sums,
        second=second,
        shift=groups.shift,
        log_likelihood=counts.new_zeros(()),
        n_samples=groups.counts.sum(),
        covariance_type=ct,
    )


def fit_vb_groups(
    groups: SufficientStats,
    init: VBPosterior,
    prior: VBPrior,
    *,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
) -> VBResult:
    """Variational EM on groups of rows known only by their statistics, every row of a
    group sharing the group's responsibilities (a mean-field family restricted to be
    constant within groups), from the posterior ``init``.

    Each iteration is :func:`vb_group_log_prob` normalised per group, the M-step on
    :func:`grouped_stats` and the bound :func:`~fednovelty.mixture.variational.vb_lower_bound`
    with the groups' entropy ``-sum_g n_g sum_k r_gk log r_gk``, stopped as
    :func:`~fednovelty.mixture.variational.fit_vb` (``|change| < tol``).
    By the concavity of the entropy the bound is a lower bound on the ELBO of the rows
    themselves under the same responsibilities, so an unrestricted E-step on the rows
    from the result can only raise it. Groups with a count of 0 are left out.

    Args:
        groups: (n_groups,) counts, (n_groups, n_features) sums and their second moments
            (full, diag or spherical), about one shift.
        init: the starting posterior (n_components components).
        prior: the shared prior.
        reg_covar, tol, max_iter: as :func:`~fednovelty.mixture.variational.fit_vb`
            (``max_iter=0`` returns ``init``).
    """
    _check_grouped(groups)
    keep = groups.counts > 0
    groups = replace(
        groups,
        counts=groups.counts[keep],
        sums=groups.sums[keep],
        second=groups.second[keep],
        n_samples=groups.counts[keep].sum(),
    )

    def step(posterior: VBPosterior) -> tuple[VBPosterior, float]:
        log_resp = log_responsibilities(vb_group_log_prob(groups, posterior))[1]
        resp = log_resp.exp()
        entropy = -(groups.counts.unsqueeze(1) * resp * log_resp).sum()
        posterior = vb_m_step(grouped_stats(groups, resp), prior, reg_covar)
        return posterior, float(vb_lower_bound(posterior, entropy))

    return VBResult(*iterate_bound(step, init, max_iter, tol))
