"""IFCA-CAM's warm-up (Alg. 1 (1)): FedAvg of the global model alone.

For ``warmup_rounds`` rounds every client trains the global model on its rows (logits
``h`` alone) and the server averages the copies, so that the global model's residual is
informative before the cluster models start; no client has a cluster yet.
"""

from __future__ import annotations

from typing import Any

from fednovelty.federated.clustered.cam_models import mean_losses, named, unnamed
from fednovelty.federated.clustered.cam_settings import ClusteredState
from fednovelty.federated.clustered.cam_step import (
    MODEL_REPLIES,
    WARMUP_GLOBAL_KIND,
    ModelStep,
    model_reply,
    private_model_reply,
)
from fednovelty.federated.core.base import ClientContext, Message, client_generator, round_seed
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
        tensors = named("global.", state.global_model)
        return Message(WARMUP_GLOBAL_KIND, tensors, {"seed": round_seed(self.config, state)})

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        X, y = data
        refused = self.refusal(WARMUP_GLOBAL_KIND, X, context)
        if refused is not None:
            return refused
        start = unnamed("global.", self.received(message, X), self.names)
        if context.terms.private is not None:
            generator = self.private_generator(context)
            trained = self.private_train(self.template, [start], X, y, context, generator)[0]
            return private_model_reply(WARMUP_GLOBAL_KIND, X, named("global.", trained), context)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        loss = mean_losses(self.template, [start], X, y)[0]
        (trained,) = yield [self.task(start, X, y, generator)]
        return model_reply(WARMUP_GLOBAL_KIND, X, loss, named("global.", trained))

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        copies = [unnamed("global.", r.tensors, self.names) for r in replies.values()]
        first = state.global_model[self.names[0]]
        state.global_model = self.average(state.global_model, copies, self.weights(replies, first))
        metrics = self.record(state, replies)
        done = self.finished_after(state, self.config.warmup_rounds)
        return (None if done else WARMUP_GLOBAL_KIND), metrics
