"""What the steps of the Fed-CAM paper's methods share: their message kinds, the replies
they declare, and :class:`ModelStep`, the base of every step.

A step's client half trains models on the client's labelled rows, by the run's local SGD
(a batch of clients' models at once: :class:`~fednovelty.federated.core.learners.LearnerRounds`)
or, under the client's differential-privacy policy, by its own DP-SGD; its server half
averages the returned copies (row-weighted, or robustly) and records the round. A reply
(:func:`model_reply`) carries the trained models, the client's row count and loss; its
private form (:data:`MODEL_PARTS`) withholds the last two.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fednovelty.federated.clustered.cam_models import (
    ModelLayout,
    box_rows,
    linear_vector,
    mean_losses,
    unnamed,
)
from fednovelty.federated.clustered.cam_private import private_models
from fednovelty.federated.clustered.cam_settings import ClusteredConfig, ClusteredState
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    round_seed,
    skipped_reply,
)
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec
from fednovelty.federated.core.learners import ClientRound, LearnerRounds, SGDTask, local_sgd_many
from fednovelty.federated.core.steps import Step
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.noise import NoiseSource
from fednovelty.federated.trust.reply_form import Shape, learner_count
from fednovelty.federated.trust.robust import robust_average_params
from fednovelty.federated.trust.value_checks import check_positive_rows

__all__ = [
    "CAM_KINDS",
    "CLUSTER_KIND",
    "ENSEMBLE_KIND",
    "KEPT",
    "MODEL_PARTS",
    "MODEL_REPLIES",
    "WARMUP_GLOBAL_KIND",
    "WARMUP_LOCAL_KIND",
    "ModelStep",
    "model_reply",
    "private_model_reply",
    "trained_reply",
]

#: the message kinds of the clustered algorithms' rounds.
ENSEMBLE_KIND = "cam_ensemble"
CLUSTER_KIND = "cam_cluster"
WARMUP_GLOBAL_KIND = "cam_warmup_global"
WARMUP_LOCAL_KIND = "cam_warmup_local"
CAM_KINDS: tuple[str, ...] = (ENSEMBLE_KIND, CLUSTER_KIND, WARMUP_GLOBAL_KIND, WARMUP_LOCAL_KIND)
#: where a k-means client keeps the model it sent last (``ClientContext.state``).
KEPT = "cam.model."


# ----------------------------------------------------------------------------- replies
def model_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A clustered round's reply: the models it trained, each of the broadcast's shapes
    (``cam_ensemble``: every member ``learner.{m}.*``; ``cam_cluster`` and
    ``cam_warmup_local``: one cluster model ``cluster.*`` shaped as ``learner.0.*``; the
    global model ``global.*`` where the round broadcast it), its row count and its loss."""
    shapes: dict[str, Shape] = {"n_samples": (), "loss": ()}
    for name, tensor in broadcast.tensors.items():
        if name.startswith("global.") or (
            broadcast.kind == ENSEMBLE_KIND and name.startswith("learner.")
        ):
            shapes[name] = tuple(tensor.shape)
        elif broadcast.kind != ENSEMBLE_KIND and name.startswith("learner.0."):
            shapes["cluster." + name.removeprefix("learner.0.")] = tuple(tensor.shape)
    return shapes


def check_cluster_index(reply: Message, broadcast: Message) -> None:
    """A ``cam_cluster`` reply names one of the broadcast's clusters."""
    cluster, k = reply.scalars.get("cluster"), learner_count(broadcast)
    if isinstance(cluster, bool) or not isinstance(cluster, int) or not 0 <= cluster < k:
        raise InvalidReplyError(
            f"scalar 'cluster' must be a cluster index in [0, {k}); got {cluster!r}."
        )


#: the private form of a model reply: the models trained by the client's DP-SGD; the row
#: count (the server averages with equal weights) and the mean loss (unbounded) withheld.
MODEL_PARTS: dict[str, str] = {
    "n_samples": "withheld",
    "loss": "withheld",
    "learner.": "dp_sgd",
    "cluster.": "dp_sgd",
    "global.": "dp_sgd",
}


