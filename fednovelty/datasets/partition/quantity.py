"""Quantity(k) label-quantity skew: each client holds rows of only ``k`` distinct groups.

This is NIID-Bench's ``#C=k`` scheme (Li et al., 2022, "Federated learning on non-IID data
silos: an experimental study"), the FedGenGMM paper's "Quantity" partition: every client is
assigned ``groups_per_client`` distinct groups, and each group's shuffled rows are split evenly
(sizes differ by at most one) among the clients that hold it.

Unlike NIID-Bench, which draws each client's groups independently and drops the rows of groups
that no client drew, the groups here are dealt in rounds, each client taking a group it lacks
from those with the fewest holders so far (random tie-break; a swap with another client when it
already holds all of those). So every group is held by at least one client, every row is used
exactly once, and the numbers of holders of any two groups differ by at most one (barring rare
cases where no swap exists).
That needs ``n_clients * groups_per_client >= n_groups``; otherwise a ValueError says so.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from fednovelty.datasets.partition._common import _check_groups, _check_int, _group_members, _rng

__all__ = ["quantity_partition"]


def _assign_groups(
    n_groups: int, n_clients: int, k: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """``k`` distinct group codes per client (int64, sorted), every group held by some client.

    Deals ``k`` rounds; in each, the clients (in a random order) each take one group they do not
    hold yet, chosen at random among the groups with the fewest holders so far. When the client
    already holds every such group ``g``, a swap keeps the counts level: another client that
    lacks ``g`` hands the client one of its groups the client lacks and takes ``g`` instead. So
    no group gets a second holder while one has none (hence full cover when
    ``n_clients * k >= n_groups``), and holder counts differ by at most one whenever a swap is
    available (almost always).
    """
    holds = np.zeros((n_clients, n_groups), dtype=bool)
    n_holders = np.zeros(n_groups, dtype=np.int64)
    for _ in range(k):
        for c in rng.permutation(n_clients):
            fewest = n_holders == n_holders.min()
            free = np.flatnonzero(fewest & ~holds[c])
            if free.size:
                g = int(rng.choice(free))
                holds[c, g] = True
                n_holders[g] += 1
                continue
            g = int(rng.choice(np.flatnonzero(fewest)))  # c holds all of these
            swap = holds & ~holds[c][None, :] & ~holds[:, g][:, None]
            if swap.any():
                other, h = np.argwhere(swap)[rng.integers(np.count_nonzero(swap))]
                holds[other, h], holds[other, g], holds[c, h] = False, True, True
                n_holders[g] += 1
                continue
            load = np.where(holds[c], np.iinfo(np.int64).max, n_holders)
            g = int(rng.choice(np.flatnonzero(load == load.min())))
            holds[c, g] = True
            n_holders[g] += 1
    return [np.flatnonzero(row).astype(np.int64) for row in holds]


def quantity_partition(
    groups: ArrayLike,
    n_clients: int,
    groups_per_client: int,
    *,
    random_state: int | np.random.Generator | None = None,
) -> list[np.ndarray]:
    """Label-quantity skew: each client gets rows of only ``groups_per_client`` distinct groups.

    Each client is assigned ``groups_per_client`` distinct groups (every group goes to at least
    one client); each group's rows are shuffled and split evenly among the clients holding it.
    A group with fewer rows than holders leaves some holders with no rows of it, so a client can
    end up with fewer than ``groups_per_client`` groups (or, with tiny groups, no rows at all).
    Rows of a group held by no client cannot occur: such a partition is refused instead.

    Args:
        groups: shape (n_samples,); any labels (class ids, k-means cluster ids from
            :func:`~fednovelty.datasets.partition.kmeans_groups`, strings).
        n_clients: number of clients, >= 1, with ``n_clients * groups_per_client >= n_groups``.
        groups_per_client: ``k``, the number of distinct groups per client,
            ``1 <= k <= n_groups``. ``k = 1`` is the most skewed; ``k = n_groups`` gives every
            client every group (an IID-like split stratified by group).
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        ``n_clients`` sorted int64 index arrays into ``groups``; every row appears exactly once.

    Raises:
        ValueError: a bad argument, named in the message.

    Examples:
        >>> labels = np.repeat([0, 1, 2, 3], 5)  # 4 groups of 5 rows
        >>> parts = quantity_partition(labels, n_clients=4, groups_per_client=2,
        ...                            random_state=0)
        >>> [len(np.unique(labels[p])) for p in parts]
        [2, 2, 2, 2]
        >>> sorted(np.concatenate(parts).tolist()) == list(range(20))
        True
    """
    labels = _check_groups(groups)
    n_clients = _check_int(n_clients, "n_clients", 1)
    k = _check_int(groups_per_client, "groups_per_client", 1)
    _, members = _group_members(labels)
    n_groups = len(members)
    if k > n_groups:
        raise ValueError(
            f"groups_per_client={k} exceeds the number of distinct groups ({n_groups}); use "
            f"groups_per_client <= {n_groups}."
        )
    if n_clients * k < n_groups:
        raise ValueError(
            f"n_clients={n_clients} x groups_per_client={k} = {n_clients * k} client slots cannot "
            f"hold all {n_groups} groups, so some rows would belong to no client; raise "
            f"n_clients or groups_per_client so that n_clients * groups_per_client >= "
            f"{n_groups}."
        )
    rng = _rng(random_state)
    held = _assign_groups(n_groups, n_clients, k, rng)
    holders: list[list[int]] = [[] for _ in range(n_groups)]
    for client, codes in enumerate(held):
        for g in codes:
            holders[int(g)].append(client)
    chunks: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    for rows, owners in zip(members, holders, strict=True):
        rows = rng.permutation(rows)
        # shuffle who gets the larger pieces, so low client ids are not favoured
        owners = rng.permutation(owners)
        for client, piece in zip(owners, np.array_split(rows, owners.size), strict=True):
            chunks[int(client)].append(piece)
    return [np.sort(np.concatenate([*c, np.empty(0, np.int64)])).astype(np.int64) for c in chunks]
