"""Steps and the chain that runs them (``federated.core.steps``), on a toy chain defined here.

``Toy`` chains three steps: ``Count`` (one uncounted ``toy_count`` round: row counts and
row sums), ``Centre`` (a :class:`NoRoundStep`: it broadcasts the pooled mean to the later
rounds and its ``view`` centres the rows; a client with fewer than ``MIN_ROWS`` rows cannot
be centred and raises :class:`ClientSkip`) and ``Total`` (``toy_total`` rounds, counted, as
many as the toy's ``total_rounds``: row counts and sums of the rows its client half sees).
Every server half writes what it saw into ``state.log``; the references are NumPy sums of
each client's rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import torch

from fednovelty.federated.core.base import ClientContext, Message, ReleaseTerms, skipped_reply
from fednovelty.federated.core.declarations import ReplySpec, UndeclaredReplyError, declare
from fednovelty.federated.core.steps import ChainedAlgorithm, ClientSkip, NoRoundStep, Step
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation

#: rows a client needs to be centred (fewer: ``Centre.view`` raises ``ClientSkip``).
MIN_ROWS = 4
SKIP_REASON = "too few rows to centre"


def _sums_spec(kind: str) -> ReplySpec:
    return ReplySpec(
        kind,
        shapes=lambda broadcast, d: {"n_samples": (), "total": (d,)},
        backing={"n_samples": "client", "total": "client"},
    )


def _sums_reply(kind: str, X: torch.Tensor) -> Message:
    tensors = {"n_samples": torch.tensor(float(X.shape[0]), dtype=X.dtype), "total": X.sum(0)}
    return Message(kind, tensors, backing=client_backing(tensors, X.shape[0]))


@dataclass
class ToyState:
    phase: str = ""
    rounds: int = 0
    log: list = field(default_factory=list)
    n: float = 0.0
    mean: torch.Tensor | None = None
    totals: list = field(default_factory=list)


class Count(Step):
    kinds = ("toy_count",)
    replies = declare(_sums_spec("toy_count"))
    counted = False

    def begin(self, state: ToyState) -> str:
        state.log.append(("begin", "Count"))
        return "toy_count"

    def configure(self, state: ToyState) -> Message:
        return Message("toy_count")

    def client_step(self, X, message, context) -> Message:
        return _sums_reply("toy_count", X)

    def server_step(self, state: ToyState, replies):
        state.log.append(("server", "toy_count", tuple(replies)))
        state.n = sum(float(r.tensors["n_samples"]) for r in replies.values())
        state.mean = sum(r.tensors["total"] for r in replies.values()) / state.n
        return None, {"phase": "toy_count", "n": state.n}

    def finish(self, state: ToyState) -> None:
        state.log.append(("finish", "Count"))


class Centre(NoRoundStep):
    def begin(self, state: ToyState) -> None:
        state.log.append(("begin", "Centre"))
        return None

    def broadcast(self, state: ToyState):
        return {"centre": state.mean}, {"centred": True}

    def view(self, X, message, context):
        if X.shape[0] < MIN_ROWS:
            raise ClientSkip(SKIP_REASON)
        return X - message.tensors["centre"]

    def finish(self, state: ToyState) -> None:
        state.log.append(("finish", "Centre"))


class Total(Step):
    kinds = ("toy_total",)
    replies = declare(_sums_spec("toy_total"))

    def __init__(self, config: Any = None, rounds: int = 2) -> None:
        super().__init__(config)
        self.max_rounds = rounds
        self.seen: list[int] = []  # how many clients each client_steps call answered

    def begin(self, state: ToyState) -> str:
        state.log.append(("begin", "Total"))
        return "toy_total"

    def configure(self, state: ToyState) -> Message:
        return Message("toy_total", scalars={"round": state.rounds})

    def client_steps(self, items, message):
        self.seen.append(len(items))
        return super().client_steps(items, message)

    def client_step(self, X, message, context) -> Message:
        return _sums_reply("toy_total", X)

    def server_step(self, state: ToyState, replies):
        state.log.append(("server", "toy_total", tuple(replies)))
        state.totals.append({c: r.tensors["total"].clone() for c, r in replies.items()})
        done = len(state.totals) >= self.max_rounds
        return (None if done else "toy_total"), {"phase": "toy_total"}

    def finish(self, state: ToyState) -> None:
        state.log.append(("finish", "Total"))


class Toy(ChainedAlgorithm):
    def __init__(self, total_rounds: int = 2, steps: list[Step] | None = None) -> None:
        self._chain(steps if steps is not None else [Count(), Centre(), Total(rounds=total_rounds)])

    def new_state(self) -> ToyState:
        return ToyState()


def _clients(sizes: dict[int, int]) -> dict[int, torch.Tensor]:
    rng = np.random.default_rng(0)
    return {cid: torch.as_tensor(rng.normal(3.0, 2.0, size=(n, 2))) for cid, n in sizes.items()}


def _run(algorithm: ChainedAlgorithm, clients: dict[int, torch.Tensor]):
    return run_simulation(algorithm, clients, privacy=PrivacyPolicy(min_rows=1), random_state=0)


# ----------------------------------------------------------------------------- a whole run
def test_the_steps_run_in_order_and_each_server_half_sees_its_rounds_replies() -> None:
    clients = _clients({7: 12, 2: 9, 5: 15})  # ids out of order
    result = _run(Toy(), clients)
    state = result.state
    assert [r.kind for r in result.history] == ["toy_count", "toy_total", "toy_total"]
    assert state.log == [
        ("begin", "Count"),
        ("server", "toy_count", (2, 5, 7)),  # the round's replies, in client-id order
        ("begin", "Centre"),  # no round of its own: the next step begins at once
        ("begin", "Total"),
        ("server", "toy_total", (2, 5, 7)),
        ("server", "toy_total", (2, 5, 7)),
        ("finish", "Total"),  # finish: last step first, once the last step is done
        ("finish", "Centre"),
        ("finish", "Count"),
    ]
    pooled = np.concatenate([clients[c].numpy() for c in (2, 5, 7)])
    assert state.n == pooled.shape[0]
    np.testing.assert_allclose(state.mean.numpy(), pooled.mean(0), rtol=1e-12)
    for totals in state.totals:  # each client's rows centred on the pooled mean, summed
        for cid, total in totals.items():
            expected = (clients[cid].numpy() - pooled.mean(0)).sum(0)
            np.testing.assert_allclose(total.numpy(), expected, rtol=1e-9, atol=1e-12)
    assert state.phase == "done" and result.history[-1].metrics["phase"] == "toy_total"
    assert state.rounds == 2  # Count's round is not counted, Total's two are


def test_a_no_round_step_spends_no_round_and_counts_in_no_bound() -> None:
    algorithm = Toy(total_rounds=3)
    assert algorithm.max_rounds == 1 + 0 + 3
    result = _run(algorithm, _clients({0: 8, 1: 8}))
    assert len(result.history) == 4 and "centre" not in {r.kind for r in result.history}
    assert result.state.rounds == 3


def test_a_client_skip_is_a_named_skipped_reply_and_the_round_goes_on() -> None:
    clients = _clients({0: 10, 1: MIN_ROWS - 1, 2: 11})
    result = _run(Toy(), clients)
    count, *totals = result.history
    assert count.skipped == () and count.replied == (0, 1, 2)  # no view before Count
    for record in totals:
        assert record.skipped == ((1, SKIP_REASON),) and not record.failed
        assert record.replied == (0, 1, 2)  # the skipped reply passed the server gate
    assert result.state.log[4] == ("server", "toy_total", (0, 2))  # but no server half sees it
    pooled = np.concatenate([c.numpy() for c in clients.values()])  # client 1 in Count's
    for cid in (0, 2):
        expected = (clients[cid].numpy() - pooled.mean(0)).sum(0)
        np.testing.assert_allclose(result.state.totals[0][cid].numpy(), expected, rtol=1e-9)


def test_the_chain_stops_where_its_steps_say() -> None:
    """A step's server half naming no next round ends it; one that keeps asking past the
    chain's ``max_rounds`` (the steps' summed ``max_rounds``) is stopped by the loop."""
    assert [r.kind for r in _run(Toy(total_rounds=1), _clients({0: 6})).history] == [
        "toy_count",
        "toy_total",
    ]

    class Endless(Total):
        def server_step(self, state, replies):
            super().server_step(state, replies)
            return "toy_total", {}

    with pytest.raises(RuntimeError, match="Toy exceeded 3 rounds"):
        _run(Toy(steps=[Count(), Centre(), Endless(rounds=2)]), _clients({0: 6}))


def test_a_chain_without_rounds_is_done_at_start() -> None:
    algorithm = Toy(steps=[Centre()])
    state = algorithm.start()
    assert state.phase == "done" and algorithm.finished(state)
    assert state.log == [("begin", "Centre"), ("finish", "Centre")]
    assert _run(Toy(steps=[Centre()]), _clients({0: 6})).history == []


# ----------------------------------------------------------------------------- the halves
def test_a_later_round_carries_what_the_finished_steps_broadcast() -> None:
    algorithm = Toy()
    state = algorithm.start()
    assert "centre" not in algorithm.configure(state).tensors  # nothing finished before Count
    state.phase, state.mean = "toy_total", torch.tensor([1.0, -2.0], dtype=torch.float64)
    message = algorithm.configure(state)
    assert message.kind == "toy_total" and message.scalars == {"round": 0}
    assert torch.equal(message.tensors["centre"], state.mean)
    assert message.expect == {"centred": True}


class _Scaling(ReleaseTerms):
    """Terms whose ``clip`` doubles the rows (to see that it runs, and after what)."""

    def clip(self, X: torch.Tensor) -> torch.Tensor:
        return 2.0 * X


def test_client_rows_pass_the_views_the_steps_rows_and_the_clip_and_keep_their_order() -> None:
    class Squared(Total):
        def rows(self, X, message, context):
            return X.square()

    step = Squared()
    algorithm = Toy(steps=[Count(), Centre(), step])
    centre = torch.tensor([0.5, -1.0], dtype=torch.float64)
    message = Message("toy_total", {"centre": centre})
    rows = _clients({0: 6, 1: MIN_ROWS - 1, 2: 5})
    items = [(rows[c], ClientContext(c, terms=_Scaling())) for c in (0, 1, 2)]
    replies = algorithm.client_steps(items, message)
    assert step.seen == [2]  # the step's client half answers only the clients that can
    assert replies[1] == skipped_reply("toy_total", SKIP_REASON)
    for index in (0, 2):
        expected = 2.0 * (rows[index].numpy() - centre.numpy()) ** 2
        np.testing.assert_allclose(replies[index].tensors["total"].numpy(), expected.sum(0))
    one = algorithm.client_step(rows[0], message, ClientContext(0, terms=_Scaling()))
    assert torch.equal(one.tensors["total"], replies[0].tensors["total"])


def test_a_labelled_step_takes_the_rows_with_the_extra_tensors() -> None:
    class Labelled(Total):
        labelled = True

        def client_step(self, data, message, context):
            X, y = data
            return _sums_reply("toy_total", X[y == 1])

    class LabelledToy(Toy):
        def split_data(self, data):
            X, y = data
            return X, (y,)

    algorithm = LabelledToy(steps=[Centre(), Labelled()])
    X = torch.arange(12.0, dtype=torch.float64).reshape(6, 2)
    y = torch.tensor([1, 0, 1, 1, 0, 0])
    message = Message("toy_total", {"centre": torch.zeros(2, dtype=torch.float64)})
    reply = algorithm.client_step((X, y), message, ClientContext(0))
    np.testing.assert_array_equal(reply.tensors["total"].numpy(), X.numpy()[[0, 2, 3]].sum(0))


def test_the_server_half_leaves_skipped_replies_out() -> None:
    algorithm = Toy()
    state = algorithm.start()
    X = torch.ones(3, 2, dtype=torch.float64)
    replies = {4: _sums_reply("toy_count", X), 1: skipped_reply("toy_count", "no")}
    state, metrics = algorithm.server_step(state, replies)
    assert state.log[1] == ("server", "toy_count", (4,))
    assert metrics == {"phase": "toy_count", "n": 3.0}
    assert state.phase == "toy_total" and state.rounds == 0  # Count is not counted
    state, _ = algorithm.server_step(state, {0: _sums_reply("toy_total", X)})
    assert state.rounds == 1


def test_batches_and_reply_spec_are_the_answering_steps() -> None:
    class Batched(Total):
        batched = True

    algorithm = Toy(steps=[Count(), Centre(), Batched()])
    assert algorithm.batches("toy_total") and not algorithm.batches("toy_count")
    assert algorithm.reply_spec("toy_count") is Count.replies["toy_count"]
    assert algorithm.reply_spec("toy_total") is Total.replies["toy_total"]


# ----------------------------------------------------------------------------- misuse
def test_two_steps_answering_one_kind_cannot_be_chained() -> None:
    with pytest.raises(ValueError, match="two steps answer messages of kind 'toy_count'"):
        Toy(steps=[Count(), Count()])


def test_a_spec_under_another_kind_cannot_be_chained() -> None:
    class Misfiled(Count):
        replies = MappingProxyType({"toy_count": _sums_spec("toy_other")})  # another kind's

    misfiled = r"Misfiled: the ReplySpec for \['toy_count'\] names another kind"
    with pytest.raises(UndeclaredReplyError, match=misfiled):
        Toy(steps=[Misfiled()])


def test_a_kind_no_step_answers_is_refused_by_name() -> None:
    algorithm = Toy()
    with pytest.raises(UndeclaredReplyError, match="no step of Toy answers messages of kind 'em'"):
        algorithm.reply_spec("em")
    with pytest.raises(ValueError, match="Toy clients do not answer messages of kind 'em'"):
        algorithm.client_step(torch.ones(5, 2), Message("em"), ClientContext(0))
    state = algorithm.start()
    state.phase = "em"
    with pytest.raises(ValueError, match="Toy clients do not answer messages of kind 'em'"):
        algorithm.configure(state)


def test_a_finished_chain_configures_no_round() -> None:
    algorithm = Toy(steps=[Centre()])
    with pytest.raises(RuntimeError, match="Toy has finished; no round to configure"):
        algorithm.configure(algorithm.start())


def test_a_round_of_skipped_replies_only_reaches_no_server_half() -> None:
    algorithm = Toy()
    state = algorithm.start()
    with pytest.raises(ValueError, match=r"no client replied with statistics in round 1 \(toy_"):
        algorithm.server_step(state, {0: skipped_reply("toy_count", "below floor")})
    assert state.log == [("begin", "Count")] and state.phase == "toy_count"


def test_a_no_round_steps_round_methods_refuse() -> None:
    step, state = Centre(), ToyState()
    with pytest.raises(RuntimeError, match="Centre runs no round"):
        step.configure(state)
    with pytest.raises(RuntimeError, match="Centre runs no round"):
        step.client_step(torch.ones(5, 2), Message("x"), ClientContext(0))
    with pytest.raises(RuntimeError, match="Centre runs no round"):
        step.server_step(state, {})
    assert step.max_rounds == 0


def test_a_steps_first_round_is_its_first_kind_unless_it_says_otherwise() -> None:
    class TwoKinds(Step):
        kinds = ("toy_a", "toy_b")
        replies = declare(_sums_spec("toy_a"), _sums_spec("toy_b"))
        configure = client_step = server_step = None  # the round methods do not matter here

    step = TwoKinds()
    assert step.begin(ToyState()) == "toy_a" and step.config is None
    assert TwoKinds("settings").config == "settings"
    X = torch.ones(3, 2)
    assert step.view(X, Message("toy_a"), ClientContext(0)) is X
    assert step.rows(X, Message("toy_a"), ClientContext(0)) is X
    assert step.broadcast(ToyState()) == ({}, {})
