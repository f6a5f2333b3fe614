"""A lying client against the round loop (``fednovelty.runtime.loop``): a gross lie in the
first round is dropped by name and the client asked no more; a client caught lying later
loses its earlier contributions (the run starts again without it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _liars import Forging

from fednovelty import FedGMMDetector
from fednovelty.detectors import base
from fednovelty.evaluation.metrics import auroc
from fednovelty.federated import FederatedAlgorithm, FederatedEM, Message
from fednovelty.federated.trust import gate
from fednovelty.runtime import run_simulation

LIAR = 3


def Lying(inner: FederatedAlgorithm, forge) -> Forging:
    """``inner`` whose client ``LIAR`` replies ``forge(reply, number)`` in its
    ``number``-th non-skipped reply (1-based) and honestly otherwise."""
    return Forging(inner, LIAR, lambda reply, message, number: forge(reply, number))


def _replace(reply: Message, **tensors) -> Message:
    return Message(reply.kind, {**reply.tensors, **tensors}, dict(reply.scalars))


def huge_first_moments(reply: Message, number: int) -> Message:
    """Means of 1e133 in the first (moments) reply, honest replies after it."""
    if reply.kind != "moments":
        return reply
    return _replace(reply, mean=torch.full_like(reply.tensors["mean"], 1e133))


def nan_in_third_reply(reply: Message, number: int) -> Message:
    """Honest in its first two replies, NaN sums in the third."""
    if number != 3:
        return reply
    return _replace(reply, sums=reply.tensors["sums"] * float("nan"))


def _task(seed: int = 0):
    """Three Gaussian blobs in 4-D over 10 clients; test rows: fresh blob rows (inliers)
    and uniform rows in a wide box (novel)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 5, (3, 4))
    X = np.concatenate([c + rng.normal(size=(300, 4)) for c in centers])
    groups = rng.integers(0, 10, len(X))
    inliers = np.concatenate([c + rng.normal(size=(100, 4)) for c in centers])
    novel = rng.uniform(-15, 15, (200, 4))
    y = np.r_[np.zeros(len(inliers)), np.ones(len(novel))]
    return X, groups, np.r_[inliers, novel], y


def test_a_gross_liar_in_the_first_round_leaves_the_default_fit_as_good(monkeypatch):
    X, groups, X_test, y = _task()
    clean = FedGMMDetector(3, random_state=0).fit(X, groups=groups)
    clean_auroc = auroc(y, clean.decision_function(X_test))
    simulate = base.run_simulation
    monkeypatch.setattr(
        base,
        "run_simulation",
        lambda algorithm, *a, **k: simulate(Lying(algorithm, huge_first_moments), *a, **k),
    )
    lied = FedGMMDetector(3, random_state=0).fit(X, groups=groups)
    lied_auroc = auroc(y, lied.decision_function(X_test))
    assert clean_auroc > 0.95
    assert abs(lied_auroc - clean_auroc) <= 0.02, (clean_auroc, lied_auroc)
    first = lied.history_[0]
    assert first["kind"] == "moments" and first["n_dropped"] == 1
    assert all(r["n_sampled"] == 9 for r in lied.history_[1:])  # asked no more
    assert not any(r["restarted"] for r in lied.history_)  # it had contributed nothing


def _clients(seed: int = 0) -> dict[int, torch.Tensor]:
    X, groups, _, _ = _task(seed)
    return {c: torch.as_tensor(X[groups == c]) for c in range(10)}


def _algorithm() -> FederatedEM:
    return FederatedEM(
        3, mixture_weights="personal", standardize=True, prior_strength=6.0, random_state=0
    )


