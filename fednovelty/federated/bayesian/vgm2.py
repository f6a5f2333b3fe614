"""VGM2 (Puppala et al., "Variational Gaussian Mixture Manifold Models for Client-Specific
Federated Personalization") and its baselines on the same encoder (algorithm layer).

One algorithm :class:`VGM2`, one kind of round (``"vgm2"``), the method set by
``VGM2Config.method``; every client trains a personal MLP encoder ``f: R^m -> R^d`` (and,
for the baselines, a linear class head ``R^d -> C``) with Adam for ``local_epochs`` passes
over its rows each time it is sampled:

- ``"vgm2"`` (Alg. 1): parametric UMAP on the client's fuzzy kNN graph, the pairs'
  similarity loss and calibration error, and a KL term to the broadcast prior, with the
  client's mixture relation markers trained alongside; only the markers and the row count
  cross the wire, and the server combines them (moment matching or natural parameters).
- ``"local"``: cross-entropy of the head on the encoder; nothing but the row count and the
  loss is sent.
- ``"fedavg"``: the same network trained from the global one, averaged by rows.
- ``"prototype"`` (FedProto): personal networks pulled towards global class prototypes in
  the embedding, which the server averages.

The losses, prediction rule and the choices where the paper is silent are stated on
:class:`VGM2` (and ``docs/vgm2.md``). Under a client's differential-privacy policy what
leaves it is trained by DP-SGD (:mod:`fednovelty.federated.trust.dp_sgd`): VGM2's encoder and
markers on pairs of rows, FedAvg's network on the cross-entropy; the row count is a noisy
histogram, the loss is withheld, and the prototype baseline has no private form
(:class:`VGM2`, "Differential privacy"). Client data is a pair ``(X, y)``; the server
drops a reply that :func:`reply_problem` finds bad (``n_invalid`` in the metrics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from fednovelty.federated.core.base import ClientContext, Message, client_generator, skipped_reply
from fednovelty.federated.core.config import (
    AGGREGATIONS,
    TorchSettings,
    at_least,
    check_robust_arguments,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.learners import initial_parameters, logits
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init import DP_MODES, round_seed
from fednovelty.federated.trust.dp_sgd import DPSGDSettings, private_sgd
from fednovelty.federated.trust.privacy import client_backing
from fednovelty.federated.trust.robust import robust_average_params
from fednovelty.federated.trust.validation import (
    InvalidReplyError,
    Shape,
    check_counts_within,
    check_positive_rows,
)
from fednovelty.mixture.dirnig import (
    default_markers,
    free_from_markers,
    kl_markers,
    marker_to_posterior,
    markers_from_free,
    posterior_to_marker,
    same_class_logit,
    soft_calibration_error,
)
from fednovelty.mixture.vb_aggregate import aggregate_posteriors

__all__ = [
    "VGM2",
    "VGM2_AGGREGATIONS",
    "VGM2_KIND",
    "VGM2_METHODS",
    "VGM2_PREDICTIONS",
    "VGM2_PRIVATE_PARTS",
    "VGM2Config",
    "VGM2State",
    "aggregate_priors",
    "class_prototypes",
    "embed",
    "encoder_template",
    "fuzzy_graph",
    "head_template",
    "marker_scores",
    "pair_distances",
    "reply_problem",
    "umap_ab",
    "umap_loss",
]

VGM2_KIND = "vgm2"
#: VGM2's methods: the paper's and its baselines on the same encoder.
VGM2_METHODS: tuple[str, ...] = ("vgm2", "local", "fedavg", "prototype")
#: how VGM2's server combines the client markers (Prop. 1 or Sec. 3.5).
VGM2_AGGREGATIONS: tuple[str, ...] = ("moment", "natural")
#: how VGM2 turns pair similarities into class predictions (``docs/vgm2.md``).
VGM2_PREDICTIONS: tuple[str, ...] = ("nearest", "top_pi")


@settings_dataclass
class VGM2Config(TorchSettings):
    """Settings of VGM2 and its baselines (``VGM2``, :mod:`fednovelty.federated.bayesian.vgm2`).

    The paper (Puppala et al., Sec. 5) fixes rounds (100), local epochs (8), Adam and
    B = 15 calibration bins; it gives no gamma, eta, lambda or d: the defaults here are this
    package's choice, fixed across datasets (``docs/vgm2.md``).

    Attributes:
        method: ``"vgm2"`` (markers only cross the wire), ``"local"`` (nothing does),
            ``"fedavg"`` (encoder and head averaged) or ``"prototype"`` (FedProto: class
            prototypes in the embedding averaged).
        n_features: width of the rows; n_classes: labels 0..n_classes-1 (>= 2).
        embedding_dim: d, the encoder's output width (>= 1).
        hidden: the encoder's hidden width (an MLP ``n_features -> hidden -> d``).
        n_markers: K components per relation marker (>= 1).
        rounds: communication rounds (>= 1); local_epochs: E passes over the rows per round.
        batch_size: rows per step (pairs: every pair of the batch; UMAP: as many edges).
        learning_rate: Adam's for the networks; marker_learning_rate: Adam's for the
            markers' unconstrained parameters.
        umap_weight, similarity_weight (gamma), calibration_weight (eta), kl_weight
            (lambda): the weights of Eq. 7's terms (calibration 0 switches Eq. 5 off).
        prototype_weight: FedProto's pull towards the global prototypes.
        train_encoder: False freezes the encoder at its initial weights (ablation).
        n_neighbors, min_dist, negative_sample_rate: parametric UMAP's graph and loss.
        n_bins: calibration bins (B).
        aggregation: ``"moment"`` (Prop. 1) or ``"natural"`` (Sec. 3.5).
        robust_aggregation, trim, client_weight_cap: the robust options of
            :class:`RobustSettings` (``robust_aggregation`` there ``aggregation``, a name
            this config gives the markers' rule): ``method="fedavg"`` averages the encoder
            and head as the coordinate-wise trimmed mean (``"trimmed"``) or median
            (``"median"``) of the clients' copies; the other methods have ``"sum"`` only
            (markers and prototypes are not model updates); the cap applies to every
            method.
        prediction, top_m: how VGM2 classifies a row from ``pi_1`` (Eq. 3) of its distances
            to the client's training rows: ``"nearest"`` (default): among its ``top_m``
            nearest training rows, a class scores the sum of its rows' ``pi_1``;
            ``"top_pi"``: a class scores the mean of its ``top_m`` largest ``pi_1``.
        dp_mode: ``None`` (off) or the clients' differential-privacy mode (one of
            :data:`~fednovelty.federated.init.DP_MODES`): what the server knows of their
            policies. With it set the server expects no loss, averages the clients'
            markers or networks with equal weights (a row count, noisy or exact, is not
            read) and takes the plain sum only; the prototype baseline is refused.
        random_state: integer seed; dtype, device: of the models.
    """

    method: str = "vgm2"
    n_features: int
    n_classes: int
    embedding_dim: int = 16
    hidden: int = 128
    n_markers: int = 3
    rounds: int = 100
    local_epochs: int = 8
    batch_size: int = 64
    learning_rate: float = 1e-3
    marker_learning_rate: float = 1e-2
    umap_weight: float = 1.0
    similarity_weight: float = 1.0
    calibration_weight: float = 1.0
    kl_weight: float = 0.01
    prototype_weight: float = 1.0
    train_encoder: bool = True
    n_neighbors: int = 15
    min_dist: float = 0.1
    negative_sample_rate: int = 5
    n_bins: int = 15
    aggregation: str = "moment"
    robust_aggregation: str = "sum"
    trim: float = 0.1
    client_weight_cap: float | None = None
    prediction: str = "nearest"
    top_m: int = 5
    dp_mode: str | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, choices in (
            ("method", VGM2_METHODS),
            ("aggregation", VGM2_AGGREGATIONS),
            ("prediction", VGM2_PREDICTIONS),
        ):
            self._check_choice(name, choices)
        for name, low in (
            ("n_features", 1),
            ("n_classes", 2),
            ("embedding_dim", 1),
            ("hidden", 1),
            ("n_markers", 1),
            ("rounds", 1),
            ("local_epochs", 1),
            ("batch_size", 2),
            ("n_neighbors", 2),
            ("negative_sample_rate", 1),
            ("n_bins", 1),
            ("top_m", 1),
        ):
            value = at_least(name, getattr(self, name), low)
            if int(value) != float(value):
                raise ValueError(f"{name} must be an integer, got {value!r}.")
            self._set(name, int(value))
        for name in (
            "umap_weight",
            "similarity_weight",
            "calibration_weight",
            "kl_weight",
            "prototype_weight",
        ):
            self._set(name, float(at_least(name, getattr(self, name), 0)))
        for name in ("learning_rate", "marker_learning_rate", "min_dist"):
            value = getattr(self, name)
            if isinstance(value, bool) or not float(value) > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}.")
            self._set(name, float(value))
        if not isinstance(self.train_encoder, bool):
            raise ValueError(f"train_encoder must be True or False, got {self.train_encoder!r}.")
        allowed = AGGREGATIONS if self.method == "fedavg" else ("sum",)
        robust = check_robust_arguments(
            self.robust_aggregation,
            self.trim,
            self.client_weight_cap,
            allowed,
            owner=f"VGM2 with method={self.method!r}",
            name="robust_aggregation",
        )
        for name, value in zip(
            ("robust_aggregation", "trim", "client_weight_cap"), robust, strict=True
        ):
            self._set(name, value)
        if self.dp_mode is not None:
            self._check_choice("dp_mode", DP_MODES)
            if self.method == "prototype":
                raise ValueError(
                    "VGM2's prototype baseline has no private form (its class means of an "
                    "embedding trained on all the rows have no bound); use method='vgm2', "
                    "'fedavg' or 'local' with dp_mode, or dp_mode=None."
                )
            if self.robust_aggregation != "sum" or self.client_weight_cap is not None:
                raise ValueError(
                    "with dp_mode the server takes the plain average of DP-SGD models; use "
                    "robust_aggregation='sum' and client_weight_cap=None."
                )

    @property
    def private(self) -> bool:
        """Whether the clients release under differential privacy (``dp_mode`` set)."""
        return self.dp_mode is not None


#: where a client keeps its personal models, markers and graph (``ClientContext.state``).
ENCODER, HEAD, MARKERS, GRAPH = "vgm2.encoder.", "vgm2.head.", "vgm2.markers", "vgm2.graph."


@dataclass
class VGM2State:
    """The server's state of a VGM2 run.

    Attributes:
        phase, rounds: the chain's current kind and counted rounds.
        prior: the Dir-NIG prior ``p_t(M)``, (2, 5, K) (``"vgm2"``).
        global_encoder, global_head: FedAvg's network (``"fedavg"``).
        prototypes: (n_classes, d) global prototypes; prototype_counts: (n_classes,) rows
            behind each (0: none yet) (``"prototype"``).
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