def _model_spec(kind: str, *checks) -> ReplySpec:
    """A model reply of ``kind``: trained models (backed as models), row count and loss;
    under differential privacy its parts (:data:`MODEL_PARTS`)."""
    return ReplySpec(
        kind,
        shapes=model_shapes,
        checks=(check_positive_rows, *checks),
        backing={
            "n_samples": "client",
            "loss": "client",
            "learner.": "model",
            "cluster.": "model",
            "global.": "model",
        },
        private="parts",
        private_parts=MODEL_PARTS,
    )


#: the replies of the clustered steps, by kind.
MODEL_REPLIES: dict[str, ReplySpec] = {
    ENSEMBLE_KIND: _model_spec(ENSEMBLE_KIND),
    WARMUP_GLOBAL_KIND: _model_spec(WARMUP_GLOBAL_KIND),
    WARMUP_LOCAL_KIND: _model_spec(WARMUP_LOCAL_KIND),
    CLUSTER_KIND: _model_spec(CLUSTER_KIND, check_cluster_index),
}


def model_reply(
    kind: str, X: Tensor, loss: Tensor, tensors: dict[str, Tensor], **scalars
) -> Message:
    """A reply of models ``tensors`` trained on all the client's rows ``X``, with their row
    count and the mean ``loss``; ``scalars`` as given."""
    tensors = {name: value.clone() for name, value in tensors.items()}
    tensors["n_samples"] = torch.tensor(float(X.shape[0]), dtype=X.dtype)
    tensors["loss"] = loss.detach().to(X.dtype).reshape(())
    return Message(kind, tensors, scalars, backing=client_backing(tensors, X.shape[0]))


def private_model_reply(
    kind: str, X: Tensor, tensors: dict[str, Tensor], context: ClientContext, **scalars
) -> Message:
    """A reply of models trained by the client's DP-SGD, stating its steps; the loss is
    not computed (the gate withholds it, and the row count)."""
    steps = context.terms.private.dp_sgd.steps
    return model_reply(kind, X, X.new_zeros(()), tensors, dp_sgd_steps=steps, **scalars)


def trained_reply(
    kind: str,
    X: Tensor,
    tensors: dict[str, Tensor],
    losses: Tensor | None,
    context: ClientContext,
) -> Message:
    """The reply of models ``tensors`` that :meth:`ModelStep.trained` trained: with the mean
    of their ``losses`` (M,) (:func:`model_reply`), or, trained by the client's DP-SGD
    (``losses`` ``None``), in private form (:func:`private_model_reply`)."""
    if losses is None:
        return private_model_reply(kind, X, tensors, context)
    return model_reply(kind, X, losses.mean(), tensors)


