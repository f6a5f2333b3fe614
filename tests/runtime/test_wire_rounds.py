"""Rounds on the wire: a federated EM run's bytes per client per round equal the closed-form
size of its packed messages (Cholesky factors and symmetric second moments as d(d+1)/2
entries, float32 halving), and a reply whose wire description is malformed is dropped with a
reason while the fit goes on."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import torch

from fednovelty.federated import FederatedEM, Message, PrivacyPolicy
from fednovelty.federated.core.wire import WIRE
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import loop, run_simulation
from fednovelty.runtime.loop import Delivery
from fednovelty.runtime.simulation import InProcessTransport

K, D, ROWS = 3, 6, 300
N_CLIENTS = 3


def clients() -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(D, D))
    rows = [rng.normal(size=(ROWS, D)) @ mixing + 3 * c for c in range(N_CLIENTS)]
    return [torch.as_tensor(r) for r in rows]


def algorithm(**settings) -> FederatedEM:
    """Federated EM from a given start (no preparation rounds), ``max_iter`` EM rounds."""
    data = torch.cat(clients())
    a = torch.as_tensor(np.random.default_rng(1).normal(size=(K, D, D)))
    precisions = torch.eye(D, dtype=torch.float64) + 0.1 * (a @ a.mT)  # not diagonal
    return FederatedEM(
        K,
        weights_init=torch.full((K,), 1 / K, dtype=torch.float64),
        means_init=data[:: len(data) // K][:K],
        precisions_init=precisions,
        max_iter=4,
        tol=0.0,
        **settings,
    )


def symmetric_seconds(em: FederatedEM) -> FederatedEM:
    """``em`` whose clients send each second moment as the mean of it and its transpose:
    exactly symmetric (a GEMM's two triangles may differ in the last bit)."""
    step = em.client_step

    def client_step(X, message, context) -> Message:
        reply = step(X, message, context)
        second = reply.tensors.get("second")
        if second is None or second.ndim != 3:
            return reply
        return dataclasses.replace(
            reply, tensors={**reply.tensors, "second": (second + second.mT) / 2}
        )

    em.client_step = client_step  # an instance attribute: the registry is left alone
    return em


def description(**forms: list[str]) -> int:
    """Bytes of the wire description ``pack`` writes for ``forms`` (its JSON, compact)."""
    return len(json.dumps(forms, separators=(",", ":")))


TRIANGLE = D * (D + 1) // 2
REPLY_TENSORS = ["counts", "sums", "second", "log_likelihood", "n_samples"]


def test_bytes_per_client_per_round_are_the_packed_closed_form() -> None:
    result = run_simulation(symmetric_seconds(algorithm()), clients())
    assert [r.kind for r in result.history] == ["em"] * 4
    down = 8 * (K + K * D + K * TRIANGLE + D) + description(upper=["precisions_cholesky"])
    up = 8 * (K + K * D + K * TRIANGLE + 2) + description(symmetric=["second"])
    raw_up = 8 * (K + K * D + K * D * D + 2)
    for record in result.history:
        assert record.bytes_down == N_CLIENTS * down
        assert record.bytes_up == N_CLIENTS * up
    assert up < 0.75 * raw_up
    # float32 on the wire: every float64 tensor at half its bytes
    narrow = run_simulation(symmetric_seconds(algorithm(wire_dtype="float32")), clients())
    down32 = 4 * (K + K * D + K * TRIANGLE + D) + description(
        upper=["precisions_cholesky"], cast=["weights", "means", "precisions_cholesky", "shift"]
    )
    up32 = 4 * (K + K * D + K * TRIANGLE + 2) + description(
        symmetric=["second"], cast=REPLY_TENSORS
    )
    for record in narrow.history:
        assert record.bytes_down == N_CLIENTS * down32
        assert record.bytes_up == N_CLIENTS * up32


def test_packing_changes_no_number() -> None:
    """The plain run and the run whose second moments travel as triangles agree to round-off
    (the symmetric part is what the server's M-step takes); float32 on the wire moves the
    final means, by no more than float32 precision."""
    plain = run_simulation(algorithm(), clients()).state.params
    packed = run_simulation(symmetric_seconds(algorithm()), clients()).state.params
    narrow = run_simulation(algorithm(wire_dtype="float32"), clients()).state.params
    scale = float(plain.means.abs().amax())
    assert float((packed.means - plain.means).abs().amax()) <= 1e-12 * scale
    assert torch.allclose(packed.precisions_cholesky, plain.precisions_cholesky, rtol=1e-10)
    gap = float((narrow.means - plain.means).abs().amax())
    assert 0 < gap <= 1e-5 * scale


class Corrupting(InProcessTransport):
    """Client 2's reply of round 1 claims a packed ``second`` of a length no triangle has."""

    def exchange(self, number: int, message: Message) -> Delivery:
        delivery = super().exchange(number, message)
        if number == 1 and 2 in delivery.replies:
            reply = delivery.replies[2]
            tensors = {**reply.tensors, "second": torch.zeros(K, TRIANGLE + 1)}
            scalars = {**reply.scalars, WIRE: json.dumps({"symmetric": ["second"]})}
            delivery.replies[2] = Message(reply.kind, tensors, scalars)
        return delivery


def run(data: list[torch.Tensor], transport_class=InProcessTransport):
    em = algorithm()
    contexts = {
        c: gate.client_context(c, policy=PrivacyPolicy(), wire=True) for c in range(len(data))
    }
    transport = transport_class(
        em, dict(enumerate(data)), contexts, 1.0, 0.0, np.random.default_rng(0)
    )
    return loop.run_rounds(em, transport, validator=ReplyValidator(n_features=D))


def test_a_malformed_packed_reply_is_dropped_with_its_reason_and_the_fit_goes_on() -> None:
    state, history = run(clients(), Corrupting)
    first = history[0]
    assert first.replied == (0, 1) and not first.failed
    assert [c for c, _ in first.dropped] == [2]
    assert "malformed wire format" in first.dropped[0][1] and "d(d+1)/2" in first.dropped[0][1]
    assert all(r.replied == (0, 1) for r in history[1:]) and len(history) == 4
    # the model is that of the federation without client 2
    without, _ = run(clients()[:2])
    assert torch.equal(state.params.means, without.params.means)
