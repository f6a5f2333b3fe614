"""E-step statistics of many row sets at once: one computation where there were many calls.

Federated EM asks every client for the E-step statistics of its own rows under one
broadcast mixture. A client of 100 rows is a small problem: :func:`~fednovelty.mixture.stats.
e_step_stats` spends about as long on its fixed cost (building buffers, a dozen small kernel
launches, ~250 us) as on the rows. :func:`e_step_stats_many` computes the statistics of a
*group* of row sets (one per client) as one computation on their rows padded to one length
``m``, (G, m, d):

* the component log-densities of all ``G * m`` rows in one call of the same kernel
  (:class:`~fednovelty.mixture.density.ComponentDensity`); each set's own log-weights
  ``log pi_g`` are added per set: the bias ``log det U - d/2 log 2 pi + log pi_g`` is formed
  as one set's E-step forms it (inside the one GEMM for ``diag``/``spherical``, a batched
  product with one factor matrix per set), so each row's log-densities are those of the
  set's own E-step;
* responsibilities row by row (:func:`~fednovelty.mixture.density.normalize_rows_`), padded
  rows' set to zero;
* each set's counts, sums and (``diag``, ``spherical``) second moments in one batched
  product ``resp_g^T A_g``, full and tied second moments ``C_g^T [r_1 C_g, ..., r_K C_g]``
  in batched products over blocks of sets that fit the density's cache block, and, where
  asked, each set's ``sum_i r_ik^2`` and each row's ``log p(x_i)``.

The sums run over the same rows with the same responsibilities as one set's E-step, in
another order: they equal it to round-off (a few ulp), not bit for bit.
:func:`set_groups` cuts sets into groups of similar length whose padded rows fit a row
budget; a set longer than the budget is left to the one-set path (its fixed cost is then
small beside its rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.mixture.covariance import check_covariance_type
from fednovelty.mixture.density import (
    LOG_2PI,
    ComponentDensity,
    Workspace,
    default_chunk_size,
    normalize_rows_,
)

__all__ = ["StatsMany", "budget_rows", "e_step_stats_many", "set_groups"]


@dataclass(frozen=True)
class StatsMany:
    """Per-set E-step statistics of a group of ``G`` row sets about one ``shift``.

    Attributes:
        counts: (G, n_components). sums: (G, n_components, n_features).
        second: (G, n_components, n_features, n_features) full, (G, n_features, n_features)
            tied, (G, n_components, n_features) diag, (G, n_components) spherical.
        log_likelihood: (G,) each set's ``sum_i log p(x_i)``. n_samples: (G,) its rows.
        squared: (G, n_components) each set's ``sum_i r_ik^2``, or ``None``.
        row_log_likelihood: (G, m) each row's ``log p(x_i)`` (set ``g``'s rows in its first
            ``lengths[g]`` entries, zeros after), or ``None``.
        lengths: (G,) int64 row counts.
    """

    counts: Tensor
    sums: Tensor
    second: Tensor
    log_likelihood: Tensor
    n_samples: Tensor
    squared: Tensor | None
    row_log_likelihood: Tensor | None
    lengths: Tensor


def budget_rows(n_components: int, n_features: int, chunk_size: int | None = None) -> int:
    """Padded rows one group may hold: ``chunk_size`` where given, else
    :func:`~fednovelty.mixture.density.default_chunk_size` (a (rows, n_components,
    n_features) float64 buffer of 32 MiB), the one-set E-step's chunk."""
    return int(chunk_size) if chunk_size else default_chunk_size(n_components, n_features)


def set_groups(lengths: Sequence[int], budget: int) -> tuple[list[list[int]], list[int]]:
    """Sets (indices into ``lengths``) in groups for :func:`e_step_stats_many`.

    Sets with rows are taken longest first; a group holds sets whose lengths are at least
    half its first (longest) one's ``m`` and at most ``budget // m`` of them, so padding at
    most doubles a group's rows. Sets longer than ``budget`` and sets without rows are in
    no group.

    Returns:
        ``(groups, alone)``: lists of set indices, and the indices of the sets longer than
        ``budget`` (sets without rows are in neither).
    """
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    alone = [i for i in order if lengths[i] > budget]
    groups: list[list[int]] = []
    group: list[int] = []
    for i in order:
        if lengths[i] > budget:
            continue
        if group and (
            2 * lengths[i] < lengths[group[0]] or len(group) >= budget // lengths[group[0]]
        ):
            groups.append(group)
            group = []
        group.append(i)
    if group:
        groups.append(group)
    return groups, alone


