"""End to end on a real Flower deployment, the clustered and variational families: the
same numbers as the in-process simulation (``_flower_e2e.py``).

Clustered EM, federated VB, one-shot VB and the kNN-distance markers (each node keeps its
rows' distances in its state), loaded into the detectors (those that have one).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from _flower_e2e import (
    N_PARTS,
    assert_same_history,
    assert_same_mixture,
    federation_of,
    make_partitions,
    simulate,
)

from fednovelty import FedVBDetector
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.clustered.clustered_em import ClusteredEM

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def partitions():
    return make_partitions()


@pytest.fixture(scope="module")
def federation(partitions, tmp_path_factory):
    yield from federation_of(partitions[1], tmp_path_factory)


def test_clustered_mixture_on_flower_equals_simulation(federation, partitions) -> None:
    """ClusteredEM: warm-up, the server's clustering and two clustered rounds;
    each node keeps its cluster and masked weights between rounds, as in the simulation."""
    federation, app = federation
    # Five rounds (centroids, one Lloyd assign, one warm-up EM round, two clustered rounds;
    # the default k-means and warm-up rounds took eleven, each a ClientApp process per node).
    # With these settings the clients split 1/2 between the clusters, with margins of 4 nats
    # or more between their clusters' log-likelihoods (not a tie that round-off could flip).
    params = {
        "n_components": 2,
        "n_clusters": 2,
        "cluster_components": 2,
        "warmup": 1,
        "kmeans_rounds": 1,
        "max_iter": 2,
        "tol": 0.0,
    }
    result = federation.run_app(
        app,
        {"algorithm": "ClusteredEM", "algorithm-params": json.dumps(params), "num-nodes": N_PARTS},
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(ClusteredEM(**params, random_state=0), partitions[1])
    state, expected = result.state, simulated.state
    assert_same_mixture(state.params, expected.params)
    assert state.client_clusters == expected.client_clusters
    assert state.cluster_sizes == expected.cluster_sizes and len(state.cluster_sizes) == 2
    assert sorted(state.cluster_sizes[-1]) == [1, 2]  # both clusters hold clients
    assert torch.equal(state.component_clusters, expected.component_clusters)
    for c, values in expected.client_log_likelihoods.items():
        assert_close_scaled(state.client_log_likelihoods[c], values, rtol=1e-12)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []


def test_federated_vb_on_flower_equals_simulation(federation, partitions) -> None:
    """FederatedVB: the prior's moments round, the initial posterior and a VB
    round give the simulation's posterior and ELBOs (a second VB round would be the same
    message again: the iterative EM test covers repeated rounds)."""
    federation, app = federation
    X = partitions[0]
    d = X.shape[1]
    params = {
        "n_components": 3,
        "weights_init": [0.3, 0.3, 0.4],
        "means_init": X[[0, len(X) // 2, len(X) - 1]].tolist(),
        "precisions_init": np.tile(10.0 * np.eye(d), (3, 1, 1)).tolist(),
        "max_iter": 1,
        "tol": 0.0,
    }
    result = federation.run_app(
        app,
        {"algorithm": "FederatedVB", "algorithm-params": json.dumps(params), "num-nodes": N_PARTS},
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(FederatedVB(**params, random_state=0), partitions[1])
    state, expected = result.state, simulated.state
    for name, tensor in expected.posterior.tensors().items():
        assert_close_scaled(state.posterior.tensors()[name], tensor, rtol=1e-12, err_msg=name)
    assert_close_scaled(state.lower_bounds, expected.lower_bounds, rtol=1e-12)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []


def assert_same_posterior(actual, expected, name: str) -> None:
    for part, tensor in expected.tensors().items():
        assert_close_scaled(actual.tensors()[part], tensor, rtol=1e-12, err_msg=f"{name}.{part}")


def test_one_shot_vb_on_flower_equals_simulation(federation, partitions) -> None:
    federation, app = federation
    params = {"n_components": 4, "posterior_aggregation": "natural"}
    result = federation.run_app(
        app,
        {
            "algorithm": "FederatedVBOneShot",
            "algorithm-params": json.dumps(params),
            "num-nodes": N_PARTS,
        },
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(FederatedVBOneShot(**params, random_state=0), partitions[1])
    state, expected = result.state, simulated.state
    assert result.algorithm == "FederatedVBOneShot" and result.dropped == []
    assert sorted(state.client_posteriors) == list(range(N_PARTS))
    for cid, posterior in expected.client_posteriors.items():
        assert_same_posterior(state.client_posteriors[cid], posterior, f"client {cid}")
        assert torch.equal(state.assignments[cid], expected.assignments[cid])
    assert_same_posterior(state.posterior, expected.posterior, "posterior")
    assert state.client_rows == expected.client_rows
    assert_same_history(result.history, simulated.history)

    X = partitions[0]
    on_flower = FedVBDetector.from_model(result, X)
    in_process = FedVBDetector.from_model(simulated, X, n_components=4, posterior_merge="natural")
    assert on_flower.n_components == 4 and on_flower.posterior_merge == "natural"
    assert_close_scaled(on_flower.decision_scores_, in_process.decision_scores_, rtol=1e-12)


def test_knn_markers_on_flower_equal_simulation(federation, partitions) -> None:
    federation, app = federation
    # five rounds: the prior's moments, k-means centroids and one assign, the initial
    # posterior and one VB round; every round after the first reads the distances each node
    # keeps in its state
    params = {"n_components": 3, "n_neighbors": 4, "kmeans_rounds": 1, "max_iter": 1, "tol": 0.0}
    result = federation.run_app(
        app,
        {
            "algorithm": "FederatedKNNMarkers",
            "algorithm-params": json.dumps(params),
            "num-nodes": N_PARTS,
        },
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(FederatedKNNMarkers(**params, random_state=0), partitions[1])
    state, expected = result.state, simulated.state
    for name, tensor in expected.posterior.tensors().items():
        assert_close_scaled(state.posterior.tensors()[name], tensor, rtol=1e-12, err_msg=name)
    assert_close_scaled(state.lower_bounds, expected.lower_bounds, rtol=1e-12)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []
