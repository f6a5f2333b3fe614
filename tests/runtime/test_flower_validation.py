"""Replies checked on receipt: real replies of every algorithm pass, broken ones are named.

Good replies come from the algorithms' own client steps; each broken reply changes one
thing (a NaN, a shape, a sign, a missing tensor). ``accept_replies`` is fed Flower reply
messages as the SuperLink returns them (content or error, sender's node id).
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from _tolerance import assert_close_scaled

pytest.importorskip("flwr")

from _flower_grid import make_grid, set_task_identity
from flwr.app import Error, Metadata
from flwr.app import Message as FlowerMessage

from fednovelty.exceptions import FederationError
from fednovelty.federated import FederatedEM, FedGenGMM, Message
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime.flower.codec import encode_message
from fednovelty.runtime.flower.validation import InvalidReplyError, accept_replies, check_reply

D = 3


def rows(seed: int, n: int = 40) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, dtype=torch.float64, generator=gen) + torch.tensor([0.0, 4, 8])


def em_round(covariance_type: str = "full") -> tuple[Message, Message]:
    """``(broadcast, reply)`` of one EM round of ``FederatedEM`` (personal weights)."""
    X = rows(0)
    algorithm = FederatedEM(2, covariance_type=covariance_type, mixture_weights="personal")
    state = algorithm.start()
    while state.phase != "em":  # run the init rounds in process
        broadcast = algorithm.configure(state)
        reply = algorithm.client_step(X, broadcast, gate.client_context(0))
        state, _ = algorithm.server_step(state, {0: reply})
    broadcast = algorithm.configure(state)
    return broadcast, algorithm.client_step(X, broadcast, gate.client_context(0))


def first_round(algorithm, data, client_id: int = 0) -> tuple[Message, Message]:
    broadcast = algorithm.configure(algorithm.start())
    return broadcast, algorithm.client_step(data, broadcast, gate.client_context(client_id))


def joint_round() -> tuple[Message, Message]:
    X, y = rows(1), torch.arange(40) % 2
    algorithm = JointFedGMM(
        2,
        2,
        2,
        means_init=X[:2],
        weights_init=[0.5, 0.5],
        precisions_init=torch.eye(D, dtype=torch.float64).expand(2, D, D).clone(),
    )
    return first_round(algorithm, (X, y))


ROUNDS = {
    "em-full": lambda: em_round("full"),
    "em-tied": lambda: em_round("tied"),
    "em-diag": lambda: em_round("diag"),
    "em-spherical": lambda: em_round("spherical"),
    "centroids": lambda: first_round(FederatedEM(3), rows(2)),
    "range": lambda: first_round(FederatedEM(3, init_params="separated"), rows(2)),
    "centroids-empty": lambda: first_round(FederatedEM(3), rows(2)[:0]),
    "local_fit": lambda: first_round(FedGenGMM(k_range=(1, 3)), rows(3)),
    "local_fit-skipped": lambda: first_round(FedGenGMM(min_client_samples=50), rows(3)),
    "joint_em": joint_round,
}


@pytest.mark.parametrize("name", list(ROUNDS))
def test_real_replies_pass(name) -> None:
    broadcast, reply = ROUNDS[name]()
    check_reply(reply, broadcast, D)


def with_tensor(message: Message, name: str, value: torch.Tensor) -> Message:
    return replace(message, tensors={**message.tensors, name: value})


def nan_in(tensor: torch.Tensor) -> torch.Tensor:
    broken = tensor.clone()
    broken.view(-1)[0] = float("nan")
    return broken


BROKEN = [
    ("em-full", lambda r: with_tensor(r, "sums", nan_in(r.tensors["sums"])), "'sums' has NaN"),
    ("em-full", lambda r: with_tensor(r, "log_likelihood", torch.tensor(float("inf"))), "inf"),
    ("em-full", lambda r: with_tensor(r, "counts", -r.tensors["counts"]), "'counts' has negative"),
    ("em-full", lambda r: with_tensor(r, "n_samples", torch.tensor(-1.0)), "'n_samples' has neg"),
    (
        "em-full",
        lambda r: with_tensor(r, "sums", r.tensors["sums"][:1]),
        r"'sums' has shape \(1, 3\)",
    ),
    ("em-full", lambda r: with_tensor(r, "second", r.tensors["second"][..., 0]), "'second'"),
    ("em-diag", lambda r: with_tensor(r, "second", torch.zeros(2, D, D)), "'second' has shape"),
    ("em-full", lambda r: replace(r, tensors={"counts": r.tensors["counts"]}), "lacks tensor"),
    ("em-full", lambda r: with_tensor(r, "extra", torch.zeros(1)), "unexpected tensor 'extra'"),
    ("em-full", lambda r: replace(r, kind="assign"), "kind 'assign'"),
    ("centroids", lambda r: with_tensor(r, "centers", torch.zeros(3, D + 1)), "'centers'"),
    ("centroids", lambda r: with_tensor(r, "counts", torch.ones(2)), r"'counts' has shape \(2,\)"),
    (
        "centroids",
        lambda r: replace(
            r,
            tensors={
                "centers": torch.zeros(5, D),
                "counts": torch.ones(5),
                "n_samples": torch.tensor(5.0),
            },
        ),
        "at most 3 asked",
    ),
    ("range", lambda r: with_tensor(r, "min", torch.zeros(D + 1)), "'min'"),
    ("local_fit", lambda r: with_tensor(r, "weights", -r.tensors["weights"]), "'weights' has neg"),
    (
        "local_fit",
        lambda r: with_tensor(r, "means", torch.zeros(r.tensors["means"].shape[0] + 1, D)),
        "'means' has shape",
    ),
    (
        "joint_em",
        lambda r: with_tensor(r, "learner.0.weight", torch.zeros(3, 3)),
        "'learner.0.weight' has shape",
    ),
    ("joint_em", lambda r: with_tensor(r, "joint_counts", torch.ones(2, 3)), "'joint_counts'"),
]


@pytest.mark.parametrize(("name", "damage", "match"), BROKEN)
def test_broken_replies_are_named(name, damage, match) -> None:
    broadcast, reply = ROUNDS[name]()
    with pytest.raises(InvalidReplyError, match=match):
        check_reply(damage(reply), broadcast, D)


# ------------------------------------------------------------------ accept_replies
def flower_reply(node: int, message: Message | None = None, error: str = "", **header):
    metadata = Metadata(
        run_id=1,
        message_id="",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id=f"to-{node}",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type="train",
    )
    if error:
        return FlowerMessage(error=Error(code=0, reason=error), metadata=metadata)
    return FlowerMessage(content=encode_message(message, **header), metadata=metadata)


def test_accept_keeps_good_replies_in_client_order_and_drops_the_rest() -> None:
    broadcast, good = em_round()
    nan = with_tensor(good, "sums", nan_in(good.tensors["sums"]))
    negative = with_tensor(good, "counts", -good.tensors["counts"])
    wrong_shape = with_tensor(good, "sums", good.tensors["sums"][:, :2])
    asked = {10: 0, 11: 1, 12: 2, 13: 3, 14: 4, 15: 5, 16: 6, 17: None}
    replies = [
        flower_reply(17, good, client_id=7, n_features=D),  # first reply of an unknown node
        flower_reply(12, nan, client_id=2, n_features=D),
        flower_reply(11, good, client_id=1, n_features=D),
        flower_reply(13, negative, client_id=3, n_features=D),
        flower_reply(14, wrong_shape, client_id=4, n_features=D),
        flower_reply(15, error="ClientApp raised ZeroDivisionError"),
        flower_reply(16, good, client_id=9, n_features=D),  # claims another client's id
        flower_reply(99, good, client_id=99, n_features=D),  # a node nobody asked
    ]  # node 10 (client 0) never replies
    accepted = accept_replies(replies, asked, broadcast, ReplyValidator(D))
    assert list(accepted.replies) == [1, 7]
    assert accepted.nodes == {1: 11, 7: 17}
    reasons = {(d.client_id, d.node_id): d.reason for d in accepted.dropped}
    assert "NaN" in reasons[(2, 12)]
    assert "negative" in reasons[(3, 13)]
    assert "'sums' has shape (2, 2)" in reasons[(4, 14)]
    assert "ZeroDivisionError" in reasons[(5, 15)]
    assert "names client 9; this node is client 6" in reasons[(6, 16)]
    assert "not asked" in reasons[(None, 99)]
    assert "no reply" in reasons[(0, 10)]
    assert len(accepted.dropped) == 7


def test_rows_of_another_width_are_dropped_not_the_run() -> None:
    broadcast, good = em_round()
    replies = [
        flower_reply(1, good, client_id=0, n_features=D),
        flower_reply(2, good, client_id=1, n_features=D + 1),
    ]
    accepted = accept_replies(replies, {1: None, 2: None}, broadcast, ReplyValidator())
    assert list(accepted.replies) == [0]
    assert "rows of 4 features; the federation's have 3" in accepted.dropped[0].reason


def test_a_client_id_is_bound_to_the_node_that_answered_as_it_first() -> None:
    broadcast, good = em_round()
    # two unknown nodes name client 0 in one round: the first keeps it, the second is dropped
    replies = [flower_reply(n, good, client_id=0, n_features=D) for n in (1, 2)]
    accepted = accept_replies(replies, {1: None, 2: None}, broadcast, ReplyValidator(D))
    assert accepted.nodes == {0: 1}
    assert "names client 0, which node 1 answers as" in accepted.dropped[0].reason
    # a later round: client 0 is bound to node 1; node 3 naming it is dropped
    later = [flower_reply(3, good, client_id=0, n_features=D)]
    accepted = accept_replies(later, {3: None}, broadcast, ReplyValidator(D), bound={0: 1})
    assert accepted.replies == {}
    assert "which node 1 answers as" in accepted.dropped[0].reason


# ------------------------------------------------------------------ the server loop, in process
@pytest.fixture
def task_identity(monkeypatch):
    set_task_identity(monkeypatch)


def client_parts(n_clients: int = 3, labels: bool = False):
    gen = torch.Generator().manual_seed(5)
    parts = [
        torch.randn(30 + 10 * c, D, dtype=torch.float64, generator=gen) + 3 * c
        for c in range(n_clients)
    ]
    if labels:
        return [(X, (X[:, 0] > X[:, 0].median()).long()) for X in parts]
    return parts


def assert_states_equal(actual, expected) -> None:
    """Same parameters up to float64 round-off relative to each tensor's scale (the engines
    may sum replies in another order; entries near zero get the scale's tolerance)."""
    for name, tensor in expected.params.tensors().items():
        assert_close_scaled(actual.params.tensors()[name], tensor, rtol=1e-12, err_msg=name)


