"""k-means++ seeding and Lloyd iterations in torch, with sample weights.

Used to initialise mixtures locally and, on the server, to seed federated k-means from the
clients' local centroids (weighted by their counts). Randomness comes from a CPU
``torch.Generator`` so the same seed gives the same numbers on any device.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.rows import RowSource


def squared_distances(X: Tensor, centers: Tensor) -> Tensor:
    """Squared Euclidean distances, shape (n_samples, n_centers); clamped at 0."""
    d2 = (
        X.square().sum(1, keepdim=True)
        - 2.0 * (X @ centers.T)
        + centers.square().sum(1).unsqueeze(0)
    )
    return d2.clamp_min_(0.0)


def _uniform(generator: torch.Generator, size: int, like: Tensor) -> Tensor:
    return torch.rand(size, generator=generator, dtype=torch.float64).to(like.device, like.dtype)


def kmeans_plusplus(
    X: Tensor,
    n_clusters: int,
    *,
    generator: torch.Generator,
    sample_weight: Tensor | None = None,
    n_local_trials: int | None = None,
) -> Tensor:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii; scikit-learn's variant).

    Args:
        X: points, shape (n_samples, n_features); needs ``n_samples >= n_clusters``.
        n_clusters: number of centres.
        generator: CPU random generator.
        sample_weight: non-negative weights, shape (n_samples,); default all ones.
        n_local_trials: candidates per step; default ``2 + int(log(n_clusters))``.

    Returns:
        Centres, shape (n_clusters, n_features), rows of ``X``.
    """
    n_samples = X.shape[0]
    if n_samples < n_clusters:
        raise ValueError(
            f"kmeans_plusplus needs n_samples >= n_clusters, got {n_samples} < {n_clusters}."
        )
    weight = (
        torch.ones(n_samples, dtype=X.dtype, device=X.device)
        if sample_weight is None
        else sample_weight
    )
    n_local_trials = n_local_trials or 2 + int(math.log(n_clusters))
    first = int(torch.multinomial(weight.double().cpu(), 1, generator=generator))
    index = [first]
    closest = squared_distances(X, X[first : first + 1]).squeeze(1)
    potential = closest @ weight
    for _ in range(1, n_clusters):
        cumulative = torch.cumsum(weight * closest, 0)
        if float(potential) <= 0:
            # Every point with positive weight coincides with a chosen centre: take an unused
            # row, preferring ones with positive weight.
            used = set(index)
            unused = [i for i in range(n_samples) if i not in used]
            positive = [i for i in unused if float(weight[i]) > 0]
            index.append((positive or unused)[0])
            continue
        targets = _uniform(generator, n_local_trials, X) * potential
        candidates = torch.searchsorted(cumulative, targets).clamp_max_(n_samples - 1)
        dist = torch.minimum(closest.unsqueeze(0), squared_distances(X[candidates], X))
        pots = dist @ weight
        best = int(torch.argmin(pots))
        potential = pots[best]
        closest = dist[best]
        index.append(int(candidates[best]))
    return X[torch.tensor(index, device=X.device)].clone()


def assign(X: Tensor, centers: Tensor) -> tuple[Tensor, Tensor]:
    """Nearest centre of each row: ``(labels, squared_distance)``, each shape (n_samples,)."""
    d2 = squared_distances(X, centers)
    dist, labels = d2.min(1)
    return labels, dist


def one_hot(labels: Tensor, n_clusters: int, like: Tensor) -> Tensor:
    """Hard responsibilities, shape (n_samples, n_clusters), dtype/device of ``like``."""
    resp = torch.zeros(labels.shape[0], n_clusters, dtype=like.dtype, device=like.device)
    resp[torch.arange(labels.shape[0], device=like.device), labels] = 1.0
    return resp


def kmeans(
    X: Tensor,
    n_clusters: int,
    *,
    generator: torch.Generator,
    sample_weight: Tensor | None = None,
    max_iter: int = 100,
    tol: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """Weighted Lloyd's algorithm from a k-means++ seed.

    ``tol`` is relative to the mean per-feature variance of ``X`` (scikit-learn's rule).
    Empty clusters keep their previous centre.

    ``X`` may be a :class:`~fednovelty.mixture.rows.RowSource` (rows read in chunks, equal
    weights): :func:`~fednovelty.mixture.kmeans_rows.kmeans_rows` runs the same algorithm
    pass by pass, and no label per row is kept (``labels`` is None).

    Returns:
        ``(centers, labels)``: shapes (n_clusters, n_features) and (n_samples,).
    """
    if isinstance(X, RowSource):
        if sample_weight is not None:
            raise ValueError("kmeans of a row source takes equal weights; sample_weight=None.")
        from fednovelty.mixture.kmeans_rows import kmeans_rows

        centers, _ = kmeans_rows(X, n_clusters, generator=generator, max_iter=max_iter, tol=tol)
        return centers, None
    weight = (
        torch.ones(X.shape[0], dtype=X.dtype, device=X.device)
        if sample_weight is None
        else sample_weight
    )
    centers = kmeans_plusplus(X, n_clusters, generator=generator, sample_weight=weight)
    threshold = tol * float(X.var(0, unbiased=False).mean()) if X.shape[0] > 1 else 0.0
    labels, _ = assign(X, centers)
    for _ in range(max_iter):
        resp = one_hot(labels, n_clusters, X) * weight.unsqueeze(1)
        counts = resp.sum(0)
        sums = resp.T @ X
        new_centers = torch.where(
            counts.unsqueeze(1) > 0, sums / counts.clamp_min(1e-300).unsqueeze(1), centers
        )
        shift = float((new_centers - centers).square().sum())
        centers = new_centers
        labels, _ = assign(X, centers)
        if shift <= threshold:
            break
    return centers, labels
