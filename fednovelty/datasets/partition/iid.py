"""IID split: a uniformly random permutation of the rows cut into near-equal parts."""

from __future__ import annotations

import numpy as np

from fednovelty.datasets.partition._common import _check_int, _rng

__all__ = ["iid_partition"]


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

    Examples:
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
