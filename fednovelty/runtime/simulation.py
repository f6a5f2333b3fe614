"""In-process simulation engine: runs any ``FederatedAlgorithm``'s rounds on one machine.

The engine owns everything that is not the algorithm: which clients take part in a round
(``fraction`` sampled without replacement, each then dropping out with probability
``dropout``), the clients' persistent state, the progress bar, callbacks, and the record
of every round (participants, bytes each way, seconds, the algorithm's metrics). Client
rows never leave their tensor; only ``Message`` objects pass between the halves, exactly
as they would between Flower nodes.
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

from fednovelty.exceptions import ClientDataError
from fednovelty.federated.base import ClientContext, FederatedAlgorithm, Scalar


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
    """

    round: int
    kind: str
    sampled: tuple[int, ...]
    replied: tuple[int, ...]
    bytes_down: int
    bytes_up: int
    seconds: float
    metrics: dict[str, Scalar] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "kind": self.kind,
            "n_sampled": len(self.sampled),
            "n_replied": len(self.replied),
            "bytes_down": self.bytes_down,
            "bytes_up": self.bytes_up,
            "seconds": self.seconds,
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
    random_state: int = 0,
    progress: bool = False,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
    description: str | None = None,
) -> SimulationResult:
    """Run ``algorithm`` to completion over in-process clients.

    Args:
        algorithm: a ``FederatedAlgorithm``.
        clients: each client's rows (n_c, n_features), as a list (ids 0..n-1) or a dict by id.
        fraction: share of clients asked each round (at least one).
        dropout: probability that an asked client does not reply.
        min_clients: fewest replies a round may go on with.
        random_state: seed of client sampling and dropout.
        progress: show a tqdm bar over rounds.
        callbacks: called with each ``RoundRecord`` as it completes.

    Returns:
        ``SimulationResult``.

    Raises:
        ValueError: bad arguments, or fewer than ``min_clients`` replies in a round.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
    data = dict(enumerate(clients)) if not isinstance(clients, dict) else dict(clients)
    if not data:
        raise ValueError("clients is empty; give at least one client's rows.")
    check_clients(data)
    rng = np.random.default_rng(random_state)
    contexts = {cid: ClientContext(cid) for cid in data}
    history: list[RoundRecord] = []
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
            if len(history) >= algorithm.max_rounds:
                raise RuntimeError(
                    f"{type(algorithm).__name__} exceeded {algorithm.max_rounds} rounds."
                )
            started = time.perf_counter()
            message = algorithm.configure(state)
            asked, replying = sample_clients(list(data), fraction, dropout, rng)
            if len(replying) < min_clients:
                raise ValueError(
                    f"round {len(history) + 1}: only {len(replying)} of {len(asked)} asked "
                    f"client(s) replied, fewer than min_clients={min_clients}. Lower dropout "
                    "or min_clients, or raise fraction."
                )
            replies = {
                cid: algorithm.client_step(data[cid], message, contexts[cid]) for cid in replying
            }
            state, metrics = algorithm.server_step(state, replies)
            record = RoundRecord(
                round=len(history) + 1,
                kind=message.kind,
                sampled=tuple(asked),
                replied=tuple(replying),
                bytes_down=message.nbytes() * len(asked),
                bytes_up=sum(r.nbytes() for r in replies.values()),
                seconds=time.perf_counter() - started,
                metrics=metrics,
            )
            history.append(record)
            for callback in callbacks:
                callback(record)
            bar.update(1)
            if "mean_log_likelihood" in metrics:
                bar.set_postfix(phase=message.kind, loglik=f"{metrics['mean_log_likelihood']:.4f}")
            else:
                bar.set_postfix(phase=message.kind)
    finally:
        bar.close()
    return SimulationResult(state, history, {cid: ctx.state for cid, ctx in contexts.items()})
