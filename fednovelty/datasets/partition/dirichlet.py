"""Dirichlet(alpha) group skew: each group's rows are divided among clients by Dir(alpha) shares.

This follows the FedGMM / FedGenGMM papers and NIID-Bench (Li et al., 2022): for each group (a
class, or a k-means cluster from :func:`~fednovelty.datasets.partition.kmeans_groups` when the data
has no class column) draw client proportions ``p ~ Dir(alpha * 1)`` and cut that group's shuffled
rows at ``floor(cumsum(p) * n_group)``. Small ``alpha`` gives each client few groups; large
``alpha`` approaches IID. With ``min_size > 0`` the whole draw is repeated until every client has
at least that many rows (NIID-Bench's rule), and a clear error is raised if that looks hopeless.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from fednovelty.datasets.partition._common import (
    _MAX_TRIES,
    _check_alpha,
    _check_groups,
    _check_int,
    _group_members,
    _rng,
)

__all__ = ["dirichlet_partition"]


def dirichlet_partition(
    groups: ArrayLike,
    n_clients: int,
    alpha: float,
    *,
    random_state: int | np.random.Generator | None = None,
    min_size: int = 0,
) -> list[np.ndarray]:
    """Group-skewed split: each group's rows are divided among clients by Dir(alpha) shares.

    Args:
        groups: shape (n_samples,); any labels (class ids, cluster ids, strings).
        n_clients: number of clients, >= 1.
        alpha: Dirichlet concentration, > 0 and finite. 0.1 is strongly skewed, 100 is close
            to IID (use :func:`~fednovelty.datasets.partition.iid_partition` for exactly
            balanced IID splits).
        random_state: None, int or ``numpy.random.Generator``.
        min_size: redraw until every client holds at least this many rows; 0 allows empty
            clients.

    Returns:
        ``n_clients`` sorted int64 index arrays into ``groups``; every row appears exactly once.
        A group with fewer rows than clients simply leaves some clients without rows of it.

    Raises:
        ValueError: a bad argument (named in the message), or ``min_size`` not reached after
            1000 draws.

    Example:
        >>> parts = dirichlet_partition([0, 0, 0, 1, 1, 1], n_clients=2, alpha=1.0,
        ...                             random_state=0)
        >>> sorted(np.concatenate(parts).tolist())
        [0, 1, 2, 3, 4, 5]
    """
    labels = _check_groups(groups)
    n_clients = _check_int(n_clients, "n_clients", 1)
    min_size = _check_int(min_size, "min_size", 0)
    alpha = _check_alpha(alpha)
    n_samples = labels.shape[0]
    if min_size * n_clients > n_samples:
        raise ValueError(
            f"min_size={min_size} for each of n_clients={n_clients} needs "
            f"{min_size * n_clients} rows, but groups has only {n_samples}."
        )
    rng = _rng(random_state)
    _, members = _group_members(labels)
    for _ in range(_MAX_TRIES):
        chunks: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for rows in members:
            rows = rng.permutation(rows)
            shares = rng.dirichlet(np.full(n_clients, float(alpha)))
            cuts = (np.cumsum(shares) * rows.shape[0]).astype(np.int64)[:-1]
            for client, piece in enumerate(np.split(rows, cuts)):
                chunks[client].append(piece)
        parts = [np.sort(np.concatenate(c)).astype(np.int64) for c in chunks]
        if min(p.shape[0] for p in parts) >= min_size:
            return parts
    raise ValueError(
        f"could not give every client min_size={min_size} rows in {_MAX_TRIES} Dirichlet "
        f"draws with alpha={alpha} and n_clients={n_clients}; lower min_size, raise alpha or "
        f"use fewer clients."
    )
