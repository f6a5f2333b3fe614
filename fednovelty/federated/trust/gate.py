"""The two gates of the trust layer, which the runtime applies around every step.

**The client gate** (:func:`answer`, :func:`answer_many`): every engine gets a client's
reply through it, never from the algorithm directly (the in-process engine through
:func:`fednovelty.runtime.threads.answer_many`, a Flower node through its ClientApp). It
unpacks the broadcast, runs the algorithm's client half with the client's
:class:`ClientTerms` in its context (the only view of the client's policy a step has: the
floor, and under differential privacy the public constants of the mechanism and fresh
noise), then releases the reply by the declaration of its kind
(:func:`~fednovelty.federated.trust.release.release`: the floor, the client's own limits,
the private form with the client's noise, charged to the client's ledger) and packs it for
the wire.

**The server gate** (:func:`accept`, after the loop's validation and plausibility screen,
:mod:`fednovelty.runtime.loop`): the replies a server step may read, with one client's
weight capped where the algorithm's settings ask for it (``client_weight_cap``,
:func:`~fednovelty.federated.trust.robust.cap_replies`) and the algorithm leaves the cap to
the gate (``gate_caps_weights``).

A client's terms are built once per client from its own configuration
(:func:`client_context`); a message can neither set nor reset them, and the ledger they
hold is the client's, not the algorithm's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    PrivateTerms,
    ReleaseTerms,
)
from fednovelty.federated.core.wire import pack, unpack
from fednovelty.federated.trust.dp import STEP_STREAM, DPPolicy, release_noise
from fednovelty.federated.trust.dp_mechanism import clip_rows
from fednovelty.federated.trust.dp_sgd import DPSGDSettings
from fednovelty.federated.trust.ledger import PrivacyLedger
from fednovelty.federated.trust.noise import NoiseSource
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.release import release
from fednovelty.federated.trust.release_many import release_many
from fednovelty.federated.trust.robust import cap_replies


class ClientPrivateTerms(PrivateTerms):
    """A client's :class:`~fednovelty.federated.core.base.PrivateTerms`, read from its
    ``DPPolicy``; :meth:`noise` draws the stream of the step's own noise for the client's
    next release (fresh OS entropy, or the policy's ``insecure_seed`` in tests)."""

    def __init__(self, terms: ClientTerms, dp: DPPolicy, dp_sgd: DPSGDSettings | None) -> None:
        self._terms, self._dp = terms, dp
        self.noise_multiplier = dp.noise_multiplier
        self.clip_norm = dp.clip_norm
        self.dp_sgd = dp_sgd

    def noise(self) -> NoiseSource:
        return release_noise(
            self._dp, self._terms.client_id, self._terms.ledger.releases, STEP_STREAM
        )


def _policy_setting(name: str) -> property:
    """A read-only property of :class:`ClientTerms`: its policy's setting ``name``."""
    return property(lambda terms: getattr(terms.policy, name), doc=f"The policy's ``{name}``.")


class ClientTerms(ReleaseTerms):
    """A client's :class:`~fednovelty.federated.core.base.ReleaseTerms`: its own
    ``policy``, its ``ledger`` (what it has released under differential privacy; replaced
    by the charged one at every noisy release) and its ``client_id``. Only the trust layer
    and the engines read ``policy`` and ``ledger``; a step reads the terms."""

    def __init__(
        self, client_id: int, policy: PrivacyPolicy, ledger: PrivacyLedger | None = None
    ) -> None:
        if not isinstance(policy, PrivacyPolicy):
            raise TypeError(f"policy must be a PrivacyPolicy, got {type(policy).__name__}.")
        self.client_id = int(client_id)
        self.policy = policy
        self.ledger = PrivacyLedger() if ledger is None else ledger
        self.private = (
            None if policy.dp is None else ClientPrivateTerms(self, policy.dp, policy.dp_sgd)
        )

    floor = _policy_setting("floor")
    min_rows = _policy_setting("min_rows")
    max_clusters = _policy_setting("max_clusters")
    allow_raw_rows = _policy_setting("allow_raw_rows")

    def clip(self, X: Tensor) -> Tensor:
        """Rows clipped to the client's ball under differential privacy (the private
        rounds' sensitivity holds for the rows summed); as they are otherwise."""
        if self.policy.dp is None:
            return X
        return clip_rows(X, X.new_zeros(X.shape[1]), self.policy.dp.clip_norm)


def client_context(
    client_id: int,
    state: dict[str, Tensor] | None = None,
    policy: PrivacyPolicy | None = None,
    wire: bool = False,
    ledger: PrivacyLedger | None = None,
) -> ClientContext:
    """A client's context with its :class:`ClientTerms` (``policy`` default
    ``PrivacyPolicy()``, ``ledger`` default empty): what every engine builds for a client.

    Raises:
        TypeError: ``policy`` is not a ``PrivacyPolicy``.
    """
    terms = ClientTerms(client_id, PrivacyPolicy() if policy is None else policy, ledger)
    return ClientContext(int(client_id), {} if state is None else state, wire, terms)


def terms_of(context: ClientContext) -> ClientTerms:
    """The client's :class:`ClientTerms` in ``context``.

    Raises:
        TypeError: the context was not built by :func:`client_context` (a client with no
            policy has nothing the gate could apply).
    """
    if not isinstance(context.terms, ClientTerms):
        raise TypeError(
            "the client gate needs a context with the client's own terms; build it with "
            "fednovelty.federated.trust.gate.client_context(client_id, policy=...)."
        )
    return context.terms


def answer(
    algorithm: FederatedAlgorithm, data: Any, message: Message, context: ClientContext
) -> Message:
    """What one client sends back: its client half, then the client gate
    (:func:`answer_many` for one client)."""
    return answer_many(algorithm, [(data, context)], message)[0]


def answer_many(
    algorithm: FederatedAlgorithm,
    items: Sequence[tuple[Any, ClientContext]],
    message: Message,
) -> list[Message]:
    """The replies of several clients held in one process to ``message``: the broadcast
    unpacked (tensors sent narrower cast to the config's ``dtype``), the algorithm's
    ``client_steps`` over them, then each reply through its own client's gate, by its own
    terms: :func:`~fednovelty.federated.trust.release.release` by the declaration of the
    message's kind (``algorithm.reply_spec``), then, where ``context.wire``, packed
    (symmetric and triangular matrices as their triangle, float64 as the config's
    ``wire_dtype``). The clients go :data:`GATE_CHUNK` at a time: a chunk's
    ``client_steps`` (each reply depends on its own client's rows and state only), then its
    replies released and packed together by
    :func:`~fednovelty.federated.trust.release_many.release_many`, which gives each reply
    what ``release`` and ``pack`` give it alone, bit for bit."""
    config = getattr(algorithm, "config", None)
    message = unpack(message, getattr(config, "dtype", None))
    every = [terms_of(context) for _, context in items]
    spec = algorithm.reply_spec(message.kind)
    wire_dtype = getattr(config, "wire_dtype", None)
    if len(items) == 1:
        (data, context), terms = items[0], every[0]
        reply = algorithm.client_steps(items, message)[0]
        released = release(reply, spec, terms.policy, config, message, terms, _shape(data))
        return [pack(released, wire_dtype) if context.wire else released]
    out: list[Message] = []
    for start in range(0, len(items), GATE_CHUNK):
        # a chunk's steps, then its gate: the steps' buffers are freed before the next chunk
        part = range(start, min(len(items), start + GATE_CHUNK))
        replies = algorithm.client_steps([items[i] for i in part], message)
        out.extend(
            release_many(
                replies,
                spec,
                [every[i].policy for i in part],
                config,
                message,
                [every[i] for i in part],
                [_shape(items[i][0]) for i in part],
                wire=[items[i][1].wire for i in part],
                wire_dtype=wire_dtype,
            )
        )
        del replies
    return out


#: clients whose steps the in-process gate runs, and whose replies it releases and packs,
#: together (``answer_many``): a chunk's step buffers are reused by the next chunk.
GATE_CHUNK = 1024


def _shape(data: Any) -> tuple[int, ...] | None:
    """The shape of a client's rows (``data`` or its first entry), ``None`` where unknown."""
    rows = data[0] if isinstance(data, tuple | list) else data
    return tuple(getattr(rows, "shape", ())) or None


def accept(algorithm: FederatedAlgorithm, replies: Mapping[int, Message]) -> dict[int, Message]:
    """The server gate's robust weighting of a round's accepted replies: one client's
    weight capped at ``config.client_weight_cap`` median clients where the algorithm leaves
    the cap to the gate (``gate_caps_weights``); skipped replies pass as they are."""
    cap = getattr(getattr(algorithm, "config", None), "client_weight_cap", None)
    if not algorithm.gate_caps_weights or cap is None:
        return dict(replies)
    answered = {c: r for c, r in replies.items() if not r.scalars.get("skipped")}
    capped = cap_replies(answered, cap)
    return {c: capped.get(c, r) for c, r in replies.items()}
