"""A federation of many small clients from three blobs and the federated EM run on it, as the
tests of many-client rounds use them (``tests/runtime/test_many_clients_round.py``,
``tests/federated/trust/test_packed_checks.py``)."""

from __future__ import annotations

import numpy as np
import torch

from fednovelty.federated import FederatedEM

K, D = 3, 4


def federation(n_clients=40, seed=0, sizes=None) -> list[torch.Tensor]:
    """Clients of 3 to 60 rows from three blobs (some below the default floor of 5);
    ``sizes``: client id -> row count, in place of the drawn ones."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4, (K, D))
    counts = rng.integers(3, 60, n_clients)
    for client, n in (sizes or {}).items():
        counts[client] = n
    return [
        torch.as_tensor(centers[rng.integers(0, K, n)] + rng.normal(size=(n, D))) for n in counts
    ]


def em(**options) -> FederatedEM:
    """Federated EM with three components from a fixed start, three rounds."""
    return FederatedEM(
        K,
        weights_init=np.full(K, 1 / K),
        means_init=np.array([[0.0] * D, [3.0] * D, [-3.0] * D]),
        precisions_init=np.stack([np.eye(D)] * K),
        max_iter=3,
        tol=0.0,
        **options,
    )


def decisions(result):
    """Each round's outcome: failed, dropped, skipped, restarted."""
    return [(r.failed, r.dropped, r.skipped, r.restarted) for r in result.history]
