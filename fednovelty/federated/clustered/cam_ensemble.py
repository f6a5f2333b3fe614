"""FedAvg+'s step: ``n_clusters`` FedAvg models (the members) trained by every client.

Each round broadcasts every member; a client trains each one on its rows (under its
differential-privacy policy, all of them in one DP-SGD loop, jointly clipped) and sends
them back; the server averages each member as FedAvg does (row-weighted, or robustly).
"""

from __future__ import annotations

from torch import Tensor

from fednovelty.federated.clustered.cam_models import unnamed
from fednovelty.federated.clustered.cam_settings import ClusteredState
from fednovelty.federated.clustered.cam_step import (
    ENSEMBLE_KIND,
    MODEL_REPLIES,
    ModelStep,
    trained_reply,
)
from fednovelty.federated.core.aggregate import learners_tensors
from fednovelty.federated.core.base import ClientContext, Message
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
        return self.round_message(state, learners_tensors(state.cluster_models))

    def answer(
        self, X: Tensor, y: Tensor, t: dict[str, Tensor], message: Message, context: ClientContext
    ) -> ClientRound:
        """Every member trained (under DP: in one DP-SGD loop, jointly clipped)."""
        members = [unnamed(f"learner.{m}.", t, self.names) for m in range(self.config.n_clusters)]
        trained, losses = yield from self.trained(members, X, y, message, context)
        return trained_reply(ENSEMBLE_KIND, X, learners_tensors(trained), losses, context)

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        first = state.cluster_models[0][self.names[0]]
        n = self.weights(replies, first)
        gammas = n.unsqueeze(1).expand(-1, self.config.n_clusters)
        state.cluster_models = robust_average_learners(
            state.cluster_models, list(replies.values()), gammas, *self.robust
        )
        metrics = self.record(state, replies)
        return (None if self.finished_after(state, self.config.rounds) else ENSEMBLE_KIND), metrics
