"""Lying clients for the tests: an algorithm wrapper whose one client forges its replies
after its own client gate (a liar does not hold itself to its policy), the lies hypothesis
draws from an honest reply, and a context in which the simulation's client lies so (for
detectors, whose algorithm the test does not build). Imported as ``_liars``; ``tests/`` is
on ``sys.path``, see ``_tolerance``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from unittest import mock

import torch
from hypothesis import strategies as st

from fednovelty.federated.core.base import FederatedAlgorithm, Message
from fednovelty.federated.core.wire import unpack
from fednovelty.federated.trust.robust import EXTENSIVE
from fednovelty.runtime import simulation

LIES = (
    "scale",
    "nan",
    "inf",
    "wrong_shape",
    "missing",
    "extra",
    "non_psd",
    "other_kind",
    "huge_rows",
    "random",
    "claim_rows",
)
#: what a consistent liar scales to claim more rows than it has: every sum over rows it
#: sends (counts, sums, second moments, row counts, ...), means and parameters unchanged.
SUMS_OVER_ROWS = (*EXTENSIVE, "n", "sum")


@st.composite
def lies(draw) -> dict:
    """What the liar does: a lie, the tensor it picks (by position), a factor, the rounds."""
    return {
        "lie": draw(st.sampled_from(LIES)),
        "pick": draw(st.integers(0, 7)),
        "factor": draw(st.sampled_from([1e300, 1e10, -1.0, 1e-300, 0.0, -1e300])),
        "every_round": draw(st.booleans()),
        "first_round": draw(st.integers(0, 3)),
        "seed": draw(st.integers(0, 2**16)),
    }


def lie(reply: Message, how: dict) -> Message:
    """``reply`` as the liar sends it (see :data:`LIES`)."""
    tensors = {name: t.clone() for name, t in reply.tensors.items()}
    names = sorted(tensors)
    g = torch.Generator().manual_seed(how["seed"])
    lie_kind = how["lie"]
    if lie_kind == "other_kind":
        return Message("em" if reply.kind != "em" else "moments", tensors, dict(reply.scalars))
    if lie_kind == "claim_rows":
        factor = abs(how["factor"]) or 1e3
        scaled = {n: (v * factor if n in SUMS_OVER_ROWS else v) for n, v in tensors.items()}
        return Message(reply.kind, scaled, dict(reply.scalars))
    if lie_kind == "extra" or not names:
        tensors["extra"] = torch.ones(3, dtype=torch.float64)
        return Message(reply.kind, tensors, dict(reply.scalars))
    name = names[how["pick"] % len(names)]
    t = tensors[name]
    floating = t.is_floating_point()
    if lie_kind == "scale" and floating:
        tensors[name] = t * how["factor"]
    elif lie_kind == "scale":  # every float tensor, as a consistent liar would
        tensors = {
            n: (v * how["factor"] if v.is_floating_point() else v) for n, v in tensors.items()
        }
    elif lie_kind in ("nan", "inf") and floating and t.numel():
        flat = t.reshape(-1).clone()
        flat[int(torch.randint(flat.numel(), (1,), generator=g))] = (
            float("nan") if lie_kind == "nan" else float("inf")
        )
        tensors[name] = flat.reshape(t.shape)
    elif lie_kind == "wrong_shape":
        tensors[name] = torch.zeros(*[s + 1 for s in t.shape], 2, dtype=t.dtype)
    elif lie_kind == "missing":
        del tensors[name]
    elif lie_kind == "non_psd" and "second" in tensors:
        tensors["second"] = -tensors["second"]
    elif lie_kind == "huge_rows":
        for key in ("n_samples", "n"):
            if key in tensors:
                tensors[key] = tensors[key] * 1e200
    elif floating:  # random: any values of the right shape
        tensors[name] = torch.randn(t.shape, dtype=t.dtype, generator=g) * how["factor"]
    return Message(reply.kind, tensors, dict(reply.scalars))


def lies_now(how: dict, number: int) -> bool:
    """Whether the liar lies in its ``number``-th reply that carries something (0-based)."""
    return number == how["first_round"] or (how["every_round"] and number > how["first_round"])


class Forging(FederatedAlgorithm):
    """``inner`` with client ``liar``'s replies replaced, after its own client gate, by
    ``forge(reply, message, number)`` (``number``: 1-based count of its replies that carry
    something; with ``skipped=True`` skipped replies are forged too, and counted)."""

    def __init__(
        self,
        inner: FederatedAlgorithm,
        liar: int,
        forge: Callable[[Message, Message, int], Message],
        skipped: bool = False,
    ) -> None:
        self.inner, self.liar, self.forge, self.skipped = inner, liar, forge, skipped
        self.max_rounds, self.labelled, self.replies = inner.max_rounds, inner.labelled, 0

    def start(self):
        return self.inner.start()

    def configure(self, state):
        return self.inner.configure(state)

    def finished(self, state):
        return self.inner.finished(state)

    def server_step(self, state, replies):
        return self.inner.server_step(state, replies)

    def reply_spec(self, kind):
        return self.inner.reply_spec(kind)

    @property
    def config(self):
        return self.inner.config

    @property
    def gate_caps_weights(self):
        return self.inner.gate_caps_weights

    def client_step(self, X, message, context):
        return self.inner.client_step(X, message, context)

    def client_steps(self, items, message):
        return self.inner.client_steps(items, message)

    def batches(self, kind):
        return self.inner.batches(kind)

    def forge_reply(self, client_id, reply, message, data, context):
        """The engine's hook for a lying client: its released reply, forged."""
        if client_id != self.liar or (reply.scalars.get("skipped") and not self.skipped):
            return reply
        self.replies += 1
        # the liar forges the logical messages, not their wire form (a forged reply travels
        # unpacked: the server reads a message without a wire description as it is)
        return self.forge(unpack(reply), unpack(message), self.replies)


