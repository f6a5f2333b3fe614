"""FeSEM's and FeSEM-CAM's warm-up (Alg. 1 (2)) and the server's k-means of client models.

During the warm-up each client continues its own model from a common start (logits ``f``
alone) and sends it; :class:`KMeansServer` clusters the released models every round (FeSEM,
Eq. 10-11: Lloyd iterations on the flattened ``nn.Linear`` parameters, clients weighted by
their rows, k-means++ seeds the first clustering, later ones start from the previous
centres). The last warm-up clustering gives the first cluster models and assignments; the
clustered rounds of the k-means methods use the same server.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fednovelty.federated.clustered.cam_models import (
    ModelLayout,
    linear_vector,
    named,
    nearest_cluster,
    unnamed,
)
from fednovelty.federated.clustered.cam_settings import ClusteredConfig, ClusteredState
from fednovelty.federated.clustered.cam_step import (
    KEPT,
    MODEL_REPLIES,
    WARMUP_LOCAL_KIND,
    ModelStep,
    trained_reply,
)
from fednovelty.federated.core.base import ClientContext, Message, server_generator
from fednovelty.federated.core.declarations import declare
from fednovelty.federated.core.learners import ClientRound
from fednovelty.federated.trust.robust import coordinate_median, coordinate_trimmed_mean
from fednovelty.mixture.kmeans import kmeans_plusplus

__all__ = [
    "KMeansServer",
    "KMeansStep",
    "LocalWarmupStep",
    "keep_model",
    "kept_model",
    "robust_centres",
]


def robust_centres(
    flat: Tensor, labels: Tensor | None, centres: Tensor, aggregation: str, trim: float
) -> Tensor:
    """The k-means centres (n_clusters, P) with each non-empty cluster's centre the
    coordinate-wise trimmed mean or median of its members' flattened models ``flat``
    (n_models, P; ``labels`` (n_models,)) under a robust ``aggregation``; ``centres``
    unchanged under ``"sum"`` (the row-weighted means) or without labels."""
    if aggregation == "sum" or labels is None:
        return centres
    out = centres.clone()
    for k in range(centres.shape[0]):
        members = flat[labels == k]
        if members.shape[0]:
            members = members.double()
            if aggregation == "median":
                out[k] = coordinate_median(members).to(out)
            else:
                out[k] = coordinate_trimmed_mean(members, trim).to(out)
    return out


class KMeansServer:
    """The server's k-means of client models (FeSEM, Eq. 10-11): Lloyd iterations on the
    flattened ``nn.Linear`` parameters, clients weighted by their rows, each centre the
    row-weighted mean of its clients' full models (an empty one does not move)."""

    def __init__(self, step: ModelStep) -> None:
        self.step = step

    def cluster(self, state: ClusteredState, replies: dict[int, Message], seeded: bool) -> None:
        """New ``state.cluster_models`` and the replying clients' assignments; Lloyd starts
        from the current models, or from k-means++ seeds among the client models when
        ``seeded`` (at most one per client model; further clusters keep their models)."""
        step, config = self.step, self.step.config
        names = step.names
        like = state.cluster_models[0][names[0]]
        models = [unnamed("cluster.", r.tensors, names) for r in replies.values()]
        flat = torch.stack([linear_vector(p, names) for p in models]).to(like)  # (m, P)
        columns = step.layout.linear_columns.to(like.device)
        n = step.weights(replies, like)
        centres = torch.stack([linear_vector(p, names) for p in state.cluster_models])
        if seeded:
            k = min(config.n_clusters, len(models))
            generator = server_generator(config, state)
            seeds = kmeans_plusplus(flat[:, columns], k, generator=generator, sample_weight=n)
            for j in range(k):  # a seed is a client model: take the whole model
                centres[j] = flat[int((flat[:, columns] - seeds[j]).abs().sum(1).argmin())]
        labels = None
        for _ in range(config.kmeans_iter):
            new = nearest_cluster(flat[:, columns], centres[:, columns])
            if labels is not None and bool(torch.equal(new, labels)):
                break
            labels = new
            share = nn.functional.one_hot(labels, config.n_clusters).to(n).T * n  # (K, m)
            total = share.sum(1, keepdim=True)
            means = (share / total.clamp_min(torch.finfo(n.dtype).tiny)) @ flat
            centres = torch.where(total > 0, means, centres)
        centres = robust_centres(flat, labels, centres, *step.robust)
        labels = nearest_cluster(flat[:, columns], centres[:, columns])  # the clients' rule
        state.cluster_models = [step.layout.unflatten(c) for c in centres]
        for cid, label in zip(replies, labels.tolist(), strict=True):
            state.client_clusters[cid] = int(label)


def keep_model(context: ClientContext, params: dict[str, Tensor]) -> None:
    """A k-means client keeps the model it sends (``KEPT``.*, in its state)."""
    context.state.update({f"{KEPT}{k}": v.clone() for k, v in params.items()})


def kept_model(context: ClientContext, names: list[str]) -> dict[str, Tensor] | None:
    """The model a k-means client sent last, or ``None`` before it sent one."""
    if f"{KEPT}{names[0]}" not in context.state:
        return None
    return unnamed(KEPT, context.state, names)


class KMeansStep(ModelStep):
    """A step whose server clusters the released client models by k-means (``kmeans``, a
    :class:`KMeansServer` of the step)."""

    def __init__(self, config: ClusteredConfig, layout: ModelLayout, additive: bool) -> None:
        super().__init__(config, layout, additive)
        self.kmeans = KMeansServer(self)


class LocalWarmupStep(KMeansStep):
    """FeSEM's and FeSEM-CAM's warm-up (Alg. 1 (2)): local training only; the server
    clusters the client models every round."""

    kinds = (WARMUP_LOCAL_KIND,)
    replies = declare(MODEL_REPLIES[WARMUP_LOCAL_KIND])

    @property
    def max_rounds(self) -> int:
        return self.config.warmup_rounds

    def configure(self, state: ClusteredState) -> Message:
        return self.round_message(state, named("learner.0.", state.cluster_models[0]))

    def answer(
        self, X: Tensor, y: Tensor, t: dict[str, Tensor], message: Message, context: ClientContext
    ) -> ClientRound:
        """The client's own model (the common start before it has one) trained and kept."""
        kept = kept_model(context, self.names)
        start = unnamed("learner.0.", t, self.names) if kept is None else kept
        (trained,), losses = yield from self.trained([start], X, y, message, context)
        keep_model(context, trained)
        return trained_reply(WARMUP_LOCAL_KIND, X, named("cluster.", trained), losses, context)

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        self.kmeans.cluster(state, replies, seeded=state.rounds == 0)
        reseeded = self.reseed(state, replies)
        metrics = self.record(state, replies, reseeded)
        done = self.finished_after(state, self.config.warmup_rounds)
        return (None if done else WARMUP_LOCAL_KIND), metrics
