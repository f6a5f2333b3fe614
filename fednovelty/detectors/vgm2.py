"""``VGM2Classifier``: VGM2 (Puppala et al.) and its baselines (Local, FedAvg,
Prototype sharing) as one personalised classifier.

A classifier, not a novelty detector: ``fit(X, y, groups)`` runs the simulated federation of
the algorithm ``method`` names (:data:`~fednovelty.federated.bayesian.vgm2_methods.
VGM2_ALGORITHMS`: :class:`~fednovelty.federated.bayesian.vgm2.VGM2` or a baseline;
``clients_per_round`` clients sampled each round, the paper's 2), and
``predict_y(X, client=c)`` classifies with client ``c``'s personal model: VGM2 by its
markers' same-class probabilities ``pi_1`` between the row and ``c``'s training rows in
``c``'s embedding (summed per class over the ``top_m`` nearest), Local and Prototype sharing
by ``c``'s own network, FedAvg by the global network (``client`` may be left out). A client
never sampled predicts with the initial encoder (VGM2: and the final prior as its markers).
The algorithm, its choices and the measured results are in
:mod:`fednovelty.federated.bayesian.vgm2` and ``docs/vgm2.md``.

Each VGM2 client keeps its training rows as the reference of its predictions (they stay
with the client: only markers cross the wire); the fitted estimator, which simulates every
client, holds them in ``client_states_`` and in its saved file.

With ``Privacy.epsilon`` (VGM2, FedAvg, Local) what leaves the clients is differentially
private per client row: the markers or network by DP-SGD (pairs of rows for VGM2), the row
count by the gate's histogram noise; :func:`~fednovelty.detectors._vgm2_privacy.vgm2_dp_plan`
calibrates both for ``rounds`` replies of every client and ``privacy_spent_`` reports what
the fit spent. The guarantee covers the
server's prior or global network and every reply; a client's own predictions read its
training rows (VGM2's reference) or its network, trained on them, and are not covered.
"""

from __future__ import annotations

from numbers import Integral
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._classifier import FederatedClassifier
from fednovelty.detectors._dp import DPPlan, RoundCost, privacy_record
from fednovelty.detectors._engine_check import refuse_flower_sim
from fednovelty.detectors._option_fields import DP_SGD
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors._vgm2_privacy import PRIVATE_HISTOGRAMS, vgm2_dp_plan
from fednovelty.detectors.base import labelled_tensors
from fednovelty.detectors.options import ClientSampling, Privacy, Robustness, Training
from fednovelty.detectors.persistence import check_items, check_positive, get_attr, get_tensor
from fednovelty.detectors.persistence_checks import check_network
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.bayesian.vgm2 import VGM2_AGGREGATIONS, VGM2_PREDICTIONS
from fednovelty.federated.bayesian.vgm2_algorithm import EncoderAlgorithm
from fednovelty.federated.bayesian.vgm2_methods import VGM2_ALGORITHMS, VGM2_METHODS
from fednovelty.federated.bayesian.vgm2_settings import (
    ENCODER,
    ENCODERS,
    HEAD,
    MARKERS,
    EncoderSettings,
    VGM2State,
)
from fednovelty.federated.bayesian.vgm2_step import VGM2_KIND
from fednovelty.federated.trust.dp_sgd import steps_for_epochs
from fednovelty.mixture.dirnig import check_markers

_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]
#: what a client keeps that the estimator keeps too (the graph is training-only).
_KEPT = (ENCODER, HEAD, MARKERS, "reference.")


