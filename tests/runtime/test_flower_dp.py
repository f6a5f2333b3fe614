"""Differential privacy on a real Flower deployment gives the numbers of the in-process
simulation: three SuperNodes each calibrate their own noise from their node config
(``dp-epsilon``, ``dp-releases``, ``dp-clip``, ``dp-mode``), clip and noise their replies at
the client gate, and the server post-processes the noisy sums; with the same test seeds
(``dp-insecure-seed``: reproducible noise, no guarantee) both engines give one mixture (the
second round's noise depends on the release count each node's ledger persisted). Marked slow
(a deployment per module)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from _flower_deployment import deployment
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.runtime import run_simulation

pytestmark = pytest.mark.slow
EPSILON, RELEASES, CLIP, SEED = 2.0, 2, 3.0, 5


@pytest.fixture(scope="module")
def partitions():
    rng = np.random.default_rng(0)
    return [rng.normal(i, 1.0, (300, 3)) for i in range(3)]


@pytest.fixture(scope="module")
def federation(partitions, tmp_path_factory):
    work = tmp_path_factory.mktemp("flower_dp")
    configs = []
    for i, part in enumerate(partitions):
        np.save(work / f"part{i}.npy", part)
        configs.append(
            {
                "partition-id": i,
                "data-path": str(work / f"part{i}.npy"),
                "dp-epsilon": EPSILON,
                "dp-releases": RELEASES,
                "dp-clip": CLIP,
                "dp-mode": "local",
                "dp-insecure-seed": SEED,
            }
        )
    yield from deployment(configs, work)


def _params(max_iter: int) -> dict:
    z = calibrate_noise(EPSILON, 1e-5, RELEASES)
    return {
        "n_components": 2,
        "mixture_weights": "global",
        "max_iter": max_iter,
        "weights_init": [0.5, 0.5],
        "means_init": [[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]],
        "precisions_init": np.tile(np.eye(3), (2, 1, 1)).tolist(),
        "bounds": [[-6.0] * 3, [8.0] * 3],
        "dp_mode": "local",
        "dp_noise_multiplier": z,
        "dp_clip": CLIP,
    }


def _run(federation, params):
    federation, app = federation
    config = {
        "algorithm": "FederatedEM",
        "algorithm-params": json.dumps(params),
        "num-nodes": 3,
    }
    return federation.run_app(app, config, timeout=600)  # a wait, not a budget


def test_private_em_on_flower_equals_simulation(federation, partitions):
    params = _params(RELEASES)
    result = _run(federation, params)
    z = calibrate_noise(EPSILON, 1e-5, RELEASES)
    dp = DPPolicy(z, CLIP, "local", 1, epsilon=EPSILON, insecure_seed=SEED)
    policy = PrivacyPolicy(dp=dp)
    clients = [torch.as_tensor(p) for p in partitions]
    simulated = run_simulation(FederatedEM(**params, random_state=0), clients, privacy=policy)
    for name, tensor in simulated.state.params.tensors().items():
        assert_close_scaled(result.state.params.tensors()[name], tensor, rtol=1e-10, err_msg=name)
    plain = run_simulation(
        FederatedEM(**{**params, "dp_noise_multiplier": 0.0}),
        clients,
        privacy=PrivacyPolicy(dp=DPPolicy(0.0, CLIP, "local")),
    )
    assert not torch.allclose(plain.state.params.means, simulated.state.params.means)
