"""Any federated algorithm run on the clients' rows projected on federated-PCA axes.

:class:`Projected` wraps an algorithm built for rows of ``q`` features and a fitted
:class:`~fednovelty.federated.mixtures.pca.PCAProjection` of the clients' ``d`` features.
The server sends the projection's mean and axes with the first broadcast (with every
broadcast when rounds sample clients, ``resend``); each client keeps them in its
``ClientContext.state`` and projects its rows, ``(X - mean) @ components.T``, before the
wrapped algorithm's client half sees them. Server halves, replies and their declarations
are the wrapped algorithm's; the round width the server gate checks is ``q``. Finding the
projection is :class:`~fednovelty.federated.mixtures.pca.PCAStep`'s two rounds (run alone as
``FederatedPCA`` first); the detectors chain the two (``pca_components``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    FederatedAlgorithm,
    Message,
    Scalar,
    skipped_reply,
)
from fednovelty.federated.core.steps import ClientSkip
from fednovelty.federated.mixtures.pca import PROJECTION_COMPONENTS, PROJECTION_MEAN, PCAProjection


@dataclass
class ProjectedState:
    """Server state of :class:`Projected`: the wrapped algorithm's state and the rounds run.

    Attributes:
        inner: the wrapped algorithm's server state.
        rounds: broadcasts configured so far.
    """

    inner: Any
    rounds: int = 0


def project_rows(X: Tensor, state: dict[str, Tensor]) -> Tensor:
    """A client's rows (n, d) projected with the mean (d,) and axes (q, d) kept in its
    ``state``: (n, q) in the rows' dtype, on their device."""
    if PROJECTION_COMPONENTS not in state:
        raise ClientSkip("the client has no PCA projection (it missed the broadcast carrying it)")
    mean = state[PROJECTION_MEAN].to(X.device, X.dtype)
    components = state[PROJECTION_COMPONENTS].to(X.device, X.dtype)
    if X.ndim != 2 or X.shape[1] != components.shape[1]:
        raise ValueError(
            f"rows of shape {tuple(X.shape)} do not match the projection's "
            f"{components.shape[1]} features."
        )
    return (X - mean) @ components.T


class Projected(FederatedAlgorithm):
    """Run ``algorithm`` on the clients' rows projected by ``projection`` (module docstring).

    Args:
        algorithm: the wrapped algorithm, built for rows of ``projection.n_components``
            features.
        projection: the fitted federated PCA of the clients' rows.
        resend: send the projection with every broadcast (rounds that sample clients: a
            client may first be asked after the first round); else with the first only.
    """

    def __init__(
        self, algorithm: FederatedAlgorithm, projection: PCAProjection, *, resend: bool = False
    ) -> None:
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "projection", projection)
        object.__setattr__(self, "resend", bool(resend))
        self._setup(algorithm.config)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("algorithm", "projection", "resend"):
            raise AttributeError(name)
        return getattr(self.__dict__["algorithm"], name)

    @property
    def max_rounds(self) -> int:
        return self.algorithm.max_rounds

    def reply_spec(self, kind: str):
        return self.algorithm.reply_spec(kind)

    # ------------------------------------------------------------------ server half
    def start(self) -> ProjectedState:
        return ProjectedState(self.algorithm.start())

    def finished(self, state: ProjectedState) -> bool:
        return self.algorithm.finished(state.inner)

    def configure(self, state: ProjectedState) -> Message:
        message = self.algorithm.configure(state.inner)
        tensors = dict(message.tensors)
        if state.rounds == 0 or self.resend:
            tensors[PROJECTION_MEAN] = self.projection.mean
            tensors[PROJECTION_COMPONENTS] = self.projection.components
        state.rounds += 1
        expect = {"n_features": self.projection.n_components, **message.expect}
        return dataclasses.replace(message, tensors=tensors, expect=expect)

    def server_step(
        self, state: ProjectedState, replies: dict[int, Message]
    ) -> tuple[ProjectedState, dict[str, Scalar]]:
        inner, metrics = self.algorithm.server_step(state.inner, replies)
        state.inner = inner
        return state, metrics

    # ------------------------------------------------------------------ client half
    def _view(self, data: Any, message: Message, context: ClientContext) -> Any:
        """The client's data with its rows projected; the projection is kept from the
        broadcast that carries it."""
        if PROJECTION_COMPONENTS in message.tensors:
            for name in (PROJECTION_MEAN, PROJECTION_COMPONENTS):
                context.state[name] = message.tensors[name]
        if isinstance(data, tuple):
            return (project_rows(data[0], context.state), *data[1:])
        return project_rows(data, context.state)

    @staticmethod
    def _inner_message(message: Message) -> Message:
        tensors = {
            k: v
            for k, v in message.tensors.items()
            if k not in (PROJECTION_MEAN, PROJECTION_COMPONENTS)
        }
        return dataclasses.replace(message, tensors=tensors)

    def client_step(self, X: Any, message: Message, context: ClientContext) -> Message:
        try:
            view = self._view(X, message, context)
        except ClientSkip as skip:
            return skipped_reply(message.kind, str(skip))
        return self.algorithm.client_step(view, self._inner_message(message), context)

    def batches(self, kind: str) -> bool:
        return self.algorithm.batches(kind)

    def client_steps(
        self, items: Sequence[tuple[Any, ClientContext]], message: Message
    ) -> list[Message]:
        try:
            views = [(self._view(data, message, context), context) for data, context in items]
        except ClientSkip:  # one at a time: each client that lacks the projection skips
            return [self.client_step(data, message, context) for data, context in items]
        return self.algorithm.client_steps(views, self._inner_message(message))


__all__ = ["Projected", "ProjectedState", "project_rows"]
