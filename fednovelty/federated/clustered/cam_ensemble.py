"""FedAvg+'s step: ``n_clusters`` FedAvg models (the members) trained by every client.

Each round broadcasts every member; a client trains each one on its rows (under its
differential-privacy policy, all of them in one DP-SGD loop, jointly clipped) and sends
them back; the server averages each member as FedAvg does (row-weighted, or robustly).
"""

from __future__ import annotations

from typing import Any

from fednovelty.federated.clustered.cam_models import mean_losses, unnamed
from fednovelty.federated.clustered.cam_settings import ClusteredState
from fednovelty.federated.clustered.cam_step import (
    ENSEMBLE_KIND,
    MODEL_REPLIES,
    ModelStep,
    model_reply,
    private_model_reply,
)
from fednovelty.federated.core.aggregate import learner_name
from fednovelty.federated.core.base import ClientContext, Message, client_generator, round_seed
from fednovelty.federated.core.declarations import declare
from fednovelty.federated.core.learners import ClientRound
from fednovelty.federated.trust.robust import robust_average_learners

__all__ = ["EnsembleStep"]


class EnsembleStep(ModelStep):
    """FedAvg+: every client trains every member; each member is averaged as FedAvg."""

    kinds = (ENSEMBLE_KIND,)
    replies = declare(MODEL_REPLIES[ENSEMBLE_KIND])

    @property
    def max_rounds(self) -> int:
        return self.config.rounds

    def configure(self, state: ClusteredState) -> Message:
        tensors = {}
        for m, params in enumerate(state.cluster_models):
            tensors.update({learner_name(m, name): value for name, value in params.items()})
        return Message(ENSEMBLE_KIND, tensors, {"seed": round_seed(self.config, state)})

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        X, y = data
        refused = self.refusal(ENSEMBLE_KIND, X, context)
        if refused is not None:
            return refused
        t = self.received(message, X)
        members = [unnamed(f"learner.{m}.", t, self.names) for m in range(self.config.n_clusters)]
        if context.terms.private is not None:  # every member in one DP-SGD loop, jointly clipped
            generator = self.private_generator(context)
            trained = self.private_train(self.template, members, X, y, context, generator)
            tensors = {
                learner_name(m, name): value
                for m, params in enumerate(trained)
                for name, value in params.items()
            }
            return private_model_reply(ENSEMBLE_KIND, X, tensors, context)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        loss = mean_losses(self.template, members, X, y).mean()
        everyone = yield [self.task(params, X, y, generator) for params in members]
        tensors = {}
        for m, trained in enumerate(everyone):
            tensors.update({learner_name(m, name): value for name, value in trained.items()})
        return model_reply(ENSEMBLE_KIND, X, loss, tensors)

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        first = state.cluster_models[0][self.names[0]]
        n = self.weights(replies, first)
        gammas = n.unsqueeze(1).expand(-1, self.config.n_clusters)
        state.cluster_models = robust_average_learners(
            state.cluster_models, list(replies.values()), gammas, *self.robust
        )
        metrics = self.record(state, replies)
        return (None if self.finished_after(state, self.config.rounds) else ENSEMBLE_KIND), metrics
