"""IFCA-CAM's warm-up (Alg. 1 (1)): FedAvg of the global model alone.

For ``warmup_rounds`` rounds every client trains the global model on its rows (logits
``h`` alone) and the server averages the copies, so that the global model's residual is
informative before the cluster models start; no client has a cluster yet.
"""

from __future__ import annotations

from torch import Tensor

from fednovelty.federated.clustered.cam_models import named, unnamed
from fednovelty.federated.clustered.cam_settings import ClusteredState
from fednovelty.federated.clustered.cam_step import (
    MODEL_REPLIES,
    WARMUP_GLOBAL_KIND,
    ModelStep,
    trained_reply,
)
from fednovelty.federated.core.base import ClientContext, Message
from fednovelty.federated.core.declarations import declare
from fednovelty.federated.core.learners import ClientRound

__all__ = ["GlobalWarmupStep"]


class GlobalWarmupStep(ModelStep):
    """IFCA-CAM's warm-up (Alg. 1 (1)): FedAvg of the global model alone."""

    kinds = (WARMUP_GLOBAL_KIND,)
    replies = declare(MODEL_REPLIES[WARMUP_GLOBAL_KIND])

    @property
    def max_rounds(self) -> int:
        return self.config.warmup_rounds

    def begin(self, state: ClusteredState) -> str | None:
        return WARMUP_GLOBAL_KIND if self.config.warmup_rounds > 0 else None

    def configure(self, state: ClusteredState) -> Message:
        return self.round_message(state, named("global.", state.global_model))

    def answer(
        self, X: Tensor, y: Tensor, t: dict[str, Tensor], message: Message, context: ClientContext
    ) -> ClientRound:
        """The global model trained on the rows."""
        start = unnamed("global.", t, self.names)
        (trained,), losses = yield from self.trained([start], X, y, message, context)
        return trained_reply(WARMUP_GLOBAL_KIND, X, named("global.", trained), losses, context)

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        copies = [unnamed("global.", r.tensors, self.names) for r in replies.values()]
        first = state.global_model[self.names[0]]
        state.global_model = self.average(state.global_model, copies, self.weights(replies, first))
        metrics = self.record(state, replies)
        done = self.finished_after(state, self.config.warmup_rounds)
        return (None if done else WARMUP_GLOBAL_KIND), metrics