ENGINE_CASES = [
    ("FederatedEM", {"n_components": 3, "max_iter": 4, "kmeans_rounds": 3}, 1.0),
    (
        "FederatedEM",
        {
            "n_components": 2,
            "mixture_weights": "personal",
            "init_params": "separated",
            "max_iter": 3,
            "covariance_type": "diag",
        },
        1.0,
    ),
    ("FederatedEM", {"n_components": 2, "max_iter": 3}, 0.5),  # sampling: registration first
    ("FederatedEM", {"n_components": 2, "max_iter": 3, "pca_components": 2}, 1.0),
    ("FedGenGMM", {"n_components": 2, "k_range": [1, 3]}, 1.0),
    (
        "JointFedGMM",
        {"n_components": 2, "n_learners": 2, "n_classes": 2, "max_iter": 2, "kmeans_rounds": 2},
        1.0,
    ),
]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(("name", "params", "fraction"), ENGINE_CASES)
def test_run_rounds_equals_simulation(name, params, fraction, task_identity) -> None:
    from fednovelty.runtime import run_simulation
    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.server import run_rounds

    parts = client_parts(4 if fraction < 1 else 3, labels=name == "JointFedGMM")
    grid, run_config = make_grid(name, params, parts)
    engine = EngineConfig(fraction=fraction, seed=3)
    result = run_rounds(grid, algorithm_from_run_config(run_config), engine)
    simulated = run_simulation(
        algorithm_from_run_config(run_config), parts, fraction=fraction, random_state=3
    )
    assert_states_equal(result.state, simulated.state)
    assert [(r.kind, r.sampled, r.replied, r.bytes_down, r.bytes_up) for r in result.history] == [
        (r.kind, r.sampled, r.replied, r.bytes_down, r.bytes_up) for r in simulated.history
    ]
    assert [t for _, t in grid.sent].count("query") == (len(parts) if fraction < 1 else 0)
    if getattr(simulated.state, "client_weights", None):
        for c, weights in simulated.state.client_weights.items():
            assert_close_scaled(result.state.client_weights[c], weights, rtol=1e-12)


