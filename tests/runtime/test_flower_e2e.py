"""End to end on a real Flower deployment, the mixtures: the same numbers as the in-process
simulation (``_flower_e2e.py``).

FedGenGMM (one round), two rounds of iterative EM with personal weights (the second round
reads each node's persisted state), the one-shot start with SQUAREM rounds, a streaming
window and the mixture of factor analysers, loaded into the detectors (those that have
one). The federation is stopped in a fixture finalizer, so its processes are cleaned up on
failures too. (Dropping failed or malformed replies is tested without a deployment in
``test_flower_validation.py``; the variational and clustered families are in
``test_flower_e2e_bayes.py``.)
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
    em_on_both,
    federation_of,
    make_partitions,
    simulate,
)

from fednovelty import FedGenGMMDetector, FedGMMDetector
from fednovelty.federated import FederatedEM, FedGenGMM, StreamingEM
from fednovelty.federated.mixtures.factor_em import FederatedFactorEM

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def partitions():
    return make_partitions()


@pytest.fixture(scope="module")
def federation(partitions, tmp_path_factory):
    yield from federation_of(partitions[1], tmp_path_factory)


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
