"""Label shards: McMahan et al.'s (2017) pathological non-IID split, the VGM2 paper's
partition (Sec. 5: ``N = 30`` clients, each ``S`` equal-size disjoint shards).

Construction: the rows are sorted by label (a stable sort of a seeded permutation, so rows
of one label come in random order), cut into ``n_clients * shards_per_client`` contiguous
shards of equal size (sizes differ by at most one when the rows do not divide evenly), and
each client receives ``shards_per_client`` shards drawn at random without replacement. With
``shards_per_client = 2`` (McMahan's choice, and the one used for VGM2's MNIST table) a
client sees rows of at most two labels, and of one when both its shards fall in one label;
a shard may straddle a label boundary, so a client can hold a few rows of a third label.
Every row is used exactly once.

Randomness: one ``numpy.random.Generator`` from ``random_state``; the same int gives the
same partition on any machine.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from fednovelty.datasets.partition._common import _check_groups, _check_int, _rng

__all__ = ["shard_partition"]


def shard_partition(
    labels: ArrayLike,
    n_clients: int,
    shards_per_client: int = 2,
    *,
    random_state: int | np.random.Generator | None = None,
) -> list[np.ndarray]:
    """Label-shard partition of rows with ``labels`` (n_samples,).

    Args:
        labels: one label per row (any sortable values).
        n_clients: number of clients (>= 1).
        shards_per_client: S shards per client (>= 1; McMahan et al. and this package's VGM2
            benchmark use 2).
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        ``n_clients`` sorted int64 index arrays that together use every row once.

    Raises:
        ValueError: bad counts, or fewer rows than shards (``n_clients * shards_per_client``).
    """
    labels = _check_groups(labels)
    n_clients = _check_int(n_clients, "n_clients", 1)
    shards_per_client = _check_int(shards_per_client, "shards_per_client", 1)
    n_shards = n_clients * shards_per_client
    if labels.shape[0] < n_shards:
        raise ValueError(
            f"{labels.shape[0]} rows cannot fill {n_shards} shards (n_clients * "
            "shards_per_client); lower n_clients or shards_per_client."
        )
    rng = _rng(random_state)
    shuffled = rng.permutation(labels.shape[0])
    order = shuffled[np.argsort(labels[shuffled], kind="stable")]
    shards = np.array_split(order, n_shards)
    dealt = rng.permutation(n_shards).reshape(n_clients, shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])).astype(np.int64) for row in dealt]
