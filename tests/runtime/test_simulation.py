"""The in-process engine ``run_simulation``: round records, sampling, dropout, callbacks.

A tiny ``FederatedAlgorithm`` whose message sizes are known by construction lets every
byte count be checked against a hand computation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fednovelty.exceptions import ClientDataError, FederationError
from fednovelty.federated import ClientContext, FederatedAlgorithm, FederatedEM, Message
from fednovelty.federated.core.declarations import ReplySpec
from fednovelty.federated.trust.backing import client_backing
from fednovelty.runtime import RoundRecord, run_simulation

#: what a ``tick`` reply holds: ``client_id + 1`` zeros and the row count.
TICK = ReplySpec(
    "tick",
    shapes=lambda broadcast, d: {"data": ("c",), "n": (1,)},
    backing={"data": "client", "n": "client"},
)


class CountingAlgorithm(FederatedAlgorithm):
    """Runs ``n_rounds`` rounds. Broadcast: a float64 tensor of ``width`` entries and one
    int scalar (``width * 8 + 8`` bytes). Client ``c`` replies with ``c + 1`` float64 zeros
    plus its row count as a float32 tensor and the string scalar ``"ok"`` (so
    ``(c + 1) * 8 + 4 + 2`` bytes). The server keeps every reply for inspection."""

    def __init__(self, n_rounds: int = 3, width: int = 4) -> None:
        self.n_rounds = n_rounds
        self.width = width
        self.max_rounds = n_rounds
        self.replies: list[dict[int, Message]] = []
        self.client_calls: list[tuple[int, int]] = []

    def reply_spec(self, kind: str) -> ReplySpec:
        return TICK

    def start(self) -> dict:
        return {"round": 0}

    def configure(self, state: dict) -> Message:
        return Message(
            "tick",
            {"payload": torch.zeros(self.width, dtype=torch.float64)},
            {"round": state["round"]},
        )

    def client_step(self, X: torch.Tensor, message: Message, context: ClientContext) -> Message:
        self.client_calls.append((int(message.scalars["round"]), context.client_id))
        seen = context.state.get("seen", torch.zeros((), dtype=torch.int64))
        context.state["seen"] = seen + 1
        tensors = {
            "data": torch.zeros(context.client_id + 1, dtype=torch.float64),
            "n": torch.tensor([float(X.shape[0])], dtype=torch.float32),
        }
        return Message("tick", tensors, {"status": "ok"}, backing=client_backing(tensors, len(X)))

    def server_step(self, state: dict, replies: dict[int, Message]):
        self.replies.append(dict(replies))
        n_rows = sum(float(r.tensors["n"]) for r in replies.values())
        return {"round": state["round"] + 1}, {"n_rows": n_rows, "phase": "tick"}

    def finished(self, state: dict) -> bool:
        return state["round"] >= self.n_rounds


def reply_bytes(client_id: int) -> int:
    return (client_id + 1) * 8 + 4 + 2


def make_clients(n_clients: int = 6) -> list[torch.Tensor]:
    """Clients of 5, 6, ... rows (each at the default privacy floor or above)."""
    return [torch.ones(c + 5, 3, dtype=torch.float64) for c in range(n_clients)]


def test_history_records_rounds_and_bytes():
    algorithm = CountingAlgorithm(n_rounds=3, width=4)
    clients = make_clients(4)
    result = run_simulation(algorithm, clients)
    history = result.history
    assert [r.round for r in history] == [1, 2, 3]
    assert all(isinstance(r, RoundRecord) for r in history)
    assert all(r.kind == "tick" for r in history)
    for record, replies in zip(history, algorithm.replies, strict=True):
        assert record.sampled == (0, 1, 2, 3)
        assert record.replied == (0, 1, 2, 3)
        assert record.bytes_up == sum(reply_bytes(c) for c in range(4))
        assert record.bytes_up == sum(m.nbytes() for m in replies.values())
        assert record.bytes_down == (4 * 8 + 8) * 4
        assert record.seconds >= 0
        assert record.metrics == {"n_rows": 5 + 6 + 7 + 8, "phase": "tick"}
    assert result.bytes_up == 3 * sum(reply_bytes(c) for c in range(4))
    assert result.bytes_down == 3 * 40 * 4
    as_dict = history[0].as_dict()
    assert as_dict["round"] == 1 and as_dict["n_sampled"] == 4 and as_dict["n_replied"] == 4
    assert as_dict["n_rows"] == 26
    # Client state persists across rounds and is returned.
    assert {c: int(s["seen"]) for c, s in result.client_states.items()} == {
        0: 3,
        1: 3,
        2: 3,
        3: 3,
    }


def test_dict_clients_keep_their_ids():
    algorithm = CountingAlgorithm(n_rounds=1)
    clients = {10: torch.ones(6, 3), 3: torch.ones(5, 3)}
    result = run_simulation(algorithm, clients)
    assert result.history[0].sampled == (3, 10)
    assert result.history[0].bytes_up == reply_bytes(3) + reply_bytes(10)
    assert sorted(result.client_states) == [3, 10]


def test_callbacks_called_once_per_round_in_order():
    seen: list[RoundRecord] = []
    other: list[int] = []
    result = run_simulation(
        CountingAlgorithm(n_rounds=4),
        make_clients(3),
        callbacks=[seen.append, lambda r: other.append(r.round)],
    )
    assert seen == result.history
    assert other == [1, 2, 3, 4]


@pytest.mark.parametrize("n_clients", [1, 2, 5, 7])
def test_fraction_half_asks_ceil_half(n_clients):
    algorithm = CountingAlgorithm(n_rounds=6)
    result = run_simulation(algorithm, make_clients(n_clients), fraction=0.5, random_state=3)
    expected = math.ceil(n_clients / 2)
    for record, replies in zip(result.history, algorithm.replies, strict=True):
        assert len(record.sampled) == expected
        assert len(set(record.sampled)) == expected
        assert set(record.sampled) <= set(range(n_clients))
        assert record.replied == record.sampled
        assert sorted(replies) == list(record.sampled)
        assert record.bytes_down == (4 * 8 + 8) * expected
        assert record.bytes_up == sum(reply_bytes(c) for c in record.sampled)
    # Only the asked clients ran their step, once per round.
    calls = sorted(algorithm.client_calls)
    assert calls == sorted((r.round - 1, c) for r in result.history for c in r.sampled)


def test_small_fraction_still_asks_one_client():
    result = run_simulation(CountingAlgorithm(n_rounds=2), make_clients(5), fraction=0.01)
    assert all(len(r.sampled) == 1 for r in result.history)


def test_fraction_sampling_varies_across_rounds():
    result = run_simulation(
        CountingAlgorithm(n_rounds=12), make_clients(8), fraction=0.5, random_state=0
    )
    assert len({r.sampled for r in result.history}) > 1


def test_dropout_gives_fewer_replies():
    algorithm = CountingAlgorithm(n_rounds=20)
    result = run_simulation(algorithm, make_clients(8), dropout=0.4, random_state=1)
    asked = sum(len(r.sampled) for r in result.history)
    replied = sum(len(r.replied) for r in result.history)
    assert asked == 20 * 8
    assert replied < asked
    assert replied > 0
    for record, replies in zip(result.history, algorithm.replies, strict=True):
        assert set(record.replied) <= set(record.sampled)
        assert sorted(replies) == list(record.replied)
        # Broadcast goes to every asked client; only replies count upwards.
        assert record.bytes_down == 40 * len(record.sampled)
        assert record.bytes_up == sum(reply_bytes(c) for c in record.replied)


def _strip_seconds(history):
    return [{k: v for k, v in r.as_dict().items() if k != "seconds"} for r in history]


def test_same_random_state_same_history():
    options = {"fraction": 0.6, "dropout": 0.3, "random_state": 123}
    first = run_simulation(CountingAlgorithm(n_rounds=8), make_clients(7), **options)
    second = run_simulation(CountingAlgorithm(n_rounds=8), make_clients(7), **options)
    assert _strip_seconds(first.history) == _strip_seconds(second.history)
    assert [r.replied for r in first.history] == [r.replied for r in second.history]
    third = run_simulation(
        CountingAlgorithm(n_rounds=8), make_clients(7), **{**options, "random_state": 124}
    )
    assert [r.replied for r in third.history] != [r.replied for r in first.history]


def test_min_clients_above_the_clients_asked_raises():
    with pytest.raises(ValueError, match="min_clients=5 but only 4 of 4"):
        run_simulation(CountingAlgorithm(n_rounds=1), make_clients(4), min_clients=5)
    with pytest.raises(ValueError, match="min_clients=3 but only 2 of 4"):
        run_simulation(CountingAlgorithm(n_rounds=1), make_clients(4), fraction=0.5, min_clients=3)


def test_rounds_without_enough_replies_are_asked_again_and_recorded():
    # dropout 0.8 among 10 clients: about one round in nine has no reply at all; before,
    # such a round ended the fit.
    for seed in range(3):
        algorithm = CountingAlgorithm(n_rounds=30)
        result = run_simulation(algorithm, make_clients(10), dropout=0.8, random_state=seed)
        done = [r for r in result.history if not r.failed]
        failed = [r for r in result.history if r.failed]
        assert len(done) == 30 and len(algorithm.replies) == 30
        assert failed, "expected at least one round with zero replies at dropout 0.8"
        assert all(r.replied == () and r.metrics == {} for r in failed)
        assert [r.round for r in result.history] == list(range(1, len(result.history) + 1))


def test_the_federation_is_gone_after_max_failed_rounds_in_a_row():
    with pytest.raises(
        FederationError, match="3 round\\(s\\) in a row had fewer than min_clients=3"
    ):
        run_simulation(
            CountingAlgorithm(n_rounds=50),
            make_clients(3),
            min_clients=3,
            dropout=0.9,
            max_failed_rounds=3,
        )
    with pytest.raises(ValueError, match="max_failed_rounds must be >= 1"):
        run_simulation(CountingAlgorithm(), make_clients(2), max_failed_rounds=0)


def test_the_default_failure_budget_grows_with_dropout():
    from fednovelty.runtime.simulation import SPURIOUS_END, failure_budget

    assert failure_budget(0.0) == failure_budget(0.05) == 5
    for dropout in (0.5, 0.6, 0.9):
        m = failure_budget(dropout)
        assert dropout**m <= SPURIOUS_END < dropout ** (m - 1)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, float("nan")])
def test_bad_fraction_raises(fraction):
    with pytest.raises(ValueError, match="fraction"):
        run_simulation(CountingAlgorithm(), make_clients(2), fraction=fraction)


@pytest.mark.parametrize("dropout", [1.0, -0.1, 2.0, float("nan")])
def test_bad_dropout_raises(dropout):
    with pytest.raises(ValueError, match="dropout"):
        run_simulation(CountingAlgorithm(), make_clients(2), dropout=dropout)


def test_no_clients_raises():
    with pytest.raises(ValueError, match="clients is empty"):
        run_simulation(CountingAlgorithm(), [])


def test_runaway_algorithm_is_stopped():
    class NeverDone(CountingAlgorithm):
        def finished(self, state):
            return False

    with pytest.raises(RuntimeError, match="exceeded 2 rounds"):
        run_simulation(NeverDone(n_rounds=2), make_clients(2))


def test_progress_bar(capsys):
    result = run_simulation(
        CountingAlgorithm(n_rounds=3), make_clients(2), progress=True, description="counting"
    )
    assert len(result.history) == 3
    captured = capsys.readouterr()
    assert "counting" in captured.err
    silent = run_simulation(CountingAlgorithm(n_rounds=3), make_clients(2), progress=False)
    assert len(silent.history) == 3
    assert capsys.readouterr().err == ""


def test_progress_bar_with_federated_em(capsys):
    from fednovelty.federated import FederatedEM

    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (40, 2)), rng.normal(6, 1, (40, 2))])
    clients = [torch.as_tensor(X[::2]), torch.as_tensor(X[1::2])]
    result = run_simulation(FederatedEM(2, random_state=0), clients, progress=True)
    assert result.state.converged
    assert "FederatedEM" in capsys.readouterr().err


def test_degenerate_clients_are_rejected_by_name():
    gen = torch.Generator().manual_seed(0)
    good = torch.randn(20, 3, dtype=torch.float64, generator=gen)
    good[10:] += 5.0  # two clusters, so the 20 rows back two centroids under the privacy floor
    algorithm = FederatedEM(2, random_state=0)
    with pytest.raises(ClientDataError, match="client 1 has 4 features but client 0 has 3"):
        run_simulation(algorithm, [good, torch.randn(5, 4, dtype=torch.float64)])
    bad = good.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ClientDataError, match="client 1: rows contain NaN or inf"):
        run_simulation(algorithm, [good, bad])
    with pytest.raises(ClientDataError, match="client 0: rows must be a 2-D floating"):
        run_simulation(algorithm, [torch.ones(4, dtype=torch.float64)])
    # empty and one-row clients are fine: they add (almost) nothing to the sums
    result = run_simulation(algorithm, [good, good[:0], good[:1]])
    assert result.state.params.n_components == 2


def test_a_labelled_algorithm_without_labels_is_named_by_client():
    """An algorithm whose ``labelled`` is true gets ``(X, y)`` tuples; rows alone are refused
    before any round, naming the client (the engine knows no algorithm class)."""

    class Labelled(CountingAlgorithm):
        labelled = True

        def client_step(self, data, message, context):
            return super().client_step(data[0], message, context)

    rows = make_clients(2)
    with pytest.raises(ClientDataError, match="client 1: this algorithm needs labelled data"):
        run_simulation(Labelled(n_rounds=1), {0: (rows[0], torch.zeros(len(rows[0]))), 1: rows[1]})
    labelled = [(X, torch.zeros(len(X))) for X in rows]
    assert len(run_simulation(Labelled(n_rounds=1), labelled).history) == 1