def test_federated_calibration_on_flower_rounds_equals_simulation(task_identity, tmp_path) -> None:
    """Nodes holding one column of calibration scores (one below its privacy floor): the
    same summed counts, the same skip and the same bytes as the simulation, and the
    result file keeps the state."""
    from fednovelty.federated.core.conformal import calibration_edges
    from fednovelty.runtime import run_simulation
    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.results import load_result, save_result
    from fednovelty.runtime.flower.server import run_rounds

    parts = [X[:, :1].square() for X in client_parts(3)] + [torch.ones(3, 1, dtype=torch.float64)]
    edges = calibration_edges(0.0)[::64]  # 65 edges: a small run config
    grid, run_config = make_grid("FederatedCalibration", {"edges": edges.tolist()}, parts)
    result = run_rounds(grid, algorithm_from_run_config(run_config), EngineConfig(seed=3))
    simulated = run_simulation(algorithm_from_run_config(run_config), parts, random_state=3)
    assert torch.equal(result.state.counts, simulated.state.counts)
    assert result.state.n_rows == simulated.state.n_rows == 30 + 40 + 50
    assert [(r.kind, r.replied, r.skipped, r.bytes_down, r.bytes_up) for r in result.history] == [
        (r.kind, r.replied, r.skipped, r.bytes_down, r.bytes_up) for r in simulated.history
    ]
    assert result.history[0].skipped[0][0] == 3
    save_result(result, tmp_path / "calibration.safetensors")
    back = load_result(tmp_path / "calibration.safetensors").state
    assert type(back) is type(result.state) and torch.equal(back.counts, result.state.counts)
    assert torch.equal(back.edges, torch.as_tensor(edges)) and back.n_rows == result.state.n_rows


