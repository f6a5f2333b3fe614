"""Messages and the two-halves contract every federated algorithm follows.

An algorithm is a *client step* (local rows + broadcast message + the client's own state
-> reply message + new client state) and a *server step* (replies -> new server state).
Both halves are pure functions of their inputs; the engine (``fednovelty.runtime``) decides
who runs them, where and when: an in-process loop, or Flower nodes. Only ``Message``
objects cross between the halves: tensors and plain scalars, never raw rows (the one
exception, ``init_params="subset"``, is flagged wherever it is used and answered only by
clients whose privacy policy allows it).

Settings travel once: an algorithm holds its settings as one frozen dataclass
(``algorithm.config``, :mod:`fednovelty.federated.core.config`) that both halves read, and a
message carries only what changes from round to round (parameters, statistics, seeds).

This is the algorithm core: it imports nothing from the trust layer
(:mod:`fednovelty.federated.trust`). A client step never sees its client's privacy policy,
budget or noise: it computes with the :class:`ReleaseTerms` its context carries (the floor
its values are backed by, and under differential privacy the :class:`PrivateTerms` of its
own noise), and the runtime passes its reply through the trust layer's client gate
(:func:`fednovelty.federated.trust.gate.answer`). A client that releases nothing in a round
replies :func:`skipped_reply` (``scalars["skipped"]`` and a ``reason``, no tensors), which
the server halves treat as absent.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.core.declarations import (
    ReplySpec,
    UndeclaredReplyError,
    register_declarations,
)

Scalar = bool | int | float | str


@dataclass(frozen=True)
class Message:
    """What crosses the wire in one direction of one round.

    Attributes:
        kind: what the message asks for or answers (e.g. ``"em"``, ``"assign"``).
        tensors: named tensors.
        scalars: named plain scalars (bool, int, float, str).
        expect: on the server only, what a valid reply to this broadcast may hold, for the
            server's reply validation (:mod:`fednovelty.federated.trust.validation`):
            ``covariance_type`` of returned statistics or mixtures, ``n_clusters`` (most
            centroids), ``max_components`` (largest local mixture), ``n_features`` (width
            of the rows the round works on, when not the federation's). Never sent, not
            counted in :meth:`nbytes`; empty on a decoded message.
        backing: on the client only, the effective rows behind the entries of each
            released tensor (a tensor of the shape of the tensor's grouped leading
            dimension, or a scalar for a whole-client value), which the client gate reads
            (:func:`fednovelty.federated.trust.release.release`) and removes. Never sent.
    """

    kind: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    scalars: dict[str, Scalar] = field(default_factory=dict)
    expect: dict[str, Scalar] = field(default_factory=dict, compare=False)
    backing: dict[str, Tensor] = field(default_factory=dict, compare=False)

    def nbytes(self) -> int:
        """Payload size: tensor bytes plus 8 bytes per scalar (strings: their UTF-8 length)."""
        size = sum(t.numel() * t.element_size() for t in self.tensors.values())
        for value in self.scalars.values():
            size += len(value.encode()) if isinstance(value, str) else 8
        return size


class PrivateTerms:
    """What a client step may know of its client's differential privacy: the mechanism's
    public constants and a source of fresh noise for what the step draws itself (a DP-SGD
    loop, a private local fit, a noisy choice). The trust layer builds them from the
    client's own policy (:class:`fednovelty.federated.trust.gate.ClientTerms`); the step
    never sees the budget, the ledger or the calibration.

    Attributes:
        noise_multiplier: the client's Gaussian noise multiplier ``z`` (std / sensitivity).
        clip_norm: the L2 ball every row a round works on is clipped to.
        dp_sgd: the client's DP-SGD settings for learners that leave it, or ``None`` (a
            private round then releases no learner weights).
    """

    noise_multiplier: float = 0.0
    clip_norm: float = 1.0
    dp_sgd: Any = None

    def noise(self) -> Any:
        """A fresh noise source for the noise the step draws itself in this release."""
        raise NotImplementedError


class ReleaseTerms:
    """What a client step may know of its client's release rules.

    The trust layer sets each client's terms from the client's own policy
    (:func:`fednovelty.federated.trust.gate.client_context`); this base is the unprotected
    protocol (no floor, no noise, no clipping), what a step called on its own sees.

    Attributes:
        floor: rows that must back a released value (1: no floor; 1 under differential
            privacy, where the noise protects the rows).
        min_rows: the client's floor setting, kept under differential privacy (what a
            step winsorises per-row values and merges small clusters by).
        max_clusters: the most local clusters a round may ask the client for.
        allow_raw_rows: whether the client answers rounds that send raw rows.
        private: the client's :class:`PrivateTerms` under differential privacy, else
            ``None``.
    """

    floor: int = 1
    min_rows: int = 1
    max_clusters: int = 2**31 - 1
    allow_raw_rows: bool = True
    private: PrivateTerms | None = None

    @property
    def has_floor(self) -> bool:
        """Whether the floor applies (:attr:`floor` > 1)."""
        return self.floor > 1

    def releases(self, n_rows: int) -> bool:
        """Whether a client of ``n_rows`` rows releases anything (``n_rows >= floor``)."""
        return n_rows >= self.floor and n_rows > 0

    @property
    def below_floor(self) -> str:
        """The reason a client with too few rows gives for skipping a round."""
        return f"fewer rows than the client's privacy floor (min_rows={self.min_rows})"

    def cluster_bound(self, asked: int, n_rows: int) -> int:
        """Local k-means clusters a client of ``n_rows`` rows forms when asked for
        ``asked``: ``min(asked, max_clusters, n_rows // min_rows)`` (0: too few rows)."""
        return max(0, min(int(asked), self.max_clusters, n_rows // self.min_rows))

    def clip(self, X: Tensor) -> Tensor:
        """The rows a private round works on (clipped to the client's ball under
        differential privacy; here, as they are)."""
        return X


@dataclass
class ClientContext:
    """What a client step knows about itself.

    Attributes:
        client_id: the client's stable integer id (row group in simulation, partition id on
            Flower); seeds the client's randomness.
        state: tensors the client keeps between rounds (e.g. personal mixture weights).
        wire: the client's replies cross a wire (set by the engines): the client gate packs
            them (:mod:`fednovelty.federated.core.wire`); ``False``: plain replies, for a
            client step called in process.
        terms: the client's :class:`ReleaseTerms`, set by the trust layer from the
            client's own configuration, never from a message
            (:func:`fednovelty.federated.trust.gate.client_context`).
    """

    client_id: int
    state: dict[str, Tensor] = field(default_factory=dict)
    wire: bool = False
    terms: ReleaseTerms = field(default_factory=ReleaseTerms)


def skipped_reply(kind: str, reason: str) -> Message:
    """A reply that releases nothing: ``scalars`` ``{"skipped": True, "reason": reason}``
    and no tensors (not even the row count)."""
    return Message(kind, scalars={"skipped": True, "reason": reason})


def derived_seed(random_state: int, salt: int) -> int:
    """An integer seed for one use (a round, a server draw) derived from ``random_state``
    and ``salt``: independent streams for different salts."""
    return int(np.random.SeedSequence([int(random_state), int(salt)]).generate_state(1)[0])


def client_generator(seed: int, client_id: int) -> torch.Generator:
    """A CPU generator for one client in one round, independent across clients."""
    entropy = np.random.SeedSequence([int(seed), int(client_id)]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(entropy))


def round_seed(config: Any, state: Any) -> int:
    """The seed of the round after ``state.rounds`` counted rounds (``config.random_state``)."""
    return derived_seed(config.random_state, state.rounds)


def server_generator(config: Any, state: Any) -> torch.Generator:
    """The server's generator in the round after ``state.rounds`` counted rounds."""
    return torch.Generator().manual_seed(round_seed(config, state) ^ 0x5EED)


class FederatedAlgorithm(ABC):
    """Base class: an algorithm is its settings (``config``) plus two pure halves.

    The engine loop is::

        state = algo.start()
        while not algo.finished(state):
            message = algo.configure(state)
            replies = {cid: algo.client_step(X_c, message, ctx_c) for sampled clients}
            state, metrics = algo.server_step(state, replies)

    Every field of ``config`` reads as an attribute of the algorithm
    (``algo.covariance_type``); settings are frozen: build a new algorithm to change one.
    """

    #: upper bound on the number of rounds (for progress bars and safety).
    max_rounds: int = 1
    #: whether a client's data is a labelled tuple ``(X, y)`` / ``(X, y, Z)`` rather than
    #: rows ``X`` alone (engines check client data by it; they know no algorithm by name).
    labelled: bool = False
    #: the settings dataclass of the algorithm (``None`` for algorithms without one).
    config_class: ClassVar[type | None] = None
    #: the algorithm's settings, an instance of ``config_class``.
    config: Any = None
    #: whether the server gate caps one client's weight (``config.client_weight_cap``,
    #: :func:`fednovelty.federated.trust.robust.cap_replies`) before the server step; an
    #: algorithm that weighs its clients itself leaves it ``False``.
    gate_caps_weights: ClassVar[bool] = False
    #: message kind -> what its replies hold (:class:`~fednovelty.federated.core.declarations.
    #: ReplySpec`), one per kind the client half answers; a chained algorithm reads its
    #: steps' instead.
    replies: ClassVar[Mapping[str, ReplySpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Record the reply kinds the class declares (``replies``), which the server gate
        reads by kind (:func:`~fednovelty.federated.core.declarations.register_declarations`).
        Engines find an algorithm by name in :mod:`fednovelty.federated.registry`."""
        super().__init_subclass__(**kwargs)
        register_declarations(cls)

    def reply_spec(self, kind: str) -> ReplySpec:
        """The declaration of replies of ``kind``, read by the client gate and the server
        gate (:mod:`fednovelty.federated.trust.validation`) and by the thread choice.

        Raises:
            UndeclaredReplyError: the algorithm declares no reply of ``kind``.
        """
        declared = type(self).replies  # the class's declaration, whatever an instance holds
        if kind not in declared:
            raise UndeclaredReplyError(
                f"{type(self).__name__} declares no replies of kind {kind!r} (it declares "
                f"{sorted(declared)}); messages of that kind are not answered or accepted."
            )
        return declared[kind]

    @classmethod
    def from_config(cls, config: Any) -> FederatedAlgorithm:
        """The algorithm with settings ``config`` (an instance of ``config_class``)."""
        if cls.config_class is None or not isinstance(config, cls.config_class):
            expected = getattr(cls.config_class, "__name__", None)
            raise TypeError(
                f"{cls.__name__} takes a {expected} config, got {type(config).__name__}."
            )
        algorithm = cls.__new__(cls)
        algorithm._setup(config)
        return algorithm

    def _setup(self, config: Any) -> None:
        """Hold ``config`` and derive what the algorithm needs from it (subclasses extend)."""
        object.__setattr__(self, "config", config)

    def _setting_names(self) -> frozenset[str]:
        config = self.__dict__.get("config")
        if config is None or not dataclasses.is_dataclass(config):
            return frozenset()
        return frozenset(f.name for f in dataclasses.fields(config))

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_") and name in self._setting_names():
            return getattr(self.__dict__["config"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._setting_names():
            raise AttributeError(
                f"{type(self).__name__}.{name} is a setting and settings are frozen; build a "
                f"new {type(self).__name__} (or dataclasses.replace its config) instead."
            )
        object.__setattr__(self, name, value)

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

    def batches(self, kind: str) -> bool:
        """Whether :meth:`client_steps` runs several clients' rounds of ``kind`` as one
        batched computation (an engine holding many clients then hands them over
        together)."""
        return False

    def client_steps(
        self, items: Sequence[tuple[Any, ClientContext]], message: Message
    ) -> list[Message]:
        """The client half of several clients answering the same ``message``: one
        ``client_step`` each, in order. An algorithm whose clients run the same computation
        (learner SGD, an E-step) may run them as one batched computation instead; each
        client's reply depends only on its own rows and state, as one at a time."""
        return [self.client_step(data, message, context) for data, context in items]

    @abstractmethod
    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[Any, dict[str, Scalar]]:
        """Aggregate the replies (keyed by client id) into a new state; also returns the
        round's metrics (e.g. mean log-likelihood)."""

    @abstractmethod
    def finished(self, state: Any) -> bool:
        """Whether training is over."""

    def all_skipped(self, state: Any) -> bool:
        """Called by the round loop when every valid reply of the last round was skipped
        (each client below its floor for what the round asked): whether the server changed
        ``state`` so that the round is worth asking again in a smaller form (the loop then
        does not count it as failed). The default changes nothing."""
        return False
