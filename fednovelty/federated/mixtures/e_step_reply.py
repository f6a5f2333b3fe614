"""One client's reply to an E-step round: its statistics under its privacy floor.

The client half that federated EM (:class:`~fednovelty.federated.mixtures.em.EMStep`), a
stream's windows (:mod:`~fednovelty.federated.streams.streaming`) and federated variational
Bayes share: the E-step statistics of the client's rows under the broadcast mixture and the
client's log-weights (:func:`client_e_step`), its own next weights where they are personal
(:func:`personal_log_weights`), and the reply with what backs each released value
(:func:`floored_stats_message`: effective rows per component, a winsorised log-likelihood,
a tied second moment recomputed from the kept components, :func:`kept_tied_second`). The
client gate (:func:`fednovelty.federated.trust.gate.answer`) then applies the floor.
:mod:`~fednovelty.federated.mixtures.batched_e_step` computes the same replies for many
clients at once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import stats_message
from fednovelty.federated.core.base import Message, ReleaseTerms
from fednovelty.federated.trust.backing import backed, effective_rows, stats_backing
from fednovelty.federated.trust.contrast import winsorised_row_values
from fednovelty.mixture import MixtureParams, e_step_stats, predict_proba, stats_from_resp
from fednovelty.mixture.density import Workspace
from fednovelty.mixture.rows import chunks
from fednovelty.mixture.stats import SufficientStats

__all__ = ["client_e_step", "floored_stats_message", "kept_tied_second", "personal_log_weights"]


def client_e_step(
    X: Tensor,
    t: dict[str, Tensor],
    log_weights: Tensor,
    config: Any,
    workspace: Workspace,
    has_floor: bool,
    row_likelihoods: bool = False,
) -> tuple[SufficientStats, Tensor | None, Tensor | None]:
    """The E-step statistics of rows ``X`` (n, d) under the broadcast mixture ``t`` (its
    ``means``, ``precisions_cholesky`` and ``shift``) and the client's ``log_weights`` (K,),
    in ``config``'s ``covariance_type`` and ``chunk_size``. Under a floor (``has_floor``)
    also each component's sum of squared responsibilities (K,) (with the counts, its
    effective rows: the floor's test) and, with ``row_likelihoods``, each row's
    log-likelihood (n,). Returns ``(stats, squared sums or None, row log-likelihoods or
    None)``."""
    squared = X.new_zeros(t["means"].shape[0]) if has_floor else None
    rows = X.new_empty(X.shape[0]) if has_floor and row_likelihoods else None
    stats = e_step_stats(
        X,
        log_weights,
        t["means"],
        t["precisions_cholesky"],
        config.covariance_type,
        t["shift"],
        config.chunk_size,
        workspace,
        squared_counts=squared,
        row_log_likelihood=rows,
    )
    return stats, squared, rows


def personal_log_weights(counts: Tensor) -> Tensor:
    """A client's own log mixture weights (K,) from its E-step ``counts`` (K,), each count
    raised by ``10 eps`` of its dtype first so that no weight is zero."""
    counts = counts + 10 * torch.finfo(counts.dtype).eps
    return (counts / counts.sum()).log()


def floored_stats_message(
    X: Tensor,
    stats: SufficientStats,
    squared: Tensor | None,
    terms: ReleaseTerms,
    log_weights: Tensor,
    broadcast: dict[str, Tensor],
    kind: str,
    row_log_likelihood: Tensor | None = None,
) -> Message:
    """The reply of an E-step round under the client's floor: ``stats`` of the rows ``X``
    (n, d) with every component backed by fewer than ``min_rows`` effective rows sent as
    zeros (``squared``: sum_i r_ik^2, (n_components,); None: no floor), or a skipped reply
    when no component is backed. ``log_weights`` (n_components,) and the broadcast
    ``means``, ``precisions_cholesky`` and ``shift`` gave the responsibilities (a tied
    covariance's one second moment is recomputed from the kept components' rows).

    ``row_log_likelihood`` (n,): each row's ``log p(x_i)``; where given, the released
    log-likelihood is the sum of those values with outlying rows winsorised
    (:func:`~fednovelty.federated.trust.contrast.winsorised_row_values`, n times the mean of the
    rows kept where clipping cannot back it): a crafted mixture (two Gaussians of equal
    covariance make ``log p`` a softplus of one direction) cannot make it one row's value."""
    if squared is not None and row_log_likelihood is not None and X.shape[0] > 0:
        values, ll_rows = winsorised_row_values(row_log_likelihood, terms.min_rows)
        stats = replace(stats, log_likelihood=values.mean() * X.shape[0])
    else:
        ll_rows = None
    if squared is None:  # no floor: every component is released, backed by the row count
        reply = stats_message(stats, kind)
        rows = torch.full_like(stats.counts, float(X.shape[0]))
        reply.backing.update(stats_backing(stats, rows))
        return reply
    # the gate zeroes the components below the floor; a tied second moment (one for all
    # components) is recomputed here from the kept components' rows
    rows = effective_rows(stats.counts, squared)
    stats, tied_rows = kept_tied_second(
        stats, X, log_weights, broadcast["means"], broadcast["precisions_cholesky"], rows, terms
    )
    reply = stats_message(stats, kind)
    reply.backing.update(stats_backing(stats, rows, tied_rows))
    if ll_rows is not None:
        reply.backing["log_likelihood"] = ll_rows
    return reply


def kept_tied_second(
    stats: SufficientStats,
    X: Tensor,
    log_weights: Tensor,
    means: Tensor,
    precisions_cholesky: Tensor,
    rows: Tensor,
    terms: ReleaseTerms,
) -> tuple[SufficientStats, Tensor | None]:
    """``tied`` statistics whose one second moment covers only the rows of the components
    backed by ``terms.min_rows`` effective rows (``rows``, (n_components,)), and the
    effective rows behind it; other statistics, or tied ones whose components are all (or
    none) backed, come back as they are with ``None``. The client gate zeroes the other
    tensors of the unbacked components.

    Args:
        stats: one client's statistics of rows ``X`` (n, d) about ``stats.shift``.
        log_weights: (n_components,) the responsibilities' log weights; ``means`` and
            ``precisions_cholesky`` the broadcast mixture's.
    """
    keep = backed(rows, terms.min_rows)
    if stats.covariance_type != "tied" or bool(keep.all()) or not bool(keep.any()):
        return stats, None
    params = MixtureParams(log_weights.exp(), means, precisions_cholesky, "tied")
    kept = keep.to(X.dtype)
    weight = torch.cat(  # (n,): a row source's (n, n_components) never at once
        [(predict_proba(params, rows, log_weights=log_weights) * kept).sum(1) for rows in chunks(X)]
    )
    second = stats_from_resp(X, weight.unsqueeze(1), "tied", stats.shift).second
    return replace(stats, second=second), effective_rows(weight.sum(0), weight.square().sum(0))
