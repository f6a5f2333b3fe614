"""The settings and the server state shared by the Fed-CAM paper's classification methods.

:class:`ClusteredConfig` holds every setting of the five methods (the paper's defaults);
each method's own config (``IFCAConfig``, ... beside its algorithm) narrows it by one
class-level rule, :class:`WarmupRule`: how many warm-up rounds the method may run and what
``warmup_rounds=None`` means. :class:`ClusteredState` is the server's state of a run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from fednovelty.federated.core.config import (
    RobustSettings,
    TorchSettings,
    at_least,
    settings_dataclass,
)
from fednovelty.federated.core.learners import OPTIMIZERS, LearnerFactory, as_learner, mlp_learner
from fednovelty.federated.init.settings import PrivateSettings
from fednovelty.federated.init.units import check_bounds

__all__ = [
    "CLUSTER_AVERAGES",
    "EMPTY_CLUSTER_RULES",
    "WARMUP_SHARE",
    "ClusteredConfig",
    "ClusteredState",
    "WarmupRule",
]

#: How the server moves a cluster model towards its clients' copies (``cluster_average``).
CLUSTER_AVERAGES: tuple[str, ...] = ("cluster", "global")
#: What becomes of a cluster that no client joined (``empty_clusters``).
EMPTY_CLUSTER_RULES: tuple[str, ...] = ("keep", "reseed")
#: The share of ``rounds`` a CAM method warms up by default (the paper: 30 of 100).
WARMUP_SHARE = 0.3


@dataclass(frozen=True)
class WarmupRule:
    """The warm-up a method runs (Alg. 1), as its config declares it (``WARMUP``).

    Attributes:
        share: the share of ``rounds`` that ``warmup_rounds=None`` warms up (rounded).
        least: the fewest warm-up rounds the method runs (the default too).
        reason: why it needs ``least`` rounds (named in the error).
    """

    share: float = 0.0
    least: int = 0
    reason: str = ""

    def default(self, rounds: int) -> int:
        """The warm-up of ``warmup_rounds=None``: ``max(round(share * rounds), least)``,
        at most ``rounds``."""
        return min(int(max(round(self.share * rounds), self.least)), rounds)


@settings_dataclass
class ClusteredConfig(PrivateSettings, RobustSettings, TorchSettings):
    """Settings of the Fed-CAM paper's classification methods
    (:class:`~fednovelty.federated.clustered.cam_algorithm.ClusteredAlgorithm`); the
    defaults are the paper's (Sec. 5: 100 rounds of which 30 warm-up, 10 local steps of SGD
    with learning rate 0.001, momentum 0.9 and batch 32). Each method's config narrows it by
    its ``WARMUP`` rule (:class:`WarmupRule`; ``None``: the method has no warm-up).

    Attributes:
        n_features: width of the clients' rows (the models are built before any reply).
        n_classes: number of label classes, labels 0..n_classes-1 (>= 2).
        n_clusters: K cluster models (FedAvg+: ensemble members), >= 1.
        rounds: communication rounds in all, warm-up included (>= 1).
        warmup_rounds: the CAM warm-up (Alg. 1): IFCA-CAM runs this many rounds of FedAvg
            on the global model alone; FeSEM and FeSEM-CAM this many rounds of local
            training only before their first k-means (at least 1: k-means needs trained
            client models). ``None``: the method's default, ``round(0.3 * rounds)`` for the
            CAM methods (30 of 100), 1 for FeSEM, 0 for IFCA and FedAvg+ (which have no
            warm-up); the config holds the number.
        learner_factory: ``(n_features, n_classes) -> nn.Module`` (JSON: ``"learner"``,
            ``"linear"``, ``"mlp"`` or ``"cnn"``); every model (global, cluster, member) is
            one.
        local_steps: mini-batch steps of each local training per round (>= 1).
        learning_rate, momentum, batch_size, optimizer: the local training (``"sgd"`` with
            heavy-ball ``momentum``, or ``"adam"``).
        kmeans_reg: FeSEM's lambda (Eq. 12-13): proximal pull of a client's model towards
            its cluster's model in local training (>= 0; the paper picks it from 0.001, 0.01,
            0.1).
        kmeans_iter: most Lloyd iterations of the server's k-means each round (>= 1).
        cluster_average: ``"cluster"``: a cluster model becomes the row-weighted mean of its
            clients' copies (IFCA's and FeSEM's rule, Eq. 11); ``"global"``: Eq. 6, each
            copy weighted by its rows over all the round's rows and the rest kept from the
            current model.
        aggregation, trim, client_weight_cap: the robust options (:class:`RobustSettings`):
            every model the server averages (global, cluster, ensemble member, FeSEM's
            k-means centres) becomes the coordinate-wise trimmed mean (``"trimmed"``) or
            median (``"median"``) of its clients' copies instead of their row-weighted mean.
        empty_clusters: ``"keep"``: a cluster no client joined keeps its model and may win
            clients back (the paper's methods as written; collapse stays visible);
            ``"reseed"``: its model is replaced by the released client model farthest from
            its own cluster's model.
        bounds: public per-feature bounds ``(low, high)`` (``None``: none): every client
            maps its rows to ``[-1, 1]`` per feature before its models see them, and so must
            predictions (:func:`~fednovelty.federated.clustered.cam_models.model_rows`); what
            a private run needs, since its rows are clipped to ``dp_clip`` around the origin.
        dp_mode, dp_noise_multiplier, dp_clip: what the server knows of its clients'
            differential-privacy policy (:class:`.init.settings.PrivateSettings`;
            ``dp_mode`` set: the clients send ``"parts"`` replies, averaged with equal
            weights, and no loss is recorded). Every mechanism of a private round runs on the
            client, so the mode changes nothing else.
        dp_loss_clip: the public bound ``L`` each row's cross-entropy is clipped to in a
            private min-loss choice (IFCA, IFCA-CAM; the noise scales with it, so it sets
            the choice's accuracy, not its privacy); ``None``: ``2 log(n_classes)``, twice
            the loss of a uniform prediction (clipping at the uniform loss itself hid the
            gap between two clusters' models on a two-class task).
        random_state: integer seed (initial models, batches, k-means++).
        dtype, device: of the models, on the server and the clients.
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {"learner_factory": "learner"}
    #: the method's warm-up (``None``: it has none, ``warmup_rounds`` must be 0 or None).
    WARMUP: ClassVar[WarmupRule | None] = None

    n_features: int
    n_classes: int
    n_clusters: int = 5
    rounds: int = 100
    warmup_rounds: int | None = None
    learner_factory: LearnerFactory = mlp_learner
    local_steps: int = 10
    learning_rate: float = 0.001
    momentum: float = 0.9
    batch_size: int = 32
    optimizer: str = "sgd"
    kmeans_reg: float = 0.01
    kmeans_iter: int = 10
    cluster_average: str = "cluster"
    empty_clusters: str = "keep"
    bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    dp_loss_clip: float | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low in (
            ("n_features", 1),
            ("n_classes", 2),
            ("n_clusters", 1),
            ("rounds", 1),
            ("local_steps", 1),
            ("batch_size", 1),
            ("kmeans_iter", 1),
        ):
            value = at_least(name, getattr(self, name), low)
            if int(value) != float(value):
                raise ValueError(f"{name} must be an integer, got {value!r}.")
            self._set(name, int(value))
        for name in ("learning_rate", "momentum", "kmeans_reg"):
            self._set(name, float(at_least(name, getattr(self, name), 0)))
        if self.momentum >= 1:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum!r}.")
        for name, choices in (
            ("optimizer", tuple(OPTIMIZERS)),
            ("cluster_average", CLUSTER_AVERAGES),
            ("empty_clusters", EMPTY_CLUSTER_RULES),
        ):
            self._check_choice(name, choices)
        self._set("learner_factory", as_learner(self.learner_factory))
        self._set("warmup_rounds", self._checked_warmup())
        self._set("bounds", check_bounds(self.bounds))
        if self.bounds is not None and len(self.bounds[0]) != self.n_features:
            raise ValueError(
                f"bounds give {len(self.bounds[0])} features; the rows have "
                f"n_features={self.n_features}."
            )
        clip = self.dp_loss_clip
        clip = 2 * math.log(self.n_classes) if clip is None else float(clip)
        if not (math.isfinite(clip) and clip > 0):
            raise ValueError(
                f"dp_loss_clip must be a finite number > 0 or None; got {self.dp_loss_clip!r}."
            )
        self._set("dp_loss_clip", clip)

    def _checked_warmup(self) -> int:
        """``warmup_rounds`` under the method's ``WARMUP`` rule (``None``: its default)."""
        rule, value = self.WARMUP, self.warmup_rounds
        if value is None:
            return 0 if rule is None else rule.default(self.rounds)
        value = int(at_least("warmup_rounds", value, 0))
        if value > self.rounds:
            raise ValueError(
                f"warmup_rounds={value} exceeds rounds={self.rounds} (rounds counts the "
                "warm-up); raise rounds or lower warmup_rounds."
            )
        owner = type(self).__name__.removesuffix("Config")  # the method's class
        if rule is None and value:
            raise ValueError(
                f"{owner} has no warm-up (Alg. 1 warms up the CAM methods); use "
                "warmup_rounds=0 or None."
            )
        if rule is not None and value < rule.least:
            raise ValueError(f"{owner} {rule.reason}: warmup_rounds must be >= {rule.least}.")
        return value


@dataclass
class ClusteredState:
    """The server's state of a clustered run.

    Attributes:
        phase, rounds: the chain's current kind and counted rounds.
        global_model: the global model's parameters (CAM; unused otherwise).
        cluster_models: K parameter dicts: the cluster models (FedAvg+: the members).
        client_clusters: client id -> its latest cluster (clients heard from).
        cluster_sizes: one list of K client counts per round.
        reseeded: clusters re-seeded in each round (``empty_clusters="reseed"``).
        losses: the round's row-weighted mean training loss of the clients' starting models.
    """

    phase: str = ""
    rounds: int = 0
    global_model: dict[str, Tensor] = field(default_factory=dict)
    cluster_models: list[dict[str, Tensor]] = field(default_factory=list)
    client_clusters: dict[int, int] = field(default_factory=dict)
    cluster_sizes: list[list[int]] = field(default_factory=list)
    reseeded: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
