"""Clustered federated classification and Fed-CAM (Ma et al., "Structured federated learning
through clustered additive modeling") (algorithm layer).

Five methods of the paper's Table 1, one algorithm :class:`ClusteredFL` set by
``ClusteredConfig.method``, every model a learner of ``learner_factory`` trained by
:func:`~fednovelty.federated.core.learners.local_sgd` and averaged by
:func:`~fednovelty.federated.core.aggregate.average_params`:

- **FedAvg+**: ``n_clusters`` FedAvg models from different random starts, every client
  training every member; prediction is their soft vote.
- **IFCA** (Ghosh et al. 2020): each client joins the cluster model of least loss on its
  rows, trains it and sends it back; the server averages each cluster's copies.
- **FeSEM** (Xie et al. 2021): the server clusters the clients' models by k-means on their
  parameters; each client trains from its cluster's model, pulled towards it by
  ``kmeans_reg``.
- **IFCA-CAM**, **FeSEM-CAM** (Alg. 1): a global model is added to the cluster models'
  logits, ``F_i(x) = h(x; Theta_g) + f(x; Theta_c(i))``; each round a client trains each
  half on the residual of the other, after a warm-up.

The warm-up, the choices where the paper is silent and the private rounds (under the
client's ``PrivacyPolicy.dp`` and ``dp_sgd``: models by DP-SGD, a cluster picked by
report-noisy-min, row count and loss withheld) are stated on :class:`ClusteredFL`. Client
data is a pair ``(X, y)``; predictions are pure functions of the final
:class:`ClusteredState`: :func:`cluster_log_proba`, :func:`ensemble_proba`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from fednovelty.federated.core.aggregate import average_params, learner_name
from fednovelty.federated.core.base import ClientContext, Message, client_generator, skipped_reply
from fednovelty.federated.core.config import (
    RobustSettings,
    TorchSettings,
    at_least,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.learners import (
    OPTIMIZERS,
    ClientRound,
    LearnerFactory,
    LearnerRounds,
    SGDTask,
    as_learner,
    initial_parameters,
    learner_template,
    local_sgd_many,
    logits,
    mlp_learner,
)
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init import (
    PrivateSettings,
    box_units,
    check_bounds,
    round_seed,
    server_generator,
)
from fednovelty.federated.trust.dp import clip_rows
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, DPSGDSettings, private_sgd
from fednovelty.federated.trust.noise import NoiseSource, add_gaussian, check_source
from fednovelty.federated.trust.privacy import client_backing
from fednovelty.federated.trust.robust import (
    coordinate_median,
    coordinate_trimmed_mean,
    robust_average_learners,
    robust_average_params,
)
from fednovelty.federated.trust.validation import (
    InvalidReplyError,
    Shape,
    check_positive_rows,
    learner_count,
)
from fednovelty.mixture.kmeans import kmeans_plusplus

__all__ = [
    "CAM_KINDS",
    "CLUSTERED_METHODS",
    "AdditivePair",
    "ClusteredConfig",
    "ClusteredFL",
    "ClusteredState",
    "box_rows",
    "clipped_loss_sums",
    "cluster_log_proba",
    "ensemble_proba",
    "linear_vector",
    "mean_losses",
    "model_rows",
    "model_template",
    "nearest_cluster",
    "noisy_cluster_losses",
    "private_models",
]

#: the message kinds of the clustered algorithms' rounds.
ENSEMBLE_KIND = "cam_ensemble"
CLUSTER_KIND = "cam_cluster"
WARMUP_GLOBAL_KIND = "cam_warmup_global"
WARMUP_LOCAL_KIND = "cam_warmup_local"
CAM_KINDS: tuple[str, ...] = (ENSEMBLE_KIND, CLUSTER_KIND, WARMUP_GLOBAL_KIND, WARMUP_LOCAL_KIND)
#: where a k-means client keeps the model it sent last (``ClientContext.state``).
KEPT = "cam.model."


#: The Fed-CAM paper's methods (``ClusteredConfig.method``): name -> (how clients are
#: clustered, whether a global model is added to the cluster models).
CLUSTERED_METHODS: dict[str, tuple[str, bool]] = {
    "FedAvg+": ("ensemble", False),
    "IFCA": ("min_loss", False),
    "FeSEM": ("kmeans", False),
    "IFCA-CAM": ("min_loss", True),
    "FeSEM-CAM": ("kmeans", True),
}
#: How the server moves a cluster model towards its clients' copies (``cluster_average``).
CLUSTER_AVERAGES: tuple[str, ...] = ("cluster", "global")
#: What becomes of a cluster that no client joined (``empty_clusters``).
EMPTY_CLUSTER_RULES: tuple[str, ...] = ("keep", "reseed")
#: The share of ``rounds`` a CAM method warms up by default (the paper: 30 of 100).
WARMUP_SHARE = 0.3


@settings_dataclass
class ClusteredConfig(PrivateSettings, RobustSettings, TorchSettings):
    """Settings of the Fed-CAM paper's classification methods (``ClusteredFL``,
    :mod:`fednovelty.federated.clustered.cam`); the defaults are the paper's (Sec. 5: 100 rounds of
    which 30 warm-up, 10 local steps of SGD with learning rate 0.001, momentum 0.9 and
    batch 32).

    Attributes:
        method: ``"FedAvg+"`` (an ensemble of ``n_clusters`` FedAvg models), ``"IFCA"``
            (min-loss clusters), ``"FeSEM"`` (k-means on client models), ``"IFCA-CAM"`` or
            ``"FeSEM-CAM"`` (either, plus a global model added to the cluster models' logits,
            Eq. 1).
        n_features: width of the clients' rows (the models are built before any reply).
        n_classes: number of label classes, labels 0..n_classes-1 (>= 2).
        n_clusters: K cluster models (FedAvg+: ensemble members), >= 1.
        rounds: communication rounds in all, warm-up included (>= 1).
        warmup_rounds: the CAM warm-up (Alg. 1): IFCA-CAM runs this many rounds of FedAvg
            on the global model alone; FeSEM and FeSEM-CAM this many rounds of local
            training only before their first k-means (at least 1: k-means needs trained
            client models). ``None``: ``round(0.3 * rounds)`` for the CAM methods (30 of
            100), 1 for FeSEM, 0 for IFCA and FedAvg+ (which have no warm-up).
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
            predictions (:func:`model_rows`); what a private run needs, since its rows are
            clipped to ``dp_clip`` around the origin.
        dp_mode, dp_noise_multiplier, dp_clip: what the server knows of its clients'
            differential-privacy policy (:class:`~fednovelty.federated.init.PrivateSettings`;
            ``dp_mode`` set: the clients send ``"parts"`` replies, averaged with equal
            weights, and no loss is recorded). Every mechanism of a private round runs on
            the client (:class:`ClusteredFL`), so the mode changes nothing else.
        dp_loss_clip: the public bound ``L`` each row's cross-entropy is clipped to in a
            private min-loss choice (IFCA, IFCA-CAM; the noise scales with it, so it sets
            the choice's accuracy, not its privacy); ``None``: ``2 log(n_classes)``, twice
            the loss of a uniform prediction (clipping at the uniform loss itself hid the
            gap between two clusters' models on a two-class task).
        random_state: integer seed (initial models, batches, k-means++).
        dtype, device: of the models, on the server and the clients.
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {"learner_factory": "learner"}

    method: str
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
        self._check_choice("method", tuple(CLUSTERED_METHODS))
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

    @property
    def clustering(self) -> str:
        """``"ensemble"`` (FedAvg+), ``"min_loss"`` (IFCA) or ``"kmeans"`` (FeSEM)."""
        return CLUSTERED_METHODS[self.method][0]

    @property
    def additive(self) -> bool:
        """Whether a global model is added to the cluster models (CAM, Eq. 1)."""
        return CLUSTERED_METHODS[self.method][1]

    def _checked_warmup(self) -> int:
        clustering, additive = CLUSTERED_METHODS[self.method]
        value = self.warmup_rounds
        if value is None:
            value = round(WARMUP_SHARE * self.rounds) if additive else 0
            value = max(value, 1) if clustering == "kmeans" else value
            return min(int(value), self.rounds)
        value = int(at_least("warmup_rounds", value, 0))
        if value > self.rounds:
            raise ValueError(
                f"warmup_rounds={value} exceeds rounds={self.rounds} (rounds counts the "
                "warm-up); raise rounds or lower warmup_rounds."
            )
        if clustering == "kmeans" and value < 1:
            raise ValueError(
                f"{self.method} clusters client models by k-means, which needs models trained "
                "first: warmup_rounds must be >= 1 (rounds of local training only)."
            )
        if not additive and clustering != "kmeans" and value:
            raise ValueError(
                f"{self.method} has no warm-up (Alg. 1 warms up the CAM methods); use "
                "warmup_rounds=0 or None."
            )
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


# ----------------------------------------------------------------------------- pure helpers
def model_template(config: ClusteredConfig) -> nn.Module:
    """The module every model of a run is evaluated with (its own initial weights are never
    used, and drawing them leaves torch's global generator as it was)."""
    with torch.random.fork_rng(devices=[]):
        return learner_template(
            config.learner_factory, config.n_features, config.n_classes, config.device, config.dtype
        )


def linear_names(template: nn.Module) -> list[str]:
    """Names of the parameters of ``template``'s ``nn.Linear`` layers (all parameters when
    it has none): the coordinates of FeSEM's distance."""
    names = [
        f"{prefix}.{name}" if prefix else name
        for prefix, module in template.named_modules()
        if isinstance(module, nn.Linear)
        for name, _ in module.named_parameters(recurse=False)
    ]
    return names or [name for name, _ in template.named_parameters()]


def linear_vector(params: dict[str, Tensor], names: Sequence[str]) -> Tensor:
    """The parameters ``names`` of one model flattened into one vector."""
    return torch.cat([params[name].reshape(-1) for name in names])


def nearest_cluster(vectors: Tensor, centres: Tensor) -> Tensor:
    """Index of the nearest centre of each vector, (n_vectors,) from (n_vectors, P) and
    (K, P); ties go to the lowest index. The squared distances are taken centre by centre as
    sums of squared differences, so a client's own computation and the server's agree."""
    distances = torch.stack([(vectors - c).square().sum(1) for c in centres], dim=1)
    return distances.argmin(1)


def mean_losses(
    template: nn.Module,
    models: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    offset: Tensor | None = None,
) -> Tensor:
    """Mean cross-entropy of each model on ``(X, y)`` (logits plus ``offset``), (len(models),)."""
    with torch.no_grad():
        out = []
        for params in models:
            z = logits(template, params, X)
            z = z if offset is None else z + offset
            out.append(nn.functional.cross_entropy(z, y))
        return torch.stack(out)


def cluster_log_proba(
    template: nn.Module, state: ClusteredState, X: Tensor, cluster: int, additive: bool
) -> Tensor:
    """``log p(y | x)`` (n, n_classes) of cluster ``cluster``'s model (plus the global model's
    logits when ``additive``: Eq. 1)."""
    with torch.no_grad():
        z = logits(template, state.cluster_models[cluster], X)
        if additive:
            z = z + logits(template, state.global_model, X)
        return nn.functional.log_softmax(z, dim=1)


def ensemble_proba(template: nn.Module, state: ClusteredState, X: Tensor) -> Tensor:
    """FedAvg+'s soft vote: the members' mean class probabilities, (n, n_classes)."""
    with torch.no_grad():
        probs = [nn.functional.softmax(logits(template, p, X), dim=1) for p in state.cluster_models]
        return torch.stack(probs).mean(0)


def _named(prefix: str, params: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"{prefix}{name}": value for name, value in params.items()}


def _unnamed(prefix: str, tensors: dict[str, Tensor], names: Sequence[str]) -> dict[str, Tensor]:
    return {name: tensors[f"{prefix}{name}"] for name in names}


# ----------------------------------------------------------------------------- private rounds
def box_rows(X: Tensor, bounds: tuple) -> Tensor:
    """Rows (n, d) in the units of the public box ``bounds``: ``[-1, 1]`` per feature."""
    offset, scale = box_units(bounds, X)
    return (X - offset) / scale


def model_rows(X: Tensor, bounds: tuple | None = None, clip: float | None = None) -> Tensor:
    """Rows (n, d) as the models of a run see them: in the units of its public box
    ``bounds`` (``[-1, 1]`` per feature) and clipped to the L2 radius ``clip`` around the
    origin (a private run's ``dp_clip``), as its client halves saw theirs (``X`` itself
    with neither)."""
    if bounds is not None:
        X = box_rows(X, bounds)
    if clip is not None:
        X = clip_rows(X, X.new_zeros(X.shape[1]), float(clip))
    return X


class AdditivePair(nn.Module):
    """One client's additive model (Eq. 1): ``forward(x) = cluster(x) + global(x)``, two
    copies of ``template`` named ``cluster`` and ``global`` (parameters ``cluster.*`` and
    ``global.*``, as a reply names them) holding ``cluster`` and ``glob`` (frozen).

    DP-SGD evaluates it with the parameters of one half given (``functional_call`` with
    ``cluster.*`` alone, or ``global.*`` alone): that half is trained and the other is its
    frozen copy, so one loop trains each half on the residual of the other's broadcast
    model, the paper's parallel (FedSim) update (Eq. 5 and 8).
    """

    def __init__(
        self, template: nn.Module, cluster: dict[str, Tensor], glob: dict[str, Tensor]
    ) -> None:
        super().__init__()
        for prefix, params in (("cluster", cluster), ("global", glob)):
            half = copy.deepcopy(template)
            with torch.no_grad():
                for name, value in half.named_parameters():
                    value.copy_(params[name]).requires_grad_(False)
            self.add_module(prefix, half)

    def forward(self, x: Tensor) -> Tensor:
        return self._modules["cluster"](x) + self._modules["global"](x)


def private_models(
    template: nn.Module,
    starts: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    settings: DPSGDSettings,
    generator: torch.Generator,
    *,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    mu_prox: float = 0.0,
) -> list[dict[str, Tensor]]:
    """The ``M`` models ``starts`` trained on the same rows in one DP-SGD loop
    (:func:`~fednovelty.federated.trust.dp_sgd.private_sgd`: each step's per-row gradients of all
    of them clipped together to ``settings.clip_norm``, one Gaussian mechanism a step) on the
    mean of their cross-entropies, each row weighted ``1 / M`` per model (DP-SGD's weights
    sum to at most 1). With ``"sgd"`` the learning rate is multiplied by ``M``, so that each
    model takes the step of its own loss (the clip then bounds a row's gradients of the
    ``M`` losses together at ``M * clip_norm``); Adam does not see the loss's scale.

    Args:
        template: the module the models are evaluated with (an :class:`AdditivePair` for
            CAM's two halves).
        starts: ``M`` parameter dicts (not modified); X: rows (n, d); y: labels (n,).
        settings, generator: the client's own DP-SGD and private generator.

    Returns:
        ``M`` dicts of trained parameters, named as ``starts``.
    """
    m = len(starts)
    weight = X.new_full((X.shape[0], m), 1.0 / m)
    rate = learning_rate * m if optimizer == "sgd" else learning_rate
    return private_sgd(
        template,
        starts,
        X,
        y,
        weight,
        settings,
        generator,
        learning_rate=rate,
        optimizer=optimizer,
        momentum=momentum,
        mu_prox=mu_prox,
    )


def clipped_loss_sums(
    template: nn.Module,
    models: Sequence[dict[str, Tensor]],
    X: Tensor,
    y: Tensor,
    offset: Tensor | None,
    bound: float,
) -> Tensor:
    """Each model's sum over the rows of ``min(CE_i, bound)`` (logits plus ``offset``),
    (len(models),) float64. One row added or removed moves each sum by at most ``bound``,
    so the vector by at most ``sqrt(len(models)) * bound`` in L2."""
    with torch.no_grad():
        sums = []
        for params in models:
            z = logits(template, params, X)
            z = z if offset is None else z + offset
            per_row = nn.functional.cross_entropy(z, y, reduction="none")
            sums.append(per_row.clamp(max=bound).sum().double().cpu())
        return torch.stack(sums)


def noisy_cluster_losses(
    sums: Tensor, bound: float, multiplier: float, generator: NoiseSource
) -> Tensor:
    """The Gaussian mechanism on :func:`clipped_loss_sums` ``sums`` (K,): each entry plus
    noise of standard deviation ``multiplier * sqrt(K) * bound`` (``multiplier`` times the
    vector's L2 sensitivity) from the client's ``generator``; its argmin is the private
    min-loss cluster (report-noisy-min, post-processing of the noisy vector)."""
    k = sums.shape[0]
    spread = float(multiplier) * math.sqrt(k) * float(bound)
    return add_gaussian(sums.to(torch.float64), spread, generator)


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


def _model_reply(kind: str, *checks) -> ReplySpec:
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
    ENSEMBLE_KIND: _model_reply(ENSEMBLE_KIND),
    WARMUP_GLOBAL_KIND: _model_reply(WARMUP_GLOBAL_KIND),
    WARMUP_LOCAL_KIND: _model_reply(WARMUP_LOCAL_KIND),
    CLUSTER_KIND: _model_reply(CLUSTER_KIND, check_cluster_index),
}


# ----------------------------------------------------------------------------- the steps
class _ModelStep(LearnerRounds, Step):
    """What the clustered steps share: the settings, the template, the local training."""

    labelled = True

    def __init__(self, algorithm: ClusteredFL) -> None:
        self.algorithm = algorithm
        self.config: ClusteredConfig = algorithm.config

    @property
    def template(self) -> nn.Module:
        return self.algorithm.template

    @property
    def names(self) -> list[str]:
        return self.algorithm.parameter_names

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
        (:func:`private_models`, with the run's optimiser settings)."""
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

    def received(self, message: Message, X: Tensor) -> dict[str, Tensor]:
        return {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}

    def finished_after(self, state: ClusteredState, last: int) -> bool:
        """Whether the round being folded (number ``state.rounds + 1``) is round ``last``."""
        return state.rounds + 1 >= last

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


def _reply(kind: str, X: Tensor, loss: Tensor, tensors: dict[str, Tensor], **scalars) -> Message:
    tensors = {name: value.clone() for name, value in tensors.items()}
    tensors["n_samples"] = torch.tensor(float(X.shape[0]), dtype=X.dtype)
    tensors["loss"] = loss.detach().to(X.dtype).reshape(())
    # models trained on all the client's rows, their row count and mean loss
    return Message(kind, tensors, scalars, backing=client_backing(tensors, X.shape[0]))


def _private_reply(
    kind: str, X: Tensor, tensors: dict[str, Tensor], context: ClientContext, **scalars
) -> Message:
    """A reply of models trained by the client's DP-SGD, stating its steps; the loss is
    not computed (the gate withholds it, and the row count)."""
    steps = context.terms.private.dp_sgd.steps
    return _reply(kind, X, X.new_zeros(()), tensors, dp_sgd_steps=steps, **scalars)


class EnsembleStep(_ModelStep):
    """FedAvg+: every client trains every member; each member is averaged as FedAvg."""

    kinds = (ENSEMBLE_KIND,)
    replies = declare(MODEL_REPLIES[ENSEMBLE_KIND])

    def __init__(self, algorithm: ClusteredFL) -> None:
        super().__init__(algorithm)
        self.max_rounds = self.config.rounds

    def configure(self, state: ClusteredState) -> Message:
        tensors = {}
        for m, params in enumerate(state.cluster_models):
            tensors.update({learner_name(m, name): value for name, value in params.items()})
        return Message(ENSEMBLE_KIND, tensors, {"seed": round_seed(self.config, state)})

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        X, y = data
        refused = self.refusal(ENSEMBLE_KIND, X, context)
        if refused is not None:
            return refused
        t = self.received(message, X)
        members = [_unnamed(f"learner.{m}.", t, self.names) for m in range(self.config.n_clusters)]
        if context.terms.private is not None:  # every member in one DP-SGD loop, jointly clipped
            generator = self.private_generator(context)
            trained = self.private_train(self.template, members, X, y, context, generator)
            tensors = {
                learner_name(m, name): value
                for m, params in enumerate(trained)
                for name, value in params.items()
            }
            return _private_reply(ENSEMBLE_KIND, X, tensors, context)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        loss = mean_losses(self.template, members, X, y).mean()
        everyone = yield [self.task(params, X, y, generator) for params in members]
        tensors = {}
        for m, trained in enumerate(everyone):
            tensors.update({learner_name(m, name): value for name, value in trained.items()})
        return _reply(ENSEMBLE_KIND, X, loss, tensors)

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        first = state.cluster_models[0][self.names[0]]
        n = self.weights(replies, first)
        gammas = n.unsqueeze(1).expand(-1, self.config.n_clusters)
        state.cluster_models = robust_average_learners(
            state.cluster_models, list(replies.values()), gammas, *self.robust
        )
        metrics = self.record(state, replies)
        return (None if self.finished_after(state, self.config.rounds) else ENSEMBLE_KIND), metrics


class GlobalWarmupStep(_ModelStep):
    """IFCA-CAM's warm-up (Alg. 1 (1)): FedAvg of the global model alone."""

    kinds = (WARMUP_GLOBAL_KIND,)
    replies = declare(MODEL_REPLIES[WARMUP_GLOBAL_KIND])

    def __init__(self, algorithm: ClusteredFL) -> None:
        super().__init__(algorithm)
        self.max_rounds = self.config.warmup_rounds

    def begin(self, state: ClusteredState) -> str | None:
        return WARMUP_GLOBAL_KIND if self.config.warmup_rounds > 0 else None

    def configure(self, state: ClusteredState) -> Message:
        tensors = _named("global.", state.global_model)
        return Message(WARMUP_GLOBAL_KIND, tensors, {"seed": round_seed(self.config, state)})

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        X, y = data
        refused = self.refusal(WARMUP_GLOBAL_KIND, X, context)
        if refused is not None:
            return refused
        start = _unnamed("global.", self.received(message, X), self.names)
        if context.terms.private is not None:
            generator = self.private_generator(context)
            trained = self.private_train(self.template, [start], X, y, context, generator)[0]
            return _private_reply(WARMUP_GLOBAL_KIND, X, _named("global.", trained), context)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        loss = mean_losses(self.template, [start], X, y)[0]
        (trained,) = yield [self.task(start, X, y, generator)]
        return _reply(WARMUP_GLOBAL_KIND, X, loss, _named("global.", trained))

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        copies = [_unnamed("global.", r.tensors, self.names) for r in replies.values()]
        first = state.global_model[self.names[0]]
        state.global_model = self.average(state.global_model, copies, self.weights(replies, first))
        metrics = self.record(state, replies)
        done = self.finished_after(state, self.config.warmup_rounds)
        return (None if done else WARMUP_GLOBAL_KIND), metrics


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


class _KMeansServer:
    """The server's k-means of client models (FeSEM, Eq. 10-11): Lloyd iterations on the
    flattened ``nn.Linear`` parameters, clients weighted by their rows, each centre the
    row-weighted mean of its clients' full models (an empty one does not move)."""

    def __init__(self, step: _ModelStep) -> None:
        self.step = step

    def cluster(self, state: ClusteredState, replies: dict[int, Message], seeded: bool) -> None:
        """New ``state.cluster_models`` and the replying clients' assignments; Lloyd starts
        from the current models, or from k-means++ seeds among the client models when
        ``seeded`` (at most one per client model; further clusters keep their models)."""
        step, config = self.step, self.step.config
        names = step.names
        like = state.cluster_models[0][names[0]]
        models = [_unnamed("cluster.", r.tensors, names) for r in replies.values()]
        flat = torch.stack([linear_vector(p, names) for p in models]).to(like)  # (m, P)
        columns = step.algorithm.linear_columns.to(like.device)
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
        state.cluster_models = [step.algorithm.unflatten(c) for c in centres]
        for cid, label in zip(replies, labels.tolist(), strict=True):
            state.client_clusters[cid] = int(label)


class LocalWarmupStep(_ModelStep):
    """FeSEM's and FeSEM-CAM's warm-up (Alg. 1 (2)): local training only; the server
    clusters the client models every round."""

    kinds = (WARMUP_LOCAL_KIND,)
    replies = declare(MODEL_REPLIES[WARMUP_LOCAL_KIND])

    def __init__(self, algorithm: ClusteredFL) -> None:
        super().__init__(algorithm)
        self.max_rounds = self.config.warmup_rounds
        self.kmeans = _KMeansServer(self)

    def configure(self, state: ClusteredState) -> Message:
        tensors = _named("learner.0.", state.cluster_models[0])  # the common start
        return Message(WARMUP_LOCAL_KIND, tensors, {"seed": round_seed(self.config, state)})

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        X, y = data
        refused = self.refusal(WARMUP_LOCAL_KIND, X, context)
        if refused is not None:
            return refused
        start = _unnamed("learner.0.", self.received(message, X), self.names)
        if f"{KEPT}{self.names[0]}" in context.state:
            start = _unnamed(KEPT, context.state, self.names)
        if context.terms.private is not None:
            generator = self.private_generator(context)
            trained = self.private_train(self.template, [start], X, y, context, generator)[0]
            context.state.update({f"{KEPT}{k}": v.clone() for k, v in trained.items()})
            return _private_reply(WARMUP_LOCAL_KIND, X, _named("cluster.", trained), context)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        loss = mean_losses(self.template, [start], X, y)[0]
        (trained,) = yield [self.task(start, X, y, generator)]
        context.state.update({f"{KEPT}{k}": v.clone() for k, v in trained.items()})
        return _reply(WARMUP_LOCAL_KIND, X, loss, _named("cluster.", trained))

    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        self.kmeans.cluster(state, replies, seeded=state.rounds == 0)
        reseeded = self.algorithm.reseed(state, replies)
        metrics = self.record(state, replies, reseeded)
        done = self.finished_after(state, self.config.warmup_rounds)
        return (None if done else WARMUP_LOCAL_KIND), metrics


class ClusterStep(_ModelStep):
    """The clustered rounds of IFCA, FeSEM and their CAM forms (module docstring)."""

    kinds = (CLUSTER_KIND,)
    replies = declare(MODEL_REPLIES[CLUSTER_KIND])

    def __init__(self, algorithm: ClusteredFL) -> None:
        super().__init__(algorithm)
        self.max_rounds = self.config.rounds - self.config.warmup_rounds
        self.kmeans = _KMeansServer(self)

    def begin(self, state: ClusteredState) -> str | None:
        return CLUSTER_KIND if self.max_rounds > 0 else None

    def configure(self, state: ClusteredState) -> Message:
        tensors = {}
        for k, params in enumerate(state.cluster_models):
            tensors.update({learner_name(k, name): value for name, value in params.items()})
        if self.config.additive:
            tensors.update(_named("global.", state.global_model))
        return Message(CLUSTER_KIND, tensors, {"seed": round_seed(self.config, state)})

    # ------------------------------------------------------------------ client half
    def choose(
        self,
        models: list[dict[str, Tensor]],
        X: Tensor,
        y: Tensor,
        h: Tensor | None,
        kept,
        with_loss: bool = True,
    ) -> tuple[int, Tensor | None]:
        """The client's cluster (module docstring) and its model's loss on the rows (``None``
        for a k-means client's nearest centre ``with_loss=False``)."""
        if self.config.clustering == "kmeans" and kept is not None:
            fc = self.algorithm.linear_names
            centres = torch.stack([linear_vector(p, fc) for p in models])
            mine = linear_vector(kept, fc).to(centres).unsqueeze(0)
            cluster = int(nearest_cluster(mine, centres)[0])
            if not with_loss:
                return cluster, None
            return cluster, mean_losses(self.template, [models[cluster]], X, y, h)[0]
        losses = mean_losses(self.template, models, X, y, h)
        return int(losses.argmin()), losses[int(losses.argmin())]

    def private_choice(
        self,
        models: list[dict[str, Tensor]],
        X: Tensor,
        y: Tensor,
        h: Tensor | None,
        kept,
        context: ClientContext,
        generator: NoiseSource,
    ) -> int:
        """The client's cluster under its differential-privacy policy (:class:`ClusteredFL`):
        FeSEM's nearest centre to the model it released last (post-processing), or a
        uniformly random cluster without one (its rows unread); IFCA's min-loss by
        report-noisy-min (:func:`noisy_cluster_losses` of the clipped loss sums, multiplier
        ``HISTOGRAM_SHARE * z`` of the client's own ``z``)."""
        if self.config.clustering == "kmeans":
            if kept is not None:
                return self.choose(models, X, y, h, kept, with_loss=False)[0]
            return check_source(generator).randint(len(models))
        bound = self.config.dp_loss_clip
        sums = clipped_loss_sums(self.template, models, X, y, h, bound)
        multiplier = HISTOGRAM_SHARE * context.terms.private.noise_multiplier
        return int(noisy_cluster_losses(sums, bound, multiplier, generator).argmin())

    def private_step(
        self,
        models: list[dict[str, Tensor]],
        glob: dict[str, Tensor] | None,
        X: Tensor,
        y: Tensor,
        h: Tensor | None,
        kept,
        context: ClientContext,
    ) -> Message:
        """The client half under its differential-privacy policy: the private choice, then
        its cluster's model (CAM: and the global model, each on the residual of the
        other's broadcast model, in one loop: :class:`AdditivePair`) by DP-SGD."""
        config = self.config
        generator = self.private_generator(context)
        cluster = self.private_choice(models, X, y, h, kept, context, generator)
        pull = config.kmeans_reg if config.clustering == "kmeans" else 0.0
        if glob is None:
            start = [models[cluster]]
            theta = self.private_train(self.template, start, X, y, context, generator, pull)[0]
            tensors = _named("cluster.", theta)
        else:
            pair = AdditivePair(self.template, models[cluster], glob)
            start = [_named("cluster.", models[cluster]), _named("global.", glob)]
            halves = self.private_train(pair, start, X, y, context, generator, pull)
            tensors = {**halves[0], **halves[1]}
            theta = _unnamed("cluster.", tensors, self.names)
        if config.clustering == "kmeans":
            context.state.update({f"{KEPT}{k}": v.clone() for k, v in theta.items()})
        return _private_reply(CLUSTER_KIND, X, tensors, context, cluster=cluster)

    def client_round(self, data: Any, message: Message, context: ClientContext) -> ClientRound:
        X, y = data
        config = self.config
        refused = self.refusal(CLUSTER_KIND, X, context)
        if refused is not None:
            return refused
        t = self.received(message, X)
        models = [_unnamed(f"learner.{k}.", t, self.names) for k in range(config.n_clusters)]
        glob = _unnamed("global.", t, self.names) if config.additive else None
        with torch.no_grad():
            h = None if glob is None else logits(self.template, glob, X)
        kept = None
        if f"{KEPT}{self.names[0]}" in context.state:
            kept = _unnamed(KEPT, context.state, self.names)
        if context.terms.private is not None:
            return self.private_step(models, glob, X, y, h, kept, context)
        cluster, loss = self.choose(models, X, y, h, kept)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        pull = config.kmeans_reg if config.clustering == "kmeans" else 0.0
        (theta,) = yield [self.task(models[cluster], X, y, generator, offset=h, mu_prox=pull)]
        tensors = _named("cluster.", theta)
        if glob is not None:  # the global copy fits the residual of the cluster's model
            with torch.no_grad():
                f = logits(self.template, models[cluster], X)
            (residual,) = yield [self.task(glob, X, y, generator, offset=f)]
            tensors.update(_named("global.", residual))
        if config.clustering == "kmeans":
            context.state.update({f"{KEPT}{k}": v.clone() for k, v in theta.items()})
        return _reply(CLUSTER_KIND, X, loss, tensors, cluster=cluster)

    # ------------------------------------------------------------------ server half
    def server_step(self, state: ClusteredState, replies: dict[int, Message]):
        config = self.config
        if config.private and config.clustering == "min_loss":
            replies = self.naming_clusters(replies)
        like = state.cluster_models[0][self.names[0]]
        n = self.weights(replies, like)
        if config.additive:
            copies = [_unnamed("global.", r.tensors, self.names) for r in replies.values()]
            state.global_model = self.average(state.global_model, copies, n)
        if config.clustering == "kmeans":
            self.kmeans.cluster(state, replies, seeded=False)
        else:
            self.average_clusters(state, replies, n)
        reseeded = self.algorithm.reseed(state, replies)
        metrics = self.record(state, replies, reseeded)
        return (None if self.finished_after(state, config.rounds) else CLUSTER_KIND), metrics

    def naming_clusters(self, replies: dict[int, Message]) -> dict[int, Message]:
        """The replies whose ``cluster`` is a cluster index: the server gate checks a noisy
        (``dp_mode``) reply for form and finiteness only, so a private min-loss round drops
        the others here.

        Raises:
            ValueError: no reply names a cluster.
        """
        k = self.config.n_clusters
        kept = {}
        for cid, reply in replies.items():
            cluster = reply.scalars.get("cluster")
            if not isinstance(cluster, bool) and isinstance(cluster, int) and 0 <= cluster < k:
                kept[cid] = reply
        if not kept:
            raise ValueError(f"no reply of the round names a cluster in [0, {k}).")
        return kept

    def average_clusters(self, state: ClusteredState, replies: dict[int, Message], n: Tensor):
        """IFCA: each cluster model from its clients' copies (``cluster_average``)."""
        chosen = torch.tensor([int(r.scalars["cluster"]) for r in replies.values()])
        copies = [_unnamed("cluster.", r.tensors, self.names) for r in replies.values()]
        total = n.sum()
        for k in range(self.config.n_clusters):
            weights = n * (chosen == k).to(n)
            if float(weights.sum()) <= 0:
                continue  # empty: kept (Eq. 6 with C_k empty)
            combined = self.average(state.cluster_models[k], copies, weights)
            if self.config.cluster_average == "global":  # Eq. 6: the rest of the rows keep it
                share = torch.stack([total - weights.sum(), weights.sum()])
                combined = average_params(
                    state.cluster_models[k], [state.cluster_models[k], combined], share
                )
            state.cluster_models[k] = combined
        for cid, reply in replies.items():
            state.client_clusters[cid] = int(reply.scalars["cluster"])


# ----------------------------------------------------------------------------- the algorithm
class ClusteredFL(ChainedAlgorithm):
    """The Fed-CAM paper's classification methods (see the module docstring):
    ``ClusteredFL(method, n_features, n_classes, **settings)`` with the settings of
    :class:`ClusteredConfig`, or
    ``ClusteredFL.from_config(ClusteredConfig(...))``.

    The chain is the method's warm-up step (IFCA-CAM: :class:`GlobalWarmupStep`; FeSEM,
    FeSEM-CAM: :class:`LocalWarmupStep`) then :class:`ClusterStep`; FedAvg+ is
    :class:`EnsembleStep` alone. Initial models: ``n_clusters + 1`` draws of
    ``learner_factory`` under ``random_state``, the cluster models (members) first and the
    global model last; k-means methods start every client's warm-up from the first.

    The CAM methods train in the paper's FedSim form: each round a client trains two copies
    in parallel, its cluster model on the residual of the global one (logits
    ``h(x; Theta_g) + f(x; theta_i)``, ``Theta_g`` fixed: Eq. 5/13) and the global model on
    the residual of its cluster's (``h(x; theta_i^0) + f(x; Theta_c(i))``, ``Theta_c(i)``
    fixed: Eq. 8/15); the server averages the global copies over every client (Eq. 9) and
    the cluster copies as IFCA or FeSEM do. IFCA-CAM's assignment is the min-loss of Eq. 2
    on the additive model.

    Warm-up (Alg. 1): IFCA-CAM first runs ``warmup_rounds`` rounds of FedAvg on the global model
    alone (logits ``h``), so that its residual is informative before the cluster models start;
    FeSEM-CAM (and FeSEM, with one round by default) first runs ``warmup_rounds`` rounds of
    *local training only*: each client continues its own model (logits ``f`` alone, from a common
    start) and sends it, and the server k-means-clusters those models every warm-up round
    (k-means++ seeds the first, later ones start from the previous centres); the last warm-up
    clustering gives the first cluster models and assignments.

    Choices where the paper is silent, each a setting or stated here:

    - **Who decides a client's cluster**: the client, in every method. IFCA: the min-loss
      model. FeSEM: the centre nearest to the model it sent last (kept in its state,
      ``cam.model.*``), which is the server's k-means assignment of that model to the current
      centres (the same squared distances, up to round-off at exact ties); a client without such
      a model (not asked during the warm-up) joins by min-loss. The reply carries the cluster id
      (``scalars["cluster"]``), so the server learns what the client used without broadcasting
      other clients' assignments. The server's record (``client_clusters``) is each client's
      latest: IFCA's choice, FeSEM's k-means label.
    - **Ties**: the lowest cluster index wins (``argmin``'s first minimum), in the min-loss rule
      and in nearest-centre assignment alike.
    - **FeSEM's distance**: squared Euclidean on the flattened parameters of the learner's
      ``nn.Linear`` layers (the paper: "the flattened parameters of the fully-connected layers";
      all parameters for ``linear`` and ``mlp``, the dense layers of ``cnn``), every client
      weighted by its rows; the centres are the row-weighted means of the full models.
    - **Empty clusters** (``empty_clusters``): ``"keep"`` (default): a cluster no client joined
      keeps its model unchanged (Eq. 6 with an empty ``C_k``; in k-means, an empty centre does not
      move) and can win clients back; ``"reseed"``: after the round, each empty cluster's model is
      replaced by a released client model, the one farthest (FeSEM's distance) from its own
      cluster's model, each client model used once. Every round records the cluster sizes
      (``cluster_sizes``: clients per cluster over every client the server has heard from, by
      their latest assignment) and the number of clusters re-seeded (``reseeded``); a row of
      zeros is a round without assignments (warm-up of IFCA-CAM, FedAvg+).
    - **More clusters than clients**: nothing special for IFCA (some clusters stay empty); the
      server's k-means seeds at most one centre per released model and the remaining clusters
      keep their models, empty.
    - **Eq. 13's gradient weight** ``n_i / n`` is left out: each client takes plain steps on
      its own mean loss (as FedAvg's local training), the pull ``kmeans_reg`` added.
    - **The privacy floor**: a client with fewer rows than its ``min_rows`` trains nothing and
      releases nothing (``skipped``), so the server never learns its cluster.

    Under differential privacy (the client's own ``PrivacyPolicy.dp`` and ``dp_sgd``; the
    server's ``dp_mode`` set) every reply is a ``"parts"`` release (:data:`MODEL_PARTS`),
    every mechanism runs on the client, from its own generator, in every ``dp_mode``:

    - **Models**: every model a client sends is trained by its own DP-SGD
      (:func:`private_models`: ``dp_sgd.steps`` Poisson-sampled steps, not ``local_steps``
      mini-batches); the models one round trains on the same rows share one loop and one
      joint clip, one Gaussian mechanism a step: FedAvg+'s ``K`` members, and CAM's cluster
      and global halves (:class:`AdditivePair`, each on the residual of the other's
      broadcast model as in the FedSim update). The proximal pull ``kmeans_reg`` of
      FeSEM-CAM then applies to both halves.
    - **The cluster choice**: IFCA's and IFCA-CAM's min-loss is a report-noisy-min: each
      row's cross-entropy under each cluster model is clipped to ``dp_loss_clip`` (``L``),
      summed per cluster, and the vector (L2 sensitivity ``sqrt(K) L``) gets Gaussian noise
      of multiplier ``HISTOGRAM_SHARE * z`` (the client's ``z``) before its argmin: one
      mechanism a clustered round, which costs what a released histogram does
      (:meth:`private_choices`). FeSEM's nearest centre to the model the client released
      last is post-processing of that release; a client without one (not asked during the
      warm-up) joins a uniformly random cluster.
    - **Withheld**: the row count (the server averages the clients' models, FeSEM's
      k-means centres included, with equal weights, and ``cluster_average="global"`` counts
      clients) and the mean loss (no bound; the rounds record NaN).
    - **Not covered**: which clients take part in a round (a client with at least one row
      replies), the reply's timing and size, and the row count: DP-SGD divides each step by
      the expected sample ``q n`` (:mod:`~fednovelty.federated.trust.dp_sgd` treats ``n`` as
      public), so withholding ``n_samples`` does not hide it from the models' scale.
    """

    labelled = True
    config_class = ClusteredConfig

    def __init__(self, method: str, n_features: int, n_classes: int, **settings: Any):
        config = ClusteredConfig(
            method=method, n_features=n_features, n_classes=n_classes, **settings
        )
        self._setup(config)

    def _setup(self, config: ClusteredConfig) -> None:
        super()._setup(config)
        self.template = model_template(config)
        self.parameter_names = [name for name, _ in self.template.named_parameters()]
        self.linear_names = linear_names(self.template)
        self._shapes = {n: p.shape for n, p in self.template.named_parameters()}
        offsets, begin = {}, 0
        for name, shape in self._shapes.items():
            offsets[name] = (begin, begin + shape.numel())
            begin += shape.numel()
        #: the columns of ``linear_names`` in a model flattened in ``parameter_names`` order
        self.linear_columns = torch.cat(
            [torch.arange(*offsets[name]) for name in self.linear_names]
        )
        self._offsets = offsets
        if config.clustering == "ensemble":
            steps: list[Step] = [EnsembleStep(self)]
        elif config.clustering == "kmeans":
            steps = [LocalWarmupStep(self), ClusterStep(self)]
        else:
            steps = [GlobalWarmupStep(self), ClusterStep(self)]
        self._chain(steps)

    def private_choices(self, kind: str) -> int:
        """The noisy cluster choices a client makes in one round of ``kind`` under
        differential privacy (each one Gaussian mechanism of multiplier ``HISTOGRAM_SHARE *
        z``, the cost of one released histogram): 1 in IFCA's and IFCA-CAM's clustered
        rounds, else 0."""
        return int(kind == CLUSTER_KIND and self.config.clustering == "min_loss")

    def new_state(self) -> ClusteredState:
        config = self.config
        draws = initial_parameters(
            lambda: learner_template(
                config.learner_factory,
                config.n_features,
                config.n_classes,
                config.device,
                config.dtype,
            ),
            config.n_clusters + 1,
            config.random_state,
        )
        return ClusteredState(global_model=draws[-1], cluster_models=draws[:-1])

    def unflatten(self, vector: Tensor) -> dict[str, Tensor]:
        """A model flattened in ``parameter_names`` order as its parameter dict."""
        return {
            name: vector[begin:end].reshape(self._shapes[name]).clone()
            for name, (begin, end) in self._offsets.items()
        }

    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor]]:
        if not isinstance(data, tuple | list) or len(data) != 2:
            raise ValueError(
                f"ClusteredFL clients hold (X, y) pairs; got {type(data).__name__}"
                + (f" of {len(data)}" if isinstance(data, tuple | list) else "")
                + "."
            )
        X, y = data
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"client data rows disagree: X has {X.shape[0]}, y {y.shape[0]}.")
        return X, (y,)

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
        fc = self.linear_names
        models = [_unnamed("cluster.", r.tensors, self.parameter_names) for r in replies.values()]
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
