"""Summable sufficient statistics of a Gaussian mixture and the M-step from them.

EM's M-step needs, per component ``k``, only ``n_k = sum_i r_ik``, the first moment
``s_k = sum_i r_ik (x_i - c)`` and the second moment ``S_k = sum_i r_ik (x_i - c)(x_i - c)^T``
(or its diagonal, its trace, or for ``tied`` the sum over components). Statistics computed
on disjoint sets of rows **add**, so the M-step on summed statistics is exactly the M-step
on the pooled rows: this is what makes federated EM exact, and what secure aggregation and
differential-privacy noise operate on.

``c`` is a *shift* shared by everyone who computes statistics that will be added (in
federated EM the server broadcasts it with the parameters). Moments about a point near the
data keep the M-step's ``S_k / n_k - m_k m_k^T`` free of catastrophic cancellation when the
features have large offsets, in float32 as well as float64. Statistics with different shifts
cannot be merged.

Shapes of ``second`` by covariance type: full (n_components, n_features, n_features);
tied (n_features, n_features); diag (n_components, n_features); spherical (n_components,).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.mixture.containers import ComponentTensors, SummableStats
from fednovelty.mixture.covariance import check_covariance_type
from fednovelty.mixture.density import (
    ComponentDensity,
    Workspace,
    default_chunk_size,
    normalize_rows_,
)
from fednovelty.mixture.rows import numbered_chunks


@dataclass(frozen=True)
class SufficientStats(ComponentTensors, SummableStats):
    """Sums over rows that determine the M-step; merge with ``+``.

    Attributes:
        counts: ``sum_i r_ik``, shape (n_components,).
        sums: ``sum_i r_ik (x_i - shift)``, shape (n_components, n_features).
        second: second moments about ``shift`` (shape depends on ``covariance_type``).
        shift: the common reference point ``c``, shape (n_features,).
        log_likelihood: ``sum_i log p(x_i)`` under the parameters of the E-step, shape ().
        n_samples: number of rows summed, shape ().
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
    """

    counts: Tensor
    sums: Tensor
    second: Tensor
    shift: Tensor
    log_likelihood: Tensor
    n_samples: Tensor
    covariance_type: str

    SHAPE_FIELD = "sums"
    SUMMED = ("counts", "sums", "second", "log_likelihood", "n_samples")
    SHAPED = ("sums", "counts")
    AXES = "(n_components, n_features)"

    def check_mergeable(self, other: SufficientStats) -> None:
        """Also the covariance types must agree."""
        if other.covariance_type != self.covariance_type:
            raise ValueError(
                "Cannot merge statistics of covariance types "
                f"{self.covariance_type!r} and {other.covariance_type!r}."
            )
        super().check_mergeable(other)


def zero_stats(
    n_components: int,
    n_features: int,
    covariance_type: str,
    shift: Tensor,
) -> SufficientStats:
    """Statistics of zero rows (a client that contributes nothing); dtype/device of ``shift``."""
    check_covariance_type(covariance_type)
    like = {"dtype": shift.dtype, "device": shift.device}
    second_shape = {
        "full": (n_components, n_features, n_features),
        "tied": (n_features, n_features),
        "diag": (n_components, n_features),
        "spherical": (n_components,),
    }[covariance_type]
    return SufficientStats(
        counts=torch.zeros(n_components, **like),
        sums=torch.zeros(n_components, n_features, **like),
        second=torch.zeros(second_shape, **like),
        shift=shift,
        log_likelihood=torch.zeros((), **like),
        n_samples=torch.zeros((), **like),
        covariance_type=covariance_type,
    )


def merge_stats(stats: Iterable[SufficientStats]) -> SufficientStats:
    """Sum statistics (associative and commutative up to round-off).

    Raises:
        ValueError: ``stats`` is empty or the statistics are not compatible.
    """
    stats = list(stats)
    if not stats:
        raise ValueError("merge_stats needs at least one SufficientStats.")
    total = stats[0]
    for s in stats[1:]:
        total = total + s
    return total


def _second_moments(centered: Tensor, resp: Tensor, covariance_type: str) -> Tensor:
    """Second moments of ``centered`` (n, d) under ``resp`` (n, K); shape per type."""
    n, d = centered.shape
    k = resp.shape[1]
    if covariance_type == "full":
        weighted = resp.unsqueeze(2) * centered.unsqueeze(1)  # (n, K, d)
        return _unfold_full(centered.T @ weighted.view(n, k * d), k, d)
    if covariance_type == "tied":
        return _symmetric(centered.T @ (centered * resp.sum(1, keepdim=True)))
    if covariance_type == "diag":
        return resp.T @ centered.square()
    return resp.T @ centered.square().sum(1)


def _unfold_full(folded: Tensor, n_components: int, n_features: int) -> Tensor:
    """(d, K * d) with ``[a, k * d + b] = sum_i x_ia r_ik x_ib`` -> (K, d, d) second moments,
    made exactly symmetric (the two triangles differ in their last bits; a symmetric matrix
    travels as its upper triangle, :mod:`fednovelty.federated.core.wire`)."""
    unfolded = folded.view(n_features, n_components, n_features).transpose(0, 1)
    return _symmetric(unfolded)


def _symmetric(matrices: Tensor) -> Tensor:
    """``(M + M^T) / 2`` of (..., d, d) matrices: exactly symmetric, contiguous (written once
    into a new contiguous tensor)."""
    out = torch.empty(matrices.shape, dtype=matrices.dtype, device=matrices.device)
    return torch.add(matrices, matrices.transpose(-1, -2), out=out).mul_(0.5)


def stats_from_resp(
    X: Tensor,
    resp: Tensor,
    covariance_type: str,
    shift: Tensor,
    chunk_size: int | None = None,
) -> SufficientStats:
    """Statistics of rows ``X`` (n_samples, n_features) with given responsibilities
    ``resp`` (n_samples, n_components), e.g. one-hot k-means labels or a joint model's
    responsibilities summed over its learners. ``log_likelihood`` is 0.

    Rows are taken ``chunk_size`` at a time (default ``default_chunk_size``: a (rows,
    n_components, n_features) float64 buffer of 32 MiB), so extra memory is bounded whatever
    ``n_samples``; one chunk gives the statistics of a single pass exactly. ``X`` may be a
    :class:`~fednovelty.mixture.rows.RowSource` (its chunks, cut to ``chunk_size``).
    """
    check_covariance_type(covariance_type)
    d = X.shape[1]
    step = int(chunk_size or default_chunk_size(resp.shape[1], d))
    counts = sums = second = None
    for start, rows in numbered_chunks(X, step):
        centered = rows - shift
        part = resp[start : start + rows.shape[0]]
        moments = (part.sum(0), part.T @ centered, _second_moments(centered, part, covariance_type))
        if counts is None:
            counts, sums, second = moments
        else:
            counts, sums, second = counts + moments[0], sums + moments[1], second + moments[2]
    return SufficientStats(
        counts=counts,
        sums=sums,
        second=second,
        shift=shift,
        log_likelihood=torch.zeros((), dtype=X.dtype, device=X.device),
        n_samples=torch.tensor(float(X.shape[0]), dtype=X.dtype, device=X.device),
        covariance_type=covariance_type,
    )


def e_step_stats(
    X: Tensor,
    log_weights: Tensor,
    means: Tensor,
    precisions_cholesky: Tensor,
    covariance_type: str,
    shift: Tensor,
    chunk_size: int | None = None,
    workspace: Workspace | None = None,
    squared_counts: Tensor | None = None,
    row_log_likelihood: Tensor | None = None,
) -> SufficientStats:
    """E-step on ``X`` folded into sufficient statistics, in row chunks.

    Extra memory is one (chunk_size, width) buffer of augmented rows (width d + 1; 2d + 1 for
    ``diag``, d + 2 for ``spherical``), a few (chunk_size, n_components) ones and, for
    ``full``/``tied``, one cache-sized block (``density.BLOCK_BYTES`` per thread) of the
    (rows, n_components * n_features) products; the large buffers are allocated once and
    reused by every chunk; never a copy of ``X``. Densities are evaluated
    on ``X - shift`` against ``means - shift``, which is the same density and better
    conditioned.

    Per chunk of ``n`` rows: the centred rows are written into the augmented buffer of
    ``ComponentDensity`` (``[c, 1]`` for ``full``); one GEMM gives the log-densities (for
    ``full`` all ``(c_i - m_k) U_k`` at once, squared and summed block by block while still
    in cache); ``normalize_rows_`` turns them into responsibilities in place; one GEMM
    ``resp^T @ A`` adds counts, sums and (``diag``, ``spherical``) second moments. Full
    second moments are one GEMM per block, ``C^T @ [r_1 * C, ..., r_K * C]``, whose right
    operand reuses the density's block buffer.

    Args:
        X: rows, shape (n_samples, n_features): a tensor, or a
            :class:`~fednovelty.mixture.rows.RowSource` read chunk by chunk.
        log_weights: ``log pi``, shape (n_components,).
        means: shape (n_components, n_features).
        precisions_cholesky: per ``covariance_type``.
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
        shift: reference point for the moments, shape (n_features,).
        chunk_size: rows per chunk; default from ``default_chunk_size`` (32 MiB of buffers).
        workspace: scratch buffers to reuse across calls (e.g. one per client process, or one
            for all clients of a simulation), and the density's factors while the
            parameters stay the same (:meth:`~fednovelty.mixture.density.Workspace.density`);
            a fresh one by default.
        squared_counts: if given, a (n_components,) tensor to which ``sum_i r_ik^2`` is
            added (with ``counts``, a component's effective number of rows, which a client's
            privacy floor needs); one extra (chunk, n_components) product per chunk.
        row_log_likelihood: if given, a (n_samples,) tensor filled with each row's
            ``log p(x_i)`` (the terms of the returned ``log_likelihood``).

    Returns:
        ``SufficientStats`` whose ``log_likelihood`` is ``sum_i log p(x_i)`` under the given
        parameters (the lower bound scikit-learn tracks, times n_samples).
    """
    n_samples = X.shape[0]
    if n_samples == 0:
        return zero_stats(means.shape[0], means.shape[1], covariance_type, shift)
    k, d = means.shape
    ct = covariance_type
    like = {"dtype": X.dtype, "device": X.device}
    if workspace is None:
        density = ComponentDensity(means - shift, precisions_cholesky, ct, offset=log_weights)
    else:  # built once for the calls that share these parameters (``Workspace.density``)
        density = workspace.density(means, shift, precisions_cholesky, ct, log_weights)
    if not chunk_size:
        # full/tied: the usual (rows, K, d) budget. diag/spherical have no such buffer; their
        # widest per-row buffers are the augmented rows and a few (rows, K): fill the same
        # budget with those (fewer, larger chunks: -10-20% time on 2 cores, d=32, K=10).
        wide = ct in ("full", "tied")
        chunk_size = (
            default_chunk_size(k, d) if wide else default_chunk_size(1, density.width + 3 * k)
        )
    chunk_size = min(n_samples, chunk_size)
    # resp^T @ A accumulates [sums | (diag) second moments | (spherical) traces | counts].
    moments = torch.zeros(k, density.width, **like)
    if ct == "full":  # folded[a, k * d + b] = sum_i c_ia r_ik c_ib
        second = torch.zeros(d, k * d, **like)
    elif ct == "tied":
        second = torch.zeros(d, d, **like)
    log_likelihood = torch.zeros((), **like)
    for start, rows in numbered_chunks(X, chunk_size):
        n = rows.shape[0]
        A = density.augmented(n, rows)
        centered = torch.sub(rows, shift, out=A[:, :d])
        density.complete(A)
        weighted = density.log_prob(A)  # (n, K): log pi_k + log N(x_i | k)
        log_norm, resp = normalize_rows_(weighted)
        log_likelihood += log_norm.sum()
        if row_log_likelihood is not None:
            row_log_likelihood[start : start + n] = log_norm
        moments.addmm_(resp.T, A)
        if squared_counts is not None:
            squared_counts += resp.square().sum(0)
        if ct == "full":
            blocks = density.blocks(n, rows)
            W_all = density.scratch(blocks[0][1], rows)  # the density's block buffer is free
            W3_all = W_all.view(-1, k, d)
            resp3, centered3 = resp.unsqueeze(2), centered.unsqueeze(1)
            for b0, b1 in blocks:
                torch.mul(resp3[b0:b1], centered3[b0:b1], out=W3_all[: b1 - b0])
                second.addmm_(centered[b0:b1].T, W_all[: b1 - b0])
        elif ct == "tied":
            second.addmm_(centered.T, centered * resp.sum(1, keepdim=True))
    sums, counts = moments[:, :d].contiguous(), moments[:, -1].contiguous()
    if ct == "full":
        second = _unfold_full(second, k, d)
    elif ct == "tied":
        second = _symmetric(second)
    elif ct == "diag":
        second = moments[:, d : 2 * d].contiguous()
    elif ct == "spherical":
        second = moments[:, d].contiguous()
    return SufficientStats(
        counts=counts,
        sums=sums,
        second=second,
        shift=shift,
        log_likelihood=log_likelihood,
        n_samples=torch.tensor(float(n_samples), **like),
        covariance_type=covariance_type,
    )


@dataclass(frozen=True, eq=False)
class CovariancePrior:
    """A conjugate prior on every component covariance: ``strength`` pseudo-rows whose
    covariance is ``diag(scale)``.

    The M-step becomes the maximum a posteriori estimate
    ``Sigma_k = (n_k Sigma_k_ML + strength * diag(scale)) / (n_k + strength)``, the mode of
    an inverse-Wishart posterior with scale matrix ``strength * diag(scale)`` (the
    penalised log-likelihood adds ``strength`` Gaussian rows of that scatter to every
    component). A component backed by many rows keeps its own shape; one backed by a few,
    or by rows that repeat the same value, is pulled towards ``diag(scale)`` instead of
    collapsing onto a spike. It acts on summed statistics only, so federated EM stays exact.

    Attributes:
        strength: number of pseudo-rows, > 0.
        scale: (n_features,) positive target variances.
    """

    strength: float
    scale: Tensor

    def __post_init__(self) -> None:
        if not float(self.strength) > 0:
            raise ValueError(f"CovariancePrior strength must be > 0, got {self.strength}.")
        if self.scale.ndim != 1 or not bool(torch.all(self.scale > 0)):
            raise ValueError("CovariancePrior scale must be a 1-D tensor of positive variances.")


def _shrink(cov: Tensor, nk: Tensor, prior: CovariancePrior, covariance_type: str) -> Tensor:
    """Covariances (without ``reg_covar``) pulled towards the prior's ``diag(scale)``."""
    nu = float(prior.strength)
    psi = prior.scale.to(cov.device, cov.dtype)
    if covariance_type == "full":
        w = (nk / (nk + nu)).view(-1, 1, 1)
        return w * cov + (1 - w) * torch.diag(psi)
    if covariance_type == "tied":
        w = nk.sum() / (nk.sum() + nu)
        return w * cov + (1 - w) * torch.diag(psi)
    if covariance_type == "diag":
        w = (nk / (nk + nu)).unsqueeze(1)
        return w * cov + (1 - w) * psi
    w = nk / (nk + nu)
    return w * cov + (1 - w) * psi.mean()


