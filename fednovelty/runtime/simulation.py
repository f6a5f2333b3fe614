"""In-process simulation engine: runs any ``FederatedAlgorithm``'s rounds on one machine.

The engine owns everything that is not the algorithm: which clients take part in a round
(``fraction`` sampled without replacement, each then dropping out with probability
``dropout``), the clients' persistent state, the progress bar, callbacks, and the record
of every round (participants, bytes each way, seconds, the algorithm's metrics). Client
rows never leave their tensor; only ``Message`` objects pass between the halves, exactly
as they would between Flower nodes.

Every reply goes through the same :class:`~fednovelty.federated.validation.ReplyValidator`
as on Flower: a reply that is malformed or contradicts what its client declared before is
dropped (recorded in ``RoundRecord.dropped``) and the round goes on with the others. A round
with fewer than ``min_clients`` valid replies is recorded as failed and asked again of a
fresh sample; the run stops with a :class:`~fednovelty.exceptions.FederationError` only
after ``max_failed_rounds`` failed rounds in a row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from fednovelty.exceptions import ClientDataError, FederationError
from fednovelty.federated.base import ClientContext, FederatedAlgorithm, Scalar
from fednovelty.federated.privacy import PrivacyPolicy
from fednovelty.federated.validation import ReplyValidator
from fednovelty.runtime.threads import run_client_step, run_server_step


@dataclass(frozen=True)
class RoundRecord:
    """What happened in one communication round.

    Attributes:
        round: 1-based round number.
        kind: the broadcast message's kind (e.g. ``"em"``).
        sampled: client ids asked; ``replied``: client ids that answered.
        bytes_down: bytes broadcast (message size x clients asked).
        bytes_up: bytes of all replies.
        seconds: wall time of the round.
        metrics: the algorithm's metrics for the round.
        dropped: ``(client id, reason)`` of every reply the validation dropped.
        failed: fewer than ``min_clients`` valid replies: the server step did not run and
            the round is asked again.
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
            "failed": self.failed,
            **self.metrics,
        }


@dataclass
class SimulationResult:
    """Final server state, per-round records and the clients' final states."""

    state: Any
    history: list[RoundRecord]
    client_states: dict[int, dict[str, Tensor]]

    @property
    def bytes_up(self) -> int:
        return sum(r.bytes_up for r in self.history)

    @property
    def bytes_down(self) -> int:
        return sum(r.bytes_down for r in self.history)


