"""Split one dataset's rows among simulated clients (IID or Dirichlet label/feature skew).

A partition is a ``list`` of ``n_clients`` int64 index arrays, each sorted, that together use
every row exactly once. :func:`groups_from_partition` turns it into the ``groups=`` array (client
id per row) that a detector's ``fit`` takes.

Dirichlet skew follows the FedGMM / FedGenGMM papers and NIID-Bench (Li et al., 2022): for each
group (a class, or a k-means cluster from :func:`kmeans_groups` when the data has no class
column) draw client proportions ``p ~ Dir(alpha * 1)`` and cut that group's shuffled rows at
``floor(cumsum(p) * n_group)``. Small ``alpha`` gives each client few groups; large ``alpha``
approaches IID. With ``min_size > 0`` the whole draw is repeated until every client has at least
that many rows (NIID-Bench's rule), and a clear error is raised if that looks hopeless.

Randomness: ``random_state`` is None, an int, or a ``numpy.random.Generator``; the same int
gives the same partition on any machine (numpy's PCG64 stream is stable across platforms).
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike
from sklearn.cluster import KMeans

__all__ = ["dirichlet_partition", "groups_from_partition", "iid_partition", "kmeans_groups"]

_MAX_TRIES = 1000


def _rng(random_state: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or (
        isinstance(random_state, numbers.Integral)
        and not isinstance(random_state, bool)
        and random_state >= 0
    ):
        return np.random.default_rng(random_state)
    raise ValueError(
        f"random_state must be None, a non-negative int or a numpy.random.Generator; "
        f"got {random_state!r}."
    )


def _check_int(value, name: str, minimum: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}.")
    return int(value)


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
            to IID (use :func:`iid_partition` for exactly balanced IID splits).
        random_state: None, int or ``numpy.random.Generator``.
        min_size: redraw until every client holds at least this many rows; 0 allows empty
            clients.

    Returns:
        ``n_clients`` sorted int64 index arrays into ``groups``; every row appears exactly once.

    Raises:
        ValueError: a bad argument (named in the message), or ``min_size`` not reached after
            1000 draws.

    Example:
        >>> parts = dirichlet_partition([0, 0, 0, 1, 1, 1], n_clients=2, alpha=1.0,
        ...                             random_state=0)
        >>> sorted(np.concatenate(parts).tolist())
        [0, 1, 2, 3, 4, 5]
    """
    labels = np.asarray(groups)
    if labels.ndim != 1 or labels.shape[0] == 0:
        raise ValueError(f"groups must be a non-empty 1-D array (n_samples,); got {labels.shape}.")
    n_clients = _check_int(n_clients, "n_clients", 1)
    min_size = _check_int(min_size, "min_size", 0)
    if (
        not isinstance(alpha, numbers.Real)
        or isinstance(alpha, bool)
        or not np.isfinite(alpha)
        or alpha <= 0
    ):
        raise ValueError(
            f"alpha must be a finite number > 0 (small = more skewed); got {alpha!r}. For an "
            f"IID split use iid_partition."
        )
    n_samples = labels.shape[0]
    if min_size * n_clients > n_samples:
        raise ValueError(
            f"min_size={min_size} for each of n_clients={n_clients} needs "
            f"{min_size * n_clients} rows, but groups has only {n_samples}."
        )
    rng = _rng(random_state)
    _, codes = np.unique(labels, return_inverse=True)
    codes = codes.ravel()
    members = np.split(np.argsort(codes, kind="stable"), np.cumsum(np.bincount(codes))[:-1])
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


def iid_partition(
    n_samples: int,
    n_clients: int,
    *,
    random_state: int | np.random.Generator | None = None,
) -> list[np.ndarray]:
    """Uniformly random split into ``n_clients`` parts whose sizes differ by at most one.

    Args:
        n_samples: number of rows to split, >= 1.
        n_clients: number of clients, 1 <= n_clients <= n_samples.
        random_state: None, int or ``numpy.random.Generator``.

    Returns:
        ``n_clients`` sorted int64 index arrays into ``range(n_samples)``; every row appears
        exactly once.

    Example:
        >>> [p.shape[0] for p in iid_partition(10, 3, random_state=0)]
        [4, 3, 3]
    """
    n_samples = _check_int(n_samples, "n_samples", 1)
    n_clients = _check_int(n_clients, "n_clients", 1)
    if n_clients > n_samples:
        raise ValueError(
            f"n_clients={n_clients} exceeds n_samples={n_samples}; some clients would get no "
            f"rows. Use fewer clients."
        )
    order = _rng(random_state).permutation(n_samples)
    return [np.sort(p).astype(np.int64) for p in np.array_split(order, n_clients)]


def kmeans_groups(
    X: ArrayLike,
    n_groups: int,
    *,
    random_state: int | np.random.Generator | None = None,
) -> np.ndarray:
    """k-means cluster labels, to make feature-distribution skew when there is no class column.

    Feed the result to :func:`dirichlet_partition` as ``groups``. k-means is scale-sensitive:
    scale the features first (e.g. with ``MinMaxScaling``) if their units differ.

    Args:
        X: shape (n_samples, n_features), finite.
        n_groups: number of clusters, 1 <= n_groups <= n_samples.
        random_state: None, int or ``numpy.random.Generator`` (a Generator supplies the seed
            for scikit-learn's ``KMeans``).

    Returns:
        int64 array of shape (n_samples,) with values in ``range(n_groups)``.
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
    arrays = [np.asarray(idx) for idx in parts]
    for client, idx in enumerate(arrays):
        if idx.size and (
            idx.ndim != 1 or idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= n_samples
        ):
            raise ValueError(
                f"parts[{client}] must be a 1-D array of integer row indices in "
                f"[0, {n_samples}); got shape {idx.shape}, dtype {idx.dtype}, values "
                f"[{idx.min()}, {idx.max()}]."
            )
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
