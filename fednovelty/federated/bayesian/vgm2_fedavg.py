"""VGM2's FedAvg baseline (McMahan et al.): the family's encoder and a class head trained
from the global network on each sampled client and averaged by the server, by rows.

The server's average may be robust (``robust_aggregation``: the coordinate-wise trimmed mean
or median of the clients' copies, :func:`~fednovelty.federated.trust.robust.
robust_average_params`); predictions use the global network. Under a client's
differential-privacy policy with DP-SGD settings the network trains by DP-SGD on the
cross-entropy (:func:`private_classifier`) and the server averages with equal weights. The
round is the family's (:class:`~fednovelty.federated.bayesian.vgm2_step.EncoderStep`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fednovelty.federated.bayesian.vgm2_algorithm import EncoderAlgorithm
from fednovelty.federated.bayesian.vgm2_networks import (
    Classifier,
    embed,
    prefixed,
    private_adam,
    train_classifier,
    unprefixed,
)
from fednovelty.federated.bayesian.vgm2_settings import EncoderSettings, VGM2State
from fednovelty.federated.bayesian.vgm2_step import EncoderStep, LocalUpdate
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.config import AGGREGATIONS, settings_dataclass
from fednovelty.federated.trust.dp_sgd import DPSGDSettings
from fednovelty.federated.trust.robust import robust_average_params

__all__ = ["VGM2FedAvg", "VGM2FedAvgConfig", "VGM2FedAvgStep", "private_classifier"]


@settings_dataclass
class VGM2FedAvgConfig(EncoderSettings):
    """Settings of the FedAvg baseline (:class:`VGM2FedAvg`): the family's
    (:class:`~fednovelty.federated.bayesian.vgm2_settings.EncoderSettings`), with every
    robust aggregation (``"sum"``, ``"trimmed"``, ``"median"``) of the encoder and head."""

    METHOD = "fedavg"
    ROBUST_CHOICES = AGGREGATIONS


def network_tensors(encoder: dict[str, Tensor], head: dict[str, Tensor]) -> dict[str, Tensor]:
    """An encoder's and a head's parameters under one set of names (``encoder.*``,
    ``head.*``): a round's broadcast, a reply and DP-SGD's :class:`Classifier` all use them."""
    return {**prefixed("encoder.", encoder), **prefixed("head.", head)}


def private_classifier(
    templates: tuple[nn.Module, nn.Module],
    config: EncoderSettings,
    encoder: dict[str, Tensor],
    head: dict[str, Tensor],
    X: Tensor,
    y: Tensor,
    settings: DPSGDSettings,
    generator: torch.Generator,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """FedAvg's local training under DP-SGD (``settings``): the cross-entropy of
    :class:`~fednovelty.federated.bayesian.vgm2_networks.Classifier` (``templates``: the
    encoder's and the head's) by
    :func:`~fednovelty.federated.bayesian.vgm2_networks.private_adam` (DP-SGD with Adam at
    ``learning_rate``; ``train_encoder=False``: the head alone on the frozen
    encoder's embeddings). Returns the encoder and the head."""
    encoder_t, head_t = templates
    if config.train_encoder:
        template, start, rows = Classifier(encoder_t, head_t), network_tensors(encoder, head), X
    else:
        with torch.no_grad():
            rows = embed(encoder_t, encoder, X)
        template, start = head_t, head
    trained = private_adam(template, start, rows, y, config, settings, generator)
    if not config.train_encoder:
        return encoder, trained
    return unprefixed("encoder.", trained), unprefixed("head.", trained)


class VGM2FedAvgStep(EncoderStep):
    """The FedAvg baseline's round: the global network goes out, each client's trained copy
    comes back under the broadcast's names and the server averages them."""

    private_training = True
    keeps_networks = False  # the client's copy is the next round's global network's input

    def round_tensors(self, state: VGM2State) -> dict[str, Tensor]:
        return network_tensors(state.global_encoder, state.global_head)

    def reply_tensors(self, broadcast: Message) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in broadcast.tensors.items()}

    def fold(self, state: VGM2State, replies: dict[int, Message], n: Tensor) -> None:
        like = next(iter(state.global_encoder.values()))
        weights = n.to(like)
        encoders = [unprefixed("encoder.", r.tensors) for r in replies.values()]
        heads = [unprefixed("head.", r.tensors) for r in replies.values()]
        robust = (self.config.robust_aggregation, self.config.trim)
        state.global_encoder = robust_average_params(
            state.global_encoder, encoders, weights, *robust
        )
        state.global_head = robust_average_params(state.global_head, heads, weights, *robust)

    def start_networks(self, X, message, kept):
        """The broadcast global network."""
        encoder = {k: v.to(X) for k, v in unprefixed("encoder.", message.tensors).items()}
        head = {k: v.to(X) for k, v in unprefixed("head.", message.tensors).items()}
        return encoder, head

    def train(self, X, y, message, kept, networks, generator) -> LocalUpdate:
        encoder, head = networks
        templates = (self.algorithm.encoder, self.algorithm.head)
        encoder, head, loss = train_classifier(
            templates, self.config, encoder, head, X, y, generator
        )
        tensors = network_tensors(encoder, head)
        return LocalUpdate(encoder, head, tensors, loss)

    def train_private(
        self, X, y, message, kept, networks, settings: DPSGDSettings, generator
    ) -> LocalUpdate:
        encoder, head = networks
        templates = (self.algorithm.encoder, self.algorithm.head)
        encoder, head = private_classifier(
            templates, self.config, encoder, head, X, y, settings, generator
        )
        tensors = network_tensors(encoder, head)
        return LocalUpdate(encoder, head, tensors)


class VGM2FedAvg(EncoderAlgorithm):
    """The FedAvg baseline (module docstring): ``VGM2FedAvg(n_features, n_classes,
    **settings)`` with the settings of :class:`VGM2FedAvgConfig`. The state's
    ``global_encoder`` and ``global_head`` start at the initial weights; every client
    predicts with them."""

    config_class = VGM2FedAvgConfig
    step_class = VGM2FedAvgStep

    def new_state(self) -> VGM2State:
        return VGM2State(global_encoder=self.initial_encoder(), global_head=self.initial_head())

    def predicting_networks(self, client_state, state):
        """The global network (the same for every client)."""
        return state.global_encoder, state.global_head
