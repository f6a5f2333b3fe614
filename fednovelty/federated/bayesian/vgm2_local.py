"""VGM2's "Local" baseline: each client trains the family's encoder and a class head on its
own rows only, when it is sampled; nothing but its row count and loss is sent and the server
keeps nothing.

Under a client's differential-privacy policy it trains as usual (its network never leaves
it) and withholds the loss. The round is the family's
(:class:`~fednovelty.federated.bayesian.vgm2_step.EncoderStep`).
"""

from __future__ import annotations

from fednovelty.federated.bayesian.vgm2_algorithm import EncoderAlgorithm
from fednovelty.federated.bayesian.vgm2_networks import train_classifier
from fednovelty.federated.bayesian.vgm2_settings import EncoderSettings
from fednovelty.federated.bayesian.vgm2_step import EncoderStep, LocalUpdate
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["VGM2Local", "VGM2LocalConfig", "VGM2LocalStep"]


@settings_dataclass
class VGM2LocalConfig(EncoderSettings):
    """Settings of the Local baseline (:class:`VGM2Local`): the family's
    (:class:`~fednovelty.federated.bayesian.vgm2_settings.EncoderSettings`); the robust
    options are ``"sum"`` only (nothing is averaged)."""

    METHOD = "local"


class VGM2LocalStep(EncoderStep):
    """The Local baseline's round: cross-entropy on the client's rows; only the row count
    and the loss are sent."""

    def train(self, X, y, message, kept, networks, generator) -> LocalUpdate:
        encoder, head = networks
        templates = (self.algorithm.encoder, self.algorithm.head)
        encoder, head, loss = train_classifier(
            templates, self.config, encoder, head, X, y, generator
        )
        return LocalUpdate(encoder, head, {}, loss)


class VGM2Local(EncoderAlgorithm):
    """The Local baseline (module docstring): ``VGM2Local(n_features, n_classes,
    **settings)`` with the settings of :class:`VGM2LocalConfig`. A client predicts with its
    own network (the initial one if it was never sampled)."""

    config_class = VGM2LocalConfig
    step_class = VGM2LocalStep
