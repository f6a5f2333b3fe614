"""The round loop every engine runs: an engine differs only in its :class:`Transport`.

:func:`run_rounds` owns what every engine shares: ``algorithm.start``, then per round
``configure`` -> the message packed (:func:`~fednovelty.federated.core.wire.pack`: symmetric and
triangular matrices as their triangle, float64 as the config's ``wire_dtype``) -> the
transport carries it to the clients it asks and brings back their (packed) replies -> every
reply is unpacked and goes through the server gate: the run's
:class:`~fednovelty.federated.trust.validation.ReplyValidator`, the plausibility screen and the
robust weighting (:func:`~fednovelty.federated.trust.gate.accept`) -> ``server_step`` over the
valid replies (in increasing client id, under :func:`~fednovelty.runtime.threads.run_server_step`)
-> a :class:`RoundRecord` -> callbacks -> ``finished``. A round with fewer than
``min_clients`` valid replies that carry statistics is recorded as failed (no server step)
and asked again: a ``skipped`` reply (a client below its privacy floor, or refusing the
round) passes validation but does not count, so no server step sees a round of skipped
replies only. ``max_failed_rounds`` failed rounds in a row stop the run with a
:class:`~fednovelty.exceptions.FederationError`.

**A client caught lying loses its earlier contributions.** A client whose reply the server
gate drops (invalid, or implausible against the others: not a ``skipped`` reply) is
excluded from the rest of the run (:meth:`Transport.exclude`; any later reply of it is
dropped unread). Where it contributed to an earlier successful round of the run, its
statistics are already in the model: the run starts again from ``algorithm.start()``
without it (:meth:`Transport.restart` puts the clients' kept state and the sampling stream
back to where the run began), so the final model is that of a run without the client. The
round that caught it is recorded with ``restarted`` (the reason); at most ``max_restarts``
restarts, each excluding at least one more client.

A :class:`Transport` decides which clients are asked each round and how the message reaches
them: the in-process engine runs client steps on rows it holds
(:mod:`fednovelty.runtime.simulation`), the Flower engine pushes encoded messages to nodes
and pulls their replies (:mod:`fednovelty.runtime.flower.server`). The loop knows no
algorithm and no engine; it uses only the algorithm's ``start``, ``configure``,
``server_step``, ``finished`` and ``max_rounds``.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednovelty.exceptions import FederationError
from fednovelty.federated.core.base import FederatedAlgorithm, Message, Scalar
from fednovelty.federated.core.packed_runs import PackedRun
from fednovelty.federated.core.wire import pack, travelled_narrower, unpack
from fednovelty.federated.core.wire_many import unpack_runs
from fednovelty.federated.trust.gate import accept
from fednovelty.federated.trust.plausible import gross_screen
from fednovelty.federated.trust.reply_form import is_skipped
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime.progress import progress_bar
from fednovelty.runtime.threads import run_server_step

#: a round's valid replies -> the replies the server step gets and metrics of the round
#: (``run_rounds``' ``combine``).
Combine = Callable[
    [Message, Mapping[int, Message]], tuple[Mapping[int, Message], dict[str, Scalar]]
]
#: a dropped reply: ``(client id, reason)``; the client id is ``None`` where the engine
#: could not tell which client sent it (a Flower node that never named one).
Drop = tuple[int | None, str]


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one communication round.

    Attributes:
        round: 1-based round number.
        kind: the broadcast message's kind (e.g. ``"em"``).
        sampled: client ids asked; ``replied``: client ids that answered.
        bytes_down: bytes broadcast (packed message size x clients asked).
        bytes_up: bytes of all replies as they crossed the wire (packed).
        seconds: wall time of the round.
        metrics: the algorithm's metrics for the round.
        dropped: ``(client id, reason)`` of every reply the validation dropped.
        skipped: ``(client id, reason)`` of every valid reply that carried nothing
            (``skipped``: below the client's privacy floor, or refused).
        failed: fewer than ``min_clients`` valid replies that are not ``skipped``: the
            server step did not run and the round is asked again.
        restarted: why the run started again after this round (clients caught lying
            after contributing to earlier rounds); empty when it did not.
    """

    round: int
    kind: str
    sampled: tuple[int, ...]
    replied: tuple[int, ...]
    bytes_down: int
    bytes_up: int
    seconds: float
    metrics: dict[str, Scalar] = field(default_factory=dict)
    dropped: tuple[tuple[int, str], ...] = ()
    failed: bool = False
    skipped: tuple[tuple[int, str], ...] = ()
    restarted: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "kind": self.kind,
            "n_sampled": len(self.sampled),
            "n_replied": len(self.replied),
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "seconds": self.seconds,
            "n_dropped": len(self.dropped),
            "n_skipped": len(self.skipped),
            "failed": self.failed,
            "restarted": bool(self.restarted),
            **self.metrics,
        }


