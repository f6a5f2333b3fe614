"""A Flower run's configuration and result file with the algorithm registry: the ServerApp and
every ClientApp rebuild the same settings dataclass from the run config, and a result file
stores the settings' JSON and any registered state (PCA projections and covariance priors
included). Nothing here needs Flower installed."""

from __future__ import annotations

import json

import pytest
import torch

from fednovelty.federated import (
    FederatedEM,
    FederatedPCA,
    JointFedGMM,
    algorithm_name,
    algorithm_settings,
)
from fednovelty.runtime import run_simulation
from fednovelty.runtime.flower.config import algorithm_from_run_config
from fednovelty.runtime.flower.results import (
    FlowerResult,
    algorithm_config,
    load_result,
    save_result,
)


def run_config_of(algorithm) -> dict:
    return {
        "algorithm": algorithm_name(algorithm),
        "algorithm-params": json.dumps(algorithm_settings(algorithm)),
    }


@pytest.mark.parametrize(
    "algorithm",
    [
        FederatedEM(2, pca_components=2, standardize=True, dtype=torch.float32),
        JointFedGMM(2, 1, 3, learner_factory="mlp", prior_strength=3.0),
        FederatedPCA(3),
    ],
    ids=["FederatedEM", "JointFedGMM", "FederatedPCA"],
)
def test_server_and_nodes_rebuild_the_same_settings(algorithm) -> None:
    run_config = run_config_of(algorithm)
    server, node = algorithm_from_run_config(run_config), algorithm_from_run_config(run_config)
    assert server.config == node.config == algorithm.config
    assert type(server) is type(algorithm)


def test_the_run_seed_is_the_random_state_unless_the_params_set_one() -> None:
    run_config = {"algorithm": "FedGenGMM", "algorithm-params": "{}", "seed": 11}
    assert algorithm_from_run_config(run_config).random_state == 11
    run_config["algorithm-params"] = json.dumps({"random_state": 4})
    assert algorithm_from_run_config(run_config).random_state == 4
    pca = algorithm_from_run_config(
        {"algorithm": "FederatedPCA", "algorithm-params": '{"n_components": 2}'}
    )
    assert pca.n_components == 2  # an algorithm without a random_state takes none


def test_a_result_file_keeps_the_projection_the_prior_and_the_settings(tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    clients = [torch.randn(60, 5, generator=gen, dtype=torch.float64) + c for c in range(3)]
    algorithm = FederatedEM(2, pca_components=3, prior_strength=4.0, max_iter=5)
    run = run_simulation(algorithm, clients)
    result = FlowerResult(
        state=run.state,
        history=run.history,
        client_states={},
        algorithm=algorithm_name(algorithm),
        config=algorithm_config(algorithm),
    )
    save_result(result, tmp_path / "result.safetensors")
    back = load_result(tmp_path / "result.safetensors")
    assert back.algorithm == "FederatedEM" and back.config == algorithm_settings(algorithm)
    assert (back.config["n_components"], back.config["dtype"]) == (2, "float64")
    state = back.state
    for name in ("mean", "components", "explained_variance"):
        assert torch.equal(getattr(state.projection, name), getattr(run.state.projection, name))
    assert state.projection.n_samples == run.state.projection.n_samples
    assert state.pca.round == 2 and state.pca.client_counts == run.state.pca.client_counts
    assert torch.equal(state.prior.scale, run.state.prior.scale)
    assert state.prior.strength == run.state.prior.strength
    assert torch.equal(state.params.means, run.state.params.means)
