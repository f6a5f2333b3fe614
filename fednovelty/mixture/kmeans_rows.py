"""k-means++ seeding and Lloyd iterations over a :class:`~fednovelty.mixture.rows.RowSource`,
pass by pass, with the numbers of :func:`~fednovelty.mixture.kmeans.kmeans` on the same rows.

:func:`~fednovelty.mixture.kmeans.kmeans` hands a source here. The generator is drawn from in
the same order and amounts as the in-memory algorithm, so the same seed picks the same rows:

- the first centre: ``torch.multinomial`` of equal weights draws one exponential variable
  per row and takes the row with the largest ``1 / q``; here the draws are made chunk by
  chunk (the generator yields the same sequence in pieces) and the largest is kept across
  chunks (its first occurrence, as ``argmax``);
- each later centre: every row's squared distance to its nearest centre is kept (one
  number a row, 8 bytes in float64; its running sum, another while a centre is drawn),
  candidates are drawn from it as in memory and their potentials summed chunk by chunk.

Lloyd's iterations are one pass each: every row's nearest centre, the centres' row counts
and row sums; the per-feature variance that scales ``tol`` comes from merged moments. Sums
over chunks differ from one sum over all rows in their last bits only; a choice they decide
(a candidate, the stopping rule) could differ only at an exact tie.

Extra memory: the per-row distances while seeding, one chunk and (n_clusters, n_features)
sums; never a copy of the rows or a label per row (the centres' row counts are returned).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.kmeans import _uniform, assign, one_hot, squared_distances
from fednovelty.mixture.rows import RowSource, chunks, numbered_chunks
from fednovelty.mixture.scaling import feature_moments


def first_index(n_rows: int, generator: torch.Generator, block: int) -> int:
    """``torch.multinomial(torch.ones(n_rows, dtype=torch.float64), 1, generator=generator)``
    without its (n_rows,) buffers: the exponential draws made ``block`` at a time, the row
    of the largest ``1 / q`` kept (the first of equals)."""
    best, best_value = 0, -math.inf
    for start in range(0, n_rows, block):
        q = torch.empty(min(block, n_rows - start), dtype=torch.float64)
        q.exponential_(1, generator=generator)
        ratio = torch.div(torch.ones_like(q), q)
        index = int(torch.argmax(ratio))
        value = float(ratio[index])
        if value > best_value:
            best, best_value = start + index, value
    return best


def _nearest_sums(X: RowSource, centers: Tensor) -> tuple[Tensor, Tensor]:
    """One pass: each centre's row count (n_centers,) and the sum of its rows
    (n_centers, n_features), every row with its nearest centre."""
    k = centers.shape[0]
    counts = X.new_zeros(k)
    sums = X.new_zeros(k, X.shape[1])
    for rows in chunks(X):
        labels, _ = assign(rows, centers)
        resp = one_hot(labels, k, rows)
        counts += resp.sum(0)
        sums += resp.T @ rows
    return counts, sums


def kmeans_plusplus_rows(X: RowSource, n_clusters: int, *, generator: torch.Generator) -> Tensor:
    """:func:`~fednovelty.mixture.kmeans.kmeans_plusplus` of a source's rows with equal
    weights (module docstring): centres (n_clusters, n_features), rows of ``X``."""
    n = X.shape[0]
    if n < n_clusters:
        raise ValueError(f"kmeans_plusplus needs n_samples >= n_clusters, got {n} < {n_clusters}.")
    n_local_trials = 2 + int(math.log(n_clusters))
    index = [first_index(n, generator, X.chunk_rows)]
    picked = [X.rows_at(torch.tensor(index))]
    closest = X.new_empty(n)
    for start, rows in numbered_chunks(X):
        closest[start : start + rows.shape[0]] = squared_distances(rows, picked[0]).squeeze(1)
    potential = closest.sum()
    for _ in range(1, n_clusters):
        if float(potential) <= 0:  # every row coincides with a chosen centre: an unused row
            used = set(index)
            index.append(next(i for i in range(n) if i not in used))
            picked.append(X.rows_at(torch.tensor(index[-1:])))
            continue
        cumulative = torch.cumsum(closest, 0)
        targets = _uniform(generator, n_local_trials, closest) * potential
        candidates = torch.searchsorted(cumulative, targets).clamp_max_(n - 1)
        del cumulative
        rows_of = X.rows_at(candidates)  # (n_local_trials, n_features)
        pots = X.new_zeros(n_local_trials)
        for start, rows in numbered_chunks(X):
            near = closest[start : start + rows.shape[0]].unsqueeze(0)
            pots += torch.minimum(near, squared_distances(rows_of, rows)).sum(1)
        best = int(torch.argmin(pots))
        potential = pots[best]
        for start, rows in numbered_chunks(X):
            part = closest[start : start + rows.shape[0]]
            nearer = squared_distances(rows_of[best : best + 1], rows).squeeze(0)
            torch.minimum(part, nearer, out=part)
        index.append(int(candidates[best]))
        picked.append(rows_of[best : best + 1])
    return torch.cat(picked).clone()


def kmeans_rows(
    X: RowSource,
    n_clusters: int,
    *,
    generator: torch.Generator,
    max_iter: int = 100,
    tol: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """:func:`~fednovelty.mixture.kmeans.kmeans` of a source's rows with equal weights,
    one pass per Lloyd iteration (module docstring).

    Returns:
        ``(centers, counts)``: (n_clusters, n_features) and each centre's row count
        (n_clusters,) under the final centres (the sizes of ``kmeans``'s labels).
    """
    centers = kmeans_plusplus_rows(X, n_clusters, generator=generator)
    threshold = tol * float(feature_moments(X).variance.mean()) if X.shape[0] > 1 else 0.0
    counts, sums = _nearest_sums(X, centers)
    for _ in range(max_iter):
        new_centers = torch.where(
            counts.unsqueeze(1) > 0, sums / counts.clamp_min(1e-300).unsqueeze(1), centers
        )
        shift = float((new_centers - centers).square().sum())
        centers = new_centers
        counts, sums = _nearest_sums(X, centers)
        if shift <= threshold:
            break
    return centers, counts
