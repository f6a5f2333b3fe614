"""VGM2 on a real Flower deployment equals the in-process simulation.

As ``test_flower_e2e.py``: a SuperLink and three SuperNodes on 127.0.0.1, ``examples/flower``
started with ``flwr run``, each node holding one labelled partition (``.npz`` with ``X`` and
``y``). Two VGM2 rounds on every node: each node builds its fuzzy kNN graph and trains its
encoder and markers, keeping them in its ``context.state`` between messages; only the
markers travel. The server's prior, the losses and the rounds' bytes must equal
``run_simulation``'s to float64 round-off. Every message starts a ClientApp process, so the
module is marked slow.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _flower_deployment import deployment
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from fednovelty.federated.bayesian.vgm2 import VGM2
from fednovelty.runtime import run_simulation

pytestmark = pytest.mark.slow

N_PARTS = 3
PARAMS = {
    "n_features": 6,
    "n_classes": 3,
    "rounds": 2,
    "local_epochs": 1,
    "hidden": 8,
    "embedding_dim": 3,
    "batch_size": 16,
    "n_neighbors": 5,
    "dtype": "float64",
}


@pytest.fixture(scope="module")
def partitions() -> list[tuple[np.ndarray, np.ndarray]]:
    """Three clients, two of three Gaussian classes each (centres 3 e_k in 6 features)."""
    rng = np.random.default_rng(0)
    parts = []
    for c in range(N_PARTS):
        y = np.repeat([c % 3, (c + 1) % 3], 15)
        parts.append((rng.normal(0, 0.4, (30, 6)) + 3 * np.eye(6)[y], y))
    return parts


@pytest.fixture(scope="module")
def federation(partitions, tmp_path_factory):
    work = tmp_path_factory.mktemp("flower")
    paths = []
    for i, (X, y) in enumerate(partitions):
        paths.append(work / f"part{i}.npz")
        np.savez(paths[-1], X=X, y=y)
    configs = [{"partition-id": i, "data-path": str(p)} for i, p in enumerate(paths)]
    yield from deployment(configs, work)


def test_vgm2_on_flower_equals_simulation(federation, partitions) -> None:
    federation, app = federation
    result = federation.run_app(
        app,
        {"algorithm": "VGM2", "algorithm-params": json.dumps(PARAMS), "num-nodes": N_PARTS},
        timeout=600,  # a wait, not a budget
    )
    clients = [
        (torch.as_tensor(X, dtype=torch.float64), torch.as_tensor(y).long()) for X, y in partitions
    ]
    settings = {k: v for k, v in PARAMS.items() if k not in ("n_features", "n_classes")}
    settings["dtype"] = torch.float64
    simulated = run_simulation(VGM2(6, 3, **settings, random_state=0), clients, random_state=0)
    state, expected = result.state, simulated.state
    assert_close_scaled(state.prior, expected.prior, rtol=1e-12)
    assert_close_scaled(state.losses, expected.losses, rtol=1e-12)
    assert [r.kind for r in result.history] == [r.kind for r in simulated.history]
    for got, want in zip(result.history, simulated.history, strict=True):
        assert (got.sampled, got.replied) == (want.sampled, want.replied)
        assert (got.bytes_down, got.bytes_up) == (want.bytes_down, want.bytes_up)
    assert result.dropped == []
