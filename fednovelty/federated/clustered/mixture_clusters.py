"""The clusters of a clustered additive mixture
(:class:`~fednovelty.federated.clustered.clustered_em.ClusteredEM`): which components each
cluster's clients use, how well each cluster's mixture fits rows, and the server's k-means
of the clients' weight summaries.

A model of ``M = K_g + C K_c`` components is shared by ``C`` clusters: component ``k``
belongs to cluster ``component_clusters[k]`` (-1: global, used by every cluster). These pure
functions give each cluster its components (:func:`partition_components`: the ones its
members use most), score rows under each cluster's mixture (:func:`row_log_likelihoods`,
:func:`cluster_log_likelihoods`) and cluster clients by the Hellinger distance of their
weights (:func:`summary_of`, :func:`hellinger_kmeans`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.kmeans import assign, kmeans_plusplus

__all__ = [
    "allowed_components",
    "cluster_log_likelihoods",
    "hellinger_kmeans",
    "log_normalised",
    "partition_components",
    "row_log_likelihoods",
    "summary_of",
]


def allowed_components(component_clusters: Tensor, n_clusters: int) -> Tensor:
    """Which components each cluster's clients use: the global ones and their cluster's.

    Args:
        component_clusters: (M,) int64, -1 for a global component, else its cluster.
        n_clusters: C.

    Returns:
        (C, M) bool.
    """
    clusters = torch.arange(n_clusters, device=component_clusters.device).unsqueeze(1)
    return (component_clusters.unsqueeze(0) == -1) | (component_clusters.unsqueeze(0) == clusters)


def cluster_log_likelihoods(log_prob: Tensor, cluster_log_weights: Tensor) -> Tensor:
    """Mean log-likelihood per row of rows under each cluster's mixture.

    Args:
        log_prob: (n_samples, M) ``log N(x_i; mu_k, Sigma_k)``.
        cluster_log_weights: (C, M) each cluster's log weights (-inf where not allowed).

    Returns:
        (C,); ``-inf`` for a cluster without an allowed component.
    """
    return row_log_likelihoods(log_prob, cluster_log_weights).mean(0)


def row_log_likelihoods(log_prob: Tensor, cluster_log_weights: Tensor) -> Tensor:
    """Each row's log-likelihood under each cluster's mixture: (n_samples, C) from
    ``log_prob`` (n_samples, M) and ``cluster_log_weights`` (C, M); ``-inf`` for a cluster
    without an allowed component."""
    joint = log_prob.unsqueeze(1) + cluster_log_weights.unsqueeze(0)  # (n, C, M)
    return torch.logsumexp(joint, dim=2)


def hellinger_kmeans(
    summaries: Tensor,
    n_clusters: int,
    generator: torch.Generator,
    *,
    restarts: int = 5,
    max_iter: int = 100,
    centers_init: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """k-means of clients' summaries (rows), the best of ``restarts`` k-means++ starts (or
    one start from ``centers_init``); an empty cluster's centre is re-seeded at the row
    farthest from its own centre.

    Args:
        summaries: (n_clients, p) rows (square roots of weight vectors for the Hellinger
            distance).
        n_clusters: C <= n_clients.
        generator: the draws of k-means++.
        restarts: starts tried (>= 1) when ``centers_init`` is None.
        centers_init: (C, p) a warm start.

    Returns:
        ``(labels (n_clients,) int64, centers (C, p))``.
    """
    n = summaries.shape[0]
    if n_clusters > n:
        raise ValueError(f"n_clusters={n_clusters} exceeds the {n} clients to cluster.")
    starts = [centers_init] if centers_init is not None else [None] * max(1, restarts)
    best = None
    for start in starts:
        centers = (
            kmeans_plusplus(summaries, n_clusters, generator=generator)
            if start is None
            else start.clone()
        )
        labels = torch.zeros(n, dtype=torch.long, device=summaries.device)
        for _ in range(max_iter):
            new, dist = assign(summaries, centers)
            for j in range(n_clusters):
                if not bool((new == j).any()):  # re-seed at the farthest row
                    far = int(dist.argmax())
                    new[far], dist[far] = j, 0.0
            centers = torch.stack([summaries[new == j].mean(0) for j in range(n_clusters)])
            if bool((new == labels).all()):
                break
            labels = new
        inertia = float(assign(summaries, centers)[1].sum())
        if best is None or inertia < best[0] - 1e-12 * max(1.0, abs(best[0])):
            best = (inertia, labels, centers)
    return best[1], best[2]


def partition_components(
    member_weights: list[Tensor], cluster_components: int
) -> tuple[Tensor, Tensor]:
    """Give each cluster the ``cluster_components`` components its members use most
    (:class:`~fednovelty.federated.clustered.clustered_em.ClusteredEM`, step 2); the
    rest stay global.

    A component's *share* in cluster ``j`` is the members' mean weight on it over the sum of
    that mean across clusters. In ``cluster_components`` passes, every cluster in turn takes
    the unassigned component with its largest share (ties: the lowest index).

    Args:
        member_weights: per cluster, (n_members, M) its members' weights (a cluster with no
            member counts as using nothing).
        cluster_components: K_c, with ``C K_c < M``.

    Returns:
        ``(component_clusters, cluster_log_weights)``: (M,) int64 each component's cluster
        (-1: global) and (C, M) each cluster's log weights, its members' mean weights on
        the global components and its own, renormalised (-inf elsewhere).
    """
    m = member_weights[0].shape[1]
    usage = torch.stack(
        [w.mean(0) if w.shape[0] else w.new_zeros(m) for w in member_weights]
    )  # (C, M)
    n_clusters = usage.shape[0]
    share = usage / usage.sum(0, keepdim=True).clamp_min(torch.finfo(usage.dtype).tiny)
    owners = torch.full((m,), -1, dtype=torch.long, device=usage.device)
    for _ in range(cluster_components):
        for j in range(n_clusters):
            free = owners == -1
            candidates = torch.where(free, share[j], torch.full_like(share[j], -1.0))
            owners[int(torch.argmax(candidates))] = j
    allowed = allowed_components(owners, n_clusters)
    floor = 10 * torch.finfo(usage.dtype).eps
    weights = torch.where(allowed, usage + floor, torch.zeros_like(usage))
    return owners, (weights / weights.sum(1, keepdim=True)).log()


def log_normalised(weights: Tensor) -> Tensor:
    """log of ``weights / weights.sum()``, -inf where a weight is 0."""
    total = weights.sum()
    if float(total) <= 0:
        raise ValueError("a cluster's weights are all zero.")
    return (weights / total).log()


def summary_of(counts: Tensor) -> Tensor:
    """A client's summary for the server's k-means: the square roots of its weights (their
    Euclidean distance is the Hellinger distance). counts: (M,) -> (M,)."""
    part = counts.clamp_min(0)
    total = part.sum()
    if float(total) <= 0:
        return torch.full_like(part, 1.0 / math.sqrt(part.numel()))
    return (part / total).sqrt()
