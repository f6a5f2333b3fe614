"""Messages and the two-halves contract every federated algorithm follows.

An algorithm is a *client step* (local rows + broadcast message + the client's own state
-> reply message + new client state) and a *server step* (replies -> new server state).
Both halves are pure functions of their inputs; the engine (``fednovelty.runtime``) decides
who runs them, where and when: an in-process loop, or Flower nodes. Only ``Message``
objects cross between the halves: tensors and plain scalars, never raw rows (the one
exception, ``init_params="subset"``, is flagged wherever it is used and answered only by
clients whose :class:`~fednovelty.federated.privacy.PrivacyPolicy` allows it).

Every client step enforces its client's own privacy policy (``ClientContext.policy``)
whatever the message asks; a client that releases nothing in a round replies
:func:`skipped_reply` (``scalars["skipped"]`` and a ``reason``, no tensors), which the
server halves treat as absent.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.privacy import PrivacyPolicy

Scalar = bool | int | float | str


@dataclass(frozen=True)
class Message:
    """What crosses the wire in one direction of one round.

    Attributes:
        kind: what the message asks for or answers (e.g. ``"em"``, ``"assign"``).
        tensors: named tensors.
        scalars: named plain scalars (bool, int, float, str).
    """

    kind: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Payload size: tensor bytes plus 8 bytes per scalar (strings: their UTF-8 length)."""
        size = sum(t.numel() * t.element_size() for t in self.tensors.values())
        for value in self.scalars.values():
            size += len(value.encode()) if isinstance(value, str) else 8
        return size


@dataclass
class ClientContext:
    """What a client step knows about itself.

    Attributes:
        client_id: the client's stable integer id (row group in simulation, partition id on
            Flower); seeds the client's randomness.
        state: tensors the client keeps between rounds (e.g. personal mixture weights).
        policy: the client's own privacy policy (set by the engine from the client's
            configuration, never from a message); every client step enforces it.
    """

    client_id: int
    state: dict[str, Tensor] = field(default_factory=dict)
    policy: PrivacyPolicy = field(default_factory=PrivacyPolicy)


def skipped_reply(kind: str, reason: str) -> Message:
    """A reply that releases nothing: ``scalars`` ``{"skipped": True, "reason": reason}``
    and no tensors (not even the row count)."""
    return Message(kind, scalars={"skipped": True, "reason": reason})


def client_generator(seed: int, client_id: int) -> torch.Generator:
    """A CPU generator for one client in one round, independent across clients."""
    entropy = np.random.SeedSequence([int(seed), int(client_id)]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(entropy))


class FederatedAlgorithm(ABC):
    """Base class: an algorithm is its configuration plus two pure halves.

    The engine loop is::

        state = algo.start()
        while not algo.finished(state):
            message = algo.configure(state)
            replies = {cid: algo.client_step(X_c, message, ctx_c) for sampled clients}
            state, metrics = algo.server_step(state, replies)
    """

    #: upper bound on the number of rounds (for progress bars and safety).
    max_rounds: int = 1
    #: whether a client's data is a labelled tuple ``(X, y)`` / ``(X, y, Z)`` rather than
    #: rows ``X`` alone (engines check client data by it; they know no algorithm by name).
    labelled: bool = False

    @abstractmethod
    def start(self) -> Any:
        """The server's initial state."""

    @abstractmethod
    def configure(self, state: Any) -> Message:
        """The message broadcast to the clients sampled for the next round."""

    @abstractmethod
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        """Run the client half on local rows ``X`` (n_samples, n_features); may update
        ``context.state``. Returns the reply."""

    @abstractmethod
    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[Any, dict[str, Scalar]]:
        """Aggregate the replies (keyed by client id) into a new state; also returns the
        round's metrics (e.g. mean log-likelihood)."""

    @abstractmethod
    def finished(self, state: Any) -> bool:
        """Whether training is over."""


def check_prior_arguments(
    prior_strength: float | None, prior_scale: float
) -> tuple[float | None, float]:
    """``(prior_strength, prior_scale)`` as floats, or a ``ValueError`` naming the bad one:
    the strength is ``None`` (no prior) or > 0 pseudo-rows, the scale > 0."""
    if prior_strength is not None and not float(prior_strength) > 0:
        raise ValueError(f"prior_strength must be > 0 or None, got {prior_strength}.")
    if not float(prior_scale) > 0:
        raise ValueError(f"prior_scale must be > 0, got {prior_scale}.")
    return (None if prior_strength is None else float(prior_strength)), float(prior_scale)
