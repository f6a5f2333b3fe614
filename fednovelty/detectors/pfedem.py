"""``PFedEMDetector``: the pFedEM paper's method (``fednovelty.federated.joint_models.pfedem``) as a
scikit-learn style classifier and novelty scorer, beside FedGMM's joint model.

It shares the joint models' fitting, saving and Gaussian scores (``log_px``,
``decision_function(score="px")``, ``adapt``); its class probabilities follow the paper's
Eq. 15, ``P(y | x) = sum_k pi_k P_k(y | x)``, with a client's weights (the shares of its rows
in each Gaussian's partition in the last round) or the global ones.

Under ``dp_epsilon`` (with ``gaussian_aggregation="exact"`` and ``dp_bounds``) the fit is
differentially private per client row as the joint model's: the budget buys the
statistics' noise and the sub-models' DP-SGD together (``dp_learner_share``), each round
also releases the noisy hard counts, and ``privacy_spent_`` reports what the fit spent.
In ``"central"`` mode the server keeps no per-client weights (they would come from exact
counts): ``client=`` then scores with the global weights (``adapt`` gives a client's own);
in ``"local"`` mode each client's weights come from its noisy hard counts.

With ``gaussian_features="backbone"`` the Gaussians model the paper's ``z = f(x)``: the rows
through sub-model 0's layers before its class layer (``learner="mlp"`` or ``"cnn"``), in
every round through the broadcast sub-model 0's and, first, through the initial one (the
initialisation's rows); ``means_`` and the covariances are the backbone's width. Every score
of the Gaussians (``log_px``, ``score_samples``, ``decision_function``, ``predict_components``
and the per-component API, ``adapt``) maps rows through the final sub-model 0's backbone, as
does a loaded model (the file holds the learners). There is no PCA front end
(``pca_components="auto"`` engages none; an axis count is refused), no differential privacy
(backbone features have no public box to clip into), and ``explain``, ``sample``, ``bic``
and ``aic`` are refused (they speak of the rows' own features or of a density of ``x``).
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.utils._param_validation import StrOptions

from fednovelty.detectors._labels import label_codes
from fednovelty.detectors._option_fields import DP, DP_SGD, KMEANS_START
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.explain import Components
from fednovelty.detectors.joint import JointModelDetector
from fednovelty.detectors.options import Initialisation, Privacy, Robustness, Training
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.joint_models.pfedem import (
    ESTEP_STARTS,
    GAUSSIAN_AGGREGATIONS,
    SUBMODEL_WEIGHTS,
    PFedEM,
    pfedem_predict_proba,
)
from fednovelty.federated.joint_models.pfedem_backbone import (
    GAUSSIAN_FEATURES,
    BackboneMap,
    backbone_width,
)

__all__ = ["PFedEMDetector"]


class PFedEMDetector(JointModelDetector):
    """pFedEM (the pFedEM paper, Algorithm 1): K Gaussians and K sub-models, each trained on
    the rows its Gaussian claims; inference by Eq. 15. The paper's algorithm as written:
    ``PFedEMDetector(K, **PAPER_ALGORITHM)`` (``fednovelty.federated.joint_models.pfedem``:
    ``estep_start="broadcast"``, ``submodel_weights="clients"``,
    ``gaussian_aggregation="paper"``).

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(0, 1, (400, 2)) + np.repeat([[-4.0, 0.0], [4.0, 0.0]], 200, axis=0)
        >>> y = np.concatenate([X[:200, 1] > 0, X[200:, 1] < 0]).astype(int)  # opposite rules
        >>> det = PFedEMDetector(2, random_state=0).fit(X, y, np.repeat([0, 1], 200))
        >>> det.predict_y([[-4.0, 2.0], [4.0, 2.0]], client=0).tolist()
        [1, 1]
    """

    _params = declare(
        Param(
            "gaussian_aggregation",
            "paper",
            [StrOptions(set(GAUSSIAN_AGGREGATIONS))],
            '``"paper"`` (Eq. 12-14, per-feature variances) or ``"exact"`` (summed soft '
            "statistics; the only one with a private form: ``dp_epsilon`` needs it).",
        ),
        Param(
            "estep_start",
            "kept",
            [StrOptions(set(ESTEP_STARTS))],
            'The mixture weights of a client\'s E-step: ``"kept"`` (its own Eq. 11 weights '
            'from the last round it took part in) or ``"broadcast"`` (Algorithm 1 line 5: '
            "the global weights every round).",
        ),
        Param(
            "submodel_weights",
            "counts",
            [StrOptions(set(SUBMODEL_WEIGHTS))],
            "The weight of a client's sub-model copies in the server's average: "
            '``"counts"`` (its hard count ``|D_ik|``) or ``"clients"`` (Eq. 5: '
            "``p_i = |D_i| / sum_j |D_j|``).",
        ),
        Param(
            "gaussian_features",
            "input",
            [StrOptions(set(GAUSSIAN_FEATURES))],
            'What the Gaussians model: ``"input"`` (the rows, after ``pca_components``) or '
            "``\"backbone\"`` (the paper's ``z = f(x)``: the rows through sub-model 0's "
            'layers before its class layer; needs ``learner="mlp"`` or ``"cnn"``; no PCA '
            "front end and no ``privacy.epsilon``).",
        ),
        option(
            Training,
            fields=("local_epochs", "learning_rate", "batch_size", "optimizer"),
            auto={"local_epochs": 5, "learning_rate": 0.5, "batch_size": 32},
        ),
        option(Initialisation, fields=KMEANS_START),
        option(
            Robustness,
            docs={
                "aggregation": '``"trimmed"`` reads the paper\'s replies as statistics and '
                "trims them."
            },
        ),
        option(Privacy, fields=(*DP, *DP_SGD)),
        docs={
            "n_components": "K Gaussians, and as many sub-models.",
            "covariance_type": 'The paper\'s is ``"diag"``; ``"exact"`` takes any type.',
        },
    )

    def __init__(
        self,
        n_components=2,
        *,
        gaussian_aggregation="paper",
        estep_start="kept",
        submodel_weights="counts",
        gaussian_features="input",
        learner="linear",
        training=None,
        covariance_type="diag",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        init_params="kmeans",
        initialisation=None,
        pca_components="auto",
        sampling=None,
        robustness=None,
        privacy=None,
        contamination=0.1,
        calibration="contamination",
        alpha=0.01,
        calibration_share=0.2,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ) -> None:
        store(self, locals())

    @property
    def _n_learners(self) -> int:
        return self.n_components

    def _algorithm(self, learner_width: int, seed: int, pca_components, **overrides):
        return PFedEM(**self._joint_options(learner_width, seed, pca_components, overrides))

    def _kept_state(self, index: int) -> dict[str, torch.Tensor]:
        kept = getattr(self, "_client_states", {}).get(index)
        if kept is not None:
            return kept
        weights = torch.as_tensor(np.diagonal(self.client_joint_weights_[index]).copy())
        return {"log_weights": weights.to(**self._torch_options()).clamp_min(1e-300).log()}

    # -------------------------------------------------------------- backbone features
    @property
    def _backbone(self) -> bool:
        return self.gaussian_features == "backbone"

    def _fit_rounds(self, clients, seed, labels=None) -> None:
        """With ``"backbone"`` features no PCA front end runs (the algorithm maps each
        client's rows itself); an axis count and ``privacy.epsilon`` are refused."""
        if not self._backbone:
            return super()._fit_rounds(clients, seed, labels)
        if self.pca_components not in (None, "auto"):
            raise ValueError(
                "gaussian_features='backbone' models the backbone's features themselves; use "
                f"pca_components=None or 'auto' (no front end); got {self.pca_components!r}."
            )
        if self._option("privacy").epsilon is not None:
            raise ValueError(
                "gaussian_features='backbone' has no private form: differential privacy clips "
                "rows into a public box, and backbone features have none (they move as the "
                "backbone trains); use gaussian_features='input' with privacy.epsilon."
            )
        n_total = sum(c.shape[0] for c in clients)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        codes = [torch.as_tensor(p, device=c.device) for p, c in zip(labels, clients, strict=True)]
        self._fit_em(list(zip(clients, codes, strict=True)), seed, pca_components=None)
        self._set_projection(None)

    def _front_end_rounds(self, n_features=None) -> int:
        return 0 if self._backbone else super()._front_end_rounds(n_features)

    def _backbone_map(self) -> BackboneMap:
        """The final sub-model 0's backbone, as a map from rows to the Gaussians' rows."""
        return BackboneMap(self.learner_template_, self.joint_state_.learners[0])

    def _gmm_input(self, X: torch.Tensor) -> torch.Tensor:
        return self._backbone_map().transform(X) if self._backbone else super()._gmm_input(X)

    def _components(self) -> Components:
        if not self._backbone:
            return super()._components()
        return Components(self.model_, self._backbone_map())

    def _refuse_on_backbone(self, what: str) -> None:
        if self._backbone:  # NotImplementedError, as the base's refusals of these methods
            raise NotImplementedError(
                f"{what} is not defined with gaussian_features='backbone': the Gaussians model "
                "the backbone's features, not the rows; fit with gaussian_features='input'."
            )

    def explain(self, X, *, client=None):
        self._refuse_on_backbone("explain (shares of the input features)")
        return super().explain(X, client=client)

    def sample(self, n_samples=1, random_state=None):
        self._refuse_on_backbone("sample (rows drawn from the Gaussians)")
        return super().sample(n_samples, random_state)

    def _n_parameters(self) -> int:
        self._refuse_on_backbone("bic or aic (a density of the rows)")
        return super()._n_parameters()

    def _mixture_from(self, tensors, prefix, covariance_type, n_features=None):
        if self._backbone and n_features is None:  # checked against the learners in _set_state
            means = tensors.get(f"{prefix}.means")
            n_features = int(means.shape[-1]) if means is not None and means.ndim else None
        return super()._mixture_from(tensors, prefix, covariance_type, n_features)

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        if not self._backbone:
            return
        try:
            width = backbone_width(self.learner_template_)
        except ValueError as error:
            raise ModelFormatError(f"a backbone model's learner: {error}") from None
        if self.model_.n_features != width:
            raise ModelFormatError(
                f"the Gaussians are {self.model_.n_features} wide, the learners' backbone "
                f"{width}: a model with gaussian_features='backbone' needs them equal."
            )

    # -------------------------------------------------------------- Eq. 15
    def predict_proba_y(self, X, client=None) -> np.ndarray:
        """Eq. 15: ``sum_k pi_k P_k(y | x)``, shape (n_samples, n_classes), with ``client``'s
        weights (an id seen in fit or an ``adapt`` handle) or the global ones."""
        Xt = self._check_score_input(X)
        if client is None:
            weights = self.model_.weights
        else:
            joint = self._log_pi(client, Xt).exp()
            weights = torch.diagonal(joint) if joint.ndim == 2 else joint.sum(-1)
        with torch.no_grad():
            proba = pfedem_predict_proba(
                self.learner_template_, self.joint_state_.learners, Xt, weights
            )
        return proba.cpu().numpy()

    def log_py_given_x(self, X, y, client=None) -> np.ndarray:
        """``log P(y | x)`` under Eq. 15 (label novelty), shape (n_samples,)."""
        proba = self.predict_proba_y(X, client)
        codes = label_codes(y, self.classes_, proba.shape[0], torch.device("cpu")).numpy()
        return np.log(np.maximum(proba[np.arange(proba.shape[0]), codes], 1e-300))
