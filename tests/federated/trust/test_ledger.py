"""The client's privacy ledger (``fednovelty.federated.trust.ledger``): charged by each release's
cost, read by the accountant the plans calibrate with, owned by the client so that no restart
resets it, and refusing costlier rounds than the budget allows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import epsilon_spent
from fednovelty.federated.trust.dp_sgd import DPSGDSettings, learning_epsilon, release_blocks
from fednovelty.federated.trust.ledger import (
    PrivacyLedger,
    gaussian_cost,
    ledger_from_tensors,
    ledger_to_tensors,
)
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime.simulation import InProcessTransport

F64 = torch.float64
BOUNDS = ([-4.0] * 3, [4.0] * 3)


def test_the_ledger_reads_the_plans_accountant():
    """Releases of summed statistics compose as ``epsilon_spent`` reads them; with DP-SGD
    steps, as ``learning_epsilon`` does (the two accountants the plans calibrate with)."""
    z = 4.0
    ledger = PrivacyLedger()
    for _ in range(5):
        ledger = ledger.after(gaussian_cost(z, 3))
    assert ledger.releases == 5
    assert ledger.epsilon(1e-5) == pytest.approx(epsilon_spent(z, 5, 1e-5), rel=1e-9)
    mixed = PrivacyLedger().after(gaussian_cost(z, 3), (1.2, 0.1, 30))
    mixed = mixed.after(gaussian_cost(z, 3 + 1 / 64), (1.2, 0.1, 30))
    expected = learning_epsilon(z, release_blocks(2, 1), 1.2, 0.1, 60, 1e-5)
    assert mixed.epsilon(1e-5) == pytest.approx(expected, rel=1e-9)
    assert math.isinf(PrivacyLedger().after(gaussian_cost(0.0, 3)).epsilon(1e-5))
    assert PrivacyLedger().epsilon(1e-5) == 0.0


def test_a_ledger_round_trips_and_a_damaged_one_is_refused():
    ledger = PrivacyLedger().after(0.25, (1.5, 0.05, 20)).after(0.5)
    assert ledger_from_tensors(ledger_to_tensors(ledger)) == ledger
    tensors = ledger_to_tensors(ledger)
    with pytest.raises(ValueError, match="lacks"):
        ledger_from_tensors({"gaussian": tensors["gaussian"]})
    with pytest.raises(ValueError, match="negative or NaN"):
        ledger_from_tensors({**tensors, "gaussian": torch.tensor(-1.0, dtype=F64)})


def _rows(n: int, seed: int) -> torch.Tensor:
    return torch.as_tensor(np.random.default_rng(seed).normal(size=(n, 3)))


def _private_em() -> FederatedEM:
    return FederatedEM(
        2,
        weights_init=[0.5, 0.5],
        means_init=[[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
        precisions_init=np.stack([np.eye(3)] * 2),
        dp_mode="local",
        dp_noise_multiplier=2.0,
        dp_clip=3.0,
    )


def _transport(algorithm, policy):
    data = {c: _rows(50, c) for c in range(2)}
    contexts = {c: gate.client_context(c, policy=policy, wire=False) for c in data}
    rng = np.random.default_rng(0)
    return InProcessTransport(algorithm, data, contexts, 1.0, 0.0, rng), contexts


def test_a_restart_neither_resets_the_budget_nor_reuses_the_noise():
    """A budget of two releases: after two releases and a restart (a liar caught), the
    client refuses the third; before, the restart restored a state without the count and the
    client released again, with the noise of its first release."""
    algorithm = _private_em()
    budget = epsilon_spent(2.0, 2, 1e-5)
    policy = PrivacyPolicy(dp=DPPolicy(2.0, 3.0, "local", epsilon=budget, insecure_seed=1))
    transport, contexts = _transport(algorithm, policy)
    message = algorithm.configure(algorithm.start())
    first = transport.exchange(1, message).replies
    transport.restart()
    second = transport.exchange(2, message).replies
    assert all(contexts[c].terms.ledger.releases == 2 for c in contexts)
    # the release after the restart draws the next noise, not the first one again
    for c in first:
        assert not torch.equal(first[c].tensors["counts"], second[c].tensors["counts"])
    transport.restart()
    third = transport.exchange(3, message).replies
    assert all(r.scalars.get("skipped") for r in third.values())
    assert all("budget is spent" in r.scalars["reason"] for r in third.values())


def _joint() -> JointFedGMM:
    private = dict(bounds=BOUNDS, dp_mode="local", dp_noise_multiplier=1.0, dp_clip=math.sqrt(3))
    options = dict(max_iter=4, kmeans_rounds=2, local_epochs=1, learning_rate=0.5, random_state=0)
    return JointFedGMM(2, 2, 2, **options, **private)


def _joint_em_broadcast(algorithm: JointFedGMM, data, policy: PrivacyPolicy):
    """A joint_em broadcast, reached by a server that answered its start rounds with a
    client outside the test (its budget is not the one under test)."""
    state = algorithm.start()
    while state.phase != "joint_em":
        message = algorithm.configure(state)
        reply = gate.answer(algorithm, data, message, gate.client_context(9, policy=policy))
        state = algorithm.server_step(state, {9: reply})[0]
    return algorithm.configure(state)


def test_costlier_rounds_than_planned_are_refused_within_the_budget():
    """A node plans 6 releases, 4 of them joint rounds with DP-SGD steps (epsilon 2). A
    server that sends joint rounds in place of the 2 start rounds gets at most what the
    budget allows: the client's epsilon never passes 2 (counting releases, it reached
    2.39)."""
    from fednovelty.runtime.flower.client import policy_from_node_config

    node = {
        "dp-epsilon": 2.0,
        "dp-releases": 6,
        "dp-clip": math.sqrt(3),
        "dp-mode": "local",
        "dp-sgd-steps": 10,
        "dp-learner-rounds": 4,
        "dp-sample-rate": 0.1,
    }
    policy = policy_from_node_config(node)
    sgd: DPSGDSettings = policy.dp_sgd
    z = policy.dp.noise_multiplier
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(400, 3)))
    data = (X, (X[:, 1] > 0).long())
    algorithm = _joint()
    message = _joint_em_broadcast(algorithm, data, policy)
    context = gate.client_context(0, policy=policy)
    released = 0
    for _ in range(6):
        reply = gate.answer(algorithm, data, message, context)
        if reply.scalars.get("skipped"):
            assert "budget is spent" in reply.scalars["reason"]
            break
        released += 1
    assert released < 6
    assert context.terms.ledger.epsilon(1e-5) <= 2.0 * (1 + 1e-4)
    # what counting releases would have allowed: six joint rounds
    six = learning_epsilon(z, release_blocks(6, 6), sgd.noise_multiplier, 0.1, 60, 1e-5)
    assert six > 2.0
