"""Federated EM's E-step round answered for many clients at once (``EMStep.client_steps``,
:mod:`fednovelty.federated.mixtures.batched_e_step`) against each client's own
``client_step``: the same replies (statistics to 1e-12 relative, the same backing and floor
decisions, the same skipped replies), the same personal weights kept, the same released
replies through each client's gate (differential-privacy noise included), and whole fits
with ``batch_clients`` on and off."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from fednovelty.federated.core.base import Message
from fednovelty.federated.mixtures.em import EMStep, FederatedEM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.backing import backed
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture import MixtureParams, precisions_cholesky_from_covariances
from fednovelty.mixture.em import moment_shift
from fednovelty.runtime.simulation import run_simulation

F64 = torch.float64
K, D = 3, 4
RTOL = 1e-12


def _mixture(covariance_type: str, seed: int = 0) -> MixtureParams:
    """Three well-separated components in 4 dimensions."""
    gen = torch.Generator().manual_seed(seed)
    means = torch.tensor([[0.0] * D, [6.0, 0.0, 1.0, 0.0], [0.0, 7.0, 0.0, -2.0]], dtype=F64)
    eye = torch.eye(D, dtype=F64)
    covariances = {
        "full": torch.stack(
            [eye * (1.0 + i) + 0.3 * torch.ones(D, D, dtype=F64) for i in range(K)]
        ),
        "tied": eye * 1.5 + 0.2 * torch.ones(D, D, dtype=F64),
        "diag": torch.rand(K, D, generator=gen, dtype=F64) + 0.5,
        "spherical": torch.tensor([1.0, 2.0, 0.7], dtype=F64),
    }[covariance_type]
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    chol = precisions_cholesky_from_covariances(covariances, covariance_type)
    return MixtureParams(weights, means, chol, covariance_type)


def _clients(params: MixtureParams, sizes, seed: int = 1) -> list[torch.Tensor]:
    """Rows near the mixture's components; client 1 draws only from component 0 (its other
    components are backed by a few rows at most)."""
    rng = np.random.default_rng(seed)
    means = params.means.numpy()
    clients = []
    for c, n in enumerate(sizes):
        labels = np.zeros(n, int) if c == 1 else rng.integers(0, K, n)
        X = means[labels] + rng.normal(0.0, 1.0, (n, D))
        clients.append(torch.as_tensor(X))
    return clients


def _message(params: MixtureParams) -> Message:
    return Message("em", {**params.tensors(), "shift": moment_shift(params)})


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Equal to ``RTOL`` of the values' scale."""
    assert a.shape == b.shape, what
    scale = float(b.abs().max()) if b.numel() else 0.0
    diff = float((a - b).abs().max()) if b.numel() else 0.0
    assert diff <= RTOL * max(scale, 1e-300), f"{what}: {diff:.3g} vs scale {scale:.3g}"


def _same_reply(batched: Message, alone: Message, floor: int | None = None) -> None:
    assert batched.kind == alone.kind
    assert batched.scalars == alone.scalars
    assert list(batched.tensors) == list(alone.tensors)
    for name, value in alone.tensors.items():
        _close(batched.tensors[name], value, name)
    assert set(batched.backing) == set(alone.backing)
    for name, rows in alone.backing.items():
        mine = torch.as_tensor(batched.backing[name])
        _close(mine, torch.as_tensor(rows), f"backing of {name}")
        if floor is not None:  # the same floor decisions
            assert torch.equal(backed(mine, floor), backed(torch.as_tensor(rows), floor))


def _contexts(n: int, policy: PrivacyPolicy, states=None) -> list:
    states = states or [{} for _ in range(n)]
    return [gate.client_context(c, dict(states[c]), policy) for c in range(n)]


SIZES = [40, 30, 3, 0, 25, 40, 7, 18]  # client 2 below the floor, client 3 without rows


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("weights", ["global", "personal"])
def test_batched_replies_equal_each_clients_own(covariance_type, weights):
    params = _mixture(covariance_type)
    clients = _clients(params, SIZES)
    step = EMStep(FederatedEM(K, covariance_type=covariance_type, mixture_weights=weights).config)
    message = _message(params)
    policy = PrivacyPolicy(min_rows=5)
    rng = np.random.default_rng(3)
    states = [
        {"log_weights": torch.as_tensor(np.log(rng.dirichlet(np.ones(K))))}
        if weights == "personal" and c % 2 == 0
        else {}
        for c in range(len(SIZES))
    ]
    one, many = _contexts(len(SIZES), policy, states), _contexts(len(SIZES), policy, states)
    alone = [step.client_step(X, message, ctx) for X, ctx in zip(clients, one, strict=True)]
    batched = step.client_steps(list(zip(clients, many, strict=True)), message)
    assert len(batched) == len(alone)
    for b, a in zip(batched, alone, strict=True):
        _same_reply(b, a, floor=5)
    assert [bool(r.scalars.get("skipped")) for r in batched] == [
        False,
        False,
        True,
        True,
        False,
        False,
        False,
        False,
    ]
    unbacked = batched[1].backing["counts"] < 5
    assert unbacked.any() and not unbacked.all()  # client 1 keeps some components only
    for a, b in zip(one, many, strict=True):  # the same personal weights kept
        assert set(a.state) == set(b.state)
        for name in a.state:
            _close(b.state[name], a.state[name], name)
    if weights == "personal":
        assert "log_weights" in many[2].state and "log_weights" not in many[3].state


