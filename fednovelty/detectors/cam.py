"""``ClusteredFLClassifier``: the Fed-CAM paper's classification methods (FedAvg+, IFCA,
FeSEM, IFCA-CAM, FeSEM-CAM; Ma et al.) as one estimator.

A classifier, not a novelty detector: it models ``p(y | x)`` with cluster models (and, for
the CAM methods, a global model added to them, ``F_i(x) = h(x; Theta_g) + f(x;
Theta_c(i))``), and has no density of ``x``. ``fit(X, y, groups)`` runs the simulated
federation of the method's algorithm (``CLUSTERED_METHODS[method]``, a
:class:`~fednovelty.federated.clustered.cam_algorithm.ClusteredAlgorithm`); ``predict_y(X,
client=c)`` classifies with client ``c``'s cluster. The algorithms and their choices (warm-up,
the residual alternation, empty clusters, ties) are described in
:mod:`fednovelty.federated.clustered.cam_algorithm` and ``docs/clustered.md``.

With ``Privacy.epsilon`` every client trains the models it sends by DP-SGD and picks its cluster
privately (IFCA, IFCA-CAM: a report-noisy-min over clipped losses; FeSEM: from the model it
released); the budget buys both (:func:`~fednovelty.detectors._cam_privacy.private_plan`),
and ``privacy_spent_`` reports what
the fit spent.
"""

from __future__ import annotations

import math
from dataclasses import replace
from numbers import Integral, Real

import numpy as np
import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._cam_privacy import private_plan
from fednovelty.detectors._classifier import FederatedClassifier
from fednovelty.detectors._dp import DPPlan, privacy_record, public_bounds, round_costs
from fednovelty.detectors._labels import label_codes
from fednovelty.detectors._option_fields import DP_SGD
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.base import labelled_tensors
from fednovelty.detectors.options import Privacy, Robustness, Training
from fednovelty.detectors.persistence import check_items, get_attr, get_tensor
from fednovelty.detectors.persistence_checks import check_network
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_methods import CLUSTERED_METHODS
from fednovelty.federated.clustered.cam_models import (
    cluster_log_proba,
    ensemble_proba,
    mean_losses,
    model_rows,
    model_template,
)
from fednovelty.federated.clustered.cam_settings import (
    CLUSTER_AVERAGES,
    EMPTY_CLUSTER_RULES,
    ClusteredConfig,
    ClusteredState,
)
from fednovelty.federated.core.learners import LEARNERS, logits
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE

_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]
#: The privacy fields Fed-CAM reads: all but ``mode`` and ``local_iterations`` (every
#: mechanism of a private Fed-CAM round runs on the client, its DP-SGD and its noisy cluster
#: choice, so the plan is ``"local"``).
_PRIVACY_FIELDS = ("min_rows", "epsilon", "delta", "bounds", "clip", *DP_SGD, "loss_clip")


