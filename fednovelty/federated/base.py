"""Messages and the two-halves contract every federated algorithm follows.

An algorithm is a *client step* (local rows + broadcast message + the client's own state
-> reply message + new client state) and a *server step* (replies -> new server state).
Both halves are pure functions of their inputs; the engine (``fednovelty.runtime``) decides
who runs them, where and when: an in-process loop, or Flower nodes. Only ``Message``
objects cross between the halves: tensors and plain scalars, never raw rows (the one
exception, ``init_params="subset"``, is flagged wherever it is used and answered only by
clients whose :class:`~fednovelty.federated.privacy.PrivacyPolicy` allows it).

Settings travel once: an algorithm holds its settings as one frozen dataclass
(``algorithm.config``, :mod:`fednovelty.federated.config`) that both halves read, and a
message carries only what changes from round to round (parameters, statistics, seeds).

Every client step enforces its client's own privacy policy (``ClientContext.policy``)
whatever the message asks; a client that releases nothing in a round replies
:func:`skipped_reply` (``scalars["skipped"]`` and a ``reason``, no tensors), which the
server halves treat as absent.
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

from fednovelty.federated.declarations import ReplySpec, UndeclaredReplyError
from fednovelty.federated.ledger import PrivacyLedger
from fednovelty.federated.privacy import PrivacyPolicy, release

Scalar = bool | int | float | str


@dataclass(frozen=True)
class Message:
    """What crosses the wire in one direction of one round.

    Attributes:
        kind: what the message asks for or answers (e.g. ``"em"``, ``"assign"``).
        tensors: named tensors.
        scalars: named plain scalars (bool, int, float, str).
        expect: on the server only, what a valid reply to this broadcast may hold, for the
            server's reply validation (:mod:`fednovelty.federated.validation`):
            ``covariance_type`` of returned statistics or mixtures, ``n_clusters`` (most
            centroids), ``max_components`` (largest local mixture), ``n_features`` (width
            of the rows the round works on, when not the federation's). Never sent, not
            counted in :meth:`nbytes`; empty on a decoded message.
        backing: on the client only, the effective rows behind the entries of each
            released tensor (a tensor of the shape of the tensor's grouped leading
            dimension, or a scalar for a whole-client value), which the client gate reads
            (:func:`fednovelty.federated.privacy.release`) and removes. Never sent.
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


@dataclass
class ClientContext:
    """What a client step knows about itself.

    Attributes:
        client_id: the client's stable integer id (row group in simulation, partition id on
            Flower); seeds the client's randomness.
        state: tensors the client keeps between rounds (e.g. personal mixture weights).
        policy: the client's own privacy policy (set by the engine from the client's
            configuration, never from a message); every client step enforces it.
        wire: the client's replies cross a wire (set by the engines): ``answer`` packs
            them (:mod:`fednovelty.federated.wire`); ``False``: plain replies, for a client
            step called in process.
        ledger: what the client has released under differential privacy
            (:class:`~fednovelty.federated.ledger.PrivacyLedger`): the client's, outside the
            algorithm's ``state``, so that no restart, attempt or server message resets it;
            the client gate charges it.
    """

    client_id: int
    state: dict[str, Tensor] = field(default_factory=dict)
    policy: PrivacyPolicy = field(default_factory=PrivacyPolicy)
    wire: bool = False
    ledger: PrivacyLedger = field(default_factory=PrivacyLedger)


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


#: every algorithm class with settings, by class name (see ``FederatedAlgorithm``).
REGISTERED: dict[str, type] = {}


def _builtin(cls: type) -> bool:
    return cls.__module__.startswith("fednovelty.federated.")


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
    #: message kind -> what its replies hold (:class:`~fednovelty.federated.declarations.
    #: ReplySpec`), one per kind the client half answers; a chained algorithm reads its
    #: steps' instead.
    replies: ClassVar[Mapping[str, ReplySpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Register every algorithm with settings (``config_class``) by its class name, where
        engines find it (:mod:`fednovelty.federated.registry`); a class outside the package
        does not replace one of the package's."""
        super().__init_subclass__(**kwargs)
        if getattr(cls, "config_class", None) is None:
            return
        known = REGISTERED.get(cls.__name__)
        if known is None or not _builtin(known) or _builtin(cls):
            REGISTERED[cls.__name__] = cls

    def reply_spec(self, kind: str) -> ReplySpec:
        """The declaration of replies of ``kind``, read by the client gate and the server
        gate (:mod:`fednovelty.federated.validation`) and by the thread choice.

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

    def answer(self, data: Any, message: Message, context: ClientContext) -> Message:
        """What the client sends back: :meth:`client_step`, then the client gate.

        The gate (:func:`~fednovelty.federated.privacy.release`) applies the client's own
        policy (``context.policy``) to the step's reply by the declaration of its kind
        (``self.reply_spec(message.kind)``): every released value backed by at least
        ``min_rows`` effective rows, no more grouped entries than the client's own
        configuration allows, nothing the declaration does not classify, and the
        client-side ``backing`` removed. Every engine answers through this method or
        :meth:`answer_many` (``fednovelty.runtime.threads``); under a differential-privacy
        policy it is the one place the client's noise is added.

        It is also the client's side of the wire (:mod:`fednovelty.federated.wire`): a
        packed broadcast is unpacked before the step (tensors sent narrower cast to the
        config's ``dtype``) and, where ``context.wire`` (the engines set it), the released
        reply is packed: symmetric and triangular matrices as their triangle, float64 as the
        config's ``wire_dtype``; ``wire.unpack`` gives the step's tensors back.
        """
        return self.answer_many([(data, context)], message)[0]

    def answer_many(
        self, items: Sequence[tuple[Any, ClientContext]], message: Message
    ) -> list[Message]:
        """:meth:`answer` for several clients held in one process (the simulation):
        :meth:`client_steps` over all of them, then each reply through its own client's
        gate, by its own policy and state."""
        from fednovelty.federated.wire import pack, unpack  # wire imports this module

        message = unpack(message, getattr(self.config, "dtype", None))
        replies = self.client_steps(items, message)
        spec = self.reply_spec(message.kind)
        out = []
        for reply, (data, context) in zip(replies, items, strict=True):
            rows = data[0] if isinstance(data, tuple | list) else data
            shape = tuple(getattr(rows, "shape", ())) or None
            released = release(reply, spec, context.policy, self.config, message, context, shape)
            wire_dtype = getattr(self.config, "wire_dtype", None)
            out.append(pack(released, wire_dtype) if context.wire else released)
        return out

    @abstractmethod
    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[Any, dict[str, Scalar]]:
        """Aggregate the replies (keyed by client id) into a new state; also returns the
        round's metrics (e.g. mean log-likelihood)."""

    @abstractmethod
    def finished(self, state: Any) -> bool:
        """Whether training is over."""
