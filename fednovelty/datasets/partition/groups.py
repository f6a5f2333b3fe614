"""Groupings around a partition: k-means clusters to skew over, and client id per row.

- :func:`kmeans_groups` makes the ``groups`` that a partitioner skews over when a dataset has no
  class column (the FedGenGMM paper's feature-distribution skew).
- :func:`groups_from_partition` inverts a partition into the ``groups=`` array (client id per
  row) that a detector's ``fit`` takes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.cluster import KMeans

from fednovelty.datasets.partition._common import _check_int, _check_parts, _rng

__all__ = ["groups_from_partition", "kmeans_groups"]


def kmeans_groups(
    X: ArrayLike,
    n_groups: int,
    *,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    """k-means cluster labels, to make feature-distribution skew when there is no class column.

    Feed the result to :func:`~fednovelty.datasets.partition.dirichlet_partition` or
    :func:`~fednovelty.datasets.partition.quantity_partition` as ``groups``. k-means is
    scale-sensitive: scale the features first (e.g. with ``MinMaxScaling``) if their units differ.

    Args:
        X: shape (n_samples, n_features), finite.
        n_groups: number of clusters, 1 <= n_groups <= n_samples.
        random_state: None, int or ``numpy.random.Generator`` (a Generator supplies the seed
            for scikit-learn's ``KMeans``).

    Returns:
        int64 array of shape (n_samples,) with values in ``range(n_groups)``.

    Example:
        >>> X = np.array([[0.0], [0.1], [10.0], [10.1]])
        >>> labels = kmeans_groups(X, 2, random_state=0)
        >>> bool(labels[0] == labels[1] != labels[2] == labels[3])
        True
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X must be a non-empty 2-D array (n_samples, n_features); got {X.shape}.")
    if not np.isfinite(X).all():
        raise ValueError("X contains NaN or infinite values; drop or impute them first.")
    n_groups = _check_int(n_groups, "n_groups", 1)
    if n_groups > X.shape[0]:
        raise ValueError(f"n_groups={n_groups} exceeds the number of rows in X ({X.shape[0]}).")
    seed = random_state
    if random_state is not None:
        seed = int(_rng(random_state).integers(2**31 - 1))
    labels = KMeans(n_clusters=n_groups, n_init="auto", random_state=seed).fit_predict(X)
    return labels.astype(np.int64)


def groups_from_partition(parts: list[ArrayLike], n_samples: int) -> np.ndarray:
    """Client id per row: the inverse of a partition, as a detector's ``fit(groups=...)`` takes.

    Args:
        parts: ``n_clients`` index arrays that together use each of ``range(n_samples)`` once.
        n_samples: total number of rows.

    Returns:
        int64 array of shape (n_samples,); ``out[i]`` is the client that holds row ``i``.

    Raises:
        ValueError: an index out of range, a row in two clients, or a row in none.

    Example:
        >>> groups_from_partition([np.array([0, 3]), np.array([1, 2])], 4).tolist()
        [0, 1, 1, 0]
    """
    n_samples = _check_int(n_samples, "n_samples", 0)
    arrays = _check_parts(parts, n_samples)
    rows = np.concatenate([idx.astype(np.int64) for idx in arrays] + [np.empty(0, np.int64)])
    owners = np.repeat(np.arange(len(arrays), dtype=np.int64), [idx.size for idx in arrays])
    counts = np.bincount(rows, minlength=n_samples)
    repeated = np.flatnonzero(counts > 1)
    if repeated.size:
        row = int(repeated[0])
        raise ValueError(
            f"row {row} is in more than one client (clients {owners[rows == row].tolist()}); "
            f"every row must belong to exactly one client."
        )
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        raise ValueError(
            f"{missing.size} rows are in no client (first: {missing[:5].tolist()}); a partition "
            f"must use every row of range(n_samples) exactly once."
        )
    out = np.empty(n_samples, dtype=np.int64)
    out[rows] = owners
    return out
