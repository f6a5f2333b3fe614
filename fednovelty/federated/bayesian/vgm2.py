"""VGM2 (Puppala et al., "Variational Gaussian Mixture Manifold Models for Client-Specific
Federated Personalization"): personal parametric-UMAP encoders and Dir-NIG relation markers.

Every sampled client trains its encoder and its mixture relation markers on the loss of Eq. 7
(:mod:`~fednovelty.federated.bayesian.vgm2_training`) and sends only the markers and its row
count; the server combines the markers into the next round's prior (moment matching or
natural parameters: :func:`~fednovelty.federated.bayesian.vgm2_markers.aggregate_priors`). A
client predicts from the same-class probabilities ``pi_1`` between a row and its training
rows in its own embedding. The round is the family's
(:class:`~fednovelty.federated.bayesian.vgm2_step.EncoderStep`); the baselines on the same
encoder are ``vgm2_local``, ``vgm2_fedavg`` and ``vgm2_prototype``. Under a client's
differential-privacy policy the encoder and markers train by DP-SGD on pairs of rows.
The losses, the prediction rule and the choices where the paper is silent are stated on
:class:`VGM2` (and ``docs/vgm2.md``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fednovelty.federated.bayesian.vgm2_algorithm import EncoderAlgorithm
from fednovelty.federated.bayesian.vgm2_markers import aggregate_priors, marker_scores
from fednovelty.federated.bayesian.vgm2_networks import embed
from fednovelty.federated.bayesian.vgm2_settings import GRAPH, MARKERS, EncoderSettings, VGM2State
from fednovelty.federated.bayesian.vgm2_step import EncoderStep, LocalUpdate
from fednovelty.federated.bayesian.vgm2_training import private_markers, train_markers
from fednovelty.federated.bayesian.vgm2_umap import fuzzy_graph, umap_ab
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.config import settings_dataclass
from fednovelty.federated.trust.dp_sgd import DPSGDSettings
from fednovelty.mixture.dirnig import default_markers

__all__ = ["VGM2", "VGM2_AGGREGATIONS", "VGM2_PREDICTIONS", "VGM2Config", "VGM2Step"]

#: the parts of a client's fuzzy kNN graph it keeps (``vgm2.graph.heads``, ...).
GRAPH_PARTS = ("heads", "tails", "weights")
#: how VGM2's server combines the client markers (Prop. 1 or Sec. 3.5).
VGM2_AGGREGATIONS: tuple[str, ...] = ("moment", "natural")
#: how VGM2 turns pair similarities into class predictions (``docs/vgm2.md``).
VGM2_PREDICTIONS: tuple[str, ...] = ("nearest", "top_pi")


@settings_dataclass
class VGM2Config(EncoderSettings):
    """Settings of VGM2 (:class:`VGM2`): the family's
    (:class:`~fednovelty.federated.bayesian.vgm2_settings.EncoderSettings`) and the markers'.

    The paper (Sec. 5) fixes B = 15 calibration bins; it gives no gamma, eta, lambda or d:
    the defaults here are this package's choice, fixed across datasets (``docs/vgm2.md``).

    Attributes:
        n_markers: K components per relation marker (>= 1).
        marker_learning_rate: Adam's for the markers' unconstrained parameters.
        umap_weight, similarity_weight (gamma), calibration_weight (eta), kl_weight
            (lambda): the weights of Eq. 7's terms (calibration 0 switches Eq. 5 off).
        n_neighbors, min_dist, negative_sample_rate: parametric UMAP's graph and loss.
        n_bins: calibration bins (B).
        aggregation: ``"moment"`` (Prop. 1) or ``"natural"`` (Sec. 3.5).
        prediction, top_m: how a row is classified from ``pi_1`` (Eq. 3) of its distances
            to the client's training rows: ``"nearest"`` (default): among its ``top_m``
            nearest training rows, a class scores the sum of its rows' ``pi_1``;
            ``"top_pi"``: a class scores the mean of its ``top_m`` largest ``pi_1``.

    The robust options are ``"sum"`` only (markers are no model updates).
    """

    METHOD = "vgm2"

    n_markers: int = 3
    marker_learning_rate: float = 1e-2
    umap_weight: float = 1.0
    similarity_weight: float = 1.0
    calibration_weight: float = 1.0
    kl_weight: float = 0.01
    n_neighbors: int = 15
    min_dist: float = 0.1
    negative_sample_rate: int = 5
    n_bins: int = 15
    aggregation: str = "moment"
    prediction: str = "nearest"
    top_m: int = 5

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("aggregation", VGM2_AGGREGATIONS)
        self._check_choice("prediction", VGM2_PREDICTIONS)
        self._check_integers(
            ("n_markers", 1),
            ("n_neighbors", 2),
            ("negative_sample_rate", 1),
            ("n_bins", 1),
            ("top_m", 1),
        )
        self._check_weights("umap_weight", "similarity_weight", "calibration_weight", "kl_weight")
        self._check_rates("marker_learning_rate", "min_dist")


class VGM2Step(EncoderStep):
    """VGM2's round: the prior goes out, the client's markers come back (trained by
    :func:`~fednovelty.federated.bayesian.vgm2_training.train_markers`, or by DP-SGD:
    :func:`~fednovelty.federated.bayesian.vgm2_training.private_markers`) and the server
    combines them, clients weighted by rows."""

    private_training = True
    algorithm: VGM2
    config: VGM2Config

    def round_tensors(self, state: VGM2State) -> dict[str, Tensor]:
        return {"prior": state.prior}

    def reply_tensors(self, broadcast: Message) -> dict[str, tuple[int, ...]]:
        return {"markers": tuple(broadcast.tensors["prior"].shape)}

    def tensor_problem(self, reply: Message, n: float) -> str | None:
        if not bool((reply.tensors["markers"][:, [0, 2, 3, 4]] > 0).all()):
            return "marker concentration, kappa, alpha and beta must be > 0"
        return None

    def fold(self, state: VGM2State, replies: dict[int, Message], n: Tensor) -> None:
        markers = [r.tensors["markers"].double() for r in replies.values()]
        state.prior = aggregate_priors(markers, n, self.config.aggregation).to(state.prior)

    def train(self, X, y, message, kept, networks, generator) -> LocalUpdate:
        """Eq. 7 from the broadcast prior; the client's fuzzy kNN graph is built on its
        first round (when the UMAP term is on) and kept."""
        config = self.config
        prior = message.tensors["prior"].to(X)
        if config.train_encoder and config.umap_weight > 0 and f"{GRAPH}heads" not in kept:
            heads, tails, weights = fuzzy_graph(X, config.n_neighbors, config.random_state)
            kept.update(
                {f"{GRAPH}heads": heads, f"{GRAPH}tails": tails, f"{GRAPH}weights": weights}
            )
        graph = (kept.get(f"{GRAPH}heads"), kept.get(f"{GRAPH}tails"), kept.get(f"{GRAPH}weights"))
        encoder, head = networks
        encoder, markers, loss = train_markers(
            self.algorithm.encoder,
            config,
            self.algorithm.ab,
            encoder,
            prior,
            X,
            y,
            graph,
            generator,
        )
        kept[MARKERS] = markers.clone()
        return LocalUpdate(encoder, head, {"markers": markers.clone()}, loss)

    def train_private(
        self, X, y, message, kept, networks, settings: DPSGDSettings, generator
    ) -> LocalUpdate:
        """The encoder and markers by DP-SGD on pairs of rows (no kNN graph is built)."""
        prior = message.tensors["prior"].to(X)
        encoder, head = networks
        encoder, markers = private_markers(
            self.algorithm.encoder, self.config, encoder, prior, X, y, settings, generator
        )
        kept[MARKERS] = markers.clone()
        return LocalUpdate(encoder, head, {"markers": markers.clone()})


class VGM2(EncoderAlgorithm):
    """VGM2 (see the module docstring): ``VGM2(n_features, n_classes, **settings)`` with the
    settings of :class:`VGM2Config`, or ``VGM2.from_config(VGM2Config(...))``.

    Alg. 1: the loss of Eq. 7, ``L_umap + gamma L_sim + eta L_cal + lambda KL``: parametric
    UMAP's cross-entropy (Eq. 1) on edges of the client's fuzzy kNN graph (UMAP's fuzzy
    simplicial set on scikit-learn's exact neighbours, :func:`.vgm2_umap.fuzzy_graph`, built
    once per client and kept in its state), the pairs' log-loss of ``pi_1(s_ij)`` (Eq. 3-4) over
    every pair of the batch, the soft-binned calibration error (Eq. 5) of the same pairs and
    ``KL(q || p_t)`` to the broadcast prior (Eq. 6). The client's markers ``q`` start from the
    prior (Alg. 1 line 4) and are trained by Adam on their unconstrained parameters (log of the
    positive ones). Only the markers (2, 5, K) and the row count cross the wire; the server
    aggregates them (``aggregation="moment"``: Prop. 1's moment matching, the default;
    ``"natural"``: Sec. 3.5's natural-parameter average), clients weighted by rows.

    Differential privacy (a client's ``PrivacyPolicy.dp`` with its ``dp_sgd``; the server's
    ``dp_mode``): the encoder and markers train together by DP-SGD on pairs of rows
    (:func:`~fednovelty.federated.bayesian.vgm2_training.private_markers`: a row and its
    successor in a random cycle of each Poisson sample, units clipped to ``C / 3`` so that
    one row moves a step by at most ``C``; the calibration and UMAP terms, which are not sums
    over such pairs, left out); the row count is released as a one-bin histogram (the gate's
    noise), the loss is withheld, the server averages with equal weights. The markers that
    leave are covered; a client's own predictions read its training rows and are not.

    Ablations are settings: ``n_markers=1``, ``calibration_weight=0``, ``train_encoder=False``
    (the encoder stays at its initial weights; the markers are still trained).

    Choices where the paper is silent (``docs/vgm2.md``): the encoder (MLP ``m -> 128 -> 16``,
    or with ``encoder_type="convnet"`` a small ConvNet for square images, the same initial weights
    on every client), ``pi_hat_1 = pi_hat_0 = 1/2`` (Eq. 3), per-batch
    mean losses with ``gamma = eta = 1``, ``lambda = 0.01``, Adam at ``1e-3`` (networks) and
    ``1e-2`` (markers), UMAP's ``n_neighbors = 15``, ``min_dist = 0.1``, 5 negatives per edge
    (shuffled tails of the batch, as parametric UMAP), the prior ``p_0`` of
    :func:`~fednovelty.mixture.dirnig.default_markers`. Prediction
    (:func:`~fednovelty.federated.bayesian.vgm2_markers.marker_scores`,
    ``prediction="nearest"``): among the ``top_m = 5`` training rows of client ``k`` nearest to
    ``f_k(x)``, class ``c`` scores the sum of ``pi_1(||f_k(x) - f_k(x_j)||)`` (``q_k``'s
    markers) of its rows, normalised; classes the client never saw score 0. The first rule
    tried, ``prediction="top_pi"`` (the mean of a class's ``top_m`` largest ``pi_1``), fails
    because the learned ``pi_1(s)`` is not monotone in ``s`` (``docs/vgm2.md``); it stays as a
    setting.
    """

    config_class = VGM2Config
    step_class = VGM2Step
    config: VGM2Config

    def _setup(self, config: VGM2Config) -> None:
        self.ab = umap_ab(config.min_dist)
        super()._setup(config)

    def initial_prior(self) -> Tensor:
        """``p_0(M)``, (2, 5, K)."""
        return default_markers(self.config.n_markers, dtype=self.config.dtype).to(
            self.config.device
        )

    def new_state(self) -> VGM2State:
        return VGM2State(prior=self.initial_prior())

    def client_proba(
        self,
        client_state: dict[str, Tensor],
        state: VGM2State,
        X: Tensor,
        reference: tuple[Tensor, Tensor] | None = None,
        rule: str | None = None,
    ) -> Tensor:
        """Class probabilities (n, n_classes) of rows ``X`` for a client whose kept state is
        ``client_state`` (``{}``: never trained: initial weights, markers = the final prior):
        :func:`~fednovelty.federated.bayesian.vgm2_markers.marker_scores` against
        ``reference`` (the client's training rows and labels), normalised to sum to 1
        (uniform over the reference's classes when every score is 0); ``rule`` overrides
        ``config.prediction``."""
        config = self.config
        encoder, _ = self.predicting_networks(client_state, state)
        encoder = {k: v.to(X) for k, v in encoder.items()}
        with torch.no_grad():
            Z = embed(self.encoder, encoder, X)
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
