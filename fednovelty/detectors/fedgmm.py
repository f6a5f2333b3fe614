"""``FedGMMDetector``: iterative federated EM (FedGMM Algorithm 2, DEM) as a PyOD detector.

The model of ``x`` alone: ``fit(X, y=None, groups)`` ignores ``y`` as PyOD's detectors do.
FedGMM's joint model of ``(x, y)`` (labels, learners ``P(y | x)``, ``log_py_given_x``,
``pfl_baseline``) is its own estimator, ``fednovelty.detectors.JointFedGMMDetector``; its
names and arguments are not accepted here, and using one raises an error that says so
(``docs/joint.md``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import StrOptions

from fednovelty.detectors._em_detector import EM_CONSTRAINTS, AdaptedClient, EMDetector
from fednovelty.detectors.base import (
    AGGREGATION_CONSTRAINTS,
    PRIOR_SCALE,
    ROBUST_CONSTRAINTS,
)
from fednovelty.detectors.persistence import register
from fednovelty.federated import FederatedEM
from fednovelty.mixture import fit_weights, log_gaussian_prob, score_samples

#: Constructor arguments that configure the joint model only (``JointFedGMMDetector``).
JOINT_ONLY_PARAMS = (
    "n_learners",
    "learner",
    "local_epochs",
    "learning_rate",
    "batch_size",
    "optimizer",
    "mu_prox",
    "aggregate_learners",
)
#: Methods of the joint model (``JointFedGMMDetector``).
JOINT_ONLY_METHODS = (
    "log_px",
    "log_py_given_x",
    "log_pxy",
    "predict_proba_y",
    "predict_y",
    "pfl_baseline",
)
_USE_JOINT = "FedGMM's joint model of (x, y) is JointFedGMMDetector (docs/joint.md)"


class _JointOnly:
    """A joint-model method name on ``FedGMMDetector``: reading it raises an
    ``AttributeError`` that names ``JointFedGMMDetector`` (so ``hasattr`` is False, on the
    class and on instances)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        raise AttributeError(
            f"FedGMMDetector has no {self.name!r}: it models x alone and ignores y. "
            f"{_USE_JOINT}: JointFedGMMDetector(...).fit(X, y, groups).{self.name}."
        )


def refuse_joint_arguments(method: str, args: tuple, kwargs: dict) -> None:
    """TypeError for arguments ``FedGMMDetector.<method>`` took only for the joint model
    (positional ``args`` are labels; ``kwargs`` names), naming ``JointFedGMMDetector``."""
    if not args and not kwargs:
        return
    given = [f"{len(args)} positional (labels)"] if args else []
    given += sorted(kwargs)
    raise TypeError(
        f"FedGMMDetector.{method} got {', '.join(given)}: labels and joint scores "
        f"(y, score=) belong to the joint model. {_USE_JOINT}."
    )