@dataclass
class Delivery:
    """One round's message as a transport carried it, before any reply is validated.

    Attributes:
        replies: client id -> reply as received (any order; the loop validates them).
        asked: client ids asked this round, increasing.
        n_asked: recipients of the broadcast (``bytes_down`` is the message's size times
            this); more than ``len(asked)`` where a recipient has no client id yet.
        bytes_up: payload bytes (``Message.nbytes``) of every reply received, as it
            crossed the wire (packed, :mod:`fednovelty.federated.core.wire`).
        widths: client id -> row width its reply declares; ``None``: every client has the
            federation's width.
        metrics: the engine's own figures for the round, added to the record's metrics.
    """

    replies: dict[int, Message]
    asked: tuple[int, ...]
    n_asked: int
    bytes_up: int
    widths: dict[int, int] | None = None
    metrics: dict[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True)
class Settled:
    """What a transport reports once a round's replies are validated.

    Attributes:
        sampled: client ids asked, increasing (the record's ``sampled``).
        dropped: every reply not used, in the engine's order; entries without a client id
            are left out of the record.
    """

    sampled: tuple[int, ...]
    dropped: tuple[Drop, ...]


class Transport(ABC):
    """How one engine asks clients: :meth:`exchange` sends a round's message to the clients
    it picks and returns their replies; :meth:`settle` hears which replies were valid."""

    @abstractmethod
    def exchange(self, number: int, message: Message) -> Delivery:
        """Send round ``number``'s ``message`` to this round's clients; their replies."""

    def settle(
        self,
        number: int,
        delivery: Delivery,
        valid: Mapping[int, Message],
        invalid: Mapping[int, str],
    ) -> Settled:
        """Take note of the validation of round ``number`` (``valid`` replies by client id,
        ``invalid``: client id -> reason) and report the round's clients and drops.

        The default reports ``delivery.asked`` and the validation's drops.
        """
        return Settled(tuple(delivery.asked), tuple(invalid.items()))

    def exclude(self, client_ids: Iterable[int]) -> None:  # noqa: B027 - optional hook
        """Stop asking ``client_ids`` (caught lying) for the rest of the run. The default
        asks them still; the loop drops their replies unread."""

    def restart(self) -> None:  # noqa: B027 - optional hook
        """The run starts again from ``algorithm.start()``: put what the clients keep
        between rounds, and the client sampling, back to where the run began. The default
        does nothing (clients that keep no state, no sampling stream)."""