def test_tied_second_moment_of_the_kept_components_equals_the_clients_own():
    """A tied client with an unbacked component releases the second moment of its kept
    components' rows, backed by their effective rows (not its row count)."""
    params = _mixture("tied")
    clients = _clients(params, [30, 30, 30])
    step = EMStep(FederatedEM(K, covariance_type="tied").config)
    message = _message(params)
    policy = PrivacyPolicy(min_rows=5)
    one, many = _contexts(3, policy), _contexts(3, policy)
    alone = [step.client_step(X, message, ctx) for X, ctx in zip(clients, one, strict=True)]
    batched = step.client_steps(list(zip(clients, many, strict=True)), message)
    assert batched[1].backing["second"].ndim == 0
    assert float(batched[1].backing["second"]) < 30  # the kept components' rows only
    for b, a in zip(batched, alone, strict=True):
        _same_reply(b, a, floor=5)


@pytest.mark.parametrize("mode", ["floor", "dp"])
def test_released_replies_through_each_clients_gate_equal_one_by_one(mode):
    """The gate releases the batched replies as the one-by-one ones: floored components
    zeroed alike, and under differential privacy each client's own noise (a test seed)."""
    params = _mixture("full")
    clients = _clients(params, SIZES)
    if mode == "dp":
        settings = {"dp_mode": "local", "dp_noise_multiplier": 1.0, "dp_clip": 10.0}
        policy = PrivacyPolicy(dp=DPPolicy(1.0, 10.0, "local", insecure_seed=11))
    else:
        settings, policy = {}, PrivacyPolicy(min_rows=5)
    covariances = torch.linalg.inv(params.precisions_cholesky @ params.precisions_cholesky.mT)
    algorithm = FederatedEM(
        K,
        weights_init=params.weights.numpy(),
        means_init=params.means.numpy(),
        precisions_init=torch.linalg.inv(covariances).numpy(),
        max_iter=1,
        **settings,
    )
    message = algorithm.configure(algorithm.start())
    assert message.kind == "em"
    one, many = _contexts(len(SIZES), policy), _contexts(len(SIZES), policy)
    alone = [gate.answer(algorithm, X, message, ctx) for X, ctx in zip(clients, one, strict=True)]
    batched = gate.answer_many(algorithm, list(zip(clients, many, strict=True)), message)
    for b, a in zip(batched, alone, strict=True):
        _same_reply(b, a)
    released = [r for r in batched if not r.scalars.get("skipped")]
    # under DP every client answers (noise alone without rows); under the floor the clients
    # of 3 and 0 rows skip, and the one of 7 rows has no component backed by 5
    assert len(released) == (len(SIZES) if mode == "dp" else len(SIZES) - 3)
    if mode == "floor":
        assert (released[1].tensors["counts"] == 0).any()  # client 1's unbacked components
    for a, b in zip(one, many, strict=True):
        assert a.terms.ledger.releases == b.terms.ledger.releases


def test_different_row_counts_are_padded_in_groups_and_long_clients_run_alone():
    """Row counts from 1 to 300 (groups padded to their longest client) and a chunk size
    that leaves the longest client to its own E-step."""
    params = _mixture("full")
    sizes = [300, 5, 6, 9, 12, 40, 41, 100, 1, 77]
    clients = _clients(params, sizes, seed=4)
    step = EMStep(FederatedEM(K, covariance_type="full", chunk_size=120).config)
    message = _message(params)
    policy = PrivacyPolicy(min_rows=5)
    one, many = _contexts(len(sizes), policy), _contexts(len(sizes), policy)
    alone = [step.client_step(X, message, ctx) for X, ctx in zip(clients, one, strict=True)]
    batched = step.client_steps(list(zip(clients, many, strict=True)), message)
    for b, a in zip(batched, alone, strict=True):
        _same_reply(b, a, floor=5)


@pytest.mark.parametrize("weights", ["global", "personal"])
def test_a_simulated_fit_is_the_same_with_and_without_batched_clients(weights):
    rng = np.random.default_rng(5)
    centres = rng.normal(0.0, 4.0, (K, D))
    sizes = [60, 45, 3, 80, 30, 52, 2, 70, 64, 41]
    clients = [
        torch.as_tensor(centres[rng.integers(0, K, n)] + rng.normal(0.0, 1.0, (n, D)))
        for n in sizes
    ]

    def fit(batch: bool):
        algorithm = FederatedEM(K, mixture_weights=weights, max_iter=8, tol=0.0, random_state=0)
        return run_simulation(copy.deepcopy(algorithm), clients, batch_clients=batch)

    batched, alone = fit(True), fit(False)
    a, b = alone.state.params, batched.state.params
    for name in ("weights", "means", "precisions_cholesky"):
        x, y = getattr(b, name), getattr(a, name)
        assert float((x - y).abs().max()) <= 1e-10 * float(y.abs().max()), name
    np.testing.assert_allclose(batched.state.lower_bounds, alone.state.lower_bounds, rtol=1e-10)
    assert [r.skipped for r in batched.history] == [r.skipped for r in alone.history]
    assert any(r.skipped for r in batched.history if r.kind == "em")
    if weights == "personal":
        for cid, state in alone.client_states.items():
            for name, value in state.items():
                _close(batched.client_states[cid][name], value, f"client {cid} {name}")