# ----------------------------------------------------------------------------- the base
class ModelStep(LearnerRounds, Step):
    """What the clustered steps share: the settings, the models' layout, the local training,
    the server's averages and the round's record.

    Attributes:
        config: the run's settings; layout: its models' :class:`ModelLayout`.
        additive: whether the method adds a global model to the cluster models (Eq. 1).
        noisy_choices: the noisy cluster choices a client makes in one private round (each
            one Gaussian mechanism of multiplier ``HISTOGRAM_SHARE * z``).
    """

    labelled = True
    noisy_choices: ClassVar[int] = 0

    def __init__(self, config: ClusteredConfig, layout: ModelLayout, additive: bool) -> None:
        self.config = config
        self.layout = layout
        self.additive = additive

    @property
    def template(self) -> nn.Module:
        return self.layout.template

    @property
    def names(self) -> list[str]:
        return self.layout.names

    def round_message(self, state: ClusteredState, tensors: dict[str, Tensor]) -> Message:
        """The message of the step's round: the models ``tensors`` and the round's seed."""
        return Message(self.kinds[0], tensors, {"seed": round_seed(self.config, state)})

    # ------------------------------------------------------------------ client half
    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        """A skipped reply when the client releases nothing this round (:meth:`refusal`),
        else :meth:`answer` on its rows, labels and the broadcast tensors."""
        X, y = data
        refused = self.refusal(self.kinds[0], X, context)
        if refused is not None:
            return refused
        return (yield from self.answer(X, y, self.received(message, X), message, context))

    def answer(
        self, X: Tensor, y: Tensor, t: dict[str, Tensor], message: Message, context: ClientContext
    ) -> ClientRound:
        """The client half of a round the client answers: rows ``X`` (n, d), labels ``y``
        (n,) and the broadcast tensors ``t`` on their device and dtype."""
        raise NotImplementedError

    def trained(
        self,
        starts: list[dict[str, Tensor]],
        X: Tensor,
        y: Tensor,
        message: Message,
        context: ClientContext,
    ) -> Generator[list[SGDTask], list[dict[str, Tensor]], tuple[list, Tensor | None]]:
        """The models ``starts`` trained on ``(X, y)`` (``yield from`` it in a client
        round), and their mean losses (M,) before training: under the client's
        differential-privacy policy all together by its own DP-SGD (losses ``None``: not
        computed), else each by the run's local SGD from the round's seed."""
        if context.terms.private is not None:
            generator = self.private_generator(context)
            return self.private_train(self.template, starts, X, y, context, generator), None
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        losses = mean_losses(self.template, starts, X, y)
        trained = yield [self.task(start, X, y, generator) for start in starts]
        return trained, losses

    def task(
        self,
        start: dict[str, Tensor],
        X: Tensor,
        y: Tensor,
        generator: torch.Generator,
        offset: Tensor | None = None,
        mu_prox: float = 0.0,
    ) -> SGDTask:
        """One model's local training from ``start`` on ``(X, y)`` (every row weight 1),
        ``offset`` logits added, ``mu_prox`` pulling it towards ``start``; yielded by a
        client round and trained with the other clients' (:meth:`train_many`)."""
        return SGDTask(start, X, y, None, generator, offset, mu_prox)

    def train_many(self, tasks: list[SGDTask]) -> list[dict[str, Tensor]]:
        config = self.config
        return local_sgd_many(
            self.template,
            tasks,
            steps=config.local_steps,
            learning_rate=config.learning_rate,
            batch_size=config.batch_size,
            optimizer=config.optimizer,
            momentum=config.momentum,
        )

    def rows(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        """The client's rows in the public box's units when the run has ``bounds`` (the
        chain then clips them under a differential-privacy policy)."""
        bounds = self.config.bounds
        return X if bounds is None else box_rows(X, bounds)

    def refusal(self, kind: str, X: Tensor, context: ClientContext) -> Message | None:
        """A skipped reply when the client releases nothing this round: fewer rows than its
        floor, or a differential-privacy policy without DP-SGD (its models leave only
        trained by it); else ``None``."""
        terms = context.terms
        if not terms.releases(X.shape[0]):
            return skipped_reply(kind, terms.below_floor)
        if terms.private is not None and terms.private.dp_sgd is None:
            return skipped_reply(kind, "models leave a client under DP only trained by DP-SGD")
        return None

    def private_generator(self, context: ClientContext) -> NoiseSource:
        """The draws of a private round's mechanisms (noisy choice, DP-SGD): fresh OS
        entropy of the client's own (:func:`~fednovelty.federated.trust.dp.release_noise`), never
        the broadcast's seed."""
        return context.terms.private.noise()

    def private_train(
        self,
        template: nn.Module,
        starts: Sequence[dict[str, Tensor]],
        X: Tensor,
        y: Tensor,
        context: ClientContext,
        generator: torch.Generator,
        mu_prox: float = 0.0,
    ) -> list[dict[str, Tensor]]:
        """The models ``starts`` trained together by the client's own DP-SGD
        (:func:`~fednovelty.federated.clustered.cam_private.private_models`, with the run's
        optimiser settings)."""
        config = self.config
        return private_models(
            template,
            starts,
            X,
            y,
            context.terms.private.dp_sgd,
            generator,
            learning_rate=config.learning_rate,
            optimizer=config.optimizer,
            momentum=config.momentum,
            mu_prox=mu_prox,
        )

    def received(self, message: Message, X: Tensor) -> dict[str, Tensor]:
        return {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}

    # ------------------------------------------------------------------ server half
    def weights(self, replies: dict[int, Message], like: Tensor) -> Tensor:
        """Each reply's weight in the server's averages, (n_replies,): its row count, or 1
        under ``dp_mode`` (the row count is withheld; the models are DP-SGD's)."""
        if self.config.private:
            return torch.ones(len(replies), dtype=like.dtype, device=like.device)
        return torch.stack([r.tensors["n_samples"] for r in replies.values()]).to(like)

    @property
    def robust(self) -> tuple[str, float]:
        """``(aggregation, trim)`` of the config (:mod:`fednovelty.federated.trust.robust`)."""
        return self.config.aggregation, self.config.trim

    def average(
        self, current: dict[str, Tensor], copies: list[dict[str, Tensor]], weights: Tensor
    ) -> dict[str, Tensor]:
        """A model from the clients' copies: the row-weighted mean, or the coordinate-wise
        trimmed mean or median of the copies with positive weight (``aggregation``)."""
        return robust_average_params(current, copies, weights, *self.robust)

    def finished_after(self, state: ClusteredState, last: int) -> bool:
        """Whether the round being folded (number ``state.rounds + 1``) is round ``last``."""
        return state.rounds + 1 >= last

    def reseed(self, state: ClusteredState, replies: dict[int, Message]) -> int:
        """``empty_clusters="reseed"``: each cluster without clients gets the released client
        model farthest from its own cluster's model (each used once); returns how many."""
        config = self.config
        if config.empty_clusters != "reseed" or not state.client_clusters:
            return 0
        sizes = [0] * config.n_clusters
        for cluster in state.client_clusters.values():
            sizes[cluster] += 1
        empty = [k for k, size in enumerate(sizes) if size == 0]
        if not empty:
            return 0
        fc = self.layout.linear_names
        models = [unnamed("cluster.", r.tensors, self.names) for r in replies.values()]
        like = state.cluster_models[0][fc[0]]
        vectors = torch.stack([linear_vector(p, fc) for p in models]).to(like)
        own = torch.stack(
            [linear_vector(state.cluster_models[state.client_clusters[c]], fc) for c in replies]
        )
        far = (vectors - own).square().sum(1)
        order = sorted(range(len(models)), key=lambda i: (-float(far[i]), i))
        for k, index in zip(empty, order, strict=False):
            state.cluster_models[k] = {n: v.to(like) for n, v in models[index].items()}
        return min(len(empty), len(order))

    def record(
        self, state: ClusteredState, replies: dict[int, Message], reseeded: int = 0
    ) -> dict[str, Any]:
        """Append the round's cluster sizes, re-seeds and loss (NaN under ``dp_mode``:
        withheld); the round's metrics."""
        sizes = [0] * self.config.n_clusters
        for cluster in state.client_clusters.values():
            sizes[cluster] += 1
        state.cluster_sizes.append(sizes)
        state.reseeded.append(reseeded)
        metrics = {
            "phase": self.kinds[0],
            "n_empty": sum(size == 0 for size in sizes) if state.client_clusters else 0,
            "reseeded": reseeded,
        }
        if self.config.private:
            state.losses.append(math.nan)
            return metrics
        n = torch.stack([r.tensors["n_samples"].double().cpu() for r in replies.values()])
        loss = torch.stack([r.tensors["loss"].double().cpu() for r in replies.values()])
        state.losses.append(float((n * loss).sum() / n.sum()))
        return {**metrics, "loss": state.losses[-1]}
