"""End to end on a real Flower deployment: the same numbers as the in-process simulation.

A SuperLink and three SuperNodes run on 127.0.0.1 (free ports) as separate processes, and
``examples/flower`` (copied) is started with ``flwr run``; each node holds one partition of
one dataset. FedGenGMM (one round), two rounds of iterative EM with personal weights (the
second round reads each node's persisted state), the one-shot start with SQUAREM rounds, a
streaming window, clustered EM, federated VB, one-shot VB, the kNN-distance markers
(each node keeps its rows' distances in its state) and the mixture of factor analysers must
equal ``run_simulation`` on the same partitions to float64 round-off, and load into the
detectors (those that have one). The federation is stopped in a fixture finalizer, so its
processes are cleaned up on failures too. (Dropping failed or malformed replies is tested
without a deployment in ``test_flower_validation.py``.)
Every message starts a ClientApp process, so each round takes seconds: the module is
marked slow.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _flower_deployment import deployment
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from fednovelty import FedGenGMMDetector, FedGMMDetector, FedVBDetector
from fednovelty.datasets.protocols import make_task
from fednovelty.federated import FederatedEM, FedGenGMM, StreamingEM
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.mixtures.factor_em import FederatedFactorEM
from fednovelty.runtime import run_simulation

pytestmark = pytest.mark.slow

N_PARTS = 3


def make_partitions() -> tuple[np.ndarray, list[np.ndarray]]:
    """The shared ``4_breastw`` inliers (9 features, scaled with the clients' merged ranges),
    split into 3 non-iid partitions: Dirichlet(0.5) over k-means clusters, as the benchmarks."""
    task = make_task("4_breastw", "novelty", n_clients=N_PARTS, alpha=0.5, seed=0)
    parts = [task.X_train[task.groups_train == i] for i in range(N_PARTS)]
    return task.X_train, parts


@pytest.fixture(scope="module")
def partitions():
    return make_partitions()


@pytest.fixture(scope="module")
def federation(partitions, tmp_path_factory):
    work = tmp_path_factory.mktemp("flower")
    paths = []
    for i, part in enumerate(partitions[1]):
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


def test_fedgengmm_on_flower_equals_simulation(federation, partitions) -> None:
    federation, app = federation
    params = {"n_components": 3, "k_range": [1, 4], "samples_per_component": 50}
    result = federation.run_app(
        app,
        {"algorithm": "FedGenGMM", "algorithm-params": json.dumps(params), "num-nodes": N_PARTS},
        timeout=600,  # a wait, not a budget
    )
    algorithm = FedGenGMM(**{**params, "k_range": (1, 4)}, random_state=0)
    simulated = simulate(algorithm, partitions[1])
    assert result.algorithm == "FedGenGMM"
    assert sorted(result.state.client_models) == [0, 1, 2]
    for c, model in simulated.state.client_models.items():
        assert_same_mixture(result.state.client_models[c], model)
    assert_same_mixture(result.state.params, simulated.state.params)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []

    X = partitions[0]
    on_flower = FedGenGMMDetector.from_model(result, X)
    in_process = FedGenGMMDetector.from_model(simulated, X, n_components=3, k_range=(1, 4))
    assert on_flower.n_components == 3 and on_flower.k_range == [1, 4]
    # scores cross zero (densities above 1 on scaled features): relative to their scale
    assert_close_scaled(on_flower.decision_scores_, in_process.decision_scores_, rtol=1e-12)
    assert on_flower.threshold_ == pytest.approx(in_process.threshold_, rel=1e-12)


def test_iterative_em_on_flower_equals_simulation(federation, partitions) -> None:
    federation, app = federation
    X = partitions[0]
    d = X.shape[1]
    init = {  # a fixed start, so that the two rounds are EM rounds (no k-means rounds)
        "weights_init": [0.3, 0.3, 0.4],
        "means_init": X[[0, len(X) // 2, len(X) - 1]].tolist(),
        "precisions_init": np.tile(10.0 * np.eye(d), (3, 1, 1)).tolist(),
    }
    params = {
        "n_components": 3,
        "mixture_weights": "personal",
        "max_iter": 2,
        "tol": 0.0,
        **init,
    }
    result, simulated = em_on_both(federation, app, partitions, params)
    state, expected = result.state, simulated.state
    assert (state.n_iter, len(result.history)) == (2, 2)
    assert_same_mixture(state.params, expected.params)
    assert sorted(state.client_weights) == [0, 1, 2]
    for c, weights in expected.client_weights.items():  # round 2 used each node's state
        assert_close_scaled(state.client_weights[c], weights, rtol=1e-12)
    assert_close_scaled(state.lower_bounds, expected.lower_bounds, rtol=1e-12)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []

    on_flower = FedGMMDetector.from_model(result, X)
    in_process = FedGMMDetector.from_model(simulated, X, n_components=3)
    assert on_flower.mixture_weights == "personal"
    assert_close_scaled(on_flower.client_weights_, in_process.client_weights_, rtol=1e-12)
    assert_close_scaled(on_flower.decision_scores_, in_process.decision_scores_, rtol=1e-12)


def test_one_shot_start_and_squarem_on_flower_equal_simulation(federation, partitions) -> None:
    """The few-round fit: one round of local fits reduced on the server, then EM rounds
    with SQUAREM on the server (an extrapolated point checked by the next round)."""
    federation, app = federation
    params = {
        "n_components": 3,
        "mixture_weights": "global",
        "init_params": "oneshot",
        "acceleration": "squarem",
        "max_iter": 4,
        "tol": 0.0,
    }
    result, simulated = em_on_both(federation, app, partitions, params)
    state, expected = result.state, simulated.state
    assert [r.kind for r in result.history] == ["oneshot"] + ["em"] * 4
    assert state.n_iter == 4
    assert_same_mixture(state.params, expected.params)
    assert_close_scaled(state.lower_bounds, expected.lower_bounds, rtol=1e-12)
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []


def test_a_streaming_window_on_flower_equals_simulation(federation, partitions) -> None:
    """One window of StreamingEM after a fitted first window: the nodes are new
    to the stream, so both engines start every client from the global weights."""
    federation, app = federation
    first = simulate(FederatedEM(3, mixture_weights="personal", random_state=0), partitions[1])
    p = first.state.params
    params = {
        "n_components": 3,
        "weights_init": p.weights.tolist(),
        "means_init": p.means.tolist(),
        "precisions_init": p.precisions_cholesky.tolist(),
        "rho": 0.5,
        "rounds": 2,
    }
    result = federation.run_app(
        app,
        {"algorithm": "StreamingEM", "algorithm-params": json.dumps(params), "num-nodes": N_PARTS},
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(StreamingEM(**params, random_state=0), partitions[1])
    state, expected = result.state, simulated.state
    assert_same_mixture(state.params, expected.params)
    for name in ("counts", "sums", "second"):
        assert_close_scaled(getattr(state.carry, name), getattr(expected.carry, name), rtol=1e-12)
    assert sorted(state.drift) == [0, 1, 2]
    for c, values in expected.drift.items():
        assert_close_scaled(state.drift[c], values, rtol=1e-12)
    assert state.births == expected.births
    assert_same_history(result.history, simulated.history)
    assert result.dropped == []


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


def test_factor_em_on_flower_equals_simulation(federation, partitions) -> None:
    """FederatedFactorEM: the moments round (standardisation, the noise prior), k-FED
    centroids and a Lloyd round, the sketch start and a factor EM round give the
    simulation's mixture of factor analysers (the result file carries ``FactorParams``)."""
    federation, app = federation
    params = {
        "n_components": 2,
        "n_factors": 2,
        "standardize": True,
        "prior_strength": 11.0,
        "kmeans_rounds": 1,
        "max_iter": 1,
        "tol": 0.0,
    }
    result = federation.run_app(
        app,
        {
            "algorithm": "FederatedFactorEM",
            "algorithm-params": json.dumps(params),
            "num-nodes": N_PARTS,
        },
        timeout=600,  # a wait, not a budget
    )
    simulated = simulate(FederatedFactorEM(**params, random_state=0), partitions[1])
    state, expected = result.state, simulated.state
    assert result.algorithm == "FederatedFactorEM" and result.dropped == []
    kinds = ["moments", "centroids", "assign", "factor_start", "factor_em"]
    assert [r.kind for r in result.history] == kinds
    assert state.n_iter == 1
    for name, tensor in expected.factors.tensors().items():
        scale = float(tensor.abs().max())
        torch.testing.assert_close(
            state.factors.tensors()[name],
            tensor,
            rtol=1e-9,
            atol=1e-9 * scale,
            msg=lambda m, name=name: f"{name}: {m}",
        )
    assert_close_scaled(state.lower_bounds, expected.lower_bounds, rtol=1e-12)
    assert_same_history(result.history, simulated.history)