def _fill_rows(
    A: Tensor, rows: Sequence[Tensor], lengths: list[int], m: int, shift: Tensor
) -> Tensor:
    """Write the sets' rows minus ``shift`` into ``A[:, :d]`` (G * m rows), each set padded
    with zero rows to ``m``; returns that view, the centred rows."""
    d = shift.shape[0]
    centered = A[:, :d]
    stacked = torch.cat(list(rows)) if len(rows) > 1 else rows[0]
    if all(n == m for n in lengths):
        return torch.sub(stacked, shift, out=centered)
    centered.zero_()
    index = torch.cat([torch.arange(n) + i * m for i, n in enumerate(lengths)])
    centered.index_copy_(0, index.to(A.device), stacked - shift)
    return centered


def _row_mask(lengths: list[int], m: int, like: Tensor) -> Tensor | None:
    """(G * m, 1) float mask of the real rows, or ``None`` where no set is padded."""
    if all(n == m for n in lengths):
        return None
    real = torch.arange(m).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)
    return real.reshape(-1, 1).to(like)


def _mahalanobis(density: ComponentDensity, A: Tensor) -> Tensor:
    """Squared Mahalanobis distances (n_rows, n_components) of augmented rows ``A`` of a
    ``full`` or ``tied`` density: its block loop (GEMM, square and row sums in cache)."""
    n, k, d = A.shape[0], density.n_components, density.n_features
    maha = torch.empty(n, k, dtype=A.dtype, device=A.device)
    blocks = density.blocks(n, A)
    y_all = density.scratch(blocks[0][1], A)
    for start, stop in blocks:
        y = y_all[: stop - start]
        if density.covariance_type == "full":
            torch.mm(A[start:stop], density.factors, out=y)
        else:
            projected = A[start:stop, :d] @ density.factors
            torch.sub(
                projected.unsqueeze(1),
                density.means_projected.unsqueeze(0),
                out=y.view(stop - start, k, d),
            )
        torch.sum(y.square_().view(stop - start, k, d), 2, out=maha[start:stop])
    return maha


def _weighted_log_prob(density: ComponentDensity, A: Tensor, log_weights: Tensor, m: int) -> Tensor:
    """``log pi_gk + log N(x_i | k)`` (G * m, n_components) of augmented rows ``A`` whose
    rows ``g * m .. (g + 1) * m`` belong to set ``g`` with ``log_weights[g]`` (G, K); the
    bias ``log det U - d/2 log 2 pi + log pi_g`` formed as one set's E-step forms it."""
    g, k = log_weights.shape
    d = density.n_features
    bias = density.log_det - 0.5 * d * LOG_2PI + log_weights  # (G, K)
    if density.covariance_type in ("full", "tied"):
        maha = _mahalanobis(density, A)
        maha.view(g, m, k).mul_(-0.5).add_(bias.unsqueeze(1))
        return maha
    factors = (density.factors * -0.5).expand(g, -1, -1).clone()  # (G, width, K)
    factors[:, -1] += bias
    return torch.bmm(A.view(g, m, -1), factors).view(g * m, k)


