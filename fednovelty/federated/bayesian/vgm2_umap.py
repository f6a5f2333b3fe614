"""Parametric UMAP's parts of VGM2's local loss (Eq. 1): the client's fuzzy kNN graph, the
curve ``q(d) = 1 / (1 + a d^(2b))`` and the cross-entropy on sampled edges.

umap-learn (the ``vgm2`` extra) builds the graph (``fuzzy_simplicial_set`` on scikit-learn's
exact neighbours) and fits ``a, b`` for ``min_dist``; the loss is torch's, differentiable in
the embeddings.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["fuzzy_graph", "umap_ab", "umap_loss"]


def _umap():
    """umap-learn's ``umap.umap_`` module (the ``vgm2`` extra), or an ImportError saying how
    to install it."""
    try:
        from umap import umap_
    except ImportError as error:  # pragma: no cover - the extra is installed by make
        raise ImportError(
            "VGM2's parametric-UMAP loss needs umap-learn: pip install 'fednovelty[vgm2]' "
            "(or umap-learn>=0.5.5)."
        ) from error
    return umap_


def umap_ab(min_dist: float, spread: float = 1.0) -> tuple[float, float]:
    """UMAP's curve ``q(d) = 1 / (1 + a d^(2b))`` for ``min_dist`` (umap-learn's fit)."""
    find_ab_params = _umap().find_ab_params

    a, b = find_ab_params(spread, min_dist)
    return float(a), float(b)


def fuzzy_graph(X: Tensor, n_neighbors: int, random_state: int) -> tuple[Tensor, Tensor, Tensor]:
    """UMAP's fuzzy simplicial set of rows ``X`` (n, n_features): umap-learn's
    ``fuzzy_simplicial_set`` on scikit-learn's exact Euclidean neighbours (the row itself
    included, as UMAP expects; ``min(n_neighbors, n)`` of them). Returns the edges' heads,
    tails (int64, (n_edges,)) and membership strengths (n_edges,) in ``X``'s dtype."""
    from sklearn.neighbors import NearestNeighbors

    fuzzy_simplicial_set = _umap().fuzzy_simplicial_set

    rows = X.detach().cpu().numpy().astype(np.float32)
    k = max(2, min(int(n_neighbors), rows.shape[0]))
    distances, indices = NearestNeighbors(n_neighbors=k).fit(rows).kneighbors(rows)
    graph, _, _ = fuzzy_simplicial_set(
        rows,
        k,
        np.random.RandomState(random_state),
        "euclidean",
        knn_indices=indices,
        knn_dists=distances.astype(np.float32),
    )
    coo = graph.tocoo()
    keep = coo.row != coo.col
    heads = torch.as_tensor(coo.row[keep].astype(np.int64))
    tails = torch.as_tensor(coo.col[keep].astype(np.int64))
    weights = torch.as_tensor(coo.data[keep]).to(device=X.device, dtype=X.dtype)
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