class VGM2Classifier(FederatedClassifier):
    """VGM2 and its baselines on one encoder (the VGM2 paper's Table 1).

    Attributes:
        classes_: the label values, sorted; columns of ``predict_proba_y``.
        client_ids_, n_clients_: the clients of ``fit``, in ``groups``' sorted order.
        state_: the final :class:`~fednovelty.federated.bayesian.vgm2_settings.VGM2State`
            (prior, global network, prototypes).
        client_states_: per client (``client_ids_`` order) what it keeps: ``vgm2.encoder.*``,
            ``vgm2.head.*``, ``vgm2.markers`` and (VGM2) its reference rows
            ``reference.X``, ``reference.y``; ``{}`` plus the reference for a client never
            sampled.
        markers_: (n_clients, 2, 5, K) each client's markers (VGM2; the final prior for a
            client never sampled).
        sampled_counts_: (n_clients,) rounds each client trained in.
        bytes_per_client_round_: mean bytes one client uploads in a round (measured).
        history_, n_rounds_, bytes_up_, bytes_down_, n_features_in_, feature_names_in_:
            as the detectors'; ``history_`` rounds carry ``loss`` and ``n_invalid``.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import Training, VGM2Classifier
        >>> rng = np.random.default_rng(0)
        >>> y = np.repeat([0, 1, 2, 3], 60)
        >>> X = rng.normal(0, 0.3, (240, 5)) + np.eye(5)[y] * 3
        >>> groups = np.repeat([0, 1, 2, 3], 60) // 2  # two clients, two classes each
        >>> clf = VGM2Classifier(rounds=4, training=Training(local_epochs=2), hidden=16,
        ...     embedding_dim=4, random_state=0).fit(X, y, groups)
        >>> float((clf.predict_y(X[:60], client=0) == y[:60]).mean()) > 0.9
        True
    """

    #: files saved when ``aggregation`` named the markers' rule and the robust option was
    #: ``robust_aggregation``.
    _renamed_params: ClassVar[dict] = {
        "aggregation": "posterior_merge",
        "robust_aggregation": "aggregation",
    }
    _params = declare(
        Param(
            "method",
            "vgm2",
            [StrOptions(set(VGM2_METHODS))],
            '``"vgm2"``, ``"local"``, ``"fedavg"`` or ``"prototype"``.',
        ),
        Param("n_markers", 3, _POSITIVE_INT, "K components per relation marker (the paper: 3)."),
        Param("embedding_dim", 16, _POSITIVE_INT, "the encoder's output width."),
        Param(
            "hidden",
            128,
            _POSITIVE_INT,
            "the encoder's hidden width (the MLP's hidden layer, the ConvNet's dense layer).",
        ),
        Param(
            "encoder",
            "mlp",
            [StrOptions(set(ENCODERS))],
            '``"mlp"`` (``n_features -> hidden -> embedding_dim``, any rows) or ``"convnet"`` '
            "(two 5x5 convolutions with pooling, then ``hidden`` and ``embedding_dim``: the "
            "paper's small ConvNet, for square one-channel images flattened to rows, side "
            ">= 16, e.g. 784 features for 28 x 28).",
        ),
        Param(
            "clients_per_round",
            2,
            _POSITIVE_INT,
            "clients sampled each round (the paper: 2; capped at the number of clients).",
            "estimator",
        ),
        option(
            Training,
            fields=("local_epochs", "batch_size", "learning_rate", "marker_learning_rate"),
            auto={"local_epochs": 8, "batch_size": 64, "learning_rate": 1e-3},
            docs={
                "local_epochs": "Each time the client is sampled (the paper: 8).",
                "batch_size": "At least 2.",
                "learning_rate": "Adam's, for the networks.",
            },
        ),
        Param("train_encoder", True, ["boolean"], "False freezes the encoder (ablation)."),
        Param(
            "posterior_merge",
            "moment",
            [StrOptions(set(VGM2_AGGREGATIONS))],
            'how the server combines the clients\' markers: ``"moment"`` (moment matching, '
            'Prop. 1) or ``"natural"`` (natural-parameter averaging, Sec. 3.5).',
        ),
        option(
            Robustness,
            docs={
                "aggregation": "The FedAvg baseline's encoders and heads; the other methods "
                'take ``"sum"`` only.'
            },
            settings={"aggregation": "robust_aggregation"},
        ),
        option(
            ClientSampling,
            fields=("engine",),
            docs={
                "engine": "The clients asked each round are ``clients_per_round``'s. "
                '``"flower-sim"`` refuses ``privacy.epsilon`` at ``fit``.'
            },
        ),
        Param(
            "prediction",
            "nearest",
            [StrOptions(set(VGM2_PREDICTIONS))],
            'VGM2\'s rule: ``"nearest"`` (among the ``top_m`` nearest training rows, a class '
            "scores the sum of its rows' ``pi_1``) or ``\"top_pi\"`` (the mean of a class's "
            "``top_m`` largest ``pi_1``); read at prediction time too.",
        ),
        Param("top_m", 5, _POSITIVE_INT, "rows (or ``pi_1`` values) ``prediction`` reads."),
        option(
            Privacy,
            fields=("min_rows", "epsilon", "delta", "mode", *DP_SGD),
            auto={"learner_share": 0.9},
            docs={
                "epsilon": "VGM2, FedAvg and Local (the prototype baseline has no private "
                "form); every client's budget covers all ``rounds``. VGM2 trains without its "
                "calibration and UMAP terms under DP.",
                "learner_share": "The rest goes to the noisy row count of every reply.",
            },
        ),
        docs={
            "rounds": "The paper: 100.",
        },
        settings={"posterior_merge": "aggregation", "encoder": "encoder_type"},
    )

    def __init__(
        self,
        method="vgm2",
        n_markers=3,
        *,
        embedding_dim=16,
        hidden=128,
        encoder="mlp",
        rounds=100,
        clients_per_round=2,
        training=None,
        objective=None,
        train_encoder=True,
        posterior_merge="moment",
        sampling=None,
        robustness=None,
        prediction="nearest",
        top_m=5,
        privacy=None,
        random_state=None,
        device=None,
        dtype="float32",
        progress=False,
    ) -> None:
        store(self, locals())

    # -------------------------------------------------------------- fitting
    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        refuse_flower_sim(self, self.n_features_in_)
        config = self._config(self.n_features_in_, len(self.classes_), seed)
        algorithm = self._algorithm_class().from_config(config)
        data = labelled_tensors(clients, labels)
        asked = min(self.clients_per_round, self.n_clients_)
        fraction = 1.0 if asked >= self.n_clients_ else (asked - 0.5) / self.n_clients_
        plan = self._dp_plan()
        engine: dict[str, Any] = {"fraction": fraction}
        if plan is not None:
            engine["privacy"] = self._privacy_policy(dp=plan.policy, dp_sgd=plan.sgd)
        result = self._simulate(algorithm, data, seed, full=True, **engine)
        states = []
        for c, (Xc, yc) in enumerate(data):
            kept = {
                k: v.clone()
                for k, v in result.client_states.get(c, {}).items()
                if k.startswith(_KEPT)
            }
            if self.method == "vgm2":
                kept["reference.X"], kept["reference.y"] = Xc.clone(), yc.clone()
            states.append(kept)
        self.state_ = result.state
        self.client_states_ = states
        self._set_derived()
        self._set_privacy_spent(plan)

    def _dp_plan(self) -> DPPlan | None:
        """The fit's :func:`vgm2_dp_plan`, or ``None`` without ``privacy.epsilon``: every
        round runs ``ceil(local_epochs / privacy.sample_rate)`` DP-SGD steps (none for
        ``method="local"``, whose networks never leave the clients)."""
        privacy = self._option("privacy")
        if privacy.epsilon is None:
            return None
        rate = float(privacy.sample_rate)
        return vgm2_dp_plan(
            float(privacy.epsilon),
            float(privacy.delta),
            privacy.mode,
            int(self.rounds),
            0
            if self.method == "local"
            else steps_for_epochs(int(self._option("training").local_epochs), rate),
            rate,
            float(privacy.sgd_clip),
            float(privacy.learner_share),
            self.n_clients_,
            float(self._option("training").batch_size),
        )

    def _set_privacy_spent(self, plan: DPPlan | None) -> None:
        """``privacy_spent_`` from ``history_``: every round that ran spent one histogram
        and the plan's DP-SGD steps (removed after a fit without ``privacy.epsilon``)."""
        if plan is None:
            if hasattr(self, "privacy_spent_"):
                del self.privacy_spent_
            return
        steps = 0 if plan.sgd is None else plan.sgd.steps
        cost = RoundCost(releases=0, histograms=PRIVATE_HISTOGRAMS, sgd_steps=steps)
        self.privacy_spent_ = privacy_record(plan, self.history_, {VGM2_KIND: cost})

    def _algorithm_class(self) -> type[EncoderAlgorithm]:
        """The algorithm of ``method`` (the family's table, ``VGM2_ALGORITHMS``)."""
        return VGM2_ALGORITHMS[self.method]

    def _config(self, n_features: int, n_classes: int, seed: int) -> EncoderSettings:
        privacy = self._option("privacy")
        dp_mode = None if privacy.epsilon is None else privacy.mode
        config_class = self._algorithm_class().config_class
        return config_class(
            **self._settings(n_features, config=config_class),
            n_features=n_features,
            n_classes=n_classes,
            random_state=seed,
            dp_mode=dp_mode,
            **self._torch_options(),
        )

    def _set_derived(self) -> None:
        """``markers_``, ``sampled_counts_``, ``bytes_per_client_round_`` and the algorithm
        used for prediction, from the fitted state and history."""
        config = self._config(self.n_features_in_, len(self.classes_), 0)
        self.algorithm_ = self._algorithm_class().from_config(config)
        if self.method == "vgm2":
            self.markers_ = (
                torch.stack([s.get(MARKERS, self.state_.prior) for s in self.client_states_])
                .cpu()
                .numpy()
            )
        counts = np.zeros(self.n_clients_, dtype=np.int64)
        up, replies = 0.0, 0
        for record in self.history_:
            up += float(record["bytes_up"])
            replies += int(record["n_replied"])
        for record in getattr(self, "_replied", []):
            counts[record] += 1
        self.sampled_counts_ = counts
        self.bytes_per_client_round_ = up / max(replies, 1)

    def _simulate(self, algorithm, clients, seed, full=False, **engine):
        result = super()._simulate(algorithm, clients, seed, full=full, **engine)
        self._replied = [c for record in result.history for c in record.replied]
        return result

    # -------------------------------------------------------------- predicting
    def _client_index(self, client) -> int | None:
        """The index of ``client`` in ``client_ids_``; ``None`` for the global model
        (FedAvg), or the only client of a one-client fit.

        Raises:
            ValueError: an unknown client, or no client named for a personalised method
                fitted on several clients.
        """
        if client is None:
            if self.method != "fedavg" and self.n_clients_ == 1:
                return 0
            if self.method != "fedavg":
                raise ValueError(
                    f"method={self.method!r} is personalised: pass client=, one of the "
                    f"clients of fit ({self.client_ids_[:10].tolist()}"
                    + (" ..." if self.n_clients_ > 10 else "")
                    + ")."
                )
            return None
        matches = np.flatnonzero(self.client_ids_ == client)
        if matches.size == 0:
            raise ValueError(
                f"unknown client {client!r}; known clients: {self.client_ids_[:10].tolist()}"
                + (" ..." if self.n_clients_ > 10 else "")
                + "."
            )
        return int(matches[0])

    def predict_proba_y(self, X, client=None) -> np.ndarray:
        """Class probabilities (n_samples, n_classes), columns ``classes_``, with client
        ``client``'s model (FedAvg: the global one; ``client`` may be omitted).

        VGM2's "probabilities" are its class scores normalised to sum to 1 (module
        docstring); classes the client never saw get 0. They come in the estimator's
        ``dtype`` (a float32 model's are float32).
        """
        self._check_fitted()
        index = self._client_index(client)
        Xt = self._check_score_input(X)
        kept = {} if index is None else self.client_states_[index]
        reference = None
        if self.method == "vgm2":
            reference = (kept["reference.X"], kept["reference.y"])
        proba = self.algorithm_.client_proba(kept, self.state_, Xt, reference, self.prediction)
        return proba.cpu().numpy()  # in the estimator's dtype: float32 rounds at 1e-7

    def predict_y(self, X, client=None) -> np.ndarray:
        """The most probable label of each row (original label values)."""
        proba = self.predict_proba_y(X, client)
        return self.classes_[proba.argmax(1)]

    def predict_proba(self, X, client=None) -> np.ndarray:
        """scikit-learn's name for :meth:`predict_proba_y`."""
        return self.predict_proba_y(X, client)

    def predict(self, X, client=None) -> np.ndarray:
        """scikit-learn's name for :meth:`predict_y`."""
        return self.predict_y(X, client)

    # -------------------------------------------------------------- persistence
    def _saved_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        state = self.state_
        tensors: dict[str, torch.Tensor] = {}
        if state.prior is not None:
            tensors["state.prior"] = state.prior
        tensors.update({f"state.encoder.{k}": v for k, v in state.global_encoder.items()})
        tensors.update({f"state.head.{k}": v for k, v in state.global_head.items()})
        if state.prototypes is not None:
            tensors["state.prototypes"] = state.prototypes
            tensors["state.prototype_counts"] = state.prototype_counts
        for c, kept in enumerate(self.client_states_):
            for k, v in kept.items():
                tensors[f"client.{c}.{k}"] = v
        attrs = {
            **self._common_attrs(),
            "client_keys_": [sorted(kept) for kept in self.client_states_],
            "replied_": list(self._replied),
            "losses_": list(state.losses),
            "invalid_": list(state.invalid),
        }
        return tensors, attrs

    def _set_state(self, tensors: dict[str, torch.Tensor], attrs: dict) -> None:
        """Restore the fitted attributes from ``save``'s output, validated."""
        options = self._torch_options()
        self._restore_common(attrs)
        classes = self.classes_.tolist()
        keys = check_items(get_attr(attrs, "client_keys_", list), "client_keys_", list)
        if len(keys) != self.n_clients_:
            raise ModelFormatError(f"client_keys_ must list {self.n_clients_} clients' keys.")
        replied = check_items(get_attr(attrs, "replied_", list), "replied_", int)
        if any(not 0 <= c < self.n_clients_ for c in replied):
            raise ModelFormatError("replied_ names a client that does not exist.")
        self._replied = replied
        try:
            config = self._config(self.n_features_in_, len(classes), 0)
            algorithm = self._algorithm_class().from_config(config)
        except ValueError as error:
            raise ModelFormatError(
                f"the attributes 'n_features_in_' and 'classes_' make no model: {error}"
            ) from None

        def shaped(prefix: str, template) -> dict[str, torch.Tensor]:
            return {
                n: get_tensor(tensors, f"{prefix}{n}", tuple(p.shape)).to(**options)
                for n, p in template.named_parameters()
            }

        state = VGM2State(phase="done", rounds=self.n_rounds_)
        state.losses = [float(v) for v in get_attr(attrs, "losses_", list)]
        state.invalid = check_items(get_attr(attrs, "invalid_", list), "invalid_", int)
        k = int(self.n_markers)
        if self.method == "vgm2":
            state.prior = _markers(tensors, "state.prior", k).to(**options)
        elif self.method == "fedavg":
            state.global_encoder = shaped("state.encoder.", algorithm.encoder)
            state.global_head = shaped("state.head.", algorithm.head)
            _check_networks(state.global_encoder, state.global_head, "'state.*'")
        elif self.method == "prototype":
            shape = (len(classes), config.embedding_dim)
            state.prototypes = get_tensor(tensors, "state.prototypes", shape).to(**options)
            counts = get_tensor(tensors, "state.prototype_counts", (len(classes),))
            check_positive(
                counts, "the tensor 'state.prototype_counts'", "it counts rows", allow_zero=True
            )
            state.prototype_counts = counts.to(**options)
        self.state_ = state
        shapes = {
            **{f"{ENCODER}{n}": tuple(p.shape) for n, p in algorithm.encoder.named_parameters()},
            **{f"{HEAD}{n}": tuple(p.shape) for n, p in algorithm.head.named_parameters()},
        }
        clients = []
        for c, names_c in enumerate(keys):
            check_items(names_c, "client_keys_ items", str)
            kept = {}
            for key in names_c:
                name = f"client.{c}.{key}"
                if name not in tensors:
                    raise ModelFormatError(f"the tensor {name!r} is missing.")
                tensor = tensors[name]
                if key == "reference.y":
                    if tensor.dtype != torch.int64 or bool(
                        ((tensor < 0) | (tensor >= len(classes))).any()
                    ):
                        raise ModelFormatError(f"{name!r} must hold class codes.")
                    kept[key] = tensor.to(options["device"])
                elif key == MARKERS:
                    kept[key] = _markers(tensors, name, k).to(**options)
                elif key == "reference.X":
                    kept[key] = get_tensor(tensors, name).to(**options)
                    if kept[key].ndim != 2 or kept[key].shape[1] != self.n_features_in_:
                        raise ModelFormatError(
                            f"the tensor {name!r} has shape {tuple(tensor.shape)}; the model "
                            f"implies (n_rows, {self.n_features_in_})."
                        )
                elif key in shapes:
                    kept[key] = get_tensor(tensors, name, shapes[key]).to(**options)
                else:
                    raise ModelFormatError(f"the tensor {name!r} is not part of a client's state.")
            if (
                "reference.X" in kept
                and kept["reference.X"].shape[0] != kept.get("reference.y", torch.empty(0)).shape[0]
            ):
                raise ModelFormatError(
                    f"'client.{c}.reference.X' and 'client.{c}.reference.y' must hold the "
                    "same rows."
                )
            _check_networks(  # in the modules' order (``shapes``), not the file's
                {k[len(ENCODER) :]: kept[k] for k in shapes if k.startswith(ENCODER) and k in kept},
                {k[len(HEAD) :]: kept[k] for k in shapes if k.startswith(HEAD) and k in kept},
                f"'client.{c}.*'",
            )
            clients.append(kept)
        self.client_states_ = clients
        self._set_derived()


def _check_networks(
    encoder: dict[str, torch.Tensor], head: dict[str, torch.Tensor], name: str
) -> None:
    """An encoder's parameters and the class head's after it (module name -> tensor, each in
    its module's order) keep the embeddings and the class scores finite (``check_network``
    on the encoder, then on both in a row); ``name`` says which tensors they are."""
    check_network(encoder, f"the encoder {name}")
    both = {f"encoder.{k}": v for k, v in encoder.items()} | {
        f"head.{k}": v for k, v in head.items()
    }
    check_network(both, f"the encoder and class head {name}")


def _markers(tensors: dict[str, torch.Tensor], name: str, n_markers: int) -> torch.Tensor:
    """The Dir-NIG markers ``tensors[name]`` (2, 5, ``n_markers``), checked: finite, positive
    concentration, kappa, alpha and beta (``check_markers``). Raises ``ModelFormatError``."""
    markers = get_tensor(tensors, name, (2, 5, n_markers))
    try:
        return check_markers(markers, f"the tensor {name!r}")
    except ValueError as error:
        raise ModelFormatError(str(error)) from None
