"""VGM2's prototype baseline (FedProto, the VGM2 paper's App. B): personal networks pulled
towards global class prototypes in the embedding, which the server averages.

Each sampled client trains its encoder and head on the cross-entropy plus
``prototype_weight`` times FedProto's ``MSELoss`` between each row's embedding and its class's
global prototype (the mean over rows and coordinates), then sends its class means in the
embedding and its class counts; the server's prototype of a class is the count-weighted mean
of the round's client prototypes (a class absent from the round keeps its last one). It has
no private form: its prototypes are class means of an embedding trained on all the rows.
The round is the family's (:class:`~fednovelty.federated.bayesian.vgm2_step.EncoderStep`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.bayesian.vgm2_algorithm import EncoderAlgorithm
from fednovelty.federated.bayesian.vgm2_networks import embed, train_classifier
from fednovelty.federated.bayesian.vgm2_settings import EncoderSettings, VGM2State
from fednovelty.federated.bayesian.vgm2_step import EncoderStep, LocalUpdate
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["VGM2Prototype", "VGM2PrototypeConfig", "VGM2PrototypeStep", "class_prototypes"]


@settings_dataclass
class VGM2PrototypeConfig(EncoderSettings):
    """Settings of the prototype baseline (:class:`VGM2Prototype`): the family's
    (:class:`~fednovelty.federated.bayesian.vgm2_settings.EncoderSettings`; robust options
    ``"sum"`` only, prototypes are no model updates; no ``dp_mode``) and
    ``prototype_weight``, FedProto's pull towards the global prototypes (>= 0)."""

    METHOD = "prototype"
    NO_PRIVATE_FORM = (
        "VGM2's prototype baseline has no private form (its class means of an embedding "
        "trained on all the rows have no bound); use method='vgm2', 'fedavg' or 'local' "
        "(VGM2, VGM2FedAvg, VGM2Local) with dp_mode, or dp_mode=None."
    )

    prototype_weight: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_weights("prototype_weight")


def class_prototypes(Z: Tensor, y: Tensor, n_classes: int) -> tuple[Tensor, Tensor]:
    """Class means of embeddings ``Z`` (n, d) by labels ``y`` (n,): (n_classes, d) (zeros
    for absent classes) and the counts (n_classes,) in ``Z``'s dtype."""
    counts = torch.bincount(y, minlength=n_classes).to(Z.dtype)
    sums = Z.new_zeros(n_classes, Z.shape[1]).index_add_(0, y, Z)
    return sums / counts.clamp_min(1).unsqueeze(1), counts


class VGM2PrototypeStep(EncoderStep):
    """The prototype baseline's round: the global prototypes go out, each client's class
    prototypes and counts come back, the server averages them per class by counts."""

    no_private_form = (
        "VGM2's prototype baseline has no private form; not released under the "
        "client's differential-privacy policy"
    )
    config: VGM2PrototypeConfig

    def round_tensors(self, state: VGM2State) -> dict[str, Tensor]:
        return {"prototypes": state.prototypes, "prototype_counts": state.prototype_counts}

    def reply_tensors(self, broadcast: Message) -> dict[str, tuple[int, ...]]:
        n_classes = self.config.n_classes
        return {"prototypes": (n_classes, self.config.embedding_dim), "class_counts": (n_classes,)}

    def tensor_problem(self, reply: Message, n: float) -> str | None:
        counts = reply.tensors["class_counts"]
        if bool((counts < 0).any()) or float(counts.sum()) > n * (1 + 1e-6):
            return "class counts negative or above the rows sent"
        return None

    def fold(self, state: VGM2State, replies: dict[int, Message], n: Tensor) -> None:
        counts = torch.stack([r.tensors["class_counts"] for r in replies.values()])
        protos = torch.stack([r.tensors["prototypes"] for r in replies.values()])
        total = counts.sum(0)
        mean = (counts.unsqueeze(-1) * protos).sum(0) / total.clamp_min(1).unsqueeze(1)
        seen = total > 0
        state.prototypes = torch.where(seen.unsqueeze(1), mean, state.prototypes)
        state.prototype_counts = torch.where(seen, total, state.prototype_counts)

    def train(self, X, y, message, kept, networks, generator) -> LocalUpdate:
        """Cross-entropy plus the pull of the rows of classes with a global prototype."""
        protos = message.tensors["prototypes"].to(X)
        counts = message.tensors["prototype_counts"].to(X)
        weight = self.config.prototype_weight

        def pull(Z: Tensor, labels: Tensor) -> Tensor | None:
            if weight <= 0:
                return None
            known = counts[labels] > 0
            if not bool(known.any()):
                return None
            return weight * (Z[known] - protos[labels[known]]).square().mean()

        encoder, head = networks
        templates = (self.algorithm.encoder, self.algorithm.head)
        encoder, head, loss = train_classifier(
            templates, self.config, encoder, head, X, y, generator, pull
        )
        with torch.no_grad():
            Z = embed(self.algorithm.encoder, encoder, X)
        prototypes, class_counts = class_prototypes(Z, y, self.config.n_classes)
        tensors = {"prototypes": prototypes, "class_counts": class_counts}
        return LocalUpdate(encoder, head, tensors, loss)

    def backing(self, tensors: dict[str, Tensor], n_rows: int) -> dict[str, Any]:
        """A class's prototype and count: that class's rows (the gate zeros the classes
        below the floor)."""
        backing = super().backing(tensors, n_rows)
        backing["prototypes"] = backing["class_counts"] = tensors["class_counts"]
        return backing


class VGM2Prototype(EncoderAlgorithm):
    """The prototype baseline (module docstring): ``VGM2Prototype(n_features, n_classes,
    **settings)`` with the settings of :class:`VGM2PrototypeConfig`. The state's prototypes
    start at zero with zero counts (no class has one yet); a client predicts with its own
    network."""

    config_class = VGM2PrototypeConfig
    step_class = VGM2PrototypeStep

    def new_state(self) -> VGM2State:
        config = self.config
        options = {"dtype": config.dtype, "device": config.device}
        return VGM2State(
            prototypes=torch.zeros(config.n_classes, config.embedding_dim, **options),
            prototype_counts=torch.zeros(config.n_classes, **options),
        )
