"""The clustered rounds of IFCA, FeSEM and their CAM forms: :class:`ClusterStep` and its two
rules for who joins which cluster.

Each round broadcasts the cluster models (CAM: and the global model); a client picks its
cluster, trains that cluster's model on its rows (CAM: on the residual of the global
model, and the global model on the residual of its cluster's, in parallel) and names the
cluster in its reply. :class:`MinLossClusterStep` is IFCA's rule (the model of least loss;
the server averages each cluster's copies), :class:`KMeansClusterStep` FeSEM's (the centre
nearest to the model the client sent last, a proximal pull towards it in training; the
server re-clusters the released models by k-means).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from fednovelty.federated.clustered.cam_local_warmup import KMeansStep, keep_model, kept_model
from fednovelty.federated.clustered.cam_models import (
    linear_vector,
    mean_losses,
    named,
    nearest_cluster,
    unnamed,
)
from fednovelty.federated.clustered.cam_private import (
    AdditivePair,
    clipped_loss_sums,
    noisy_cluster_losses,
)
from fednovelty.federated.clustered.cam_settings import ClusteredState
from fednovelty.federated.clustered.cam_step import (
    CLUSTER_KIND,
    MODEL_REPLIES,
    ModelStep,
    model_reply,
    private_model_reply,
)
from fednovelty.federated.core.aggregate import average_params, learners_tensors
from fednovelty.federated.core.base import ClientContext, Message, client_generator
from fednovelty.federated.core.declarations import declare
from fednovelty.federated.core.learners import ClientRound, logits
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE
from fednovelty.federated.trust.noise import NoiseSource, check_source

__all__ = ["ClusterStep", "KMeansClusterStep", "MinLossClusterStep"]

Model = dict[str, Tensor]


class ClusterStep(ModelStep):
    """The clustered rounds (module docstring); a subclass says how a client picks its
    cluster (:meth:`choose`, :meth:`private_choice`) and how the server folds the cluster
    copies (:meth:`fold`).

    Attributes:
        keeps_model: whether a client keeps the model it sends (FeSEM's next choice reads it).
    """

    kinds = (CLUSTER_KIND,)
    replies = declare(MODEL_REPLIES[CLUSTER_KIND])
    keeps_model: ClassVar[bool] = False

    @property
    def max_rounds(self) -> int:
        return self.config.rounds - self.config.warmup_rounds

    @property
    def pull(self) -> float:
        """The proximal pull of a client's cluster model towards its start (``mu_prox``)."""
        return 0.0

    def begin(self, state: ClusteredState) -> str | None:
        return CLUSTER_KIND if self.max_rounds > 0 else None

    def configure(self, state: ClusteredState) -> Message:
        tensors = learners_tensors(state.cluster_models)
        if self.additive:
            tensors.update(named("global.", state.global_model))
        return self.round_message(state, tensors)

    # ------------------------------------------------------------------ client half
    def min_loss(
        self, models: list[Model], X: Tensor, y: Tensor, h: Tensor | None
    ) -> tuple[int, Tensor]:
        """IFCA's rule (Eq. 2): the cluster whose model (plus the global logits ``h``) has
        the least mean loss on the rows (ties: the lowest index), and that loss."""
        losses = mean_losses(self.template, models, X, y, h)
        return int(losses.argmin()), losses[int(losses.argmin())]

    @abstractmethod
    def choose(
        self, models: list[Model], X: Tensor, y: Tensor, h: Tensor | None, kept: Model | None
    ) -> tuple[int, Tensor]:
        """The client's cluster and its model's mean loss on the rows; ``h``: the global
        model's logits (CAM) or ``None``; ``kept``: the model the client sent last."""

    @abstractmethod
    def private_choice(
        self,
        models: list[Model],
        X: Tensor,
        y: Tensor,
        h: Tensor | None,
        kept: Model | None,
        context: ClientContext,
        generator: NoiseSource,
    ) -> int:
        """The client's cluster under its differential-privacy policy."""

    def private_step(
        self,
        models: list[Model],
        glob: Model | None,
        X: Tensor,
        y: Tensor,
        h: Tensor | None,
        kept: Model | None,
        context: ClientContext,
    ) -> Message:
        """The client half under its differential-privacy policy: the private choice, then
        its cluster's model (CAM: and the global model, each on the residual of the
        other's broadcast model, in one loop: :class:`AdditivePair`) by DP-SGD."""
        generator = self.private_generator(context)
        cluster = self.private_choice(models, X, y, h, kept, context, generator)
        pull = self.pull
        if glob is None:
            start = [models[cluster]]
            theta = self.private_train(self.template, start, X, y, context, generator, pull)[0]
            tensors = named("cluster.", theta)
        else:
            pair = AdditivePair(self.template, models[cluster], glob)
            start = [named("cluster.", models[cluster]), named("global.", glob)]
            halves = self.private_train(pair, start, X, y, context, generator, pull)
            tensors = {**halves[0], **halves[1]}
            theta = unnamed("cluster.", tensors, self.names)
        if self.keeps_model:
            keep_model(context, theta)
        return private_model_reply(CLUSTER_KIND, X, tensors, context, cluster=cluster)

    def answer(
        self, X: Tensor, y: Tensor, t: dict[str, Tensor], message: Message, context: ClientContext
    ) -> ClientRound:
        """The client's cluster (:meth:`choose`), its model trained (CAM: and the global
        model on the residual); under DP :meth:`private_step`."""
        models = [unnamed(f"learner.{k}.", t, self.names) for k in range(self.config.n_clusters)]
        glob = unnamed("global.", t, self.names) if self.additive else None
        with torch.no_grad():
            h = None if glob is None else logits(self.template, glob, X)
        kept = kept_model(context, self.names)
        if context.terms.private is not None:
            return self.private_step(models, glob, X, y, h, kept, context)
        cluster, loss = self.choose(models, X, y, h, kept)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        task = self.task(models[cluster], X, y, generator, offset=h, mu_prox=self.pull)
        (theta,) = yield [task]
        tensors = named("cluster.", theta)
        if glob is not None:  # the global copy fits the residual of the cluster's model
            with torch.no_grad():
                f = logits(self.template, models[cluster], X)
            (residual,) = yield [self.task(glob, X, y, generator, offset=f)]
            tensors.update(named("global.", residual))
        if self.keeps_model:
            keep_model(context, theta)
        return model_reply(CLUSTER_KIND, X, loss, tensors, cluster=cluster)

    # ------------------------------------------------------------------ server half
    def released(self, replies: dict[int, Message]) -> dict[int, Message]:
        """The replies the round folds (all of them)."""
        return replies

    @abstractmethod
    def fold(self, state: ClusteredState, replies: dict[int, Message], n: Tensor) -> None:
        """New cluster models and assignments from the replies (weights ``n``)."""

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        replies = self.released(replies)
        like = state.cluster_models[0][self.names[0]]
        n = self.weights(replies, like)
        if self.additive:
            copies = [unnamed("global.", r.tensors, self.names) for r in replies.values()]
            state.global_model = self.average(state.global_model, copies, n)
        self.fold(state, replies, n)
        reseeded = self.reseed(state, replies)
        metrics = self.record(state, replies, reseeded)
        done = self.finished_after(state, self.config.rounds)
        return (None if done else CLUSTER_KIND), metrics


class MinLossClusterStep(ClusterStep):
    """IFCA's clustered rounds: each client joins the cluster of least loss (a
    report-noisy-min under differential privacy); the server averages each cluster's
    copies (``cluster_average``)."""

    noisy_choices = 1

    def choose(self, models, X, y, h, kept) -> tuple[int, Tensor]:
        """The min-loss cluster (``kept`` unused)."""
        return self.min_loss(models, X, y, h)

    def private_choice(self, models, X, y, h, kept, context, generator) -> int:
        """IFCA's min-loss by report-noisy-min (:func:`noisy_cluster_losses` of the clipped
        loss sums, multiplier ``HISTOGRAM_SHARE * z`` of the client's own ``z``)."""
        bound = self.config.dp_loss_clip
        sums = clipped_loss_sums(self.template, models, X, y, h, bound)
        multiplier = HISTOGRAM_SHARE * context.terms.private.noise_multiplier
        return int(noisy_cluster_losses(sums, bound, multiplier, generator).argmin())

    def released(self, replies: dict[int, Message]) -> dict[int, Message]:
        """The replies whose ``cluster`` is a cluster index: the server gate checks a noisy
        (``dp_mode``) reply for form and finiteness only, so a private round drops the
        others here (all of them pass otherwise).

        Raises:
            ValueError: no reply names a cluster.
        """
        if not self.config.private:
            return replies
        k = self.config.n_clusters
        kept = {}
        for cid, reply in replies.items():
            cluster = reply.scalars.get("cluster")
            if not isinstance(cluster, bool) and isinstance(cluster, int) and 0 <= cluster < k:
                kept[cid] = reply
        if not kept:
            raise ValueError(f"no reply of the round names a cluster in [0, {k}).")
        return kept

    def fold(self, state: ClusteredState, replies: dict[int, Message], n: Tensor) -> None:
        """Each cluster model from its clients' copies (``cluster_average``; an empty one is
        kept: Eq. 6 with ``C_k`` empty)."""
        chosen = torch.tensor([int(r.scalars["cluster"]) for r in replies.values()])
        copies = [unnamed("cluster.", r.tensors, self.names) for r in replies.values()]
        total = n.sum()
        for k in range(self.config.n_clusters):
            weights = n * (chosen == k).to(n)
            if float(weights.sum()) <= 0:
                continue
            combined = self.average(state.cluster_models[k], copies, weights)
            if self.config.cluster_average == "global":  # Eq. 6: the rest of the rows keep it
                share = torch.stack([total - weights.sum(), weights.sum()])
                combined = average_params(
                    state.cluster_models[k], [state.cluster_models[k], combined], share
                )
            state.cluster_models[k] = combined
        for cid, reply in replies.items():
            state.client_clusters[cid] = int(reply.scalars["cluster"])


class KMeansClusterStep(ClusterStep, KMeansStep):
    """FeSEM's clustered rounds: each client joins the centre nearest to the model it sent
    last and trains with the pull ``kmeans_reg`` towards it; the server re-clusters the
    released models by k-means, from the current centres."""

    keeps_model = True

    @property
    def pull(self) -> float:
        return self.config.kmeans_reg

    def nearest(self, models: list[Model], kept: Model) -> int:
        """The centre nearest to ``kept`` (FeSEM's distance), the server's k-means label."""
        fc = self.layout.linear_names
        centres = torch.stack([linear_vector(p, fc) for p in models])
        mine = linear_vector(kept, fc).to(centres).unsqueeze(0)
        return int(nearest_cluster(mine, centres)[0])

    def choose(self, models, X, y, h, kept) -> tuple[int, Tensor]:
        """The nearest centre to ``kept``; a client without one joins by min-loss."""
        if kept is None:
            return self.min_loss(models, X, y, h)
        cluster = self.nearest(models, kept)
        return cluster, mean_losses(self.template, [models[cluster]], X, y, h)[0]

    def private_choice(self, models, X, y, h, kept, context, generator) -> int:
        """The nearest centre to the model the client released last (post-processing), or
        a uniformly random cluster without one (its rows unread)."""
        if kept is not None:
            return self.nearest(models, kept)
        return check_source(generator).randint(len(models))

    def fold(self, state: ClusteredState, replies: dict[int, Message], n: Tensor) -> None:
        self.kmeans.cluster(state, replies, seeded=False)
