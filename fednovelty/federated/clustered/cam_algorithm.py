"""The base of the Fed-CAM paper's classification methods (Ma et al., "Structured federated
learning through clustered additive modeling"): :class:`ClusteredAlgorithm`.

Each method of the paper's Table 1 is a short subclass in its own module
(:mod:`~fednovelty.federated.clustered.fedavg_plus`, :mod:`~.ifca`, :mod:`~.fesem`,
:mod:`~.ifca_cam`, :mod:`~.fesem_cam`) that declares its steps (the warm-up, the rule by
which clients are clustered) and whether a global model is added to the cluster models;
:data:`~fednovelty.federated.clustered.cam_methods.CLUSTERED_METHODS` names them. Every
model is a learner of ``learner_factory`` trained by
:func:`~fednovelty.federated.core.learners.local_sgd` and averaged by
:func:`~fednovelty.federated.core.aggregate.average_params`; client data is a pair
``(X, y)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor

from fednovelty.federated.clustered.cam_models import ModelLayout
from fednovelty.federated.clustered.cam_settings import ClusteredConfig, ClusteredState
from fednovelty.federated.clustered.cam_step import ModelStep
from fednovelty.federated.core.learners import initial_parameters, learner_template
from fednovelty.federated.core.steps import ChainedAlgorithm

__all__ = ["ClusteredAlgorithm"]


class ClusteredAlgorithm(ChainedAlgorithm):
    """The Fed-CAM paper's classification methods: a subclass per method,
    ``IFCACAM(n_features, n_classes, **settings)`` with the settings of its config (a
    :class:`~fednovelty.federated.clustered.cam_settings.ClusteredConfig`), or
    ``IFCACAM.from_config(IFCACAMConfig(...))``.

    A subclass declares (class attributes):

    - ``method``: the method's name in the paper (``"IFCA-CAM"``), read-only.
    - ``warmup``: its warm-up step (:class:`~.cam_global_warmup.GlobalWarmupStep`,
      :class:`~.cam_local_warmup.LocalWarmupStep`) or ``None``.
    - ``clustering``: the step of its clustered rounds, which says how clients are
      clustered (:class:`~.cam_cluster_step.MinLossClusterStep`,
      :class:`~.cam_cluster_step.KMeansClusterStep`; FedAvg+:
      :class:`~.cam_ensemble.EnsembleStep`, no clusters).
    - ``additive``: whether a global model is added to the cluster models' logits (CAM,
      Eq. 1: ``F_i(x) = h(x; Theta_g) + f(x; Theta_c(i))``).
    - ``config_class``: its settings, whose ``WARMUP`` rule says what ``warmup_rounds`` may be.

    The chain is ``warmup`` (when there is one) then ``clustering``. Initial models:
    ``n_clusters + 1`` draws of ``learner_factory`` under ``random_state``, the cluster
    models (members) first and the global model last; k-means methods start every client's
    warm-up from the first.

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
    server's ``dp_mode`` set) every reply is a ``"parts"`` release
    (:data:`~.cam_step.MODEL_PARTS`), every mechanism runs on the client, from its own
    generator, in every ``dp_mode``:

    - **Models**: every model a client sends is trained by its own DP-SGD
      (:func:`~.cam_private.private_models`: ``dp_sgd.steps`` Poisson-sampled steps, not
      ``local_steps`` mini-batches); the models one round trains on the same rows share one
      loop and one joint clip, one Gaussian mechanism a step: FedAvg+'s ``K`` members, and
      CAM's cluster and global halves (:class:`~.cam_private.AdditivePair`, each on the
      residual of the other's broadcast model as in the FedSim update). The proximal pull
      ``kmeans_reg`` of FeSEM-CAM then applies to both halves.
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

    Attributes:
        template: the module every model is evaluated with; parameter_names,
            linear_names: its parameters and FeSEM's coordinates (:class:`ModelLayout`).
    """

    labelled = True
    method: ClassVar[str] = ""
    warmup: ClassVar[type[ModelStep] | None] = None
    clustering: ClassVar[type[ModelStep]]
    additive: ClassVar[bool] = False

    def __init__(self, n_features: int, n_classes: int, **settings: Any) -> None:
        config_class = type(self).config_class
        if config_class is None:
            raise TypeError(
                f"{type(self).__name__} is the methods' base; build one of the methods "
                "(fednovelty.federated.clustered.cam_methods.CLUSTERED_METHODS)."
            )
        self._setup(config_class(n_features=n_features, n_classes=n_classes, **settings))

    def _setup(self, config: ClusteredConfig) -> None:
        super()._setup(config)
        self.layout = ModelLayout(config)
        self.template = self.layout.template
        self.parameter_names = self.layout.names
        self.linear_names = self.layout.linear_names
        chain = [self.clustering] if self.warmup is None else [self.warmup, self.clustering]
        self._chain([step(config, self.layout, self.additive) for step in chain])

    def private_choices(self, kind: str) -> int:
        """The noisy cluster choices a client makes in one round of ``kind`` under
        differential privacy (each one Gaussian mechanism of multiplier ``HISTOGRAM_SHARE *
        z``, the cost of one released histogram): 1 in IFCA's and IFCA-CAM's clustered
        rounds, else 0."""
        owner = self._owner.get(kind)
        return 0 if owner is None else self.steps[owner].noisy_choices

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
        return self.layout.unflatten(vector)

    def split_data(self, data: Any) -> tuple[Tensor, tuple[Tensor]]:
        if not isinstance(data, tuple | list) or len(data) != 2:
            raise ValueError(
                f"{type(self).__name__} clients hold (X, y) pairs; got {type(data).__name__}"
                + (f" of {len(data)}" if isinstance(data, tuple | list) else "")
                + "."
            )
        X, y = data
        if y.shape[0] != X.shape[0]:
            raise ValueError(f"client data rows disagree: X has {X.shape[0]}, y {y.shape[0]}.")
        return X, (y,)
