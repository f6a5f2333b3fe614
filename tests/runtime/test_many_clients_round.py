"""A round of many in-process clients, batched, against the same round one client at a time.

The in-process engine answers a round's clients in one batched E-step, releases and packs
their replies together, unpacks them together and checks them against each other in
stacked views (``trust.release_many``, ``core.wire_many``, ``trust.batch_checks``). These
tests run the same federations with ``batch_clients=False`` (each client's step, gate and
wire alone, as a Flower node runs its own) and compare what the server decided and fitted:
the same clients dropped by name for the same reason, the same skipped clients, the same
personal weights, parameters equal to round-off.
"""

from __future__ import annotations

import gc

import pytest
import torch
from _blob_federation import D, decisions, em, federation
from _liars import Forging

from fednovelty.federated import Message
from fednovelty.federated.core.wire import pack
from fednovelty.federated.core.wire_many import unpack_many
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import run_simulation
from fednovelty.runtime.simulation import rare_collections

#: client 7 holds 50 rows (the liar of the tests below is backed by enough of them)
BIG_SEVEN = {7: 50}


def liar_at(liar: int, lie) -> Forging:
    return Forging(em(), liar, lambda reply, message, number: lie(reply, number))


def non_psd_second(reply: Message, number: int) -> Message:
    if number < 2:  # honest in its first reply
        return reply
    second = reply.tensors["second"].clone()
    largest = int(reply.tensors["counts"].argmax())
    second[largest] = -second[largest]
    return Message(reply.kind, {**reply.tensors, "second": second}, dict(reply.scalars))


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(1.0, float(b.abs().max()))


@pytest.mark.parametrize(
    "make",
    [
        lambda: em(),
        lambda: em(mixture_weights="personal"),
        lambda: liar_at(7, non_psd_second),
    ],
    ids=["honest", "personal", "liar"],
)
def test_a_batched_round_decides_and_fits_as_one_client_at_a_time(make):
    clients = federation(sizes=BIG_SEVEN)
    batched = run_simulation(make(), clients)
    alone = run_simulation(make(), clients, batch_clients=False)
    assert decisions(batched) == decisions(alone)
    assert any(r.skipped for r in batched.history)  # the clients below the floor
    a, b = batched.state.params, alone.state.params
    assert relative(a.means, b.means) < 1e-10 and relative(a.covariances, b.covariances) < 1e-10
    assert batched.bytes_up == alone.bytes_up
    for cid, kept in alone.client_states.items():
        for name, value in kept.items():
            assert relative(batched.client_states[cid][name], value) < 1e-10


def test_the_liar_among_many_is_dropped_by_name_and_the_run_starts_again_without_it():
    result = run_simulation(liar_at(7, non_psd_second), federation(sizes=BIG_SEVEN))
    caught = [r for r in result.history if r.dropped]
    assert [c for c, _ in caught[0].dropped] == [7]
    assert "not positive semi-definite" in caught[0].dropped[0][1]
    assert caught[0].restarted  # it contributed to the first round
    without = run_simulation(
        em(), {c: X for c, X in enumerate(federation(sizes=BIG_SEVEN)) if c != 7}
    )
    assert relative(result.state.params.means, without.state.params.means) < 1e-10


def test_the_server_gate_gives_stacked_views_the_verdicts_of_copies():
    """Replies unpacked together are views of one tensor; a NaN and an indefinite second
    moment among them are dropped with the reasons the same replies get as copies."""
    algorithm = em()
    message = algorithm.configure(algorithm.start())
    clients = [X for X in federation(60, seed=1, sizes=BIG_SEVEN) if X.shape[0] >= 20]
    contexts = [
        gate.client_context(c, policy=PrivacyPolicy(min_rows=1), wire=True)
        for c in range(len(clients))
    ]
    packed = gate.answer_many(algorithm, list(zip(clients, contexts, strict=True)), pack(message))
    views, refused = unpack_many(dict(enumerate(packed)))
    assert not refused and views[5].tensors["second"]._base is views[6].tensors["second"]._base
    views[5].tensors["second"].view(-1)[0] = float("nan")  # in place: still views
    views[9].tensors["second"][2].neg_()
    copies = {
        c: Message(r.kind, {n: t.clone() for n, t in r.tensors.items()}) for c, r in views.items()
    }

    def accept(replies):
        validator = ReplyValidator(n_features=D, specs=algorithm.reply_spec)
        return validator.accept(message, replies)

    valid, dropped = accept(views)
    valid_copies, dropped_copies = accept(copies)
    assert dropped == dropped_copies and set(dropped) == {5, 9}
    assert list(valid) == list(valid_copies)


def test_rare_collections_restores_the_callers_thresholds():
    before = gc.get_threshold()
    with rare_collections(123_456):
        assert gc.get_threshold()[0] == max(123_456, before[0])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), rare_collections():
        raise RuntimeError("a failing run")
    assert gc.get_threshold() == before