def m_step(
    stats: SufficientStats, reg_covar: float, prior: CovariancePrior | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Maximum-likelihood (or, with ``prior``, MAP) weights, means and covariances from
    summed statistics.

    Without a prior this matches scikit-learn's ``_estimate_gaussian_parameters``
    (including its ``10 * eps`` added to every count, once, here on the server, so that the
    result does not depend on how the rows were split). With a :class:`CovariancePrior`
    every covariance is shrunk towards the prior's diagonal before ``reg_covar`` is added.

    Returns:
        ``(weights, means, covariances)``: shapes (n_components,), (n_components, n_features)
        and per ``covariance_type``; ``reg_covar`` is added to the diagonal.
    """
    eps = torch.finfo(stats.counts.dtype).eps
    nk = stats.counts + 10 * eps
    mean_offset = stats.sums / nk.unsqueeze(1)  # (K, d), about the shift
    means = stats.shift + mean_offset
    ct = stats.covariance_type
    if ct == "full":
        cov = stats.second / nk.view(-1, 1, 1) - mean_offset.unsqueeze(2) * mean_offset.unsqueeze(1)
        cov = 0.5 * (cov + cov.transpose(1, 2))
    elif ct == "tied":
        cov = (stats.second - (nk.unsqueeze(1) * mean_offset).T @ mean_offset) / nk.sum()
        cov = 0.5 * (cov + cov.T)
    elif ct == "diag":
        cov = stats.second / nk.unsqueeze(1) - mean_offset.square()
    else:
        cov = (stats.second / nk - mean_offset.square().sum(1)) / stats.n_features
    if prior is not None:
        cov = _shrink(cov, nk, prior, ct)
    if ct in ("full", "tied"):
        cov = cov + reg_covar * torch.eye(stats.n_features, dtype=cov.dtype, device=cov.device)
    else:
        cov = cov + reg_covar
    weights = nk / nk.sum()
    return weights, means, cov
