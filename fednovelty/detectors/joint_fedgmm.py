"""``JointFedGMMDetector``: FedGMM's joint model of ``(x, y)`` (FedGMM paper, Sections 2-3,
Algorithm 1) as its own estimator.

Each client models ``p_c(x, y) = sum pi_c(m1, m2) N(x; m1) P_m2(y | x)`` with
``n_components`` shared Gaussians, ``n_learners`` shared conditional models (learners) and
personal weights ``pi_c`` (M1, M2); the algorithm is
``fednovelty.federated.joint_models.joint.JointFedGMM``. What it shares with pFedEM (the
labelled fit, the joint scores, ``adapt``, saving) is
:class:`~fednovelty.detectors.joint.JointModelDetector`.
``fit(X, y, groups)`` needs the labels; ``FedGMMDetector`` is the model of ``x`` alone and
ignores ``y`` (``docs/joint.md``).
"""

from __future__ import annotations

from numbers import Integral

from sklearn.base import clone
from sklearn.utils._param_validation import Interval

from fednovelty.detectors._option_fields import DP, DP_SGD, KMEANS_START
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.fedgmm import COVARIANCE_POOLING, GLOBAL_WEIGHTS
from fednovelty.detectors.joint import JointModelDetector
from fednovelty.detectors.options import Initialisation, Privacy, Robustness, Training
from fednovelty.federated.joint_models.joint import PFL_METHODS, JointFedGMM

_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]

__all__ = ["JointFedGMMDetector"]


class JointFedGMMDetector(JointModelDetector):
    """FedGMM's joint model ``p_c(x, y)`` trained by federated EM; scores covariate novelty
    (``-log p(x)``), label novelty (``-log p(y | x)``) and joint novelty (``-log p(x, y)``),
    and classifies (``predict_y``) with each client's personal weights.

    One EM iteration is one communication round: clients send the Gaussians' sufficient
    statistics under their joint responsibilities, their joint counts (``n_c pi_c``) and
    their learners trained for ``local_epochs`` on the responsibility-weighted
    cross-entropy; the server sums the statistics and averages the learners.

    Attributes:
        classes_: the label values, sorted; columns of ``predict_proba_y``.
        weights_, means_, covariances_, precisions_cholesky_: the Gaussians and their
            global weights (numpy, as scikit-learn; sample-weighted, or the clients' mean
            with ``global_weights="client_average"``).
        client_weights_: (n_clients, M1) each client's Gaussian weights ``sum_m2 pi_c``.
        client_joint_weights_: (n_clients, M1, M2) each client's ``pi_c``, rows in
            ``client_ids_`` order.
        joint_state_: the algorithm's final ``JointState`` (learners' weights, joint counts).
        client_learners_: each client's own learners (``aggregate_learners=False``).
        pca_: the federated PCA projection (``pca_components`` set).
        n_iter_, converged_, lower_bounds_: EM rounds, convergence, mean log-likelihoods.
        history_, n_rounds_, bytes_up_, bytes_down_: the rounds and their bytes.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import JointFedGMMDetector
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(0, 1, (400, 2))
        >>> y = (X[:, 0] > 0).astype(int)
        >>> groups = np.repeat([0, 1, 2, 3], 100)
        >>> det = JointFedGMMDetector(2, n_learners=1, random_state=0).fit(X, y, groups)
        >>> det.predict_y([[2.0, 0.0], [-2.0, 0.0]]).tolist()
        [1, 0]
    """

    _params = declare(
        Param("n_learners", 2, _POSITIVE_INT, "M2 conditional models ``P_m2(y | x)``."),
        option(
            Training,
            fields=("local_epochs", "learning_rate", "batch_size", "optimizer", "mu_prox"),
            auto={"local_epochs": 5, "learning_rate": 0.5, "batch_size": 32},
        ),
        Param(
            "aggregate_learners",
            True,
            ["boolean"],
            "``False`` never averages learners (the Local baseline: score with ``client=``).",
        ),
        COVARIANCE_POOLING,
        GLOBAL_WEIGHTS,
        option(Initialisation, fields=KMEANS_START),
        option(
            Robustness, docs={"aggregation": "The learners are combined coordinate-wise alike."}
        ),
        option(Privacy, fields=(*DP, *DP_SGD)),
        docs={"pca_components": "The learners see the full rows."},
    )

    def __init__(
        self,
        n_components=8,
        *,
        n_learners=2,
        learner="linear",
        training=None,
        aggregate_learners=True,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        covariance_pooling="exact",
        global_weights="pooled",
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
        return self.n_learners

    @property
    def _shared_learners(self) -> bool:
        return self.aggregate_learners

    @classmethod
    def pfl_baseline(cls, name: str, **params) -> JointFedGMMDetector:
        """A detector configured as one of the FedGMM paper's Table 2 methods.

        ``"FedGMM"`` (as given), ``"FedEM"`` (one Gaussian: mixture of learners only),
        ``"FedAvg"`` (one Gaussian, one learner), ``"FedProx"`` (FedAvg plus the proximal
        term, ``mu_prox=0.01`` unless given) and ``"Local"`` (one Gaussian, one learner per
        client, never aggregated: score with ``client=``). Fit with ``fit(X, y, groups)``.

        Example:
            >>> JointFedGMMDetector.pfl_baseline("FedEM", n_learners=3).n_components
            1
        """
        if name not in PFL_METHODS:
            raise ValueError(f"unknown method {name!r}; choose one of {sorted(PFL_METHODS)}.")
        config = dict(PFL_METHODS[name])
        mu_prox = config.pop("mu_prox", None)  # a training setting of the detector
        training = params.pop("training", None) or Training()
        if mu_prox is not None and training.mu_prox == Training().mu_prox:
            training = clone(training).set_params(mu_prox=mu_prox)
        return cls(**{**params, **config}, training=training)

    def _algorithm(self, learner_width: int, seed: int, pca_components, **overrides):
        return JointFedGMM(**self._joint_options(learner_width, seed, pca_components, overrides))
