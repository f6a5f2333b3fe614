"""The algorithm shared by VGM2 and its baselines: :class:`EncoderAlgorithm`.

It holds the encoder and head templates and their initial weights (the same on every
client and the server), chains its method's step (``step_class``, one ``vgm2`` round kind:
:mod:`~fednovelty.federated.bayesian.vgm2_step`), reads a client's data as ``(X, y)`` pairs
and predicts by a network's softmax. Each method is a registered subclass with its own
``config_class`` (:mod:`~fednovelty.federated.bayesian.vgm2`, ``vgm2_local``,
``vgm2_fedavg``, ``vgm2_prototype``); the family by name is
:data:`~fednovelty.federated.bayesian.vgm2_methods.VGM2_ALGORITHMS`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fednovelty.federated.bayesian.vgm2_networks import (
    embed,
    encoder_template,
    head_template,
    unprefixed,
)
from fednovelty.federated.bayesian.vgm2_settings import ENCODER, HEAD, EncoderSettings, VGM2State
from fednovelty.federated.bayesian.vgm2_step import EncoderStep
from fednovelty.federated.core.learners import initial_parameters, logits
from fednovelty.federated.core.steps import ChainedAlgorithm

__all__ = ["EncoderAlgorithm"]


class EncoderAlgorithm(ChainedAlgorithm):
    """A method of the VGM2 family (module docstring): ``Method(n_features, n_classes,
    **settings)`` with the settings of its ``config_class``, or
    ``Method.from_config(config)``. Not registered itself (no ``config_class``)."""

    labelled = True
    #: the method's round (a subclass of :class:`EncoderStep`).
    step_class: ClassVar[type[EncoderStep]] = EncoderStep

    def __init__(self, n_features: int, n_classes: int, **settings: Any):
        self._setup(self.config_class(n_features=n_features, n_classes=n_classes, **settings))

    def _setup(self, config: EncoderSettings) -> None:
        super()._setup(config)
        self.encoder = encoder_template(config)
        self.head = head_template(config)
        self._initial = initial_parameters(
            lambda: nn.ModuleDict(
                {"encoder": encoder_template(config), "head": head_template(config)}
            ),
            1,
            config.random_state,
        )[0]
        self._chain([self.step_class(self)])

    def initial_encoder(self) -> dict[str, Tensor]:
        """The encoder's initial weights (the same on every client and the server)."""
        return {k: v.clone() for k, v in unprefixed("encoder.", self._initial).items()}

    def initial_head(self) -> dict[str, Tensor]:
        """The head's initial weights."""
        return {k: v.clone() for k, v in unprefixed("head.", self._initial).items()}

    def personal_networks(
        self, client_state: dict[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """A client's encoder and head as its kept state ``client_state`` holds them, or the
        initial weights for a client never trained."""
        encoder = unprefixed(ENCODER, client_state) or self.initial_encoder()
        head = unprefixed(HEAD, client_state) or self.initial_head()
        return encoder, head

    def new_state(self) -> VGM2State:
        return VGM2State()

    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor]]:
        if not isinstance(data, tuple | list) or len(data) != 2:
            raise ValueError(f"VGM2 clients hold (X, y) pairs; got {type(data).__name__}.")
        X, y = data
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"client data rows disagree: X has {X.shape[0]}, y {y.shape[0]}.")
        return X, (y,)

    def predicting_networks(
        self, client_state: dict[str, Tensor], state: VGM2State
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """The encoder and head a client predicts with: its personal ones, or the initial
        weights for a client never trained (:meth:`personal_networks`)."""
        return self.personal_networks(client_state)

    def client_proba(
        self,
        client_state: dict[str, Tensor],
        state: VGM2State,
        X: Tensor,
        reference: tuple[Tensor, Tensor] | None = None,
        rule: str | None = None,
    ) -> Tensor:
        """Class probabilities (n, n_classes) of rows ``X`` for a client whose kept state is
        ``client_state`` (``{}``: never trained): the softmax of the network of
        :meth:`predicting_networks`. ``reference`` and ``rule`` are VGM2's (its override)."""
        encoder, head = self.predicting_networks(client_state, state)
        encoder = {k: v.to(X) for k, v in encoder.items()}
        head = {k: v.to(X) for k, v in head.items()}
        with torch.no_grad():
            Z = embed(self.encoder, encoder, X)
            return torch.softmax(logits(self.head, head, Z), dim=1)
