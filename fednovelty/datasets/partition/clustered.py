"""Cluster-wise skew: clients come in ground-truth clusters that share a label distribution.

The Fed-CAM paper (Ma et al., "Structured federated learning through clustered additive
modeling", Sec. 5, ``../shared/papers/002_fc9e07a2c9865de9.txt``) splits each
dataset among m = 200 clients in four ways. Two are client-wise and already exist here:

- "Client-wise non-IID by Dirichlet distribution (alpha = 0.1)" is
  ``dirichlet_partition(labels, 200, 0.1)``: every class's rows are divided among the clients
  by Dir(0.1) shares (NIID-Bench's form of Hsu et al., 2019, the paper's [31]; Hsu et al.
  themselves draw each client's class mix from Dir(alpha * prior), and the paper does not say
  which form it used; at alpha = 0.1 both give each client very few classes).
- "Client-wise non-IID by n-class (2) [...] randomly selects n-class out of all classes in the
  dataset for each client, as proposed by [1], and then samples instances from these datasets"
  is ``quantity_partition(labels, 200, 2)``: each client holds rows of 2 classes (classes dealt
  so that every class has a holder and holder counts are level; McMahan et al.'s shards give
  the same two-classes-per-client picture).

The two cluster-wise ones are this module's, built from those same two partitioners applied
twice, first to clusters and then to the clients inside each cluster:

- :func:`cluster_dirichlet_partition`, the paper's "Cluster-wise non-IID by Dirichlet
  distribution (alpha = (0.1, 10)): This strategy divides the dataset into K clusters with
  alpha = 0.1 to generate substantial variance in cluster-wise non-IID. Then, each cluster is
  divided into m/K clients with alpha = 10 to control the non-IID across clients."
  ``dirichlet_partition(labels, n_clusters, alpha)`` gives the clusters' rows; each cluster's
  rows go to its clients by ``dirichlet_partition(..., client_alpha)``. With ``client_alpha``
  large (10) the clients of a cluster are near-homogeneous draws of its label distribution.
- :func:`cluster_nclass_partition`, the paper's "Cluster-wise non-IID by n-class (3, 2): This
  approach randomly assigns 3 classes to each cluster, ensuring a relatively balanced number
  of instances per class. It then assigns 2 classes to each client."
  ``quantity_partition(labels, n_clusters, 3)`` gives the clusters' rows (classes dealt so that
  the numbers of clusters holding any two classes differ by at most one, and each class's
  rows split evenly among its clusters: our reading of "a relatively balanced number of
  instances per class"); inside each cluster ``quantity_partition(..., 2)`` gives each client 2
  of its cluster's 3 classes. Clients of one cluster are therefore not identical (a cluster
  {a, b, c} has clients {a, b}, {a, c}, {b, c}) but all draw on the same 3 classes.

Where the paper is silent, these choices (each a parameter or stated in a docstring):

- The number of true clusters K is an argument (``n_clusters``). The paper writes K for both
  the data's clusters and the methods' cluster models (K in {5, 10} in Table 1) and does not say
  whether the data's K follows the model's.
- "m/K clients" when K does not divide m: cluster sizes differ by at most one, the larger
  clusters chosen at random.
- Client order: clients are returned in a random order (not cluster by cluster), so that no
  method can read the truth from client ids; ``client_clusters`` holds each client's true
  cluster (for the adjusted Rand index of a recovered clustering).
- Every row is used exactly once, as by the partitioners reused. An n-class split whose slots
  cannot hold every class (``n_clusters * groups_per_cluster < n_groups``, or a cluster's
  clients too few for its classes) is refused by name rather than dropping rows.
- ``min_size`` as in ``dirichlet_partition``: the whole two-level draw is repeated until every
  client holds at least that many rows, and a named error follows 1000 failed draws.
- "Class" is any grouping, as elsewhere in this package (k-means groups of a dataset without a
  class column work the same), hence the argument names ``groups``, ``groups_per_cluster``
  and ``groups_per_client``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from fednovelty.datasets.partition._common import (
    _MAX_TRIES,
    _check_alpha,
    _check_groups,
    _check_int,
    _rng,
)
from fednovelty.datasets.partition.dirichlet import dirichlet_partition
from fednovelty.datasets.partition.quantity import quantity_partition

__all__ = ["ClusteredPartition", "cluster_dirichlet_partition", "cluster_nclass_partition"]


class ClusteredPartition(NamedTuple):
    """A partition with the ground-truth cluster of each client; unpacks as a pair.

    Attributes:
        parts: ``n_clients`` sorted int64 index arrays into the rows; every row appears in
            exactly one of them.
        client_clusters: int64 array of shape (n_clients,); ``client_clusters[c]`` is the true
            cluster (in ``range(n_clusters)``) of the client holding ``parts[c]``.
    """

    parts: list[np.ndarray]
    client_clusters: np.ndarray


def _check_clusters(n_clusters, n_clients: int) -> int:
    """``n_clusters`` as an int in ``[1, n_clients]``; else a ValueError naming the problem."""
    n_clusters = _check_int(n_clusters, "n_clusters", 1)
    if n_clusters > n_clients:
        raise ValueError(
            f"n_clusters={n_clusters} exceeds n_clients={n_clients}; every cluster needs at "
            f"least one client. Use n_clusters <= n_clients."
        )
    return n_clusters


def _check_concentration(value, name: str) -> float:
    """A Dirichlet concentration named ``name`` in the error (``_check_alpha``'s rule)."""
    return _check_alpha(value, name, "e.g. 0.1; large = close to IID, e.g. 10")


def _check_min_size(min_size, n_clients: int, n_samples: int) -> int:
    min_size = _check_int(min_size, "min_size", 0)
    if min_size * n_clients > n_samples:
        raise ValueError(
            f"min_size={min_size} for each of n_clients={n_clients} needs "
            f"{min_size * n_clients} rows, but groups has only {n_samples}."
        )
    return min_size


def _clients_per_cluster(n_clients: int, n_clusters: int, rng: np.random.Generator) -> np.ndarray:
    """m/K clients per cluster, shape (n_clusters,): sizes differ by at most one (random extras)."""
    sizes = np.full(n_clusters, n_clients // n_clusters, dtype=np.int64)
    sizes[rng.choice(n_clusters, n_clients % n_clusters, replace=False)] += 1
    return sizes


def _codes(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct labels (sorted) and each row's int64 code into them."""
    values, codes = np.unique(labels, return_inverse=True)
    return values, codes.ravel().astype(np.int64)


def _shuffled(parts: list[np.ndarray], owners: list[int], rng) -> ClusteredPartition:
    """Clients in a random order, so that client ids say nothing of the clusters."""
    order = rng.permutation(len(parts))
    clusters = np.asarray(owners, dtype=np.int64)[order]
    return ClusteredPartition([parts[i] for i in order], clusters)


def _draw_until_filled(
    n_clients: int,
    n_clusters: int,
    min_size: int,
    rng: np.random.Generator,
    draw_clusters: Callable[[], list[np.ndarray] | None],
    draw_clients: Callable[[np.ndarray, int], list[np.ndarray]],
    failure: str,
) -> ClusteredPartition:
    """Two-level draws, at most ``_MAX_TRIES``, until every client holds ``min_size`` rows.

    Each draw splits the clients among the clusters (:func:`_clients_per_cluster`), then the
    rows: ``draw_clusters()`` gives one index array per cluster (``None``: redraw), and
    ``draw_clients(rows, s)`` splits a cluster's ``rows`` (index array) into ``s`` index
    arrays into the same rows' space, one per client.

    Raises:
        ValueError: no draw filled every client; ``failure`` ends the message (what was
            drawn and what to change).
    """
    for _ in range(_MAX_TRIES):
        sizes = _clients_per_cluster(n_clients, n_clusters, rng)
        clusters = draw_clusters()
        if clusters is None:
            continue
        if any(rows.size < min_size * s for rows, s in zip(clusters, sizes, strict=True)):
            continue
        parts: list[np.ndarray] = []
        owners: list[int] = []
        for k, (rows, s) in enumerate(zip(clusters, sizes, strict=True)):
            parts.extend(draw_clients(rows, int(s)))
            owners.extend([k] * int(s))
        if min(p.shape[0] for p in parts) >= min_size:
            return _shuffled(parts, owners, rng)
    raise ValueError(
        f"could not give every client min_size={min_size} rows in {_MAX_TRIES} cluster-wise "
        + failure
    )


def cluster_dirichlet_partition(
    groups: ArrayLike,
    n_clients: int,
    n_clusters: int,
    alpha: float,
    client_alpha: float = 10.0,
    *,
    random_state: int | np.random.Generator | None = None,
    min_size: int = 0,
) -> ClusteredPartition:
    """Fed-CAM's cluster-wise Dirichlet(alpha, client_alpha): Dir shares to clusters, then clients.

    Every group's rows are divided among ``n_clusters`` clusters by Dir(``alpha``) shares (as
    :func:`~fednovelty.datasets.partition.dirichlet_partition`); then each cluster's rows are
    divided among its ``n_clients / n_clusters`` clients (sizes within one) the same way with
    Dir(``client_alpha``). Small ``alpha`` (0.1) makes clusters' label distributions differ
    strongly; large ``client_alpha`` (10) keeps the clients of a cluster close to their
    cluster's distribution. The paper's "Dirichlet alpha = (0.1, 10)" is
    ``cluster_dirichlet_partition(labels, 200, K, 0.1, 10.0)``.

    Args:
        groups: shape (n_samples,); any labels (class ids, k-means cluster ids, strings).
        n_clients: number of clients, >= 1.
        n_clusters: number of ground-truth clusters, ``1 <= n_clusters <= n_clients``.
        alpha: Dirichlet concentration across clusters, > 0 and finite.
        client_alpha: Dirichlet concentration across the clients of one cluster, > 0 and
            finite (default 10, the paper's).
        random_state: None, int or ``numpy.random.Generator``.
        min_size: redraw (both levels) until every client holds at least this many rows; 0
            allows empty clients (a cluster may then receive no rows at all).

    Returns:
        :class:`ClusteredPartition` ``(parts, client_clusters)``: ``n_clients`` sorted int64
        index arrays into ``groups`` (every row exactly once), in a random client order, and
        the true cluster of each client, shape (n_clients,).

    Raises:
        ValueError: a bad argument (named in the message), more clusters than clients, or
            ``min_size`` not reached after 1000 draws.

    Example:
        >>> labels = np.repeat(np.arange(10), 100)
        >>> parts, client_clusters = cluster_dirichlet_partition(
        ...     labels, n_clients=20, n_clusters=4, alpha=0.1, random_state=0)
        >>> np.bincount(client_clusters).tolist()
        [5, 5, 5, 5]
        >>> sorted(np.concatenate(parts).tolist()) == list(range(1000))
        True
    """
    labels = _check_groups(groups)
    n_clients = _check_int(n_clients, "n_clients", 1)
    n_clusters = _check_clusters(n_clusters, n_clients)
    alpha = _check_concentration(alpha, "alpha")
    client_alpha = _check_concentration(client_alpha, "client_alpha")
    min_size = _check_min_size(min_size, n_clients, labels.shape[0])
    rng = _rng(random_state)
    _, codes = _codes(labels)

    def draw_clients(rows: np.ndarray, s: int) -> list[np.ndarray]:
        if not rows.size:  # min_size == 0: an empty cluster has empty clients
            return [np.empty(0, np.int64) for _ in range(s)]
        return [
            rows[p] for p in dirichlet_partition(codes[rows], s, client_alpha, random_state=rng)
        ]

    return _draw_until_filled(
        n_clients,
        n_clusters,
        min_size,
        rng,
        lambda: dirichlet_partition(codes, n_clusters, alpha, random_state=rng),
        draw_clients,
        f"Dirichlet draws with alpha={alpha}, client_alpha={client_alpha}, "
        f"n_clusters={n_clusters} and n_clients={n_clients}; lower min_size, raise alpha (a "
        f"small one starves some clusters) or use fewer clients.",
    )


def cluster_nclass_partition(
    groups: ArrayLike,
    n_clients: int,
    n_clusters: int,
    groups_per_cluster: int,
    groups_per_client: int,
    *,
    random_state: int | np.random.Generator | None = None,
    min_size: int = 0,
) -> ClusteredPartition:
    """Fed-CAM's cluster-wise n-class(c, k): ``c`` groups per cluster, ``k`` of them per client.

    Each cluster is dealt ``groups_per_cluster`` distinct groups and each group's rows are split
    evenly among the clusters holding it (as
    :func:`~fednovelty.datasets.partition.quantity_partition`: every group is held, holder
    counts within one). Inside each cluster, its ``n_clients / n_clusters`` clients (sizes
    within one) are each dealt ``groups_per_client`` of the cluster's groups the same way. So
    every cluster holds rows of exactly ``groups_per_cluster`` groups, and every client's groups
    are among its cluster's. The paper's "n-class (3, 2)" is
    ``cluster_nclass_partition(labels, 200, K, 3, 2)``.

    A group with fewer rows than the clients sharing it inside a cluster leaves some of them
    without it, so a client can hold fewer than ``groups_per_client`` groups (tiny groups only).

    Args:
        groups: shape (n_samples,); any labels (class ids, k-means cluster ids, strings).
        n_clients: number of clients, >= 1.
        n_clusters: number of ground-truth clusters, ``1 <= n_clusters <= n_clients``, with
            ``n_clusters * groups_per_cluster >= n_groups`` (every group in some cluster).
        groups_per_cluster: distinct groups per cluster, ``1 <= c <= n_groups``.
        groups_per_client: distinct groups per client, ``1 <= k <= groups_per_cluster``, with
            ``(n_clients // n_clusters) * k >= c`` (a cluster's clients hold all its groups).
        random_state: None, int or ``numpy.random.Generator``.
        min_size: redraw (both levels) until every client holds at least this many rows.

    Returns:
        :class:`ClusteredPartition` ``(parts, client_clusters)``: ``n_clients`` sorted int64
        index arrays into ``groups`` (every row exactly once), in a random client order, and
        the true cluster of each client, shape (n_clients,).

    Raises:
        ValueError: a bad argument or an impossible combination (named in the message), a
            group with fewer rows than the clusters that share it, or ``min_size`` not reached
            after 1000 draws.

    Example:
        >>> labels = np.repeat(np.arange(10), 60)
        >>> parts, client_clusters = cluster_nclass_partition(
        ...     labels, n_clients=20, n_clusters=5, groups_per_cluster=3,
        ...     groups_per_client=2, random_state=0)
        >>> sorted({np.unique(labels[p]).size for p in parts})
        [2]
        >>> [np.unique(labels[np.concatenate([p for p, c in zip(parts, client_clusters)
        ...                                   if c == k])]).size for k in range(5)]
        [3, 3, 3, 3, 3]
    """
    labels = _check_groups(groups)
    n_clients = _check_int(n_clients, "n_clients", 1)
    n_clusters = _check_clusters(n_clusters, n_clients)
    per_cluster = _check_int(groups_per_cluster, "groups_per_cluster", 1)
    per_client = _check_int(groups_per_client, "groups_per_client", 1)
    min_size = _check_min_size(min_size, n_clients, labels.shape[0])
    values, codes = _codes(labels)
    n_groups = values.shape[0]
    if per_cluster > n_groups:
        raise ValueError(
            f"groups_per_cluster={per_cluster} exceeds the number of distinct groups "
            f"({n_groups}); use groups_per_cluster <= {n_groups}."
        )
    if per_client > per_cluster:
        raise ValueError(
            f"groups_per_client={per_client} exceeds groups_per_cluster={per_cluster}; a "
            f"client's groups are drawn from its cluster's."
        )
    if n_clusters * per_cluster < n_groups:
        raise ValueError(
            f"n_clusters={n_clusters} x groups_per_cluster={per_cluster} = "
            f"{n_clusters * per_cluster} cluster slots cannot hold all {n_groups} groups, so "
            f"some rows would belong to no client; raise n_clusters or groups_per_cluster so "
            f"that n_clusters * groups_per_cluster >= {n_groups}."
        )
    fewest = n_clients // n_clusters
    if fewest * per_client < per_cluster:
        need = math.ceil(per_cluster / per_client) * n_clusters
        raise ValueError(
            f"a cluster of {fewest} client(s) x groups_per_client={per_client} = "
            f"{fewest * per_client} client slots cannot hold its {per_cluster} groups "
            f"(n_clients={n_clients} over n_clusters={n_clusters}); use n_clients >= {need}, "
            f"fewer clusters or more groups per client."
        )
    sharing = math.ceil(n_clusters * per_cluster / n_groups)  # most clusters holding one group
    counts = np.bincount(codes, minlength=n_groups)
    rare = np.flatnonzero(counts < sharing)
    if rare.size:
        g = int(rare[0])
        name = values[g].tolist()  # a plain int or str in the message
        raise ValueError(
            f"group {name!r} has {counts[g]} row(s), fewer than the {sharing} clusters "
            f"that may share it ({n_clusters} clusters x {per_cluster} groups over {n_groups} "
            f"groups), so a cluster could hold none of its rows; drop or merge rare groups, or "
            f"lower n_clusters or groups_per_cluster."
        )
    rng = _rng(random_state)

    def draw_clusters() -> list[np.ndarray] | None:
        clusters = quantity_partition(codes, n_clusters, per_cluster, random_state=rng)
        # holder counts can exceed `sharing` when quantity's dealing finds no swap (rare): redraw
        if any(np.unique(codes[rows]).size != per_cluster for rows in clusters):
            return None
        return clusters

    return _draw_until_filled(
        n_clients,
        n_clusters,
        min_size,
        rng,
        draw_clusters,
        lambda rows, s: [
            rows[p] for p in quantity_partition(codes[rows], s, per_client, random_state=rng)
        ],
        f"n-class draws with n_clusters={n_clusters}, groups_per_cluster={per_cluster}, "
        f"groups_per_client={per_client} and n_clients={n_clients}; lower min_size or use "
        f"fewer clients.",
    )
