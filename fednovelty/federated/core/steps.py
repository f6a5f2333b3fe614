"""Composable protocol steps and the algorithm that chains them.

A *step* is one protocol of a federated algorithm with both halves: its server half
configures a round from the state and folds the replies into the state, its client half
answers the round. An algorithm is an ordered list of steps (e.g. federated EM =
``[PCA?, moments?, k-means centroids, Lloyd assignment, EM]``); :class:`ChainedAlgorithm`
runs them in turn and is itself a :class:`~fednovelty.federated.core.base.FederatedAlgorithm`,
so engines see the usual five methods.

How steps cooperate, without knowing each other:

- ``state.phase`` is the kind of the next round's message; each kind belongs to exactly one
  step, which configures that round, answers it on the clients and folds its replies.
- When a step's server half is done, the chain calls ``begin`` on the following steps until
  one names its first round (``None``: nothing to do); after the last step the phase is
  ``"done"`` and every step's ``finish`` runs, last step first.
- A finished step may change later rounds: ``broadcast`` adds tensors to their messages and
  ``view`` transforms the client's rows (z-scores, a PCA projection); a ``view`` that cannot
  work raises :class:`ClientSkip` and the client replies skipped.
- ``state.rounds`` counts the rounds of the steps whose ``counted`` is true (round seeds).
- Each round's rows (after the views and the step's ``rows``) pass ``context.terms.clip``:
  under a client's differential privacy the trust layer clips them there, in one place.

A step declares the replies of its rounds (``replies``: kind -> ``ReplySpec``), which both
gates read through :meth:`ChainedAlgorithm.reply_spec`; an undeclared kind cannot be chained.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    skipped_reply,
)
from fednovelty.federated.core.declarations import (
    ReplySpec,
    UndeclaredReplyError,
    check_declared,
    register_declarations,
)
from fednovelty.mixture.rows import is_row_source


class ClientSkip(Exception):
    """A client cannot answer a round (raised by a step's ``view``); it replies skipped
    with the exception's message as the reason."""


class Step(ABC):
    """One protocol of a chained algorithm (see the module docstring).

    Attributes:
        kinds: the message kinds of its rounds (its client half answers them).
        replies: kind -> :class:`~fednovelty.federated.core.declarations.ReplySpec`, one for
            each of ``kinds`` (module docstring).
        counted: whether its rounds count in ``state.rounds`` (and move the round seeds).
        labelled: whether its client half takes ``(X, y, Z)`` instead of rows ``X``.
        max_rounds: most rounds it runs.
        batched: its :meth:`client_steps` runs several clients as one computation.
        streams: its client half takes rows given as a
            :class:`~fednovelty.mixture.rows.RowSource` (read chunk by chunk: its sums over
            rows are taken over the source's chunks); a step that does not cannot be asked
            of a client whose rows are a source.
    """

    kinds: tuple[str, ...] = ()
    replies: ClassVar[Mapping[str, ReplySpec]] = {}
    counted: bool = True
    labelled: bool = False
    max_rounds: int = 1
    batched: bool = False
    streams: bool = False

    def __init__(self, config: Any = None) -> None:
        """A step of the algorithm whose settings are ``config`` (its ``config``)."""
        self.config = config

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Record the replies the step declares (``register_declarations``)."""
        super().__init_subclass__(**kwargs)
        register_declarations(cls)

    def begin(self, state: Any) -> str | None:
        """Prepare ``state`` for this step; the kind of its first round, or ``None`` when it
        needs no round."""
        return self.kinds[0]

    @abstractmethod
    def configure(self, state: Any) -> Message:
        """The message of the round ``state.phase`` (one of ``kinds``)."""

    @abstractmethod
    def client_step(self, X: Any, message: Message, context: ClientContext) -> Message:
        """Answer a round of this step on rows ``X`` (n_samples, n_features), or on
        ``(X, y, Z)`` when ``labelled``."""

    def client_steps(
        self, items: Sequence[tuple[Any, ClientContext]], message: Message
    ) -> list[Message]:
        """Several clients' answers to one round (rows already through the earlier steps'
        views): one ``client_step`` each; a step whose clients run the same computation may
        batch it (:meth:`~fednovelty.federated.core.base.FederatedAlgorithm.client_steps`)."""
        return [self.client_step(data, message, context) for data, context in items]

    @abstractmethod
    def server_step(
        self, state: Any, replies: dict[int, Message]
    ) -> tuple[str | None, dict[str, Scalar]]:
        """Fold the released replies into ``state``; returns the kind of this step's next
        round (``None``: the step is done) and the round's metrics."""

    def broadcast(self, state: Any) -> tuple[dict[str, Tensor], dict[str, Scalar]]:
        """Tensors this finished step adds to a later round's message, and what it adds to
        the message's ``expect``."""
        return {}, {}

    def view(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        """The rows a later step's client half sees (this step finished)."""
        return X

    def rows(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        """The rows this step's own rounds work on, from those the earlier steps' views
        give (e.g. in the units of a public box); the rows are clipped after it under a
        differential-privacy policy."""
        return X

    def all_skipped(self, state: Any) -> bool:
        """Every client skipped this step's last round: whether ``state`` now asks a round
        they may back (:meth:`~fednovelty.federated.core.base.FederatedAlgorithm.all_skipped`);
        most steps cannot, and return False."""
        return False

    def finish(self, state: Any) -> None:  # noqa: B027 (optional hook; most steps need none)
        """Called once when the last step is done (e.g. map the result back to the user's
        units)."""


class NoRoundStep(Step):
    """A step with no round of its own: it works in ``begin``, ``broadcast``, ``view`` or
    ``finish``; its round methods raise ``RuntimeError``."""

    max_rounds = 0

    def begin(self, state: Any) -> None:
        return None

    def configure(self, state: Any) -> Message:
        raise RuntimeError(f"{type(self).__name__} runs no round.")

    def client_step(self, X: Any, message: Message, context: ClientContext) -> Message:
        raise RuntimeError(f"{type(self).__name__} runs no round.")

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        raise RuntimeError(f"{type(self).__name__} runs no round.")


class ChainedAlgorithm(FederatedAlgorithm):
    """A federated algorithm made of :class:`Step` objects run in order.

    Subclasses call :meth:`_chain` with their steps (in ``_setup``) and implement
    :meth:`new_state`; the state needs ``phase`` (str) and ``rounds`` (int) fields.
    """

    steps: tuple[Step, ...] = ()
    gate_caps_weights: ClassVar[bool] = True

    def _chain(self, steps: list[Step]) -> None:
        """Chain ``steps`` in order.

        Raises:
            UndeclaredReplyError: a step answers a kind it declares no reply for.
            ValueError: two steps answer the same kind.
        """
        owner: dict[str, int] = {}
        for index, step in enumerate(steps):
            check_declared(type(step).__name__, tuple(step.kinds), step.replies)
            for kind in step.kinds:
                if kind in owner:
                    raise ValueError(f"two steps answer messages of kind {kind!r}.")
                owner[kind] = index
        self.steps = tuple(steps)
        self._owner = owner
        self.max_rounds = sum(step.max_rounds for step in steps)

    def new_state(self) -> Any:
        """The state before any step began."""
        raise NotImplementedError

    def reply_spec(self, kind: str) -> ReplySpec:
        """The declaration of replies of ``kind`` by the step that answers it.

        Raises:
            UndeclaredReplyError: no step of the chain answers ``kind``.
        """
        if kind not in self._owner:
            raise UndeclaredReplyError(
                f"no step of {type(self).__name__} answers messages of kind {kind!r}."
            )
        return self.steps[self._owner[kind]].replies[kind]

    def _step_of(self, kind: str) -> int:
        if kind not in self._owner:
            raise ValueError(
                f"{type(self).__name__} clients do not answer messages of kind {kind!r}."
            )
        return self._owner[kind]

    def _begin_from(self, state: Any, index: int) -> str:
        """The first round of the steps from ``index`` on; ``"done"`` (and every step's
        ``finish``) when none has one."""
        for step in self.steps[index:]:
            kind = step.begin(state)
            if kind is not None:
                return kind
        for step in reversed(self.steps):
            step.finish(state)
        return "done"

    # ------------------------------------------------------------------ server half
    def start(self) -> Any:
        state = self.new_state()
        state.phase = self._begin_from(state, 0)
        return state

    def finished(self, state: Any) -> bool:
        return state.phase == "done"

    def configure(self, state: Any) -> Message:
        if state.phase == "done":
            raise RuntimeError(f"{type(self).__name__} has finished; no round to configure.")
        index = self._step_of(state.phase)
        message = self.steps[index].configure(state)
        for earlier in self.steps[:index]:
            tensors, expect = earlier.broadcast(state)
            message.tensors.update(tensors)
            message.expect.update(expect)
        return message

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[Any, dict[str, Scalar]]:
        replies = {cid: r for cid, r in replies.items() if not r.scalars.get("skipped")}
        if not replies:
            raise ValueError(
                f"no client replied with statistics in round {state.rounds + 1} ({state.phase}); "
                "clients below their privacy floor, or refusing the round, skip."
            )
        index = self._step_of(state.phase)
        step = self.steps[index]
        following, metrics = step.server_step(state, replies)
        if step.counted:
            state.rounds += 1
        state.phase = following if following is not None else self._begin_from(state, index + 1)
        return state, {"phase": metrics.pop("phase", ""), **metrics}

    def all_skipped(self, state: Any) -> bool:
        return state.phase != "done" and self.steps[self._step_of(state.phase)].all_skipped(state)

    # ------------------------------------------------------------------ client half
    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """A client's data as rows ``X`` and the labelled steps' extra tensors (``None``
        for algorithms whose clients hold rows only)."""
        return data, None

    def batches(self, kind: str) -> bool:
        return self.steps[self._step_of(kind)].batched

    def client_step(self, data: Any, message: Message, context: ClientContext) -> Message:
        return self.client_steps([(data, context)], message)[0]

    def client_steps(
        self, items: Sequence[tuple[Any, ClientContext]], message: Message
    ) -> list[Message]:
        """Each client's rows through the earlier steps' views, the step's ``rows`` and
        the client's terms (``context.terms.clip``), then the step's ``client_steps`` over
        the clients that can answer (the others reply skipped), replies in the order of
        ``items``."""
        index = self._step_of(message.kind)
        step = self.steps[index]
        replies: list[Message | None] = []
        ready: list[tuple[Any, ClientContext]] = []
        for data, context in items:
            prepared = self._step_rows(index, data, message, context)
            if not isinstance(prepared, Tensor) and is_row_source(prepared):  # chunk by chunk
                prepared = step.client_step(prepared, message, context)
            replies.append(prepared if isinstance(prepared, Message) else None)
            if not isinstance(prepared, Message):
                ready.append((prepared, context))
        answered = iter(step.client_steps(ready, message) if ready else [])
        return [reply if reply is not None else next(answered) for reply in replies]

    def _step_rows(self, index: int, data: Any, message: Message, context: ClientContext) -> Any:
        """A client's data as step ``index``'s client half takes it, or a skipped reply
        where a view cannot work."""
        X, extra = self.split_data(data)
        step = self.steps[index]
        if isinstance(X, Tensor):  # rows held at once: each view and the clip applied to them
            try:
                for earlier in self.steps[:index]:
                    X = earlier.view(X, message, context)
            except ClientSkip as skip:
                return skipped_reply(message.kind, str(skip))
            X = context.terms.clip(step.rows(X, message, context))
            return (X, *extra) if step.labelled else X
        streamed = is_row_source(X)
        if streamed and not step.streams:
            raise TypeError(
                f"{type(self).__name__}'s {type(step).__name__} ({message.kind!r} rounds) reads "
                "a client's rows as one tensor and cannot take a row source (rows read in "
                f"chunks). Steps that stream: {', '.join(streaming_steps(self))}. Give the "
                "client its rows as a tensor, or choose settings whose steps stream."
            )
        try:
            for earlier in self.steps[:index]:
                X = rowwise(X, lambda rows, s=earlier: s.view(rows, message, context))
        except ClientSkip as skip:
            return skipped_reply(message.kind, str(skip))
        X = rowwise(X, lambda rows: context.terms.clip(step.rows(rows, message, context)))
        return (X, *extra) if step.labelled else X


def rowwise(X: Any, fn: Any) -> Any:
    """``fn(X)`` of a tensor; of a row source, the source whose chunks go through ``fn``
    as they are read (a step's ``view`` and ``rows`` are row-wise)."""
    return X.map(fn) if is_row_source(X) else fn(X)


def streaming_steps(algorithm: ChainedAlgorithm) -> list[str]:
    """Names of the steps of ``algorithm`` that take a row source (``Step.streams``), or
    ``["none"]``."""
    return [type(step).__name__ for step in algorithm.steps if step.streams] or ["none"]
