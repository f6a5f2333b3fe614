"""``PFedEMDetector``: the pFedEM paper's method (``fednovelty.federated.pfedem``) as a
scikit-learn style classifier and novelty scorer, beside FedGMM's joint model.

It shares ``JointFedGMMDetector``'s fitting, saving and Gaussian scores (``log_px``,
``decision_function(score="px")``, ``adapt``); its class probabilities follow the paper's
Eq. 15, ``P(y | x) = sum_k pi_k P_k(y | x)``, with a client's weights (the shares of its rows
in each Gaussian's partition in the last round) or the global ones.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import StrOptions

from fednovelty.detectors._labels import label_codes
from fednovelty.detectors.joint import JointFedGMMDetector
from fednovelty.detectors.persistence import register
from fednovelty.federated.config import GAUSSIAN_AGGREGATIONS
from fednovelty.federated.pfedem import PFedEM, pfedem_predict_proba

__all__ = ["PFedEMDetector"]


@register
class PFedEMDetector(JointFedGMMDetector):
    """pFedEM (the pFedEM paper, Algorithm 1): K Gaussians and K sub-models, each trained on
    the rows its Gaussian claims; inference by Eq. 15.

    Args:
        n_components: K Gaussians, and as many sub-models.
        gaussian_aggregation: ``"paper"`` (Eq. 12-14, per-feature variances) or ``"exact"``
            (summed soft statistics).
        covariance_type: ``"diag"`` (the paper's) or, with ``"exact"``, any type.
        learner, local_epochs, learning_rate, batch_size, optimizer: the sub-models' local
            training each round (as ``JointFedGMMDetector``'s).
        Other arguments as ``JointFedGMMDetector``'s (no ``n_learners``, ``mu_prox`` or
        ``aggregate_learners``; ``aggregation="trimmed"`` also reads the paper's replies as
        statistics and trims them).

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(0, 1, (400, 2)) + np.repeat([[-4.0, 0.0], [4.0, 0.0]], 200, axis=0)
        >>> y = np.concatenate([X[:200, 1] > 0, X[200:, 1] < 0]).astype(int)  # opposite rules
        >>> det = PFedEMDetector(2, random_state=0).fit(X, y, np.repeat([0, 1], 200))
        >>> det.predict_y([[-4.0, 2.0], [4.0, 2.0]], client=0).tolist()
        [1, 1]
    """

    _parameter_constraints: ClassVar[dict] = {
        **{
            k: v
            for k, v in JointFedGMMDetector._parameter_constraints.items()
            if k not in ("n_learners", "mu_prox", "aggregate_learners")
        },
        "gaussian_aggregation": [StrOptions(set(GAUSSIAN_AGGREGATIONS))],
    }

    def __init__(
        self,
        n_components=2,
        *,
        gaussian_aggregation="paper",
        learner="linear",
        local_epochs=5,
        learning_rate=0.5,
        batch_size=32,
        optimizer="sgd",
        aggregation="sum",
        trim=0.1,
        client_weight_cap=None,
        covariance_type="diag",
        init_params="kmeans",
        reg_covar=1e-6,
        tol=1e-3,
        max_iter=100,
        kmeans_rounds=10,
        subset_size=100,
        pca_components=None,
        fraction=1.0,
        dropout=0.0,
        privacy_min_rows=5,
        contamination=0.1,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ):
        self.n_components = n_components
        self.gaussian_aggregation = gaussian_aggregation
        self.learner = learner
        self.local_epochs = local_epochs
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.aggregation = aggregation
        self.trim = trim
        self.client_weight_cap = client_weight_cap
        self.covariance_type = covariance_type
        self.init_params = init_params
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter
        self.kmeans_rounds = kmeans_rounds
        self.subset_size = subset_size
        self.pca_components = pca_components
        self.fraction = fraction
        self.dropout = dropout
        self.privacy_min_rows = privacy_min_rows
        self.contamination = contamination
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.progress = progress

    # the joint model's settings pFedEM fixes
    mu_prox = 0.0
    aggregate_learners = True

    @property
    def n_learners(self) -> int:
        return self.n_components

    def _algorithm(self, learner_width: int, seed: int, pca_components, **overrides):
        return PFedEM(
            self.n_components,
            len(self.classes_),
            gaussian_aggregation=self.gaussian_aggregation,
            learner_factory=self._learner_factory(),
            local_epochs=self.local_epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            optimizer=self.optimizer,
            n_learner_features=learner_width,
            **{
                **self._em_options(seed, pca_components),
                **self._aggregation_options(),
                **overrides,
            },
        )

    def _kept_state(self, index: int) -> dict[str, torch.Tensor]:
        kept = getattr(self, "_client_states", {}).get(index)
        if kept is not None:
            return kept
        weights = torch.as_tensor(np.diagonal(self.client_joint_weights_[index]).copy())
        return {"log_weights": weights.to(**self._torch_options()).clamp_min(1e-300).log()}

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
