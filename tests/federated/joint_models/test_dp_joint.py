"""FedGMM's joint model under differential privacy: the client gate's composite private
form (summed statistics, a noisy histogram of joint counts, learners trained by DP-SGD),
what it refuses, and the server's handling of noisy joint counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fednovelty.federated.core.base import Message
from fednovelty.federated.joint_models.joint import JOINT_EM_REPLY, JointFedGMM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, DPSGDSettings
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.release import release
from fednovelty.runtime.simulation import run_simulation

F64 = torch.float64
BOUNDS = ([-4.0] * 3, [4.0] * 3)


def _client(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    side = torch.randint(0, 2, (n,), generator=g)
    centres = torch.tensor([[-1.5, 0.0, 0.0], [1.5, 0.0, 0.0]], dtype=F64)
    X = torch.randn(n, 3, generator=g, dtype=F64) * 0.5 + centres[side]
    return X, (X[:, 1] > 0).long()


def _joint(mode: str | None, z: float = 5.0, **settings) -> JointFedGMM:
    private = {}
    if mode is not None:
        private = dict(bounds=BOUNDS, dp_mode=mode, dp_noise_multiplier=z, dp_clip=math.sqrt(3))
    options = dict(max_iter=4, kmeans_rounds=2, local_epochs=1, learning_rate=0.5, random_state=0)
    return JointFedGMM(2, 2, 2, **{**options, **private, **settings})


SGD = DPSGDSettings(noise_multiplier=1.0, clip_norm=1.0, sample_rate=0.1, steps=10)


def _policy(mode: str, z: float = 5.0, insecure_seed: int | None = 0, sgd=SGD) -> PrivacyPolicy:
    dp = DPPolicy(z, math.sqrt(3), mode, n_clients=4, insecure_seed=insecure_seed)
    return PrivacyPolicy(dp=dp, dp_sgd=sgd)


def test_a_private_joint_fit_trains_learners_by_dp_sgd_and_keeps_counts_positive():
    clients = [_client(800, s) for s in range(4)]
    algorithm = _joint("central", z=5.0)
    result = run_simulation(algorithm, clients, privacy=_policy("central"))
    state = result.state
    assert [r.kind for r in result.history][-1] == "joint_em"
    assert bool((state.joint_counts > 0).all())
    assert state.client_joint_weights == {}  # central: the server never keeps exact counts
    X, y = _client(2000, 99)
    template = algorithm._template(3)
    with torch.no_grad():
        accuracy = [
            float((torch.func.functional_call(template, p, (X,)).argmax(1) == y).double().mean())
            for p in state.learners
        ]
    assert max(accuracy) > 0.85  # the label is the sign of feature 1: learnable under noise
    assert all(r.metrics.get("mean_log_likelihood") is None for r in result.history[-2:])


def test_local_mode_keeps_each_clients_noisy_joint_weights():
    clients = [_client(400, s) for s in range(3)]
    result = run_simulation(_joint("local"), clients, privacy=_policy("local"))
    weights = result.state.client_joint_weights
    assert sorted(weights) == [0, 1, 2]
    assert all(bool((w > 0).all()) and abs(float(w.sum()) - 1) < 1e-9 for w in weights.values())


def _reply(algorithm: JointFedGMM, X, y, policy: PrivacyPolicy, client_id: int = 0):
    state = algorithm.start()
    while state.phase != "joint_em":  # the start rounds, answered by this one client
        message = algorithm.configure(state)
        context = gate.client_context(client_id, policy=policy)
        reply = gate.answer(algorithm, (X, y), message, context)
        state = algorithm.server_step(state, {client_id: reply})[0]
    message = algorithm.configure(state)
    context = gate.client_context(client_id, policy=policy)
    raw = algorithm.client_step((X, y), message, context)
    return message, raw, context


def test_the_gate_adds_the_histogram_noise_to_the_joint_counts_and_passes_dp_sgd_learners():
    X, y = _client(300, 0)
    algorithm = _joint("local", z=2.0)
    message, raw, _ = _reply(algorithm, X, y, _policy("local", 2.0))
    assert raw.scalars["dp_sgd_steps"] == SGD.steps
    moved = []
    for seed in range(60):
        policy = _policy("local", 2.0, insecure_seed=seed)
        out = release(raw, JOINT_EM_REPLY, policy, algorithm.config, message)
        moved.append((out.tensors["joint_counts"] - raw.tensors["joint_counts"]).flatten())
        for name, value in raw.tensors.items():
            if name.startswith("learner."):
                assert torch.equal(out.tensors[name], value)  # DP-SGD's output, post-processed
    spread = float(torch.cat(moved).std())
    assert abs(spread / (HISTOGRAM_SHARE * 2.0) - 1) < 0.15  # 240 draws


def test_the_gate_refuses_learners_not_stated_as_dp_sgd_and_undeclared_tensors():
    X, y = _client(300, 0)
    algorithm = _joint("local")
    message, raw, _ = _reply(algorithm, X, y, _policy("local"))
    policy = _policy("local")
    steps = dict(raw.scalars, dp_sgd_steps=10**6)
    lying = Message(raw.kind, raw.tensors, steps, backing=raw.backing)
    out = release(lying, JOINT_EM_REPLY, policy, algorithm.config, message)
    assert out.scalars.get("skipped") and "DP-SGD steps" in out.scalars["reason"]
    without = _policy("local", sgd=None)  # the client's own policy has no DP-SGD
    out = release(raw, JOINT_EM_REPLY, without, algorithm.config, message)
    assert out.scalars.get("skipped") and "not trained by DP-SGD" in out.scalars["reason"]
    context = gate.client_context(0, policy=without)
    own = gate.answer(algorithm, (X, y), message, context)  # nor does its step train without it
    assert own.scalars.get("skipped") and "DP-SGD" in own.scalars["reason"]
    extra = dict(raw.tensors, client_means=torch.zeros(2, 3, dtype=F64))
    backing = dict(raw.backing, client_means=torch.full((2,), 300.0))
    spec = JOINT_EM_REPLY.__class__(
        **{
            **JOINT_EM_REPLY.__dict__,
            "backing": {**JOINT_EM_REPLY.backing, "client_means": "components"},
        }
    )
    sneaky = Message(raw.kind, extra, dict(raw.scalars), backing=backing)
    out = release(sneaky, spec, policy, algorithm.config, message)
    assert out.scalars.get("skipped") and "client_means" in out.scalars["reason"]


def test_without_dp_the_joint_model_is_unchanged_by_the_private_machinery():
    clients = [_client(300, s) for s in range(3)]
    one = run_simulation(_joint(None), clients).state
    two = run_simulation(_joint(None), clients).state
    assert torch.equal(one.joint_counts, two.joint_counts)  # reproducible, and no noise
    assert np.isfinite(one.lower_bounds).all() and len(one.lower_bounds) >= 1
    with pytest.raises(TypeError, match="dp_sgd"):
        PrivacyPolicy(dp_sgd={"noise_multiplier": 1.0})