# ----------------------------------------------------------------------------- pure helpers
def encoder_template(config: VGM2Config) -> nn.Module:
    """The encoder: ``Linear(n_features, hidden) - ReLU - Linear(hidden, d)``."""
    with torch.random.fork_rng(devices=[]):
        module = nn.Sequential(
            nn.Linear(config.n_features, config.hidden),
            nn.ReLU(),
            nn.Linear(config.hidden, config.embedding_dim),
        )
    return module.to(device=config.device, dtype=config.dtype)


def head_template(config: VGM2Config) -> nn.Module:
    """The baselines' class head: ``Linear(d, n_classes)``."""
    with torch.random.fork_rng(devices=[]):
        module = nn.Linear(config.embedding_dim, config.n_classes)
    return module.to(device=config.device, dtype=config.dtype)


def embed(template: nn.Module, params: dict[str, Tensor], X: Tensor) -> Tensor:
    """The encoder's embeddings of rows ``X`` (n, n_features) -> (n, d)."""
    return logits(template, params, X)


def _umap():
    """umap-learn's ``umap.umap_`` module (the ``vgm2`` extra), or an ImportError saying how
    to install it."""
    try:
        from umap import umap_
    except ImportError as error:  # pragma: no cover - the extra is installed by make
        raise ImportError(
            "VGM2's parametric-UMAP loss needs umap-learn: pip install 'fednovelty[vgm2]' "
            "(or umap-learn>=0.5.5)."
        ) from error
    return umap_


