"""Shared by the end-to-end Flower tests (``test_flower_e2e*.py``): the partitions, the
deployment and the comparisons with the in-process simulation.

A SuperLink and three SuperNodes run on 127.0.0.1 (free ports) as separate processes, and
``examples/flower`` (copied) is started with ``flwr run``; each node holds one partition of
one dataset. Every algorithm must equal ``run_simulation`` on the same partitions to float64
round-off. Every message starts a ClientApp process, so each round takes seconds: the
modules are marked slow, and split in two so that the test workers can share them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _flower_deployment import deployment
from _tolerance import assert_close_scaled

from fednovelty.datasets.protocols import make_task
from fednovelty.federated import FederatedEM
from fednovelty.runtime import run_simulation

N_PARTS = 3


def make_partitions() -> tuple[np.ndarray, list[np.ndarray]]:
    """The shared ``4_breastw`` inliers (9 features, scaled with the clients' merged ranges),
    split into 3 non-iid partitions: Dirichlet(0.5) over k-means clusters, as the benchmarks."""
    task = make_task("4_breastw", "novelty", n_clients=N_PARTS, alpha=0.5, seed=0)
    parts = [task.X_train[task.groups_train == i] for i in range(N_PARTS)]
    return task.X_train, parts


def federation_of(parts: list[np.ndarray], tmp_path_factory):
    """A module fixture's body: a deployment whose node ``i`` holds ``parts[i]`` (.npy)."""
    work = tmp_path_factory.mktemp("flower")
    paths = []
    for i, part in enumerate(parts):
        paths.append(work / f"part{i}.npy")
        np.save(paths[-1], part)
    configs = [{"partition-id": i, "data-path": str(p)} for i, p in enumerate(paths)]
    yield from deployment(configs, work)


def simulate(algorithm, parts):
    clients = [torch.as_tensor(p, dtype=torch.float64) for p in parts]
    return run_simulation(algorithm, clients, random_state=0)


def em_on_both(federation, app, partitions, params: dict):
    """``FederatedEM(**params)`` on the Flower federation and in process: both results."""
    result = federation.run_app(
        app,
        {"algorithm": "FederatedEM", "algorithm-params": json.dumps(params), "num-nodes": N_PARTS},
        timeout=600,  # a wait, not a budget
    )
    return result, simulate(FederatedEM(**params, random_state=0), partitions[1])


def assert_same_mixture(actual, expected) -> None:
    """Same parameters up to float64 round-off relative to each tensor's scale (replies may
    be summed in another order; entries near zero get the scale's tolerance)."""
    for name, tensor in expected.tensors().items():
        assert_close_scaled(actual.tensors()[name], tensor, rtol=1e-12, err_msg=name)
    assert actual.covariance_type == expected.covariance_type


def assert_same_history(flower_history, simulated_history) -> None:
    """Same rounds, clients, bytes and metrics (Flower's adds the wire bytes)."""
    assert len(flower_history) == len(simulated_history)
    for got, want in zip(flower_history, simulated_history, strict=True):
        assert (got.kind, got.sampled, got.replied) == (want.kind, want.sampled, want.replied)
        assert (got.bytes_down, got.bytes_up) == (want.bytes_down, want.bytes_up)
        assert got.metrics["wire_bytes_up"] > got.bytes_up  # .npy headers and names
        for key, value in want.metrics.items():
            expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-12)
            assert got.metrics[key] == expected, key