def test_a_liar_caught_in_round_3_is_refitted_out_of_the_model():
    clients = _clients()
    result = run_simulation(Lying(_algorithm(), nan_in_third_reply), clients, random_state=0)
    without = run_simulation(
        _algorithm(), {c: X for c, X in clients.items() if c != LIAR}, random_state=0
    )
    restarted = [r for r in result.history if r.restarted]
    assert [r.round for r in restarted] == [3]
    assert f"[{LIAR}]" in restarted[0].restarted and "NaN" in restarted[0].restarted
    assert [c for c, _ in restarted[0].dropped] == [LIAR]
    assert all(LIAR not in r.sampled for r in result.history[3:])
    # the rounds after the restart are the run without the liar, round by round
    assert len(result.history) == 3 + len(without.history)
    assert [r.kind for r in result.history[3:]] == [r.kind for r in without.history]
    got, want = result.state.params, without.state.params
    for name in ("weights", "means", "precisions_cholesky"):
        a, b = getattr(got, name), getattr(want, name)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * float(b.abs().max()))
    for c, weights in without.state.client_weights.items():
        torch.testing.assert_close(result.state.client_weights[c], weights, rtol=1e-9, atol=1e-12)
    assert LIAR not in result.state.client_weights


def test_restarts_are_bounded():
    """Every reply of the liar is NaN after its first: with max_restarts=0 the first catch
    after a contribution ends the run, by name."""
    from fednovelty.exceptions import FederationError
    from fednovelty.federated.trust.validation import ReplyValidator
    from fednovelty.runtime.loop import run_rounds
    from fednovelty.runtime.simulation import InProcessTransport

    clients = _clients()
    algorithm = Lying(_algorithm(), nan_in_third_reply)
    contexts = {c: gate.client_context(c) for c in clients}
    transport = InProcessTransport(algorithm, clients, contexts, 1.0, 0.0, np.random.default_rng(0))
    with pytest.raises(FederationError, match=r"client\(s\) \[3\] .*max_restarts=0"):
        run_rounds(algorithm, transport, validator=ReplyValidator(4), max_restarts=0)


def test_on_flower_a_liar_caught_later_is_refitted_out_of_the_model(monkeypatch):
    """The same restart on the Flower engine: the liar's node is asked no more, every other
    node starts its kept state afresh (personal weights), and the final model equals the
    simulation of the federation without the liar."""
    pytest.importorskip("flwr")
    from _flower_grid import make_grid, set_task_identity

    from fednovelty.runtime.flower import client as flower_client
    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.server import run_rounds

    set_task_identity(monkeypatch)
    liar, answered = 1, []
    honest = flower_client.run_client_step

    def lying(algorithm, data, message, context):
        reply = honest(algorithm, data, message, context)
        if context.client_id == liar and message.kind == "em":
            answered.append(message.kind)
            if len(answered) == 2:  # after the nodes keep personal weights of an em round
                return _replace(reply, sums=reply.tensors["sums"] * float("nan"))
        return reply

    monkeypatch.setattr(flower_client, "run_client_step", lying)
    gen = torch.Generator().manual_seed(5)
    parts = [torch.randn(60, 2, dtype=torch.float64, generator=gen) for c in range(3)]
    for c, X in enumerate(parts):  # two overlapping blobs in other shares per client
        X[: 15 + 15 * c] += 2.0
    params = {"n_components": 2, "mixture_weights": "personal", "max_iter": 5}
    grid, run_config = make_grid("FederatedEM", params, parts)
    result = run_rounds(grid, algorithm_from_run_config(run_config), EngineConfig())
    without = run_simulation(
        algorithm_from_run_config(run_config), {0: parts[0], 2: parts[2]}, random_state=0
    )
    restarted = [r.round for r in result.history if r.restarted]
    assert len(restarted) == 1 and result.history[restarted[0] - 2].kind == "em"
    assert all(liar not in r.sampled for r in result.history[restarted[0] :])
    got, want = result.state.params, without.state.params
    for name in ("weights", "means", "precisions_cholesky"):
        a, b = getattr(got, name), getattr(want, name)
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9 * float(b.abs().max()))
    for c, weights in without.state.client_weights.items():
        torch.testing.assert_close(result.state.client_weights[c], weights, rtol=1e-9, atol=1e-12)