@register
class FedGMMDetector(EMDetector):
    """Gaussian mixture of ``x`` trained by federated EM over clients; scores novelty as
    ``-log p(x)``.

    Every EM iteration is one communication round: the server broadcasts the parameters,
    each client replies with summed sufficient statistics of its rows, the server adds them
    and runs the M-step. With ``mixture_weights="global"`` this is exactly centralized EM
    on the pooled rows (scikit-learn's ``GaussianMixture``), whatever the split.

    ``fit(X, y, groups)`` ignores ``y`` (PyOD's contract, as ``IForest``), so PyOD's
    ``fit_predict(X, y)`` gives the labels of ``fit(X)``. FedGMM's joint model of ``(x, y)``
    is :class:`~fednovelty.detectors.JointFedGMMDetector`; the joint model's methods
    (``log_py_given_x``, ``log_pxy``, ``predict_y``, ``predict_proba_y``, ``log_px``,
    ``pfl_baseline``), constructor arguments (``n_learners``, ``learner``, ``local_epochs``,
    ``learning_rate``, ``batch_size``, ``optimizer``, ``mu_prox``, ``aggregate_learners``) and
    ``decision_function(X, y, score=...)`` raise an error here that names it.

    Args:
        n_components: number of Gaussian components.
        covariance_type: ``"full"``, ``"tied"``, ``"diag"`` or ``"spherical"``.
        mixture_weights: ``"personal"`` (FedGMM: one weight vector per client, shared
            Gaussians) or ``"global"`` (DEM: one weight vector).
        init_params: ``"kmeans"`` (federated k-means; default), ``"separated"`` (centres
            spread over the merged feature range) or ``"subset"`` (pools a few raw rows on
            the server: not private).
        reg_covar, tol, max_iter, weights_init, means_init, precisions_init: as in
            scikit-learn's ``GaussianMixture`` (``max_iter`` = maximum EM rounds).
        standardize: fit on federated z-scores (one extra round) of the features (the model and
            its scores stay in the original units); ``False`` fits the raw features.
        covariance_prior: pseudo-rows of a conjugate prior that pulls every covariance
            towards ``prior_scale`` times the pooled variance of each feature (MAP EM on summed
            statistics); ``"auto"`` (default) is ``n_features + 2``, ``None`` turns it off
            (plain maximum likelihood).
        prior_scale: the prior's target variance as a multiple of each feature's variance
            (default 4: a component backed by few rows is flattened, not made a spike).
        kmeans_rounds: maximum federated Lloyd rounds of the ``kmeans`` init.
        subset_size: rows pooled by the ``subset`` init.
        pca_components: if set, the Gaussians model the rows' projection on this many
            principal components, computed by federated PCA (two extra rounds of summed
            moments); ``log p(x)`` is then the density of that projection (the discarded
            directions add nothing; ``docs/joint.md`` says why).
        fraction: share of clients asked each round; dropout: chance that one fails to reply.
        aggregation: how the server combines the clients' statistics: ``"sum"`` (exact
            federated EM) or ``"trimmed"`` (per component, the ``trim`` share of clients at
            each end left out: a few hostile clients cannot plant a component; costs
            accuracy where honest clients hold rare clusters; README "Poisoning").
        trim: share of clients ``aggregation="trimmed"`` leaves out at each end; must
            exceed the share of hostile clients.
        client_weight_cap: no client counts for more than this many times the median
            client's row count (``None``: no cap).
        privacy_min_rows: each client's privacy floor (``docs/privacy.md``): every statistic
            a client sends is backed by at least this many of its rows (smaller k-means
            clusters merged, components suppressed) and a client with fewer rows skips the
            round; ``1`` is no floor (exact, no protection). ``init_params="subset"`` lets
            the simulated clients send raw rows (you own them here).
        contamination: expected share of anomalies, sets ``threshold_`` (PyOD).
        random_state: seed (int, RandomState or None).
        device: ``"cpu"`` (default) or ``"cuda"``; dtype: ``"float64"`` (default) or ``"float32"``.
        progress: show a progress bar over rounds.

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: global mixture (numpy, as
            scikit-learn); with personal weights ``weights_`` is the sample-weighted average.
        client_weights_: (n_clients, n_components) personal weights, rows in ``client_ids_``
            order (``"personal"`` only).
        pca_: the federated PCA projection (``pca_components`` set).
        n_iter_, converged_, lower_bounds_: EM rounds, convergence, mean log-likelihoods.
        history_: one dict per communication round (kind, clients, bytes, metrics).
        n_rounds_, bytes_up_, bytes_down_: communication totals.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    Examples:
        >>> import numpy as np
        >>> from fednovelty import FedGMMDetector
        >>> rng = np.random.default_rng(0)
        >>> X = np.vstack([rng.normal(0, 1, (200, 2)), rng.normal(6, 1, (200, 2))])
        >>> groups = np.repeat([0, 1, 2, 3], 100)
        >>> det = FedGMMDetector(n_components=2, random_state=0).fit(X, groups=groups)
        >>> bool(det.decision_function([[3.0, 30.0]])[0] > det.threshold_)
        True
    """

    _parameter_constraints: ClassVar[dict] = {
        **EM_CONSTRAINTS,
        **ROBUST_CONSTRAINTS,
        "mixture_weights": [StrOptions({"global", "personal"})],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "aggregation": [StrOptions({"sum", "trimmed"})],
        **AGGREGATION_CONSTRAINTS,
    }

    def __init__(
        self,
        n_components=8,
        *,
        covariance_type="full",
        mixture_weights="personal",
        init_params="kmeans",
        reg_covar=1e-6,
        tol=1e-3,
        max_iter=100,
        standardize=True,
        covariance_prior="auto",
        prior_scale=PRIOR_SCALE,
        weights_init=None,
        means_init=None,
        precisions_init=None,
        kmeans_rounds=10,
        subset_size=100,
        pca_components=None,
        fraction=1.0,
        dropout=0.0,
        aggregation="sum",
        trim=0.1,
        client_weight_cap=None,
        privacy_min_rows=5,
        contamination=0.1,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
        **joint_only,
    ):
        if joint_only:
            _refuse_constructor_arguments(joint_only)
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.mixture_weights = mixture_weights
        self.init_params = init_params
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter
        self.standardize = standardize
        self.covariance_prior = covariance_prior
        self.prior_scale = prior_scale
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.kmeans_rounds = kmeans_rounds
        self.subset_size = subset_size
        self.pca_components = pca_components
        self.fraction = fraction
        self.dropout = dropout
        self.aggregation = aggregation
        self.trim = trim
        self.client_weight_cap = client_weight_cap
        self.privacy_min_rows = privacy_min_rows
        self.contamination = contamination
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.progress = progress

    def _fit_em(self, data, seed, *, pca_components, round_offset=0):
        width = pca_components or data[0].shape[1]  # of the rows the Gaussians see
        algorithm = FederatedEM(
            self.n_components,
            mixture_weights=self.mixture_weights,
            weights_init=self.weights_init,
            means_init=self.means_init,
            precisions_init=self.precisions_init,
            aggregation=self.aggregation,
            trim=self.trim,
            client_weight_cap=self.client_weight_cap,
            **self._robust_options(width),
            **self._em_options(seed, pca_components),
        )
        result = self._simulate(
            algorithm, data, seed, full=True, round_offset=round_offset, **self._em_engine()
        )
        state = result.state
        self._set_em_state(state)
        if self.mixture_weights == "personal":
            self.client_weights_ = self._client_weight_matrix(state.client_weights)
        elif hasattr(self, "client_weights_"):
            del self.client_weights_
        self._warn_if_not_converged()
        return result

    # -------------------------------------------------------------- scoring
    def _personal_weights(self) -> np.ndarray:
        if not hasattr(self, "client_weights_"):
            raise ValueError(
                "client= needs personal mixture weights: fit with mixture_weights='personal', "
                "or pass a handle from adapt()."
            )
        return self.client_weights_

    def decision_function(self, X, *args, client=None, **kwargs) -> np.ndarray:
        """Anomaly score ``-log p(x)`` of each row, shape (n_samples,); higher = more novel.

        Args:
            X: rows (n_samples, n_features).
            client: ``None`` for the model's weights (what ``threshold_``, ``predict`` and
                ``predict_proba`` use), a client id seen in fit for its personal weights
                (``mixture_weights="personal"``), or a handle from :meth:`adapt`.

        Raises:
            TypeError: labels or ``score=`` were given: those are the joint model's
                (``JointFedGMMDetector.decision_function``).
        """
        refuse_joint_arguments("decision_function", args, kwargs)
        if client is None:
            return super().decision_function(X)
        return -self.score_samples_client(X, client)

    def score_samples_client(self, X, client) -> np.ndarray:
        """``log p_c(x)`` under one client's personal weights, shape (n_samples,).

        Args:
            X: rows (n_samples, n_features).
            client: a client id as given in ``groups`` at fit time
                (``mixture_weights="personal"``), or a handle from :meth:`adapt`.
        """
        Xt = self._check_score_input(X)
        if not hasattr(self, "client_weights_") and not isinstance(client, AdaptedClient):
            raise ValueError("score_samples_client needs mixture_weights='personal'.")
        log_weights = self._log_pi(client, Xt)
        with torch.no_grad():
            return score_samples(self.model_, self._gmm_input(Xt), log_weights).cpu().numpy()

    def adapt(self, X, *args, max_iter: int = 100, tol: float = 1e-6, **kwargs) -> AdaptedClient:
        """Mixture weights for a client unseen in training, every Gaussian frozen (FedGMM
        Sec. 3: only ``pi`` is re-estimated, by EM from the global weights).

        The detector is not modified; the returned handle works as ``client=`` in
        :meth:`decision_function`, :meth:`score_samples_client` and the per-component
        methods.

        Args:
            X: the new client's rows (n_samples, n_features); at least 2.
            max_iter: maximum EM iterations; tol: stop when the mean log-likelihood changes by
                less than this.

        Returns:
            An :class:`AdaptedClient` (weights, their trace over iterations, log-likelihoods).

        Raises:
            TypeError: labels were given (``JointFedGMMDetector.adapt`` takes them).
        """
        refuse_joint_arguments("adapt", args, kwargs)
        Xt = self._adapt_rows(X, max_iter)
        params = self.model_
        with torch.no_grad():
            log_n = log_gaussian_prob(
                self._gmm_input(Xt),
                params.means,
                params.precisions_cholesky,
                params.covariance_type,
            )
            result = fit_weights(log_n, params.weights.log(), max_iter=max_iter, tol=tol)
        return self._adapted(result, Xt.shape[0], labelled=False)

    # -------------------------------------------------------------- persistence
    @classmethod
    def _upgrade_document(cls, document: dict, tensors: dict) -> tuple[type, dict, dict]:
        """A file saved before the joint model had its own class: a ``FedGMMDetector``
        fitted with ``y`` (``classes_`` saved) is read as a ``JointFedGMMDetector``, and the
        settings that do not apply to the class read are dropped (they had no effect on the
        saved model); see ``persistence.load``."""
        from fednovelty.detectors.joint import JointFedGMMDetector

        attrs = document.get("attrs")
        joint = isinstance(attrs, dict) and "classes_" in attrs
        target = JointFedGMMDetector if joint else cls
        params = document.get("params")
        if not isinstance(params, dict):
            return target, document, tensors
        names = target().get_params(deep=False)
        legacy = set(FedGMMDetector().get_params(deep=False)) | set(JOINT_ONLY_PARAMS)
        dropped = {k for k in params if k not in names and k in legacy}
        kept = {k: v for k, v in params.items() if k not in dropped}
        unused = {f"param.{k}" for k in dropped}
        tensors = {k: v for k, v in tensors.items() if k not in unused}
        return target, {**document, "params": kept}, tensors


for _name in JOINT_ONLY_METHODS:
    setattr(FedGMMDetector, _name, _JointOnly(_name))
del _name


def _refuse_constructor_arguments(given: dict) -> None:
    """TypeError for keyword arguments ``FedGMMDetector.__init__`` does not take: the joint
    model's name ``JointFedGMMDetector``, any other is unexpected."""
    joint = sorted(k for k in given if k in JOINT_ONLY_PARAMS)
    if joint:
        raise TypeError(
            f"FedGMMDetector got {joint}: these configure the joint model's learners. "
            f"{_USE_JOINT}: JointFedGMMDetector({', '.join(f'{k}=...' for k in joint)})."
        )
    raise TypeError(
        f"FedGMMDetector.__init__() got an unexpected keyword argument {sorted(given)[0]!r}."
    )