@contextmanager
def lying_client(liar: int, how: dict) -> Iterator[None]:
    """Within the block, the simulation's client ``liar`` replies ``lie(reply, how)`` in the
    rounds ``how`` names (:func:`lies_now`), after its own client gate."""
    honest, honest_many = simulation.run_client_step, simulation.run_client_steps
    answered = {"n": 0}

    def after_gate(reply, context):
        if context.client_id != liar or reply.scalars.get("skipped"):
            return reply
        answered["n"] += 1
        return lie(reply, how) if lies_now(how, answered["n"] - 1) else reply

    def liar_step(algorithm, data, message, context, *args, **kwargs):
        return after_gate(honest(algorithm, data, message, context, *args, **kwargs), context)

    def liar_steps(algorithm, items, message, *args, **kwargs):  # a batched round
        replies = honest_many(algorithm, items, message, *args, **kwargs)
        return [after_gate(r, context) for r, (_, context) in zip(replies, items, strict=True)]

    with (
        mock.patch.object(simulation, "run_client_step", liar_step),
        mock.patch.object(simulation, "run_client_steps", liar_steps),
    ):
        yield


def shifted_component(reply: Message, shift: float, component: int = 0) -> Message:
    """``reply``'s statistics with component ``component``'s rows moved by ``shift`` in
    every feature, consistently (sums and full second moments about the same shift):
    statistics some rows could have, outside the client's declared box."""
    t = reply.tensors
    a = torch.full((t["sums"].shape[1],), float(shift), dtype=t["sums"].dtype)
    n, s = t["counts"][component], t["sums"][component]
    sums, second = t["sums"].clone(), t["second"].clone()
    sums[component] = s + n * a
    second[component] += torch.outer(a, s) + torch.outer(s, a) + n * torch.outer(a, a)
    return Message(reply.kind, {**t, "sums": sums, "second": second}, dict(reply.scalars))