def sample_clients(
    client_ids: Sequence[int], fraction: float, dropout: float, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """Clients asked in a round and those that reply (the others drop out).

    Draws ``ceil(fraction * n)`` (at least one) ids without replacement from ``rng``, then
    one uniform number per asked client when ``dropout > 0``; with ``fraction >= 1`` every
    id is asked (the draw is still made, so the stream does not depend on ``fraction``).

    Returns:
        ``(asked, replied)``, both increasing.
    """
    n_asked = max(1, math.ceil(fraction * len(client_ids)))
    asked = sorted(rng.choice(np.asarray(client_ids), size=n_asked, replace=False).tolist())
    if fraction >= 1.0:
        asked = sorted(client_ids)
    replied = [c for c in asked if dropout <= 0 or rng.random() >= dropout]
    return asked, replied


def run_rounds(
    algorithm: FederatedAlgorithm,
    transport: Transport,
    *,
    validator: ReplyValidator | None = None,
    min_clients: int = 1,
    max_failed_rounds: int = 5,
    max_restarts: int = 5,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
    progress: bool | None = None,
    description: str | None = None,
    combine: Combine | None = None,
) -> tuple[Any, list[RoundRecord]]:
    """Run ``algorithm`` to completion, its messages carried by ``transport``.

    Args:
        algorithm: a ``FederatedAlgorithm``.
        transport: the engine's :class:`Transport`.
        validator: the run's reply validation; default ``ReplyValidator()``, which learns
            the federation's row width from the first broadcast that has means or centres,
            else from the widths the first replies declare (``Delivery.widths``). A
            validator without ``specs`` reads ``algorithm.reply_spec``: a reply of a kind
            the algorithm declares nothing for is dropped.
        min_clients: fewest valid replies that are not ``skipped`` a round may go on with;
            a round with fewer is recorded as failed and asked again.
        max_failed_rounds: failed rounds in a row after which the federation counts as
            gone.
        max_restarts: most restarts of the run without clients caught lying after they
            contributed (module docstring).
        callbacks: called with each :class:`RoundRecord` as it completes, in order.
        progress: show a tqdm bar over rounds (None: only when stderr is a terminal,
            :func:`~fednovelty.runtime.progress.show_progress`); ``description`` labels it
            (default: the algorithm's class name).
        combine: where given, a round's valid replies pass through it before the server
            step, which runs on the replies it returns (e.g. one secure sum of them,
            :mod:`fednovelty.runtime.secure_rounds`); the metrics it returns join the
            round's. ``None``: the server step runs on the valid replies.

    Returns:
        ``(final server state, one RoundRecord per round)``.

    Raises:
        ValueError: ``max_failed_rounds`` < 1. FederationError: ``max_failed_rounds``
            failed rounds in a row, or more than ``max_restarts`` restarts.
            RuntimeError: more than ``algorithm.max_rounds`` successful rounds of one
            attempt without finishing.
    """
    if int(max_failed_rounds) < 1:
        raise ValueError(f"max_failed_rounds must be >= 1, got {max_failed_rounds}.")
    validator = ReplyValidator() if validator is None else validator
    if validator.specs is None:  # the server gate reads the algorithm's declarations
        validator.specs = algorithm.reply_spec
    config = getattr(algorithm, "config", None)
    if getattr(config, "dp_mode", None) is not None:
        validator.private = True  # noisy replies: form and finiteness, then the noisy sum
    wire_dtype, dtype = getattr(config, "wire_dtype", None), getattr(config, "dtype", None)
    history: list[RoundRecord] = []
    failed_in_a_row = restarts = first = 0  # first: index of the attempt's first record
    excluded: set[int] = set()
    contributed: set[int] = set()  # clients in a successful round of this attempt
    state = algorithm.start()
    bar = progress_bar(
        total=algorithm.max_rounds,
        desc=description or type(algorithm).__name__,
        unit="round",
        enabled=progress,
        leave=False,
    )
    try:
        while not algorithm.finished(state):
            if sum(not r.failed for r in history[first:]) >= algorithm.max_rounds:
                name, most = type(algorithm).__name__, algorithm.max_rounds
                raise RuntimeError(f"{name} exceeded {most} rounds.")
            started = time.perf_counter()
            number = len(history) + 1
            message = algorithm.configure(state)
            sent = pack(message, wire_dtype)
            delivery = transport.exchange(number, sent)
            valid, invalid = _validate(validator, message, delivery, excluded, dtype)
            settled = transport.settle(number, delivery, valid, invalid)
            caught = sorted(set(invalid) - excluded)
            restart = restart_reason(caught, contributed, invalid)
            if caught:
                excluded.update(caught)
                transport.exclude(caught)
            failed = not restart and n_contributing(valid) < min_clients
            metrics: dict[str, Scalar] = {}
            replanned = failed and asked_too_much(algorithm, state, valid, settled)
            if replanned:
                metrics["replanned"] = 1
            if not failed and not restart:
                if combine is None:
                    state, metrics = run_server_step(algorithm, state, accept(algorithm, valid))
                else:
                    combined, combine_metrics = combine(message, valid)
                    state, metrics = run_server_step(algorithm, state, accept(algorithm, combined))
                    metrics = {**metrics, **combine_metrics}
                contributed.update(c for c, r in valid.items() if not is_skipped(r))
            record = RoundRecord(
                round=number,
                kind=message.kind,
                sampled=tuple(settled.sampled),
                replied=tuple(valid),
                bytes_down=sent.nbytes() * delivery.n_asked,
                bytes_up=delivery.bytes_up,
                seconds=time.perf_counter() - started,
                metrics={**metrics, **delivery.metrics},
                dropped=tuple((c, why) for c, why in settled.dropped if c is not None),
                failed=failed,
                skipped=tuple(
                    (c, str(r.scalars.get("reason", ""))) for c, r in valid.items() if is_skipped(r)
                ),
                restarted=restart,
            )
            history.append(record)
            for callback in callbacks:
                callback(record)
            if restart:
                restarts += 1
                if restarts > max_restarts:
                    raise FederationError(
                        f"{restart} That is restart {restarts}; max_restarts={max_restarts}. "
                        "Check the clients, or raise max_restarts."
                    )
                transport.restart()
                state, first, failed_in_a_row = algorithm.start(), len(history), 0
                contributed.clear()
                bar.reset()
                continue
            failed_in_a_row = failed_in_a_row + 1 if failed and not replanned else 0
            if failed_in_a_row >= max_failed_rounds:
                raise FederationError(
                    failed_rounds_message(history[-failed_in_a_row:], min_clients)
                )
            _show(bar, record, failed_in_a_row)
    finally:
        bar.close()
    return state, history


def asked_too_much(
    algorithm: FederatedAlgorithm,
    state: Any,
    valid: Mapping[int, Message],
    settled: Settled,
) -> bool:
    """Whether every client asked in a failed round answered validly (``settled``: none
    dropped or missing), every reply was skipped, and the algorithm changed ``state`` so
    that the round is worth asking again in a form the clients may back
    (:meth:`~fednovelty.federated.core.base.FederatedAlgorithm.all_skipped`). A round that
    failed because clients dropped out is asked again unchanged."""
    answered = set(valid) == set(settled.sampled) and not settled.dropped
    if not answered or not valid or not all(is_skipped(r) for r in valid.values()):
        return False
    return algorithm.all_skipped(state)


def n_contributing(valid: Mapping[int, Message]) -> int:
    """How many of a round's valid replies carry statistics (are not ``skipped``)."""
    return sum(not is_skipped(reply) for reply in valid.values())


def restart_reason(caught: Sequence[int], contributed: set[int], invalid: Mapping[int, str]) -> str:
    """Why the run must start again: the clients of ``caught`` (dropped this round) that
    are in ``contributed`` (used by an earlier successful round of this attempt), with the
    reasons ``invalid`` gives; ``""`` when there are none."""
    liars = [c for c in caught if c in contributed]
    if not liars:
        return ""
    reasons = "; ".join(f"client {c}: {invalid[c]}" for c in liars)
    return (
        f"client(s) {liars} sent a reply the server dropped ({reasons}) after contributing to "
        "earlier rounds; the run starts again without them."
    )


def _validate(
    validator: ReplyValidator,
    message: Message,
    delivery: Delivery,
    excluded: set[int] | frozenset[int] = frozenset(),
    dtype: Any = None,
) -> tuple[dict[int, Message], dict[int, str]]:
    """Unpack the delivered replies (:func:`~fednovelty.federated.core.wire.unpack`), then
    ``validator.accept`` them against the round's own ``message`` (not its packed form),
    then :func:`~fednovelty.federated.trust.plausible.gross_screen` of the valid ones against each
    other (a client whose declared moments or local model no honest federation produces is
    dropped with the invalid replies); ``({}, {})`` when none arrived (the validator may not
    know the federation's width yet, and there is nothing to check). Replies of
    ``excluded`` clients are dropped unread; one whose wire description is malformed is
    dropped with the reason. Noisy replies (``validator.private``, a kind with a private
    form) skip the screen: the noise of a small client is no lie.

    The checks read the replies' tensors in the dtype they travelled in (float32 under
    ``wire_dtype="float32"``: the checks' round-off slack is float32's); the valid replies
    are returned with those tensors cast to ``dtype``, the server's working dtype.
    """
    shut_out = {c: EXCLUDED for c in delivery.replies if c in excluded}
    received = {c: r for c, r in delivery.replies.items() if c not in excluded}
    if not received:
        return {}, shut_out
    replies, malformed, runs = unpack_replies(received)
    valid, invalid = (
        validator.accept(message, replies, delivery.widths, runs) if replies else ({}, {})
    )
    invalid = {**shut_out, **malformed, **invalid}
    if not (validator.private and validator.spec(message.kind).private is not None):
        implausible = gross_screen(message, valid)  # noisy replies: no cross-client screen
        valid = {c: reply for c, reply in valid.items() if c not in implausible}
        invalid = {**invalid, **implausible}
    # each valid reply as the server step reads it: unpacked again only where tensors
    # travelled narrower than the working dtype
    return {
        c: unpack(received[c], dtype) if travelled_narrower(received[c]) else reply
        for c, reply in valid.items()
    }, invalid


def unpack_replies(
    replies: Mapping[int, Message],
) -> tuple[dict[int, Message], dict[int, str], list[PackedRun]]:
    """``(unpacked replies, client id -> reason, runs)``: each reply unpacked with its
    tensors in the dtype they travelled in; one whose wire description is malformed is
    dropped with the reason (:class:`~fednovelty.federated.core.wire.WireFormatError`).
    Replies of one form are unpacked together (:func:`~fednovelty.federated.core.wire_many.
    unpack_runs`: each as ``unpack`` gives it, bit for bit); ``runs`` are those runs with
    the triangles they travelled in, which the server gate checks."""
    unpacked, refused, runs = unpack_runs(replies)  # replies of one form unpacked together
    reasons = {c: f"malformed wire format: {error}" for c, error in refused.items()}
    return unpacked, reasons, runs


#: why a reply of a client excluded earlier in the run is dropped.
EXCLUDED = "the client was excluded from this run after an earlier reply was dropped"


def _show(bar: Any, record: RoundRecord, failed_in_a_row: int) -> None:
    """Advance the progress bar by a successful round; show the phase, the log-likelihood
    where the round has one and the failed rounds in a row where there are any."""
    bar.update(0 if record.failed else 1)
    postfix = {"phase": record.kind}
    if "mean_log_likelihood" in record.metrics:
        postfix["loglik"] = f"{record.metrics['mean_log_likelihood']:.4f}"
    if failed_in_a_row:
        postfix["failed"] = failed_in_a_row
    bar.set_postfix(postfix)


def failed_rounds_message(records: Sequence[RoundRecord], min_clients: int) -> str:
    """Why a federation counts as gone: the last failed rounds with their drops."""
    last = records[-1]
    reasons = "; ".join(f"client {c}: {why}" for c, why in last.dropped) or "none dropped"
    if last.skipped:
        reasons += "; skipped: " + "; ".join(f"client {c}: {why}" for c, why in last.skipped)
    return (
        f"{len(records)} round(s) in a row had fewer than min_clients={min_clients} valid "
        f"replies (skipped ones not counted; last: round {last.round} ({last.kind}), "
        f"{len(last.replied)} of {len(last.sampled)} asked replied validly; dropped: "
        f"{reasons}). Lower dropout or min_clients, or check the clients."
    )