def umap_ab(min_dist: float, spread: float = 1.0) -> tuple[float, float]:
    """UMAP's curve ``q(d) = 1 / (1 + a d^(2b))`` for ``min_dist`` (umap-learn's fit)."""
    find_ab_params = _umap().find_ab_params

    a, b = find_ab_params(spread, min_dist)
    return float(a), float(b)


def fuzzy_graph(X: Tensor, n_neighbors: int, random_state: int) -> tuple[Tensor, Tensor, Tensor]:
    """UMAP's fuzzy simplicial set of rows ``X`` (n, n_features): umap-learn's
    ``fuzzy_simplicial_set`` on scikit-learn's exact Euclidean neighbours (the row itself
    included, as UMAP expects; ``min(n_neighbors, n)`` of them). Returns the edges' heads,
    tails (int64, (n_edges,)) and membership strengths (n_edges,) in ``X``'s dtype."""
    from sklearn.neighbors import NearestNeighbors

    fuzzy_simplicial_set = _umap().fuzzy_simplicial_set

    rows = X.detach().cpu().numpy().astype(np.float32)
    k = max(2, min(int(n_neighbors), rows.shape[0]))
    distances, indices = NearestNeighbors(n_neighbors=k).fit(rows).kneighbors(rows)
    graph, _, _ = fuzzy_simplicial_set(
        rows,
        k,
        np.random.RandomState(random_state),
        "euclidean",
        knn_indices=indices,
        knn_dists=distances.astype(np.float32),
    )
    coo = graph.tocoo()
    keep = coo.row != coo.col
    heads = torch.as_tensor(coo.row[keep].astype(np.int64))
    tails = torch.as_tensor(coo.col[keep].astype(np.int64))
    weights = torch.as_tensor(coo.data[keep]).to(device=X.device, dtype=X.dtype)
    return heads.to(X.device), tails.to(X.device), weights


def umap_loss(
    z_head: Tensor, z_tail: Tensor, a: float, b: float, negatives: int, generator: torch.Generator
) -> Tensor:
    """Parametric UMAP's cross-entropy (Eq. 1) on a batch of sampled edges: embeddings of
    the heads and tails (n, d) are attracted (``p = 1``), each head is repelled from
    ``negatives`` tails of the batch shuffled (``p = 0``); the mean over all ``n (1 +
    negatives)`` terms, a 0-d tensor. ``q(d) = 1 / (1 + a d^(2b))``."""
    n = z_head.shape[0]
    order = torch.cat([torch.randperm(n, generator=generator) for _ in range(negatives)])
    order = order.to(z_head.device)
    d2_pos = (z_head - z_tail).square().sum(1)
    d2_neg = (z_head.repeat(negatives, 1) - z_tail[order]).square().sum(1)
    eps = 1e-4

    def log1p_term(d2: Tensor) -> Tensor:
        return torch.log1p(a * (d2 + eps).pow(b))

    attract = log1p_term(d2_pos)  # -log q
    u = a * (d2_neg + eps).pow(b)
    repel = torch.log1p(u) - torch.log(u)  # -log(1 - q)
    return torch.cat([attract, repel]).mean()


