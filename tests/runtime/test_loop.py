"""The round loop every engine runs (``fednovelty.runtime.loop.run_rounds``), driven by a
scripted transport: round numbers, validation, failed rounds, records, callbacks, the
``max_rounds`` guard; and that the in-process engine runs its rounds through it (the Flower
engine's check is in ``test_flower_validation.py``, beside its in-process grid).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fednovelty.exceptions import FederationError
from fednovelty.federated import FederatedAlgorithm, Message
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import loop, run_simulation
from fednovelty.runtime.loop import Delivery, RoundRecord, Settled, Transport, run_rounds
from fednovelty.runtime.simulation import InProcessTransport

D = 2


#: what a ``tick`` reply holds: the client's row count and two values.
TICK = ReplySpec(
    "tick",
    shapes=lambda broadcast, d: {"n_samples": (), "value": (2,)},
    backing={"n_samples": "client", "value": "client"},
)


class Rounds(FederatedAlgorithm):
    """Finishes after ``n_rounds`` server steps (or never, ``n_rounds=None``); the broadcast
    carries the round count as a float64 tensor, so its size is 8 bytes + 8 per scalar. The
    server keeps the replies it is handed and reports their count."""

    def __init__(self, n_rounds: int | None = 2, max_rounds: int = 5) -> None:
        self.n_rounds, self.max_rounds = n_rounds, max_rounds
        self.seen: list[dict[int, Message]] = []

    def start(self) -> int:
        return 0

    def configure(self, state: int) -> Message:
        step = torch.tensor(float(state), dtype=torch.float64)
        return Message("tick", {"step": step}, {"who": "all"})

    def client_step(self, X, message, context) -> Message:
        return reply(float(X.shape[0]))

    def server_step(self, state: int, replies):
        self.seen.append(dict(replies))
        return state + 1, {"n_replies": len(replies)}

    replies = declare(TICK)

    def finished(self, state: int) -> bool:
        return self.n_rounds is not None and state >= self.n_rounds


def reply(n_rows: float = 10.0, value: float = 1.0) -> Message:
    tensors = {"n_samples": torch.tensor(n_rows, dtype=torch.float64)}
    tensors["value"] = torch.tensor([value, value], dtype=torch.float64)
    return Message("tick", tensors, backing=client_backing(tensors, n_rows))


class Scripted(Transport):
    """Round ``r`` returns ``script[r - 1]`` (client id -> reply) from ``n_asked`` recipients
    (the last script entry repeats); records every exchange and every settle call. With
    ``widths``, every reply declares rows of ``D`` features (as Flower's reply headers do)."""

    def __init__(self, script, n_asked: int = 4, dropped_without_id=False, widths=False) -> None:
        self.script, self.n_asked, self.widths = script, n_asked, widths
        self.dropped_without_id = dropped_without_id
        self.sent: list[tuple[int, Message]] = []
        self.settled: list[tuple[int, list[int], dict[int, str]]] = []

    def exchange(self, number: int, message: Message) -> Delivery:
        self.sent.append((number, message))
        replies = dict(self.script[min(number, len(self.script)) - 1])
        return Delivery(
            replies,
            asked=tuple(range(self.n_asked)),
            n_asked=self.n_asked,
            bytes_up=sum(r.nbytes() for r in replies.values()),
            widths=dict.fromkeys(replies, D) if self.widths else None,
            metrics={"engine_figure": 7},
        )

    def settle(self, number, delivery, valid, invalid) -> Settled:
        self.settled.append((number, list(valid), dict(invalid)))
        settled = super().settle(number, delivery, valid, invalid)
        if self.dropped_without_id:
            return Settled(settled.sampled, (*settled.dropped, (None, "unknown node")))
        return settled


def broken() -> Message:
    nan = reply()
    nan.tensors["value"] = torch.tensor([float("nan"), 0.0], dtype=torch.float64)
    return nan


def test_rounds_are_numbered_validated_and_recorded() -> None:
    algorithm = Rounds(n_rounds=2)
    # replies arrive out of client order; client 2's reply has a NaN
    transport = Scripted([{3: reply(), 0: reply(), 2: broken()}], dropped_without_id=True)
    seen: list[RoundRecord] = []
    state, history = run_rounds(
        algorithm, transport, validator=ReplyValidator(D), callbacks=[seen.append]
    )
    assert state == 2 and seen == history
    assert [n for n, _ in transport.sent] == [1, 2] and [r.round for r in history] == [1, 2]
    # the server step sees only the valid replies, in increasing client id
    assert [list(replies) for replies in algorithm.seen] == [[0, 3], [0, 3]]
    assert [(n, valid) for n, valid, _ in transport.settled] == [(1, [0, 3]), (2, [0, 3])]
    assert "NaN" in transport.settled[0][2][2]
    first, message = history[0], transport.sent[0][1]
    assert first.kind == "tick" and first.sampled == (0, 1, 2, 3) and first.replied == (0, 3)
    assert first.bytes_down == message.nbytes() * 4 == (8 + 3) * 4
    assert first.bytes_up == 2 * (8 + 16) + broken().nbytes()
    assert first.metrics == {"n_replies": 2, "engine_figure": 7}
    # the drop without a client id is the transport's to report, not the record's
    assert [c for c, _ in first.dropped] == [2] and "NaN" in first.dropped[0][1]
    assert not first.failed and first.seconds >= 0


def test_a_reply_that_contradicts_its_clients_earlier_one_is_dropped() -> None:
    transport = Scripted([{0: reply(10.0), 1: reply(12.0)}, {0: reply(99.0), 1: reply(12.0)}])
    _, history = run_rounds(Rounds(n_rounds=2), transport, validator=ReplyValidator(D))
    assert history[1].replied == (1,)
    assert "claims 99 rows; the client declared 10" in history[1].dropped[0][1]


def test_rounds_with_too_few_valid_replies_fail_and_are_asked_again() -> None:
    algorithm = Rounds(n_rounds=2)
    # round 2: client 1 skips (it is not caught lying: it is asked again in round 3)
    script = [{0: reply()}, {0: reply(), 1: skipped()}, {0: reply(), 1: reply()}]
    transport = Scripted(script)
    state, history = run_rounds(
        algorithm, transport, validator=ReplyValidator(D), min_clients=2, max_failed_rounds=3
    )
    assert state == 2
    assert [r.failed for r in history] == [True, True, False, False]
    assert [r.metrics for r in history[:2]] == [{"engine_figure": 7}] * 2  # no server step
    # a failed round is asked again: the same state, so the same message
    steps = [float(m.tensors["step"]) for _, m in transport.sent]
    assert steps == [0.0, 0.0, 0.0, 1.0] and len(algorithm.seen) == 2


def skipped() -> Message:
    return Message("tick", scalars={"skipped": True, "reason": "below the floor"})


def test_a_round_of_skipped_replies_only_fails_and_is_asked_again() -> None:
    """A skipped reply passes validation but carries nothing: it does not count toward
    min_clients, so the server step never sees a round without statistics."""
    algorithm = Rounds(n_rounds=2)
    transport = Scripted([{0: skipped(), 1: skipped()}, {0: skipped(), 1: reply()}])
    state, history = run_rounds(algorithm, transport, validator=ReplyValidator(D))
    assert state == 2
    assert [r.failed for r in history] == [True, False, False]
    assert history[0].replied == (0, 1) and not history[0].dropped
    assert [sorted(replies) for replies in algorithm.seen] == [[0, 1], [0, 1]]


@pytest.mark.parametrize("detector", ["FedGMMDetector", "ClusteredFedGMMDetector"])
def test_dropout_with_a_client_below_its_floor_fits_every_seed(detector) -> None:
    """Three clients, one of 4 rows (below the default floor of 5: it always skips), 60 %
    dropout: rounds where only the small client answers are asked again, and every seed
    fits."""
    import fednovelty

    rng = np.random.default_rng(0)
    X = rng.normal(size=(204, 2))
    groups = np.r_[np.zeros(100), np.ones(100), np.full(4, 2)].astype(int)
    options = {"n_clusters": 2, "cluster_components": 1} if detector != "FedGMMDetector" else {}
    failed = 0
    for seed in range(6):
        sampling = fednovelty.ClientSampling(dropout=0.6)
        model = getattr(fednovelty, detector)(2, sampling=sampling, random_state=seed, **options)
        model.fit(X, groups=groups)
        assert np.isfinite(model.score_samples(X)).all()
        failed += sum(r["failed"] for r in model.history_)
    assert failed > 0  # rounds were asked again


def test_the_federation_is_gone_after_max_failed_rounds_in_a_row() -> None:
    records: list[RoundRecord] = []
    transport = Scripted([{0: reply(), 1: broken()}])
    with pytest.raises(FederationError, match=r"2 round\(s\) in a row had fewer than") as info:
        run_rounds(
            Rounds(),
            transport,
            validator=ReplyValidator(D),
            min_clients=2,
            max_failed_rounds=2,
            callbacks=[records.append],
        )
    assert "round 2 (tick), 1 of 4 asked replied validly; dropped: client 1:" in str(info.value)
    assert [r.failed for r in records] == [True, True]


def test_a_round_without_replies_fails_before_the_width_is_known() -> None:
    """No reply to validate: the round is failed, not an error of the validator (which has
    no row width to learn from an empty round)."""
    transport = Scripted([{}, {0: reply()}], widths=True)
    validator = ReplyValidator()
    state, history = run_rounds(
        Rounds(n_rounds=1), transport, validator=validator, max_failed_rounds=2
    )
    assert validator.n_features == D  # learnt from the first replies
    assert state == 1 and [r.failed for r in history] == [True, False]
    assert history[0].replied == () and history[0].bytes_up == 0


def test_a_runaway_algorithm_is_stopped_at_max_rounds() -> None:
    transport = Scripted([{0: reply()}])
    with pytest.raises(RuntimeError, match="Rounds exceeded 3 rounds"):
        run_rounds(Rounds(n_rounds=None, max_rounds=3), transport, validator=ReplyValidator(D))
    assert len(transport.sent) == 3


def test_failed_rounds_do_not_count_against_max_rounds() -> None:
    transport = Scripted([{}, {}, {0: reply()}])
    state, history = run_rounds(
        Rounds(n_rounds=2, max_rounds=2), transport, validator=ReplyValidator(D)
    )
    assert state == 2 and [r.failed for r in history] == [True, True, False, False]


@pytest.mark.parametrize("bad", [0, -1])
def test_max_failed_rounds_below_one_is_named(bad) -> None:
    with pytest.raises(ValueError, match="max_failed_rounds must be >= 1"):
        run_rounds(Rounds(), Scripted([{}]), max_failed_rounds=bad)


def test_the_progress_bar_counts_successful_rounds(capsys) -> None:
    transport = Scripted([{0: reply()}])
    run_rounds(
        Rounds(n_rounds=2),
        transport,
        validator=ReplyValidator(D),
        progress=True,
        description="fake",
    )
    assert "fake" in capsys.readouterr().err


def test_the_progress_bar_shows_the_phase_loglik_and_failures_only_when_there_are_any() -> None:
    class Bar:
        def update(self, n):
            self.n = n

        def set_postfix(self, postfix):
            self.postfix = postfix

    bar = Bar()
    em = RoundRecord(1, "em", (0,), (0,), 0, 0, 0.0, {"mean_log_likelihood": -1.23456})
    loop._show(bar, em, 0)
    assert (bar.n, bar.postfix) == (1, {"phase": "em", "loglik": "-1.2346"})
    lost = RoundRecord(2, "centroids", (0,), (), 0, 0, 0.0, failed=True)
    loop._show(bar, lost, 2)
    assert (bar.n, bar.postfix) == (0, {"phase": "centroids", "failed": 2})


def test_run_simulation_runs_the_shared_loop_with_its_transport(monkeypatch) -> None:
    calls = []
    shared = loop.run_rounds

    def spy(algorithm, transport, **kwargs):
        calls.append((transport, kwargs))
        return shared(algorithm, transport, **kwargs)

    monkeypatch.setattr(loop, "run_rounds", spy)
    clients = [torch.ones(c + 5, D, dtype=torch.float64) for c in range(4)]
    result = run_simulation(Rounds(n_rounds=2), clients, fraction=0.5, min_clients=2)
    assert len(calls) == 1
    transport, kwargs = calls[0]
    assert isinstance(transport, InProcessTransport)
    assert kwargs["min_clients"] == 2 and kwargs["validator"].n_features == D
    assert [len(r.sampled) for r in result.history] == [math.ceil(0.5 * 4)] * 2