class ClusteredFLClassifier(FederatedClassifier):
    """Clustered federated classification (the Fed-CAM paper's Table 1 methods).

    Attributes:
        classes_: the label values, sorted; columns of ``predict_proba_y``.
        client_ids_, n_clients_: the clients of ``fit``, in ``groups``' sorted order.
        client_clusters_: (n_clients,) each client's cluster in ``client_ids_`` order (its
            latest assignment); -1 for a client the server never heard from (below its
            privacy floor) and for every client of FedAvg+ (no clusters).
        cluster_sizes_history_: (n_rounds, n_clusters) clients per cluster after every
            round (a row of zeros: a round without assignments, e.g. IFCA-CAM's warm-up).
        cluster_sizes_: (n_clusters,) clients per cluster at the end.
        warmup_rounds_: the warm-up rounds run.
        state_: the final
            :class:`~fednovelty.federated.clustered.cam_settings.ClusteredState` (models).
        learner_template_: the learners' module (evaluated with each model's parameters).
        history_, n_rounds_, bytes_up_, bytes_down_, n_features_in_, feature_names_in_:
            as the detectors'; ``history_`` rounds carry ``loss`` (not under
            ``dp_epsilon``: withheld), ``n_empty`` and ``reseeded``.
        input_bounds_, input_clip_: the public box the models' rows were mapped to and the
            radius they were clipped to (``dp_epsilon``; ``None`` without), applied to every
            row predicted.
        privacy_spent_: with ``dp_epsilon``, what the fit spent: ``epsilon`` (at ``delta``;
            ``epsilon_against_server`` is the same, every noise being the client's),
            ``sgd_steps``, ``sgd_noise_multiplier``, ``sample_rate``, ``cluster_choices``
            (noisy choices made) with ``choice_noise_multiplier``, and the accountant.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import ClusteredFLClassifier, Training
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(0, 1, (800, 2))
        >>> groups = np.repeat(np.arange(8), 100)
        >>> y = np.where(groups % 2 == 0, X[:, 0] > 0, X[:, 0] < 0).astype(int)
        >>> clf = ClusteredFLClassifier("IFCA-CAM", n_clusters=2, learner="linear",
        ...     rounds=20, training=Training(learning_rate=0.1), random_state=0).fit(X, y, groups)
        >>> clf.client_clusters_.tolist() in ([0, 1] * 4, [1, 0] * 4)
        True
    """

    _params = declare(
        Param(
            "method",
            "IFCA-CAM",
            [StrOptions(set(CLUSTERED_METHODS))],
            '``"IFCA-CAM"``, ``"FeSEM-CAM"``, ``"IFCA"``, ``"FeSEM"`` or ``"FedAvg+"`` (an '
            "ensemble of ``n_clusters`` FedAvg models, soft vote).",
        ),
        Param(
            "n_clusters",
            5,
            _POSITIVE_INT,
            "K cluster models (FedAvg+: ensemble members); the paper uses 5 and 10.",
        ),
        Param(
            "warmup_rounds",
            None,
            [Interval(Integral, 0, None, closed="left"), None],
            "the CAM warm-up (IFCA-CAM: FedAvg of the global model; FeSEM, FeSEM-CAM: local "
            "training only before the first k-means); ``None``: 30 % of ``rounds`` for the CAM "
            "methods, 1 for FeSEM, 0 for IFCA and FedAvg+.",
        ),
        option(
            Training,
            fields=("local_steps", "learning_rate", "batch_size", "optimizer", "momentum"),
            auto={"learning_rate": 1e-3, "batch_size": 32},
        ),
        Param(
            "kmeans_reg",
            0.01,
            [Interval(Real, 0.0, None, closed="left")],
            "FeSEM's lambda (pull of a client's model towards its centre).",
        ),
        Param("kmeans_iter", 10, _POSITIVE_INT, "most Lloyd iterations of the server's k-means."),
        Param(
            "cluster_average",
            "cluster",
            [StrOptions(set(CLUSTER_AVERAGES))],
            '``"cluster"`` (a cluster model is its clients\' row-weighted mean) or '
            '``"global"`` (the paper\'s Eq. 6).',
        ),
        Param(
            "empty_clusters",
            "keep",
            [StrOptions(set(EMPTY_CLUSTER_RULES))],
            '``"keep"`` (an empty cluster keeps its model) or ``"reseed"``.',
        ),
        option(Robustness, docs={"aggregation": "Applies to every model the server averages."}),
        option(
            Privacy,
            fields=_PRIVACY_FIELDS,
            docs={
                "sample_rate": "Fed-CAM: a round runs ``local_steps`` DP-SGD steps.",
                "learner_share": "Fed-CAM: the rest buys IFCA's noisy cluster choices.",
            },
        ),
        docs={
            "rounds": "Warm-up included (the paper: 100).",
            "dtype": "Default ``float32``: the models are neural networks.",
        },
    )

    def __init__(
        self,
        method="IFCA-CAM",
        n_clusters=5,
        *,
        learner="mlp",
        rounds=100,
        warmup_rounds=None,
        training=None,
        kmeans_reg=0.01,
        kmeans_iter=10,
        cluster_average="cluster",
        empty_clusters="keep",
        sampling=None,
        robustness=None,
        privacy=None,
        random_state=None,
        device=None,
        dtype="float32",
        progress=False,
    ) -> None:
        store(self, locals())

    # -------------------------------------------------------------- fitting
    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        if self.method != "FedAvg+" and self.n_clusters > self.n_clients_:
            raise ValueError(
                f"n_clusters={self.n_clusters} exceeds the {self.n_clients_} client(s): a "
                "cluster needs at least one client. Lower n_clusters."
            )
        config = self._config(self.n_features_in_, len(self.classes_), seed)
        method = CLUSTERED_METHODS[self.method]
        plan = private_plan(self, method.from_config(config), len(clients))
        if plan is not None:
            config = replace(config, **plan.settings)
        algorithm = method.from_config(config)
        data = labelled_tensors(clients, labels)
        privacy = self._privacy_policy(
            dp=None if plan is None else plan.policy, dp_sgd=None if plan is None else plan.sgd
        )
        result = self._simulate(
            algorithm, data, seed, full=True, privacy=privacy, **self._engine_settings()
        )
        self.warmup_rounds_ = config.warmup_rounds
        self.learner_template_ = algorithm.template
        self.input_bounds_ = config.bounds
        self.input_clip_ = config.dp_clip if config.private else None
        self._set_privacy_spent(plan, algorithm)
        self._set_fitted_state(result.state)

    def _config(self, n_features: int, n_classes: int, seed: int) -> ClusteredConfig:
        config_class = CLUSTERED_METHODS[self.method].config_class
        return config_class(
            **self._settings(n_features, config_class),
            n_features=n_features,
            n_classes=n_classes,
            random_state=seed,
            **self._torch_options(),
        )

    def _set_privacy_spent(self, plan: DPPlan | None, algorithm: ClusteredAlgorithm) -> None:
        """``privacy_spent_`` of the fit under ``plan`` (removed without one): the
        declared parts' costs of every round that ran (:func:`round_costs`: DP-SGD steps)
        plus the client-side noisy choices of IFCA's clustered rounds, each one released
        histogram's."""
        if plan is None:
            if hasattr(self, "privacy_spent_"):
                del self.privacy_spent_
            return
        costs = {
            kind: replace(cost, histograms=cost.histograms + algorithm.private_choices(kind))
            for kind, cost in round_costs(algorithm, plan).items()
        }
        record = privacy_record(plan, self.history_, costs)
        ran = [r.get("kind") for r in self.history_ if not r.get("failed")]
        choices = sum(algorithm.private_choices(kind) for kind in ran)
        record.update(
            cluster_choices=choices,
            choice_noise_multiplier=HISTOGRAM_SHARE * plan.policy.noise_multiplier,
            loss_clip=algorithm.config.dp_loss_clip,
        )
        self.privacy_spent_ = record

    def _model_input(self, X: torch.Tensor) -> torch.Tensor:
        """Rows as the fitted models saw them (:func:`model_rows`: the public box and the
        clip of a private fit)."""
        return model_rows(
            X, getattr(self, "input_bounds_", None), getattr(self, "input_clip_", None)
        )

    def _set_fitted_state(self, state: ClusteredState) -> None:
        """``state_``, ``client_clusters_``, ``cluster_sizes_history_`` and ``cluster_sizes_``
        from a final state whose client ids are indexes into ``client_ids_``."""
        self.state_ = state
        self.client_clusters_ = np.asarray(
            [state.client_clusters.get(i, -1) for i in range(self.n_clients_)], dtype=np.int64
        )
        sizes = np.asarray(state.cluster_sizes, dtype=np.int64)
        self.cluster_sizes_history_ = sizes.reshape(len(state.cluster_sizes), self.n_clusters)
        known = self.client_clusters_[self.client_clusters_ >= 0]
        self.cluster_sizes_ = np.bincount(known, minlength=self.n_clusters).astype(np.int64)

    # -------------------------------------------------------------- predicting
    @property
    def _additive(self) -> bool:
        return CLUSTERED_METHODS[self.method].additive

    def _cluster_of(self, client, cluster) -> int | None:
        """The cluster to predict with: ``cluster`` as given, ``client``'s (``None`` for a
        client without one), or ``None`` for neither (and for any client of FedAvg+).

        Raises:
            ValueError: both given, a cluster out of range (or any under FedAvg+), or a
                client not seen in fit (under FedAvg+ too), naming the known ones.
        """
        if client is not None and cluster is not None:
            raise ValueError("pass client= or cluster=, not both.")
        fedavg_plus = self.method == "FedAvg+"
        if cluster is not None:
            if fedavg_plus:
                raise ValueError("FedAvg+ has no clusters: its members vote; drop cluster=.")
            if isinstance(cluster, bool) or not isinstance(cluster, Integral):
                raise ValueError(f"cluster must be an integer; got {cluster!r}.")
            if not 0 <= int(cluster) < self.n_clusters:
                raise ValueError(f"cluster must be in [0, {self.n_clusters}); got {cluster}.")
            return int(cluster)
        if client is None:
            return None
        matches = np.flatnonzero(self.client_ids_ == client)
        if matches.size == 0:
            raise ValueError(
                f"unknown client {client!r}; known clients: {self.client_ids_[:10].tolist()}"
                + (" ..." if self.n_clients_ > 10 else "")
                + (
                    ". FedAvg+ predicts alike for every client: predict without client=."
                    if fedavg_plus
                    else ". For a client unseen in fit, assign_cluster(X, y) gives its cluster."
                )
            )
        if fedavg_plus:  # no clusters: every client's members vote alike
            return None
        found = int(self.client_clusters_[matches[0]])
        return None if found < 0 else found

    def predict_proba_y(self, X, client=None, *, cluster=None) -> np.ndarray:
        """Class probabilities ``p(y | x)``, (n_samples, n_classes), columns ``classes_``.

        Args:
            X: rows (n_samples, n_features).
            client: a client id of ``fit``: its cluster's model (CAM: plus the global
                model); a client without a cluster (below its privacy floor) gets the
                no-client prediction.
            cluster: a cluster index instead of a client (e.g. from ``assign_cluster``).

        Without either: the cluster models' probabilities averaged with the final cluster
        sizes as weights (equal weights when no client has a cluster); FedAvg+ always
        answers its members' soft vote.
        """
        self._check_fitted()
        k = self._cluster_of(client, cluster)
        Xt = self._model_input(self._check_score_input(X))
        template, state = self.learner_template_, self.state_
        if self.method == "FedAvg+":
            return ensemble_proba(template, state, Xt).cpu().numpy().astype(np.float64)
        if k is not None:
            log_proba = cluster_log_proba(template, state, Xt, k, self._additive)
            return log_proba.exp().cpu().numpy().astype(np.float64)
        sizes = self.cluster_sizes_.astype(np.float64)
        weights = sizes / sizes.sum() if sizes.sum() > 0 else np.full(self.n_clusters, 1.0)
        weights = weights / weights.sum()
        proba = sum(
            float(w) * cluster_log_proba(template, state, Xt, j, self._additive).exp()
            for j, w in enumerate(weights)
            if w > 0
        )
        return proba.cpu().numpy().astype(np.float64)

    def predict_y(self, X, client=None, *, cluster=None) -> np.ndarray:
        """The most probable label of each row, in the original label values; ``client`` and
        ``cluster`` as in :meth:`predict_proba_y`."""
        proba = self.predict_proba_y(X, client, cluster=cluster)
        return self.classes_[proba.argmax(1)]

    def predict_proba(self, X, client=None, *, cluster=None) -> np.ndarray:
        """scikit-learn's name for :meth:`predict_proba_y`."""
        return self.predict_proba_y(X, client, cluster=cluster)

    def predict(self, X, client=None, *, cluster=None) -> np.ndarray:
        """scikit-learn's name for :meth:`predict_y`."""
        return self.predict_y(X, client, cluster=cluster)

    def assign_cluster(self, X, y) -> int:
        """The cluster a client unseen in fit joins: the cluster model (CAM: plus the global
        model) with the lowest mean cross-entropy on its labelled rows (IFCA's rule, Eq. 2;
        ties: the lowest index). The estimator is not modified.

        Raises:
            ValueError: FedAvg+ (no clusters), or labels not seen in fit.
        """
        self._check_fitted()
        if self.method == "FedAvg+":
            raise ValueError("FedAvg+ has no clusters to assign; predict without client=.")
        Xt = self._check_score_input(X)
        codes = label_codes(y, self.classes_, Xt.shape[0], Xt.device)
        Xt = self._model_input(Xt)
        template, state = self.learner_template_, self.state_
        offset = None
        if self._additive:
            with torch.no_grad():
                offset = logits(template, state.global_model, Xt)
        losses = mean_losses(template, state.cluster_models, Xt, codes, offset)
        return int(losses.argmin())

    # -------------------------------------------------------------- persistence
    def save(self, path) -> None:
        """Save the fitted classifier (safetensors + JSON metadata; no pickle); a model with
        a learner factory cannot be saved (a ValueError says so)."""
        self._check_fitted()
        if callable(self.learner):
            raise ValueError(
                "a model with a custom learner factory cannot be saved safely (the factory is "
                f"code, and loading runs no code); use a named learner {sorted(LEARNERS)}."
            )
        super().save(path)

    def _saved_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        state = self.state_
        tensors = {}
        for k, params in enumerate(state.cluster_models):
            tensors.update({f"cluster.{k}.{name}": v for name, v in params.items()})
        if self._additive:
            tensors.update({f"global.{name}": v for name, v in state.global_model.items()})
        bounds = getattr(self, "input_bounds_", None)
        attrs = {
            **self._common_attrs(),
            "client_clusters_": self.client_clusters_.tolist(),
            "cluster_sizes_history_": self.cluster_sizes_history_.tolist(),
            "warmup_rounds_": int(self.warmup_rounds_),
            "input_bounds_": None if bounds is None else [list(row) for row in bounds],
            "input_clip_": getattr(self, "input_clip_", None),
        }
        return tensors, attrs

    def _restore_private(self, attrs: dict) -> None:
        """``input_bounds_`` and ``input_clip_`` from saved ``attrs`` (absent: a fit
        without ``dp_epsilon``), validated."""
        bounds, clip = attrs.get("input_bounds_"), attrs.get("input_clip_")
        try:
            self.input_bounds_ = (
                None if bounds is None else public_bounds(bounds, self.n_features_in_)
            )
        except ValueError as error:
            raise ModelFormatError(f"input_bounds_: {error}") from None
        number = isinstance(clip, int | float) and not isinstance(clip, bool)
        if clip is not None and not (number and math.isfinite(clip) and clip > 0):
            raise ModelFormatError(f"input_clip_ must be a positive number or null; got {clip!r}.")
        self.input_clip_ = None if clip is None else float(clip)

    def _set_state(self, tensors: dict[str, torch.Tensor], attrs: dict) -> None:
        """Restore the fitted attributes from ``save``'s output, validated."""
        options = self._torch_options()
        self._restore_common(attrs)
        classes = self.classes_.tolist()
        clusters = check_items(get_attr(attrs, "client_clusters_", list), "client_clusters_", int)
        if len(clusters) != self.n_clients_ or any(not -1 <= c < self.n_clusters for c in clusters):
            raise ModelFormatError(
                f"client_clusters_ must hold one cluster in [-1, {self.n_clusters}) per client "
                f"({self.n_clients_})."
            )
        history = check_items(
            get_attr(attrs, "cluster_sizes_history_", list), "cluster_sizes_history_", list
        )
        for row in history:
            check_items(row, "cluster_sizes_history_ rows", int)
            if len(row) != self.n_clusters or min(row, default=0) < 0:
                raise ModelFormatError(
                    f"cluster_sizes_history_ rows must hold {self.n_clusters} counts >= 0."
                )
            if sum(row) > self.n_clients_:
                raise ModelFormatError(
                    f"a cluster_sizes_history_ row places {sum(row)} clients; the model has "
                    f"{self.n_clients_} (client_ids_)."
                )
        self.warmup_rounds_ = get_attr(attrs, "warmup_rounds_", int, minimum=0)
        self._restore_private(attrs)
        if self.warmup_rounds_ > self.n_rounds_:
            raise ModelFormatError(
                f"warmup_rounds_={self.warmup_rounds_} exceeds n_rounds_={self.n_rounds_}."
            )
        try:
            config = self._config(self.n_features_in_, len(classes), 0)
        except ValueError as error:
            raise ModelFormatError(
                f"the attributes 'n_features_in_' and 'classes_' make no model: {error}"
            ) from None
        self.learner_template_ = model_template(config)
        shapes = {n: tuple(p.shape) for n, p in self.learner_template_.named_parameters()}

        def model(prefix: str) -> dict[str, torch.Tensor]:
            params = {n: get_tensor(tensors, f"{prefix}{n}", s) for n, s in shapes.items()}
            check_network(params, f"the model '{prefix}*'")
            return {n: v.to(**options) for n, v in params.items()}

        state = ClusteredState(
            phase="done",
            rounds=self.n_rounds_,
            global_model=model("global.") if self._additive else {},
            cluster_models=[model(f"cluster.{k}.") for k in range(self.n_clusters)],
            client_clusters={i: int(c) for i, c in enumerate(clusters) if c >= 0},
            cluster_sizes=[list(row) for row in history],
        )
        self._set_fitted_state(state)