def sample_clients(
    client_ids: Sequence[int], fraction: float, dropout: float, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    """Clients asked in a round and those that reply (the others drop out)."""
    n_asked = max(1, math.ceil(fraction * len(client_ids)))
    asked = sorted(rng.choice(np.asarray(client_ids), size=n_asked, replace=False).tolist())
    if fraction >= 1.0:
        asked = sorted(client_ids)
    replied = [c for c in asked if dropout <= 0 or rng.random() >= dropout]
    return asked, replied


def check_clients(clients: dict[int, Tensor]) -> None:
    """Reject client data an algorithm cannot use, naming the client.

    Raises:
        ClientDataError: a client's rows (a tensor, or the first of a tuple such as
            ``(X, y)`` whose other entries have one entry per row) are not a 2-D floating
            tensor, have a different
            number of columns than the others, or contain NaN/inf. Empty clients are fine
            (they contribute nothing).
    """
    widths = {}
    for cid, data in clients.items():
        X = data[0] if isinstance(data, tuple | list) else data
        if isinstance(data, tuple | list) and any(len(part) != len(X) for part in data[1:]):
            raise ClientDataError(
                f"client {cid}: the tensors of its data tuple have different lengths "
                f"{[len(part) for part in data]}; give one entry per row."
            )
        if not isinstance(X, Tensor) or X.ndim != 2 or not X.is_floating_point():
            raise ClientDataError(
                f"client {cid}: rows must be a 2-D floating torch tensor (n_samples, n_features)"
                f", got {type(X).__name__} of shape {tuple(getattr(X, 'shape', ()))}."
            )
        widths[cid] = X.shape[1]
        if X.shape[0] and not bool(torch.isfinite(X).all()):
            raise ClientDataError(f"client {cid}: rows contain NaN or inf; clean them first.")
    if len(set(widths.values())) > 1:
        first = next(iter(widths))
        odd = next(c for c, w in widths.items() if w != widths[first])
        raise ClientDataError(
            f"client {odd} has {widths[odd]} features but client {first} has "
            f"{widths[first]}; every client needs the same columns."
        )


def run_simulation(
    algorithm: FederatedAlgorithm,
    clients: Sequence[Tensor] | dict[int, Tensor],
    *,
    fraction: float = 1.0,
    dropout: float = 0.0,
    min_clients: int = 1,
    max_failed_rounds: int = 5,
    random_state: int = 0,
    progress: bool = False,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
    description: str | None = None,
    privacy: PrivacyPolicy | None = None,
) -> SimulationResult:
    """Run ``algorithm`` to completion over in-process clients.

    Args:
        algorithm: a ``FederatedAlgorithm``.
        clients: each client's rows (n_c, n_features), as a list (ids 0..n-1) or a dict by id.
        fraction: share of clients asked each round (at least one).
        dropout: probability that an asked client does not reply.
        min_clients: fewest valid replies a round may go on with; a round with fewer is
            recorded as failed and asked again of a fresh sample.
        max_failed_rounds: failed rounds in a row after which the federation counts as
            gone (a ``FederationError``).
        random_state: seed of client sampling and dropout.
        progress: show a tqdm bar over rounds.
        callbacks: called with each ``RoundRecord`` as it completes.
        privacy: the privacy policy every client enforces (its ``ClientContext.policy``);
            default ``PrivacyPolicy()`` (at least 5 rows behind every released statistic,
            no raw rows). ``PrivacyPolicy(min_rows=1)`` is the unprotected protocol.

    Returns:
        ``SimulationResult``.

    Raises:
        ValueError: bad arguments. FederationError: ``max_failed_rounds`` failed rounds in
            a row.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
    if int(max_failed_rounds) < 1:
        raise ValueError(f"max_failed_rounds must be >= 1, got {max_failed_rounds}.")
    data = dict(enumerate(clients)) if not isinstance(clients, dict) else dict(clients)
    if not data:
        raise ValueError("clients is empty; give at least one client's rows.")
    check_clients(data)
    asked_per_round = len(data) if fraction >= 1.0 else max(1, math.ceil(fraction * len(data)))
    if min_clients > asked_per_round:
        raise ValueError(
            f"min_clients={min_clients} but only {asked_per_round} of {len(data)} client(s) are "
            "asked each round; lower min_clients or raise fraction."
        )
    rng = np.random.default_rng(random_state)
    policy = PrivacyPolicy() if privacy is None else privacy
    if not isinstance(policy, PrivacyPolicy):
        raise TypeError(f"privacy must be a PrivacyPolicy or None, got {type(privacy).__name__}.")
    contexts = {cid: ClientContext(cid, policy=policy) for cid in data}
    first = next(iter(data.values()))
    validator = ReplyValidator(
        n_features=int((first[0] if isinstance(first, tuple | list) else first).shape[1])
    )
    history: list[RoundRecord] = []
    failed_in_a_row = 0
    state = algorithm.start()
    bar = tqdm(
        total=algorithm.max_rounds,
        disable=not progress,
        desc=description or type(algorithm).__name__,
        unit="round",
        leave=False,
    )
    try:
        while not algorithm.finished(state):
            if sum(not r.failed for r in history) >= algorithm.max_rounds:
                raise RuntimeError(
                    f"{type(algorithm).__name__} exceeded {algorithm.max_rounds} rounds."
                )
            started = time.perf_counter()
            message = algorithm.configure(state)
            asked, replying = sample_clients(list(data), fraction, dropout, rng)
            replies = {
                cid: run_client_step(algorithm, data[cid], message, contexts[cid])
                for cid in replying
            }
            valid, dropped = validator.accept(message, replies)
            failed = len(valid) < min_clients
            metrics: dict[str, Scalar] = {}
            if not failed:
                state, metrics = run_server_step(algorithm, state, valid)
            record = RoundRecord(
                round=len(history) + 1,
                kind=message.kind,
                sampled=tuple(asked),
                replied=tuple(valid),
                bytes_down=message.nbytes() * len(asked),
                bytes_up=sum(r.nbytes() for r in replies.values()),
                seconds=time.perf_counter() - started,
                metrics=metrics,
                dropped=tuple(dropped.items()),
                failed=failed,
            )
            history.append(record)
            for callback in callbacks:
                callback(record)
            failed_in_a_row = failed_in_a_row + 1 if failed else 0
            if failed_in_a_row >= max_failed_rounds:
                raise FederationError(
                    failed_rounds_message(history[-failed_in_a_row:], min_clients)
                )
            bar.update(0 if failed else 1)
            if "mean_log_likelihood" in metrics:
                bar.set_postfix(phase=message.kind, loglik=f"{metrics['mean_log_likelihood']:.4f}")
            else:
                bar.set_postfix(phase=message.kind, failed=failed_in_a_row or None)
    finally:
        bar.close()
    return SimulationResult(state, history, {cid: ctx.state for cid, ctx in contexts.items()})


def failed_rounds_message(records: Sequence[RoundRecord], min_clients: int) -> str:
    """Why a federation counts as gone: the last failed rounds with their drops."""
    last = records[-1]
    reasons = "; ".join(f"client {c}: {why}" for c, why in last.dropped) or "none dropped"
    return (
        f"{len(records)} round(s) in a row had fewer than min_clients={min_clients} valid "
        f"replies (last: round {last.round} ({last.kind}), {len(last.replied)} of "
        f"{len(last.sampled)} asked replied validly; dropped: {reasons}). Lower dropout or "
        "min_clients, or check the clients."
    )