def test_missing_and_failing_nodes_are_dropped_while_min_clients_reply(task_identity) -> None:
    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.server import run_rounds

    parts = client_parts(4)
    parts[2][0, 0] = float("nan")  # client 2's ClientApp raises ClientDataError
    grid, run_config = make_grid("FedGenGMM", {"n_components": 2}, parts, silent=[1000 + 7 * 3])
    engine = EngineConfig(min_clients=2, round_timeout=0.5)
    result = run_rounds(grid, algorithm_from_run_config(run_config), engine)
    assert result.history[0].replied == (0, 1)
    reasons = {d["node_id"]: d["reason"] for d in result.dropped}
    assert "node error" in reasons[1014] and "NaN" in reasons[1014]
    assert "no reply within" in reasons[1021]
    # min_clients=3 is never met: each failed round is recorded and asked again, until
    # max_failed_rounds rounds in a row have failed
    records = []
    with pytest.raises(FederationError, match=r"2 round\(s\) in a row had fewer than "):
        run_rounds(
            grid,
            algorithm_from_run_config(run_config),
            EngineConfig(min_clients=3, round_timeout=0.5, max_failed_rounds=2),
            callbacks=[records.append],
        )
    assert [(r.failed, r.replied) for r in records] == [(True, (0, 1)), (True, (0, 1))]


def test_nodes_with_other_widths_are_left_out(task_identity) -> None:
    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.server import run_rounds

    grid, run_config = make_grid("FedGenGMM", {"n_components": 2}, client_parts(3), widths={1: 2})
    result = run_rounds(grid, algorithm_from_run_config(run_config), EngineConfig())
    assert result.history[0].replied == (0, 2)
    assert "rows of 2 features" in result.dropped[0]["reason"]
    with pytest.raises(FederationError, match="only 3 node"):
        run_rounds(
            grid,
            algorithm_from_run_config(run_config),
            EngineConfig(num_nodes=4, nodes_timeout=0.3),
        )


def test_run_rounds_runs_the_shared_loop_with_a_grid_transport(task_identity, monkeypatch) -> None:
    from fednovelty.runtime import loop
    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.server import GridTransport, run_rounds

    calls = []
    shared = loop.run_rounds

    def spy(algorithm, transport, **kwargs):
        calls.append((transport, kwargs))
        return shared(algorithm, transport, **kwargs)

    monkeypatch.setattr(loop, "run_rounds", spy)
    grid, run_config = make_grid("FedGenGMM", {"n_components": 2}, client_parts(3))
    engine = EngineConfig(min_clients=2, max_failed_rounds=4)
    result = run_rounds(grid, algorithm_from_run_config(run_config), engine)
    assert len(calls) == 1
    transport, kwargs = calls[0]
    assert isinstance(transport, GridTransport)
    assert (kwargs["min_clients"], kwargs["max_failed_rounds"]) == (2, 4)
    assert result.history[0].replied == (0, 1, 2)
    assert set(result.history[0].metrics) >= {"wire_bytes_down", "wire_bytes_up"}