def pair_distances(Z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Distances ``||z_i - z_j||`` of every pair ``i < j`` of embeddings (n, d): the
    distances (n(n-1)/2,) and the pairs' ``i``, ``j`` (int64)."""
    i, j = torch.triu_indices(Z.shape[0], Z.shape[0], offset=1, device=Z.device)
    s = ((Z[i] - Z[j]).square().sum(1) + 1e-12).sqrt()
    return s, i, j


def marker_scores(
    Z: Tensor,
    reference: Tensor,
    reference_y: Tensor,
    markers: Tensor,
    n_classes: int,
    top_m: int,
    rule: str = "nearest",
) -> Tensor:
    """VGM2's prediction scores (n, n_classes) of embeddings ``Z`` (n, d) against the
    ``reference`` embeddings (n_ref, d) with labels ``reference_y`` (n_ref,), from
    ``pi_1(||z - r_j||)`` (Eq. 3, markers (2, 5, K)).

    ``rule="nearest"``: among the ``top_m`` nearest reference rows, class ``c`` scores the
    sum of ``pi_1`` of its rows (a kNN vote weighted by the same-class probability; ties in
    distance go to the lower index). ``rule="top_pi"``: class ``c`` scores the mean of the
    ``top_m`` largest ``pi_1`` over its rows. A class without reference rows scores 0."""
    with torch.no_grad():
        s = torch.cdist(Z, reference)  # (n, n_ref)
        pi = torch.sigmoid(same_class_logit(s.reshape(-1), markers)).reshape(s.shape)
        scores = Z.new_zeros(Z.shape[0], n_classes)
        if rule == "nearest":
            m = min(top_m, reference.shape[0])
            near = s.topk(m, dim=1, largest=False).indices  # (n, m)
            return scores.scatter_add_(1, reference_y[near], pi.gather(1, near))
        if rule != "top_pi":
            raise ValueError(f"rule must be 'nearest' or 'top_pi'; got {rule!r}.")
        for c in torch.unique(reference_y).tolist():
            column = pi[:, reference_y == c]
            m = min(top_m, column.shape[1])
            scores[:, c] = column.topk(m, dim=1).values.mean(1)
        return scores


def class_prototypes(Z: Tensor, y: Tensor, n_classes: int) -> tuple[Tensor, Tensor]:
    """Class means of embeddings ``Z`` (n, d) by labels ``y`` (n,): (n_classes, d) (zeros
    for absent classes) and the counts (n_classes,) in ``Z``'s dtype."""
    counts = torch.bincount(y, minlength=n_classes).to(Z.dtype)
    sums = Z.new_zeros(n_classes, Z.shape[1]).index_add_(0, y, Z)
    return sums / counts.clamp_min(1).unsqueeze(1), counts


def reply_problem(reply: Message, broadcast: Message, config: VGM2Config, d: int) -> str | None:
    """Why ``reply`` is not a valid answer to ``broadcast`` (``None``: it is): kind, the
    tensors of the method, shapes, finite values, a positive row count, positive marker
    parameters, class counts that add up to at most the rows. A private round's reply
    (``config.dp_mode``) has no loss and a noisy row count, which is not checked."""
    if reply.kind != broadcast.kind:
        return f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round"
    expected: dict[str, tuple[int, ...]] = {"n_samples": ()}
    if not config.private:
        expected["loss"] = ()
    if config.method == "vgm2":
        expected["markers"] = tuple(broadcast.tensors["prior"].shape)
    elif config.method == "fedavg":
        expected.update({k: tuple(v.shape) for k, v in broadcast.tensors.items()})
    elif config.method == "prototype":
        expected.update(prototypes=(config.n_classes, d), class_counts=(config.n_classes,))
    if set(reply.tensors) != set(expected):
        return f"reply tensors {sorted(reply.tensors)}; expected {sorted(expected)}"
    for name, shape in expected.items():
        tensor = reply.tensors[name]
        if tuple(tensor.shape) != shape:
            return f"tensor {name!r} has shape {tuple(tensor.shape)}; expected {shape}"
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"tensor {name!r} has NaN or inf values"
    n = float(reply.tensors["n_samples"])
    if not (n > 0 or config.private):
        return "a reply must come from at least one row"
    if "markers" in reply.tensors and not bool(
        (reply.tensors["markers"][:, [0, 2, 3, 4]] > 0).all()
    ):
        return "marker concentration, kappa, alpha and beta must be > 0"
    if "class_counts" in reply.tensors:
        counts = reply.tensors["class_counts"]
        if bool((counts < 0).any()) or float(counts.sum()) > n * (1 + 1e-6):
            return "class counts negative or above the rows sent"
    return None


def aggregate_priors(markers: list[Tensor], weights: Tensor, how: str) -> Tensor:
    """The server's prior (2, 5, K) from client markers (each (2, 5, K)) weighted by
    ``weights`` (n,): each relation's Dir-NIG as a 1-D posterior combined by
    :func:`~fednovelty.mixture.vb_aggregate.aggregate_posteriors` (``how``: ``"moment"``,
    Prop. 1, or ``"natural"``, Sec. 3.5), components aligned by index."""
    return torch.stack(
        [
            posterior_to_marker(
                aggregate_posteriors([marker_to_posterior(m[r]) for m in markers], weights, how)
            )
            for r in range(2)
        ]
    )


def _named(prefix: str, params: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"{prefix}{k}": v for k, v in params.items()}


def _unnamed(prefix: str, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}


class PairModel(nn.Module):
    """DP-SGD's template of VGM2's private training: the encoder and the markers'
    unconstrained parameters ``free`` (2, 5, K) in units of ``scale`` (markers
    ``markers_from_free(scale * free)``: one optimiser's step size moves them ``scale``
    times as far as the encoder's). ``forward(pair)``: a pair of rows (2, n_features) -> its
    same-class logit ``logit pi_1(||f(x_1) - f(x_2)||)`` (1,)."""

    def __init__(self, encoder: nn.Module, n_markers: int, scale: float):
        super().__init__()
        self.encoder = encoder
        self.free = nn.Parameter(torch.zeros(2, 5, n_markers))
        self.scale = float(scale)

    def markers(self, free: Tensor) -> Tensor:
        """The markers (2, 5, K) of parameters ``free``."""
        return markers_from_free(self.scale * free)

    def forward(self, pair: Tensor) -> Tensor:
        z = self.encoder(pair)
        s = ((z[0] - z[1]).square().sum() + 1e-12).sqrt()
        return same_class_logit(s.reshape(1), self.markers(self.free))


class Classifier(nn.Module):
    """DP-SGD's template of FedAvg's network: ``head(encoder(x))``; its parameters are
    named ``encoder.*`` and ``head.*`` as the reply's tensors."""

    def __init__(self, encoder: nn.Module, head: nn.Module):
        super().__init__()
        self.encoder, self.head = encoder, head

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.encoder(x))


