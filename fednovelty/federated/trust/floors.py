"""Values a client builds so that each is backed by its floor.

Where the unprotected protocol would send a value some of whose rows are too few, a client
step sends one built from enough rows instead: statistics with the components below the floor
sent as zeros (:func:`suppress_components`), k-means centroids after every row of a small
cluster joined the nearest large one (:func:`merge_small_clusters`), per-feature low and high
ends as the means of the ``min_rows`` extreme values (:func:`trimmed_range`), and a local
mixture without its components below the floor (:func:`backed_mixture`). With ``min_rows=1``
(no floor) the last three return what the unprotected protocol sends.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fednovelty.federated.trust.backing import backed
from fednovelty.mixture import MixtureParams, SufficientStats
from fednovelty.mixture.kmeans import assign, one_hot
from fednovelty.mixture.rows import RowSource, chunks, numbered_chunks


def suppress_components(
    stats: SufficientStats, keep: Tensor, tied_second: Tensor | None = None
) -> SufficientStats:
    """``stats`` with the components not in ``keep`` sent as zeros.

    Args:
        stats: one client's statistics (n_components components).
        keep: bool (n_components,), the components backed by enough rows, on any device
            (the mask is moved to the statistics' device).
        tied_second: for ``tied`` statistics (one second moment for all components), the
            second moment of the kept components' responsibilities, (n_features,
            n_features); required there, ignored otherwise.

    Returns:
        Statistics of the same shapes; counts, sums and per-component second moments of the
        suppressed components are +0.0 (never -0.0, whose sign would tell a negative sum).
        Row count and log-likelihood are unchanged.
    """
    mask = keep.to(device=stats.counts.device, dtype=torch.bool)
    zero = torch.zeros((), dtype=stats.counts.dtype, device=stats.counts.device)
    if stats.covariance_type == "tied":
        if tied_second is None:
            raise ValueError("suppress_components needs tied_second for tied statistics.")
        second = tied_second
    else:
        second = torch.where(mask.view(-1, *[1] * (stats.second.ndim - 1)), stats.second, zero)
    return replace(
        stats,
        counts=torch.where(mask, stats.counts, zero),
        sums=torch.where(mask.unsqueeze(1), stats.sums, zero),
        second=second,
    )


def merge_small_clusters(
    X: Tensor | RowSource, labels: Tensor | None, centers: Tensor, min_rows: int
) -> tuple[Tensor, Tensor]:
    """Centroids of k-means clusters with at least ``min_rows`` rows each.

    Every row of a cluster with fewer than ``min_rows`` rows joins the nearest centre of a
    cluster with enough rows (rows of large clusters stay); the centres are then the means
    of their rows, so no released centroid is backed by fewer than ``min_rows`` rows (a
    far-out single row moves its nearest centroid a little instead of being sent).

    Args:
        X: the client's rows, (n_samples, n_features): a tensor, or a
            :class:`~fednovelty.mixture.rows.RowSource` read chunk by chunk.
        labels: each row's cluster, (n_samples,) int64 in ``[0, n_clusters)``; None: each
            row's nearest centre (what k-means of a source gives, keeping no labels).
        centers: k-means centres, (n_clusters, n_features).
        min_rows: the floor.

    Returns:
        ``(centers, counts)``: (n_kept, n_features) means and (n_kept,) row counts of the
        clusters with enough rows, in their original order. With ``min_rows=1`` (no floor):
        the non-empty clusters' k-means centres as they are.

    Raises:
        ValueError: no cluster has ``min_rows`` rows (ask for fewer clusters).
    """
    k = centers.shape[0]
    if labels is None:
        sizes = sum(torch.bincount(assign(rows, centers)[0], minlength=k) for rows in chunks(X))
    else:
        sizes = torch.bincount(labels, minlength=k)
    if min_rows <= 1:
        return centers[sizes > 0], sizes[sizes > 0].to(X.dtype)
    large = sizes >= min_rows
    if not bool(large.any()):
        raise ValueError(
            f"no k-means cluster has min_rows={min_rows} rows; form at most "
            "n_rows // min_rows clusters."
        )
    kept = large.nonzero().squeeze(1)
    new_index = torch.full((k,), -1, dtype=torch.long, device=centers.device)
    new_index[kept] = torch.arange(kept.shape[0], device=centers.device)
    counts = sums = None
    for start, rows in numbered_chunks(X):
        part = assign(rows, centers)[0] if labels is None else labels[start : start + len(rows)]
        merged = new_index[part]
        moved = merged < 0
        if bool(moved.any()):
            nearest, _ = assign(rows[moved], centers[kept])
            merged[moved] = nearest
        resp = one_hot(merged, kept.shape[0], rows)
        counts = resp.sum(0) if counts is None else counts + resp.sum(0)
        sums = resp.T @ rows if sums is None else sums + resp.T @ rows
    return sums / counts.unsqueeze(1), counts


def trimmed_range(X: Tensor, min_rows: int) -> tuple[Tensor, Tensor]:
    """Per-feature low and high ends of the rows, each backed by ``min_rows`` rows.

    Args:
        X: rows, (n_samples, n_features), with ``n_samples >= min_rows``.
        min_rows: the floor (1 gives the exact minimum and maximum).

    Returns:
        ``(low, high)``, each (n_features,): the mean of the ``min_rows`` smallest and of
        the ``min_rows`` largest values of every feature (not coordinates of single rows).
    """
    ordered = X.sort(0).values
    return ordered[:min_rows].mean(0), ordered[-min_rows:].mean(0)


def backed_mixture(params: MixtureParams, n_rows: int, min_rows: int) -> MixtureParams:
    """A local mixture without the components backed by fewer than ``min_rows`` rows.

    A component's rows are ``weight_k * n_rows``: its share of the responsibilities that
    gave its mean and covariance (at most its effective rows, so the rule is the stricter
    one). The kept weights are renormalised.

    Args:
        params: a mixture fitted on ``n_rows`` rows (n_components components).
        n_rows: the rows it was fitted on.
        min_rows: the floor.

    Returns:
        The mixture of the kept components; ``params`` itself when all are kept or
        ``min_rows=1`` (no floor).

    Raises:
        ValueError: no component is backed by ``min_rows`` rows.
    """
    keep = backed(params.weights * n_rows, min_rows)
    if min_rows <= 1 or bool(keep.all()):
        return params
    if not bool(keep.any()):
        raise ValueError(f"no component of the local mixture has min_rows={min_rows} rows.")
    weights = params.weights[keep]
    prec = params.precisions_cholesky
    if params.covariance_type != "tied":
        prec = prec[keep]
    return MixtureParams(weights / weights.sum(), params.means[keep], prec, params.covariance_type)