def _full_second(density: ComponentDensity, C: Tensor, resp: Tensor, g: int, m: int) -> Tensor:
    """Each set's full second moments ``sum_i r_ik c_i c_i^T``, (G, K, d, d), exactly
    symmetric: batched products ``C_g^T [r_1 C_g, ..., r_K C_g]`` (G, d, K * d) over blocks of
    whole sets within the density's cache block (rows of one set in blocks of it where a set
    is longer), each block unfolded and symmetrised while in cache."""
    k, d = density.n_components, density.n_features
    second = C.new_empty(g, k, d, d)
    per_block = density.block_rows(C)
    sets, step = min(g, max(1, per_block // m)), min(m, per_block)  # off the CPU: all sets
    W_all = density.scratch(sets * step, C)
    folded_all = density.workspace.get("folded", (sets, d, k * d), C)
    C3 = C.view(g, m, d)
    R3 = resp.view(g, m, k)
    for s0 in range(0, g, sets):
        s1 = min(g, s0 + sets)
        folded = folded_all[: s1 - s0]
        for r0 in range(0, m, step):
            r1 = min(m, r0 + step)
            W = W_all[: (s1 - s0) * (r1 - r0)].view(s1 - s0, r1 - r0, k, d)
            torch.mul(R3[s0:s1, r0:r1].unsqueeze(3), C3[s0:s1, r0:r1].unsqueeze(2), out=W)
            left, right = C3[s0:s1, r0:r1].transpose(1, 2), W.view(s1 - s0, r1 - r0, k * d)
            if r0 == 0:
                torch.bmm(left, right, out=folded)
            else:
                folded.baddbmm_(left, right)
        unfolded = folded.view(s1 - s0, d, k, d).transpose(1, 2)  # [g, k, a, b]
        torch.add(unfolded, unfolded.transpose(-1, -2), out=second[s0:s1]).mul_(0.5)
    return second


def _symmetric(matrices: Tensor) -> Tensor:
    """``(M + M^T) / 2`` of (..., d, d) matrices, contiguous (as the one-set statistics)."""
    out = torch.empty(matrices.shape, dtype=matrices.dtype, device=matrices.device)
    return torch.add(matrices, matrices.transpose(-1, -2), out=out).mul_(0.5)


def e_step_stats_many(
    rows: Sequence[Tensor],
    log_weights: Tensor,
    means: Tensor,
    precisions_cholesky: Tensor,
    covariance_type: str,
    shift: Tensor,
    workspace: Workspace | None = None,
    squared_counts: bool = False,
    row_log_likelihood: bool = False,
) -> StatsMany:
    """The E-step statistics of each of ``G`` row sets, as :func:`~fednovelty.mixture.
    stats.e_step_stats` of each set alone (module docstring), in one computation.

    Args:
        rows: the sets' rows, each (n_g, n_features) with n_g >= 1, of one dtype and
            device; padded to the longest.
        log_weights: (n_components,) for every set, or (G, n_components) one per set.
        means: (n_components, n_features); ``precisions_cholesky`` per ``covariance_type``.
        shift: the moments' reference point (n_features,).
        workspace: scratch buffers and the density's factors (shared with the one-set
            E-step: :meth:`~fednovelty.mixture.density.Workspace.density`).
        squared_counts: also each set's ``sum_i r_ik^2`` (G, n_components).
        row_log_likelihood: also each row's ``log p(x_i)``, (G, m).

    Returns:
        :class:`StatsMany`.

    Raises:
        ValueError: ``rows`` is empty, or a set has no rows.
    """
    check_covariance_type(covariance_type)
    lengths = [int(r.shape[0]) for r in rows]
    if not lengths or min(lengths) < 1:
        raise ValueError("e_step_stats_many needs one or more row sets, each with rows.")
    g, m = len(rows), max(lengths)
    k, d = means.shape
    ct = covariance_type
    workspace = workspace if workspace is not None else Workspace()
    shared = log_weights.ndim == 1
    density = workspace.density(
        means, shift, precisions_cholesky, ct, log_weights if shared else None
    )
    like = rows[0]
    A = density.augmented(g * m, like)
    centered = _fill_rows(A, rows, lengths, m, shift)
    density.complete(A)
    if shared:
        weighted = density.log_prob(A)
    else:
        weighted = _weighted_log_prob(density, A, log_weights.to(like), m)
    log_norm, resp = normalize_rows_(weighted)
    mask = _row_mask(lengths, m, like)
    if mask is not None:
        resp.mul_(mask)
        log_norm.mul_(mask.squeeze(1))
    R3 = resp.view(g, m, k)
    moments = torch.bmm(R3.transpose(1, 2), A.view(g, m, density.width))  # (G, K, width)
    if ct == "full":
        second = _full_second(density, centered, resp, g, m)
    elif ct == "tied":
        C3 = centered.view(g, m, d)
        second = _symmetric(torch.bmm(C3.transpose(1, 2), C3 * R3.sum(2, keepdim=True)))
    elif ct == "diag":
        second = moments[:, :, d : 2 * d].contiguous()
    else:
        second = moments[:, :, d].contiguous()
    per_row = log_norm.view(g, m)
    return StatsMany(
        counts=moments[:, :, -1].contiguous(),
        sums=moments[:, :, :d].contiguous(),
        second=second,
        log_likelihood=per_row.sum(1),
        n_samples=torch.tensor(lengths, dtype=like.dtype, device=like.device),
        squared=R3.square().sum(1) if squared_counts else None,
        row_log_likelihood=per_row.clone() if row_log_likelihood else None,
        lengths=torch.tensor(lengths, dtype=torch.long),
    )
