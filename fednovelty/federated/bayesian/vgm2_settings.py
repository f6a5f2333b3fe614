"""The settings and server state shared by VGM2 and its baselines on one encoder.

:class:`EncoderSettings` holds what every method of the family reads (the encoder and head,
the local training, the robust options and the differential-privacy mode); each method's
config extends it in the method's module (:mod:`~fednovelty.federated.bayesian.vgm2`,
``vgm2_local``, ``vgm2_fedavg``, ``vgm2_prototype``) and states what differs as class
attributes: ``METHOD`` (its name in :data:`~fednovelty.federated.bayesian.vgm2_methods.
VGM2_ALGORITHMS`), ``ROBUST_CHOICES`` (the robust aggregations it has) and ``NO_PRIVATE_FORM``
(why it is refused under ``dp_mode``; ``None``: it has a private form). :class:`VGM2State` is
the server state of every method, and the ``vgm2.*`` keys name what a client keeps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from fednovelty.federated.core.config import (
    TorchSettings,
    at_least,
    check_robust_arguments,
    settings_dataclass,
)
from fednovelty.federated.init.settings import DP_MODES

__all__ = [
    "CONVNET_MIN_SIDE",
    "ENCODER",
    "ENCODERS",
    "GRAPH",
    "HEAD",
    "MARKERS",
    "EncoderSettings",
    "VGM2State",
    "image_side",
]

#: where a client keeps its personal models, markers and graph (``ClientContext.state``).
ENCODER, HEAD, MARKERS, GRAPH = "vgm2.encoder.", "vgm2.head.", "vgm2.markers", "vgm2.graph."
#: the encoders by their settings name (:func:`~fednovelty.federated.bayesian.vgm2_networks.
#: encoder_template`): an MLP on any rows, a small ConvNet on square images.
ENCODERS = ("mlp", "convnet")
#: the smallest image side the ConvNet takes (two 5x5 convolutions, each followed by 2x2
#: pooling, leave one pixel of a 16 x 16 image).
CONVNET_MIN_SIDE = 16


def image_side(n_features: int) -> int | None:
    """The side of square one-channel images flattened to ``n_features = side * side``
    values, or ``None`` when ``n_features`` is no square."""
    side = math.isqrt(max(int(n_features), 0))
    return side if side * side == n_features else None


@settings_dataclass
class EncoderSettings(TorchSettings):
    """Settings every method of the VGM2 family reads (Puppala et al., Sec. 5 fixes rounds
    (100), local epochs (8) and Adam; the other defaults are this package's choice, fixed
    across datasets: ``docs/vgm2.md``).

    Attributes:
        n_features: width of the rows; n_classes: labels 0..n_classes-1 (>= 2).
        embedding_dim: d, the encoder's output width (>= 1).
        hidden: the encoder's hidden width (an MLP ``n_features -> hidden -> d``; the
            ConvNet's dense layer).
        encoder_type: ``"mlp"`` (any rows) or ``"convnet"`` (square one-channel images
            flattened to ``side * side`` features, side >= 16; the VGM2 paper's "small
            ConvNet" for MNIST): :func:`~fednovelty.federated.bayesian.vgm2_networks.
            encoder_template` (``VGM2Classifier``'s ``encoder``; an algorithm's ``encoder``
            is the template module).
        rounds: communication rounds (>= 1); local_epochs: E passes over the rows per round.
        batch_size: rows per step (>= 2).
        learning_rate: Adam's for the networks.
        train_encoder: False freezes the encoder at its initial weights (ablation).
        robust_aggregation, trim, client_weight_cap: the robust options of
            :class:`~fednovelty.federated.core.config.RobustSettings` (``robust_aggregation``
            there ``aggregation``, a name VGM2's config gives the markers' rule): the
            aggregations of ``ROBUST_CHOICES`` (``"sum"`` only unless the method averages
            model updates); the cap applies to every method.
        dp_mode: ``None`` (off) or the clients' differential-privacy mode (one of
            :data:`~fednovelty.federated.init.settings.DP_MODES`): what the server knows of their
            policies. With it set the server expects no loss, averages with equal weights
            (a row count, noisy or exact, is not read) and takes the plain sum only; a
            method with ``NO_PRIVATE_FORM`` is refused.
        random_state: integer seed; dtype, device: of the models.
    """

    #: the method's name in the family's table (``VGM2Classifier(method=...)``).
    METHOD: ClassVar[str] = ""
    #: the robust aggregations the method has (markers and prototypes are no model updates).
    ROBUST_CHOICES: ClassVar[tuple[str, ...]] = ("sum",)
    #: why the method is refused under ``dp_mode`` (``None``: it has a private form).
    NO_PRIVATE_FORM: ClassVar[str | None] = None

    n_features: int
    n_classes: int
    embedding_dim: int = 16
    hidden: int = 128
    encoder_type: str = "mlp"
    rounds: int = 100
    local_epochs: int = 8
    batch_size: int = 64
    learning_rate: float = 1e-3
    train_encoder: bool = True
    robust_aggregation: str = "sum"
    trim: float = 0.1
    client_weight_cap: float | None = None
    dp_mode: str | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_integers(
            ("n_features", 1),
            ("n_classes", 2),
            ("embedding_dim", 1),
            ("hidden", 1),
            ("rounds", 1),
            ("local_epochs", 1),
            ("batch_size", 2),
        )
        self._check_rates("learning_rate")
        self._check_encoder()
        if not isinstance(self.train_encoder, bool):
            raise ValueError(f"train_encoder must be True or False, got {self.train_encoder!r}.")
        robust = check_robust_arguments(
            self.robust_aggregation,
            self.trim,
            self.client_weight_cap,
            self.ROBUST_CHOICES,
            owner=f"VGM2 with method={self.METHOD!r}",
            name="robust_aggregation",
        )
        for name, value in zip(
            ("robust_aggregation", "trim", "client_weight_cap"), robust, strict=True
        ):
            self._set(name, value)
        if self.dp_mode is not None:
            self._check_private()

    def _check_encoder(self) -> None:
        """A ``ValueError`` unless ``encoder_type`` is one of :data:`ENCODERS` and, for the
        ConvNet, ``n_features`` is the square of a side of at least :data:`CONVNET_MIN_SIDE`."""
        self._check_choice("encoder_type", ENCODERS)
        if self.encoder_type != "convnet":
            return
        side = image_side(self.n_features)
        if side is None or side < CONVNET_MIN_SIDE:
            raise ValueError(
                "the ConvNet encoder (VGM2Classifier's encoder='convnet', the algorithm's "
                "encoder_type='convnet') needs square one-channel images flattened to side * "
                f"side features with side >= {CONVNET_MIN_SIDE} (784 for 28 x 28); got "
                f"n_features={self.n_features}"
                + (" (no square)" if side is None else f" ({side} x {side})")
                + ". Use the MLP ('mlp') for other rows, or pad or resize the images to a "
                f"square of side >= {CONVNET_MIN_SIDE}."
            )

    def _check_private(self) -> None:
        """A ``ValueError`` unless ``dp_mode`` is a mode the method can run under."""
        self._check_choice("dp_mode", DP_MODES)
        if self.NO_PRIVATE_FORM is not None:
            raise ValueError(self.NO_PRIVATE_FORM)
        if self.robust_aggregation != "sum" or self.client_weight_cap is not None:
            raise ValueError(
                "with dp_mode the server takes the plain average of DP-SGD models; use "
                "robust_aggregation='sum' and client_weight_cap=None."
            )

    def _check_integers(self, *bounds: tuple[str, int]) -> None:
        """Each named setting as an ``int`` at least its bound, or a ``ValueError`` naming it."""
        for name, low in bounds:
            value = at_least(name, getattr(self, name), low)
            if int(value) != float(value):
                raise ValueError(f"{name} must be an integer, got {value!r}.")
            self._set(name, int(value))

    def _check_weights(self, *names: str) -> None:
        """Each named setting as a ``float`` >= 0, or a ``ValueError`` naming it."""
        for name in names:
            self._set(name, float(at_least(name, getattr(self, name), 0)))

    def _check_rates(self, *names: str) -> None:
        """Each named setting as a ``float`` > 0, or a ``ValueError`` naming it."""
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not float(value) > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}.")
            self._set(name, float(value))

    @property
    def private(self) -> bool:
        """Whether the clients release under differential privacy (``dp_mode`` set)."""
        return self.dp_mode is not None


@dataclass
class VGM2State:
    """The server's state of a run of VGM2 or one of its baselines.

    Attributes:
        phase, rounds: the chain's current kind and counted rounds.
        prior: the Dir-NIG prior ``p_t(M)``, (2, 5, K) (VGM2).
        global_encoder, global_head: FedAvg's network (the FedAvg baseline).
        prototypes: (n_classes, d) global prototypes; prototype_counts: (n_classes,) rows
            behind each (0: none yet) (the prototype baseline).
        losses: the round's row-weighted mean training loss.
        invalid: replies dropped by the server's validation, per round.
    """

    phase: str = ""
    rounds: int = 0
    prior: Tensor | None = None
    global_encoder: dict[str, Tensor] = field(default_factory=dict)
    global_head: dict[str, Tensor] = field(default_factory=dict)
    prototypes: Tensor | None = None
    prototype_counts: Tensor | None = None
    losses: list[float] = field(default_factory=list)
    invalid: list[int] = field(default_factory=list)
