"""Parametric UMAP's parts of VGM2's local loss (Eq. 1): the client's fuzzy kNN graph, the
curve ``q(d) = 1 / (1 + a d^(2b))`` and the cross-entropy on sampled edges.

The graph is UMAP's fuzzy simplicial set (McInnes, Healy & Melville 2018, Sec. 3.1) on
scikit-learn's exact Euclidean neighbours, computed here in numpy as umap-learn computes it
(its ``smooth_knn_dist``, ``compute_membership_strengths`` and fuzzy union, in float32), so
neither umap-learn nor a numba compile is needed; ``a, b`` are fitted as umap-learn's
``find_ab_params`` fits them. The loss is torch's, differentiable in the embeddings.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse
import torch
from scipy.optimize import curve_fit
from torch import Tensor

__all__ = ["fuzzy_graph", "umap_ab", "umap_loss"]

#: umap-learn's constants: the binary search's tolerance, the floor on a row's bandwidth (a
#: fraction of its mean neighbour distance) and the search's starting upper bound.
SMOOTH_K_TOLERANCE = 1e-5
MIN_K_DIST_SCALE = 1e-3
FLOAT32_MAX = np.float32(np.finfo(np.float32).max)


def umap_ab(min_dist: float, spread: float = 1.0) -> tuple[float, float]:
    """UMAP's curve ``q(d) = 1 / (1 + a d^(2b))`` for ``min_dist``: least squares against
    ``1`` below ``min_dist`` and ``exp(-(d - min_dist) / spread)`` above, on 300 points of
    ``[0, 3 spread]`` (umap-learn's ``find_ab_params``)."""
    x = np.linspace(0, spread * 3, 300)
    y = np.where(x < min_dist, 1.0, np.exp(-(x - min_dist) / spread))
    (a, b), _ = curve_fit(lambda d, a, b: 1.0 / (1.0 + a * d ** (2 * b)), x, y)
    return float(a), float(b)


def _rho(distances: np.ndarray) -> np.ndarray:
    """Each row's distance to its nearest neighbour at a positive distance (0 where none):
    UMAP's ``rho`` at local connectivity 1. ``distances`` (n, k) float32, sorted per row."""
    positive = distances > 0
    first = positive.argmax(1)
    rho = distances[np.arange(distances.shape[0]), first]
    return np.where(positive.any(1), rho, np.float32(0)).astype(np.float32)


def _sigma(distances: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """Each row's bandwidth ``sigma`` (n,) float32: the binary search (64 steps at most) for
    ``sum_{j >= 1} exp(-max(d_j - rho, 0) / sigma) = log2(k)`` over the row's neighbours but
    the first, then floored at ``1e-3`` times the row's mean distance (the whole table's mean
    for a row with ``rho = 0``), as umap-learn's ``smooth_knn_dist``."""
    n, k = distances.shape
    target = np.log2(k)
    lo = np.zeros(n, np.float32)
    hi = np.full(n, FLOAT32_MAX, np.float32)
    mid = np.ones(n, np.float32)
    active = np.ones(n, bool)
    shifted = np.maximum(distances - rho[:, None], np.float32(0))  # at or below rho: 1
    for _ in range(64):
        psum = np.zeros(n, np.float32)
        for j in range(1, k):  # in umap-learn's order, float32 sums
            psum += np.exp(-(shifted[:, j] / mid)).astype(np.float32)
        active &= np.abs(psum.astype(np.float64) - target) >= SMOOTH_K_TOLERANCE
        if not active.any():
            break
        above = active & (psum > target)
        below = active & ~(psum > target)
        hi = np.where(above, mid, hi)
        lo = np.where(below, mid, lo)
        halve = above | (below & (hi < FLOAT32_MAX))
        mid = np.where(halve, (lo + hi) / np.float32(2), np.where(below, mid * 2, mid))
        mid = mid.astype(np.float32)
    floor = np.where(
        rho > 0, MIN_K_DIST_SCALE * distances.mean(1), MIN_K_DIST_SCALE * distances.mean()
    ).astype(np.float32)
    return np.maximum(mid, floor)


def fuzzy_graph(X: Tensor, n_neighbors: int, random_state: int) -> tuple[Tensor, Tensor, Tensor]:
    """UMAP's fuzzy simplicial set of rows ``X`` (n, n_features) on scikit-learn's exact
    Euclidean neighbours (the row itself included, as UMAP expects; ``min(n_neighbors, n)``
    of them): each directed edge ``i -> j`` weighs ``exp(-max(d_ij - rho_i, 0) / sigma_i)``,
    and the graph is their fuzzy union ``A + A^T - A * A^T``. Returns the edges' heads,
    tails (int64, (n_edges,), row-major order) and membership strengths (n_edges,) in ``X``'s
    dtype. ``random_state`` is unused (exact neighbours draw nothing); it is kept so that a
    caller's seed reaches the graph if an approximate search is ever used."""
    from sklearn.neighbors import NearestNeighbors

    rows = X.detach().cpu().numpy().astype(np.float32)
    n = rows.shape[0]
    k = max(2, min(int(n_neighbors), n))
    distances, indices = NearestNeighbors(n_neighbors=k).fit(rows).kneighbors(rows)
    distances = distances.astype(np.float32)
    rho = _rho(distances)
    sigma = _sigma(distances, rho)
    shifted = np.maximum(distances - rho[:, None], np.float32(0))  # at or below rho: 1
    values = np.exp(-(shifted / sigma[:, None])).astype(np.float32)
    values[indices == np.arange(n)[:, None]] = 0.0
    directed = scipy.sparse.coo_matrix(
        (values.ravel(), (np.repeat(np.arange(n), k), indices.ravel())), shape=(n, n)
    )
    directed.eliminate_zeros()
    transpose = directed.transpose()
    graph = (directed + transpose - directed.multiply(transpose)).tocoo()
    graph.eliminate_zeros()
    keep = graph.row != graph.col
    heads = torch.as_tensor(graph.row[keep].astype(np.int64))
    tails = torch.as_tensor(graph.col[keep].astype(np.int64))
    weights = torch.as_tensor(graph.data[keep]).to(device=X.device, dtype=X.dtype)
    return heads.to(X.device), tails.to(X.device), weights


def umap_loss(
    z_head: Tensor, z_tail: Tensor, a: float, b: float, negatives: int, generator: torch.Generator
) -> Tensor:
    """Parametric UMAP's cross-entropy (Eq. 1) on a batch of sampled edges: embeddings of
    the heads and tails (n, d) are attracted (``p = 1``), each head is repelled from
    ``negatives`` tails of the batch shuffled (``p = 0``); the mean over all ``n (1 +
    negatives)`` terms, a 0-d tensor. ``q(d) = 1 / (1 + a d^(2b))``."""
    n = z_head.shape[0]
    order = torch.cat([torch.randperm(n, generator=generator) for _ in range(negatives)])
    order = order.to(z_head.device)
    d2_pos = (z_head - z_tail).square().sum(1)
    d2_neg = (z_head.repeat(negatives, 1) - z_tail[order]).square().sum(1)
    eps = 1e-4

    def log1p_term(d2: Tensor) -> Tensor:
        return torch.log1p(a * (d2 + eps).pow(b))

    attract = log1p_term(d2_pos)  # -log q
    u = a * (d2_neg + eps).pow(b)
    repel = torch.log1p(u) - torch.log(u)  # -log(1 - q)
    return torch.cat([attract, repel]).mean()