# ----------------------------------------------------------------------------- the step
def vgm2_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A ``vgm2`` reply by what the round broadcast: the client's markers shaped as the
    ``prior`` (VGM2), or its class prototypes and counts shaped as the broadcast's
    (prototype baseline), or its encoder and head under the broadcast's names (FedAvg);
    always the row count, and the loss unless the round is private (``scalars["private"]``:
    the loss is withheld)."""
    shapes: dict[str, Shape] = {"n_samples": ()}
    if not broadcast.scalars.get("private"):
        shapes["loss"] = ()
    t = broadcast.tensors
    if "prior" in t:
        shapes["markers"] = tuple(t["prior"].shape)
    if "prototypes" in t:
        shapes.update(
            prototypes=tuple(t["prototypes"].shape),
            class_counts=tuple(t["prototype_counts"].shape),
        )
    return shapes


def check_vgm2(reply: Message, broadcast: Message) -> None:
    """Positive marker concentration, kappa, alpha and beta; class counts within the rows."""
    if "markers" in reply.tensors and not bool(
        (reply.tensors["markers"][:, [0, 2, 3, 4]] > 0).all()
    ):
        raise InvalidReplyError("marker concentration, kappa, alpha and beta must be > 0.")
    if "class_counts" in reply.tensors:
        check_counts_within(reply, "class_counts", "class counts")


def classes_limit(config: VGM2Config, broadcast: Message) -> int:
    """The client's own bound on classes per reply: its configuration's ``n_classes``."""
    return int(config.n_classes)


#: the private form of a ``vgm2`` reply's tensors (its release is ``"parts"``: no summed
#: statistics, one noisy release of the client's budget): what trains on the rows leaves only by
#: DP-SGD (the markers, FedAvg's encoder and head), the row count as a one-bin histogram
#: (each row adds 1). The loss has none (withheld under DP); nor have the prototype
#: baseline's prototypes and class counts (refused).
VGM2_PRIVATE_PARTS: dict[str, str] = {
    "n_samples": "histogram",
    "markers": "dp_sgd",
    "encoder.": "dp_sgd",
    "head.": "dp_sgd",
}

#: a ``vgm2`` reply (:func:`vgm2_shapes`).
VGM2_REPLY = ReplySpec(
    VGM2_KIND,
    shapes=vgm2_shapes,
    checks=(check_positive_rows, check_vgm2),
    backing={
        "n_samples": "client",
        "loss": "client",
        "markers": "model",
        "prototypes": "classes",
        "class_counts": "classes",
        "encoder.": "model",
        "head.": "model",
    },
    limit=classes_limit,
    private="parts",
    private_parts=VGM2_PRIVATE_PARTS,
)


class VGM2Step(Step):
    """The rounds of every method (module docstring): configure, client half, server half."""

    kinds = (VGM2_KIND,)
    replies = declare(VGM2_REPLY)
    labelled = True

    def __init__(self, algorithm: VGM2) -> None:
        self.algorithm = algorithm
        self.config: VGM2Config = algorithm.config
        self.max_rounds = self.config.rounds

    # ------------------------------------------------------------------ server half
    def configure(self, state: VGM2State) -> Message:
        method = self.config.method
        tensors: dict[str, Tensor] = {}
        if method == "vgm2":
            tensors["prior"] = state.prior
        elif method == "fedavg":
            tensors.update(_named("encoder.", state.global_encoder))
            tensors.update(_named("head.", state.global_head))
        elif method == "prototype":
            tensors["prototypes"] = state.prototypes
            tensors["prototype_counts"] = state.prototype_counts
        scalars: dict[str, Any] = {"seed": round_seed(self.config, state)}
        if self.config.private:
            scalars["private"] = True
        return Message(VGM2_KIND, tensors, scalars)

    def server_step(self, state: VGM2State, replies: dict[int, Message]):
        config = self.config
        broadcast = self.configure(state)
        valid = {
            cid: r
            for cid, r in replies.items()
            if reply_problem(r, broadcast, config, config.embedding_dim) is None
        }
        state.invalid.append(len(replies) - len(valid))
        if valid and config.private:  # equal weights: no row count is read
            state.losses.append(float("nan"))
            self.fold(state, valid, torch.ones(len(valid), dtype=torch.float64))
        elif valid:
            n = torch.stack([r.tensors["n_samples"].double() for r in valid.values()])
            loss = torch.stack([r.tensors["loss"].double() for r in valid.values()])
            state.losses.append(float((n * loss).sum() / n.sum()))
            self.fold(state, valid, n)
        else:
            state.losses.append(float("nan"))
        done = state.rounds + 1 >= config.rounds
        metrics = {"phase": VGM2_KIND, "loss": state.losses[-1], "n_invalid": state.invalid[-1]}
        return (None if done else VGM2_KIND), metrics

    def fold(self, state: VGM2State, replies: dict[int, Message], n: Tensor) -> None:
        """Fold the valid replies (rows ``n``) into the state, by method."""
        method = self.config.method
        if method == "vgm2":
            markers = [r.tensors["markers"].double() for r in replies.values()]
            state.prior = aggregate_priors(markers, n, self.config.aggregation).to(state.prior)
        elif method == "fedavg":
            like = next(iter(state.global_encoder.values()))
            weights = n.to(like)
            encoders = [_unnamed("encoder.", r.tensors) for r in replies.values()]
            heads = [_unnamed("head.", r.tensors) for r in replies.values()]
            robust = (self.config.robust_aggregation, self.config.trim)
            state.global_encoder = robust_average_params(
                state.global_encoder, encoders, weights, *robust
            )
            state.global_head = robust_average_params(state.global_head, heads, weights, *robust)
        elif method == "prototype":
            counts = torch.stack([r.tensors["class_counts"] for r in replies.values()])
            protos = torch.stack([r.tensors["prototypes"] for r in replies.values()])
            total = counts.sum(0)
            mean = (counts.unsqueeze(-1) * protos).sum(0) / total.clamp_min(1).unsqueeze(1)
            seen = total > 0
            state.prototypes = torch.where(seen.unsqueeze(1), mean, state.prototypes)
            state.prototype_counts = torch.where(seen, total, state.prototype_counts)

    # ------------------------------------------------------------------ client half
    def client_step(self, data: Any, message: Message, context: ClientContext) -> Message:
        X, y = data
        config = self.config
        terms = context.terms
        if not terms.releases(X.shape[0]):
            return skipped_reply(VGM2_KIND, terms.below_floor)
        private = terms.private is not None
        if private and config.method == "prototype":
            return skipped_reply(
                VGM2_KIND,
                "VGM2's prototype baseline has no private form; not released under the "
                "client's differential-privacy policy",
            )
        sgd = None
        if private and terms.private.dp_sgd is not None and config.method in ("vgm2", "fedavg"):
            # what leaves the client trains by its own DP-SGD, from its own generator
            source = context.terms.private.noise()
            sgd = (terms.private.dp_sgd, source)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        algo = self.algorithm
        state = context.state
        if config.method == "fedavg":
            encoder = {k: v.to(X) for k, v in _unnamed("encoder.", message.tensors).items()}
            head = {k: v.to(X) for k, v in _unnamed("head.", message.tensors).items()}
        else:
            encoder = _unnamed(ENCODER, state) or algo.initial_encoder()
            head = _unnamed(HEAD, state) or algo.initial_head()
            encoder = {k: v.to(X) for k, v in encoder.items()}
            head = {k: v.to(X) for k, v in head.items()}
        tensors: dict[str, Tensor] = {}
        loss = float("nan")
        if config.method == "vgm2" and sgd is not None:
            prior = message.tensors["prior"].to(X)
            encoder, markers = algo.private_vgm2(encoder, prior, X, y, *sgd)
            state[MARKERS] = markers.clone()
            tensors["markers"] = markers.clone()
        elif config.method == "vgm2":
            prior = message.tensors["prior"].to(X)
            if config.train_encoder and config.umap_weight > 0 and f"{GRAPH}heads" not in state:
                heads, tails, weights = fuzzy_graph(X, config.n_neighbors, config.random_state)
                state.update(
                    {f"{GRAPH}heads": heads, f"{GRAPH}tails": tails, f"{GRAPH}weights": weights}
                )
            graph = (
                state.get(f"{GRAPH}heads"),
                state.get(f"{GRAPH}tails"),
                state.get(f"{GRAPH}weights"),
            )
            encoder, markers, loss = algo.train_vgm2(encoder, prior, X, y, graph, generator)
            state[MARKERS] = markers.clone()
            tensors["markers"] = markers.clone()
        elif sgd is not None:  # FedAvg under DP-SGD
            encoder, head = algo.private_classifier(encoder, head, X, y, *sgd)
            tensors.update(_named("encoder.", encoder))
            tensors.update(_named("head.", head))
        else:
            protos = counts = None
            if config.method == "prototype":
                protos = message.tensors["prototypes"].to(X)
                counts = message.tensors["prototype_counts"].to(X)
            encoder, head, loss = algo.train_classifier(
                encoder, head, X, y, generator, protos, counts
            )
            if config.method == "fedavg":
                tensors.update(_named("encoder.", encoder))
                tensors.update(_named("head.", head))
            if config.method == "prototype":
                with torch.no_grad():
                    Z = embed(algo.encoder, encoder, X)
                tensors["prototypes"], tensors["class_counts"] = class_prototypes(
                    Z, y, config.n_classes
                )
        if config.method != "fedavg":
            state.update({f"{ENCODER}{k}": v.clone() for k, v in encoder.items()})
            state.update({f"{HEAD}{k}": v.clone() for k, v in head.items()})
        tensors["n_samples"] = torch.tensor(float(X.shape[0]), dtype=X.dtype)
        scalars: dict[str, Any] = {}
        if not private:  # under DP the loss is withheld
            tensors["loss"] = torch.as_tensor(loss, dtype=X.dtype).reshape(())
        if sgd is not None:
            scalars["dp_sgd_steps"] = sgd[0].steps
        # markers, encoder and head: models trained on all the rows; a class's prototype
        # and count: that class's rows (the gate zeros the classes below the floor)
        backing = client_backing(tensors, X.shape[0])
        if "class_counts" in tensors:
            backing["prototypes"] = backing["class_counts"] = tensors["class_counts"]
        return Message(VGM2_KIND, tensors, scalars, backing=backing)


# ----------------------------------------------------------------------------- the algorithm
class VGM2(ChainedAlgorithm):
    """VGM2 and its baselines (see the module docstring): ``VGM2(n_features, n_classes,
    **settings)`` with the settings of :class:`VGM2Config`, or
    ``VGM2.from_config(VGM2Config(...))``. The methods:

    - ``"vgm2"`` (Alg. 1): the loss of Eq. 7, ``L_umap + gamma L_sim + eta L_cal + lambda KL``:
      parametric UMAP's cross-entropy (Eq. 1) on edges of the client's fuzzy kNN graph
      (``umap-learn``'s ``fuzzy_simplicial_set`` on scikit-learn's exact neighbours, built once per
      client and kept in its state), the pairs' log-loss of ``pi_1(s_ij)`` (Eq. 3-4) over every
      pair of the batch, the soft-binned calibration error (Eq. 5) of the same pairs and ``KL(q
      || p_t)`` to the broadcast prior (Eq. 6). The client's markers ``q`` start from the prior
      (Alg. 1 line 4) and are trained by Adam on their unconstrained parameters (log of the
      positive ones). Only the markers (2, 5, K) and the row count cross the wire; the server
      aggregates them (``aggregation="moment"``: Prop. 1's moment matching, the default;
      ``"natural"``: Sec. 3.5's natural-parameter average), clients weighted by rows.
    - ``"local"``: cross-entropy of the head on the encoder; nothing but the row count and loss
      is sent and the server keeps nothing.
    - ``"fedavg"``: the same network trained from the global one; the server averages encoder
      and head by rows (McMahan et al.); prediction uses the global network.
    - ``"prototype"`` (FedProto, the paper's App. B): personal networks trained on cross-entropy
      plus ``prototype_weight`` times FedProto's ``MSELoss`` between each row's embedding and
      its class's global prototype (the mean over rows and coordinates); clients send their
      class means in the embedding and class counts; the server's prototype of a class is the
      count-weighted mean of the round's client prototypes (a class absent from the round keeps
      its last one).

    Differential privacy (a client's ``PrivacyPolicy.dp`` with its ``dp_sgd``; the server's
    ``dp_mode``): VGM2's encoder and markers train together by DP-SGD on pairs of rows
    (:meth:`private_vgm2`: a row and its successor in a random cycle of each Poisson
    sample, units clipped to ``C / 3`` so that one row moves a step by at most ``C``; the
    calibration and UMAP terms, which are not sums over such pairs, left out), FedAvg's
    network by DP-SGD on the cross-entropy (:meth:`private_classifier`); the row count is
    released as a one-bin histogram (the gate's noise), the loss is withheld, the server
    averages with equal weights. Local's network never leaves its client and trains as
    usual. The prototype baseline is refused (its prototypes are class means of an
    embedding trained on all the rows). The markers and networks that leave are covered;
    a client's own predictions read its training rows and are not.

    Ablations are settings: ``n_markers=1``, ``calibration_weight=0``, ``train_encoder=False``
    (the encoder stays at its initial weights; the markers are still trained).

    Choices where the paper is silent (``docs/vgm2.md``): the encoder (MLP ``m -> 128 -> 16``,
    the same initial weights on every client), ``pi_hat_1 = pi_hat_0 = 1/2`` (Eq. 3), per-batch
    mean losses with ``gamma = eta = 1``, ``lambda = 0.01``, Adam at ``1e-3`` (networks) and
    ``1e-2`` (markers), UMAP's ``n_neighbors = 15``, ``min_dist = 0.1``, 5 negatives per edge
    (shuffled tails of the batch, as parametric UMAP), the prior ``p_0`` of
    :func:`~fednovelty.mixture.dirnig.default_markers`. Prediction (:func:`marker_scores`,
    ``prediction="nearest"``): among the ``top_m = 5`` training rows of client ``k`` nearest to
    ``f_k(x)``, class ``c`` scores the sum of ``pi_1(||f_k(x) - f_k(x_j)||)`` (``q_k``'s
    markers) of its rows, normalised; classes the client never saw score 0. The first rule
    tried, ``prediction="top_pi"`` (the mean of a class's ``top_m`` largest ``pi_1``), fails
    because the learned ``pi_1(s)`` is not monotone in ``s`` (``docs/vgm2.md``); it stays as a
    setting.
    """

    labelled = True
    config_class = VGM2Config

    def __init__(self, n_features: int, n_classes: int, **settings: Any):
        self._setup(VGM2Config(n_features=n_features, n_classes=n_classes, **settings))

    def _setup(self, config: VGM2Config) -> None:
        super()._setup(config)
        self.encoder = encoder_template(config)
        self.head = head_template(config)
        self.ab = umap_ab(config.min_dist) if config.method == "vgm2" else (1.0, 1.0)
        self._initial = initial_parameters(
            lambda: nn.ModuleDict(
                {"encoder": encoder_template(config), "head": head_template(config)}
            ),
            1,
            config.random_state,
        )[0]
        self._chain([VGM2Step(self)])

    def initial_encoder(self) -> dict[str, Tensor]:
        """The encoder's initial weights (the same on every client and the server)."""
        return {k: v.clone() for k, v in _unnamed("encoder.", self._initial).items()}

    def initial_head(self) -> dict[str, Tensor]:
        """The head's initial weights."""
        return {k: v.clone() for k, v in _unnamed("head.", self._initial).items()}

    def initial_prior(self) -> Tensor:
        """``p_0(M)``, (2, 5, K)."""
        return default_markers(self.config.n_markers, dtype=self.config.dtype).to(
            self.config.device
        )

    def new_state(self) -> VGM2State:
        config = self.config
        state = VGM2State()
        if config.method == "vgm2":
            state.prior = self.initial_prior()
        elif config.method == "fedavg":
            state.global_encoder, state.global_head = self.initial_encoder(), self.initial_head()
        elif config.method == "prototype":
            options = {"dtype": config.dtype, "device": config.device}
            state.prototypes = torch.zeros(config.n_classes, config.embedding_dim, **options)
            state.prototype_counts = torch.zeros(config.n_classes, **options)
        return state

    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor]]:
        if not isinstance(data, tuple | list) or len(data) != 2:
            raise ValueError(f"VGM2 clients hold (X, y) pairs; got {type(data).__name__}.")
        X, y = data
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"client data rows disagree: X has {X.shape[0]}, y {y.shape[0]}.")
        return X, (y,)

    # ------------------------------------------------------------------ local training
    def _batches(self, n: int, generator: torch.Generator):
        size = self.config.batch_size
        for _ in range(self.config.local_epochs):
            order = torch.randperm(n, generator=generator)
            for begin in range(0, n, size):
                batch = order[begin : begin + size]
                if batch.numel() >= 2:
                    yield batch

    def train_vgm2(
        self,
        encoder: dict[str, Tensor],
        prior: Tensor,
        X: Tensor,
        y: Tensor,
        graph: tuple[Tensor | None, Tensor | None, Tensor | None],
        generator: torch.Generator,
    ) -> tuple[dict[str, Tensor], Tensor, float]:
        """Eq. 7 by Adam for ``local_epochs`` passes from ``encoder`` and ``q = prior``;
        returns the encoder, the markers (2, 5, K) and the mean loss."""
        config = self.config
        a, b = self.ab
        train_encoder = config.train_encoder
        params = {k: v.detach().clone().requires_grad_(train_encoder) for k, v in encoder.items()}
        free = free_from_markers(prior.detach().clone()).requires_grad_(True)
        groups = [{"params": [free], "lr": config.marker_learning_rate}]
        if train_encoder:
            groups.append({"params": list(params.values()), "lr": config.learning_rate})
        optimizer = torch.optim.Adam(groups)
        heads, tails, weights = graph
        use_umap = train_encoder and config.umap_weight > 0 and heads is not None and heads.numel()
        total, steps = 0.0, 0
        frozen = None
        if not train_encoder:
            with torch.no_grad():
                frozen = embed(self.encoder, params, X)
        for batch in self._batches(X.shape[0], generator):
            batch = batch.to(X.device)
            Z = frozen[batch] if frozen is not None else embed(self.encoder, params, X[batch])
            markers = markers_from_free(free)
            s, i, j = pair_distances(Z)
            same = (y[batch][i] == y[batch][j]).to(Z.dtype)
            logit = same_class_logit(s, markers)
            loss = config.similarity_weight * nn.functional.binary_cross_entropy_with_logits(
                logit, same
            )
            if config.calibration_weight > 0:
                loss = loss + config.calibration_weight * soft_calibration_error(
                    torch.sigmoid(logit), same, config.n_bins
                )
            if config.kl_weight > 0:
                loss = loss + config.kl_weight * kl_markers(markers, prior)
            if use_umap:
                edges = torch.multinomial(
                    weights, batch.numel(), replacement=True, generator=generator
                ).to(X.device)
                z_head = embed(self.encoder, params, X[heads[edges]])
                z_tail = embed(self.encoder, params, X[tails[edges]])
                loss = loss + config.umap_weight * umap_loss(
                    z_head, z_tail, a, b, config.negative_sample_rate, generator
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
        markers = markers_from_free(free.detach())
        trained = {k: v.detach() for k, v in params.items()}
        return trained, markers, total / max(steps, 1)

    def train_classifier(
        self,
        encoder: dict[str, Tensor],
        head: dict[str, Tensor],
        X: Tensor,
        y: Tensor,
        generator: torch.Generator,
        prototypes: Tensor | None = None,
        prototype_counts: Tensor | None = None,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], float]:
        """Cross-entropy by Adam for ``local_epochs`` passes (plus FedProto's pull towards
        the global ``prototypes`` (n_classes, d) of classes with ``prototype_counts`` > 0);
        returns encoder, head and the mean loss."""
        config = self.config
        enc = {
            k: v.detach().clone().requires_grad_(config.train_encoder) for k, v in encoder.items()
        }
        hd = {k: v.detach().clone().requires_grad_(True) for k, v in head.items()}
        trainable = list(hd.values()) + (list(enc.values()) if config.train_encoder else [])
        optimizer = torch.optim.Adam(trainable, lr=config.learning_rate)
        total, steps = 0.0, 0
        for batch in self._batches(X.shape[0], generator):
            batch = batch.to(X.device)
            Z = embed(self.encoder, enc, X[batch])
            loss = nn.functional.cross_entropy(logits(self.head, hd, Z), y[batch])
            if prototypes is not None and config.prototype_weight > 0:
                known = prototype_counts[y[batch]] > 0
                if bool(known.any()):
                    gap = (Z[known] - prototypes[y[batch][known]]).square().mean()
                    loss = loss + config.prototype_weight * gap
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            steps += 1
        return (
            {k: v.detach() for k, v in enc.items()},
            {k: v.detach() for k, v in hd.items()},
            total / max(steps, 1),
        )

    def private_vgm2(
        self,
        encoder: dict[str, Tensor],
        prior: Tensor,
        X: Tensor,
        y: Tensor,
        settings: DPSGDSettings,
        generator: torch.Generator,
    ) -> tuple[dict[str, Tensor], Tensor]:
        """VGM2's local training under DP-SGD (``settings``, the client's own): the
        encoder and markers together by :func:`~fednovelty.federated.trust.dp_sgd.private_sgd`
        on pairs of rows (``pairs=True``: a row and its successor in a random cycle of the
        step's sample), a pair's loss ``gamma BCE(same, logit pi_1(s)) + lambda KL(q ||
        p_t)``, Adam at ``learning_rate`` (the markers at ``marker_learning_rate`` through
        :class:`PairModel`'s scale). Eq. 7's calibration error (of a batch's pairs) and
        parametric UMAP's loss (on the kNN graph of all the rows) are not sums over pairs
        of one row and are left out. ``train_encoder=False``: the markers alone, on the
        frozen encoder's embeddings. Returns the encoder and the markers (2, 5, K)."""
        config = self.config
        scale = config.marker_learning_rate / config.learning_rate
        inputs = X
        encoder_module: nn.Module = self.encoder
        if not config.train_encoder:
            with torch.no_grad():
                inputs = embed(self.encoder, encoder, X)
            encoder_module = nn.Identity()
        model = PairModel(encoder_module, config.n_markers, scale).to(X)
        start = {"free": free_from_markers(prior.clone()) / scale}
        if config.train_encoder:
            start.update(_named("encoder.", encoder))
        gamma, lam = config.similarity_weight, config.kl_weight

        def pair_loss(ps, pair, labels, w):
            p = ps[0]
            logit = functional_call(model, p, (pair,))
            same = (labels[0] == labels[1]).to(logit.dtype).reshape(1)
            bce = nn.functional.binary_cross_entropy_with_logits(logit, same)
            return w[0] * (gamma * bce + lam * kl_markers(model.markers(p["free"]), prior))

        (trained,) = private_sgd(
            model,
            [start],
            inputs,
            y,
            X.new_ones(X.shape[0], 1),
            settings,
            generator,
            learning_rate=config.learning_rate,
            optimizer="adam",
            row_loss=pair_loss,
            pairs=True,
        )
        markers = model.markers(trained["free"]).detach()
        return (_unnamed("encoder.", trained) if config.train_encoder else encoder), markers

    def private_classifier(
        self,
        encoder: dict[str, Tensor],
        head: dict[str, Tensor],
        X: Tensor,
        y: Tensor,
        settings: DPSGDSettings,
        generator: torch.Generator,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """FedAvg's local training under DP-SGD (``settings``): the cross-entropy of
        :class:`Classifier` by :func:`~fednovelty.federated.trust.dp_sgd.private_sgd` with Adam
        at ``learning_rate`` (``train_encoder=False``: the head alone on the frozen
        encoder's embeddings). Returns the encoder and the head."""
        config = self.config
        if not config.train_encoder:
            with torch.no_grad():
                Z = embed(self.encoder, encoder, X)
            (trained,) = private_sgd(
                self.head,
                [head],
                Z,
                y,
                X.new_ones(X.shape[0], 1),
                settings,
                generator,
                learning_rate=config.learning_rate,
                optimizer="adam",
            )
            return encoder, trained
        start = {**_named("encoder.", encoder), **_named("head.", head)}
        (trained,) = private_sgd(
            Classifier(self.encoder, self.head),
            [start],
            X,
            y,
            X.new_ones(X.shape[0], 1),
            settings,
            generator,
            learning_rate=config.learning_rate,
            optimizer="adam",
        )
        return _unnamed("encoder.", trained), _unnamed("head.", trained)

    # ------------------------------------------------------------------ prediction
    def client_proba(
        self,
        client_state: dict[str, Tensor],
        state: VGM2State,
        X: Tensor,
        reference: tuple[Tensor, Tensor] | None = None,
        rule: str | None = None,
    ) -> Tensor:
        """Class probabilities (n, n_classes) of rows ``X`` for a client whose kept state is
        ``client_state`` (``{}``: never trained: initial weights, markers = the final prior).

        VGM2: :func:`marker_scores` against ``reference`` (the client's training rows and
        labels), normalised to sum to 1 (uniform over the reference's classes when every
        score is 0); ``rule`` overrides ``config.prediction``. Local, FedProto: the client's
        network's softmax; FedAvg: the global network's.
        """
        config = self.config
        if config.method == "fedavg":
            encoder, head = state.global_encoder, state.global_head
        else:
            encoder = _unnamed(ENCODER, client_state) or self.initial_encoder()
            head = _unnamed(HEAD, client_state) or self.initial_head()
        encoder = {k: v.to(X) for k, v in encoder.items()}
        with torch.no_grad():
            Z = embed(self.encoder, encoder, X)
            if config.method != "vgm2":
                head = {k: v.to(X) for k, v in head.items()}
                return torch.softmax(logits(self.head, head, Z), dim=1)
            if reference is None:
                raise ValueError(
                    "VGM2 predicts against the client's training rows: pass reference."
                )
            markers = client_state.get(MARKERS, state.prior).to(X)
            rows, labels = reference
            ref = embed(self.encoder, encoder, rows.to(X))
            scores = marker_scores(
                Z,
                ref,
                labels.to(X.device),
                markers,
                config.n_classes,
                config.top_m,
                rule or config.prediction,
            )
            total = scores.sum(1, keepdim=True)
            present = torch.zeros(config.n_classes, dtype=X.dtype, device=X.device)
            present[torch.unique(labels)] = 1.0
            uniform = (present / present.sum()).expand_as(scores)
            return torch.where(total > 0, scores / total.clamp_min(1e-30), uniform)
