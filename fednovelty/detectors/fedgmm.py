"""``FedGMMDetector``: iterative federated EM (FedGMM Algorithm 2, DEM) as a PyOD detector.

The model of ``x`` alone: ``fit(X, y=None, groups)`` ignores ``y`` as PyOD's detectors do.
FedGMM's joint model of ``(x, y)`` is ``fednovelty.detectors.JointFedGMMDetector``
(``docs/joint.md``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import StrOptions

from fednovelty.detectors._dp import (
    bounds_engine,
    bounds_rounds,
    dp_plan,
    finish_private_fit,
    run_private_bounds,
)
from fednovelty.detectors._em_detector import AdaptedClient, EMDetector
from fednovelty.detectors._option_fields import DP, REMEDIES
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.options import Prior, Privacy
from fednovelty.federated import FederatedEM
from fednovelty.federated.mixtures.accelerate import ACCELERATIONS
from fednovelty.federated.mixtures.em import COVARIANCE_POOLINGS
from fednovelty.federated.mixtures.em import GLOBAL_WEIGHTS as GLOBAL_WEIGHT_CHOICES
from fednovelty.mixture import check_prior_rows, fit_weights_map, log_gaussian_prob, score_samples

#: FedGMM's covariance pooling (``EMConfig.covariance_pooling``): exact or the paper's.
COVARIANCE_POOLING = Param(
    "covariance_pooling",
    "exact",
    [StrOptions(set(COVARIANCE_POOLINGS))],
    '``"exact"`` (covariances from the summed second moments: centralized EM\'s M-step) or '
    "``\"paper\"`` (the FedGMM paper's: each client's covariance about its own mean, averaged "
    "with the clients' responsibility counts; no ``Privacy.epsilon``, plain "
    "``Robustness.aggregation``).",
)
#: how the global weights are formed (``EMConfig.global_weights``).
GLOBAL_WEIGHTS = Param(
    "global_weights",
    "pooled",
    [StrOptions(set(GLOBAL_WEIGHT_CHOICES))],
    '``"pooled"`` (the summed counts, normalised: each row counts once) or '
    "``\"client_average\"`` (the FedGMM paper's footnote 3: the mean of the clients' "
    'personal weights; ``mixture_weights="personal"`` only).',
)

#: the joint model's settings, found in files saved before it had its own class.
_JOINT_MODEL_PARAMS = (
    "n_learners",
    "learner",
    "local_epochs",
    "learning_rate",
    "batch_size",
    "optimizer",
    "mu_prox",
    "aggregate_learners",
)


class FedGMMDetector(EMDetector):
    """Gaussian mixture of ``x`` trained by federated EM over clients; scores novelty as
    ``-log p(x)``.

    Every EM iteration is one communication round: the server broadcasts the parameters,
    each client replies with summed sufficient statistics of its rows, the server adds them
    and runs the M-step. With ``mixture_weights="global"`` this is exactly centralized EM
    on the pooled rows (scikit-learn's ``GaussianMixture``), whatever the split.

    ``fit(X, y, groups)`` ignores ``y`` (PyOD's contract, as ``IForest``), so PyOD's
    ``fit_predict(X, y)`` gives the labels of ``fit(X)``. FedGMM's joint model of ``(x, y)``
    is :class:`~fednovelty.detectors.JointFedGMMDetector`.

    **A K the clients cannot back.** With ``init_params="kmeans"`` (the default) K is an
    upper bound: a client forms at most ``n_rows // min_rows`` k-means clusters under its
    privacy floor, and where the centroids the clients send are fewer than K the fit seeds
    half as many centres as centroids (each centre then pools about two, so that some
    client's rows back it), and merges the centres into half as many again when a Lloyd
    round backs none. The fit then warns with a
    :class:`~fednovelty.exceptions.FewerComponentsWarning` (a ``DataLossWarning``) naming
    the K fitted, the centroids sent and the rows, and ``n_components_`` is the fitted K.
    Why a warning and not an error: no caller can see the clients' row counts before the
    fit, so an error would cost a federation's rounds to learn one number, which the
    warning gives with the fit (as scikit-learn's ``QuantileTransformer`` fits
    ``n_quantiles_ = n_samples`` where ``n_quantiles`` is too large, and warns). Exactly K
    or an error: ``warnings.simplefilter("error", FewerComponentsWarning)``; the fit then
    raises and the detector keeps the state it had. What the caller can check itself stays
    an error: ``n_components`` above the number of rows passed to ``fit``; given initial
    means (``means_init``) or the ``"separated"`` start are never merged. The server
    chooses the smaller K from counts the clients released anyway (one centroid per
    cluster of at least ``min_rows`` rows); no client sends more for it. On the 25 ADBench
    tabular sets and the 17 image-embedding sets (10 Dirichlet clients, K = 10, both
    protocols, seeds 0-1) this happens on 5 of 168 cells (``45_wine`` once,
    ``MVTec-AD_toothbrush`` four times; ``docs/which_detector.md``).

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: global mixture (numpy, as
            scikit-learn); with personal weights ``weights_`` is their sample-weighted
            average (``global_weights="pooled"``) or their plain mean (``"client_average"``).
        client_weights_: (n_clients, n_components) personal weights, rows in ``client_ids_``
            order (``"personal"`` only).
        n_components_, effective_n_components_: the fitted K (fewer than ``n_components``
            where the clients' privacy floors cannot back it, with a
            ``FewerComponentsWarning``) and the components backed by at least one training
            row.
        pca_: the federated PCA projection of the front end (``pca_components`` an int, or
            ``"auto"`` on rows of more than 200 features; ``docs/high_dimension.md``).
        n_iter_, converged_, lower_bounds_: EM rounds, convergence, mean log-likelihoods
            (under ``dp_epsilon`` the clients withhold log-likelihoods: ``max_iter`` rounds
            run and ``lower_bounds_`` is empty).
        privacy_spent_: with ``dp_epsilon``, what the fit spent: ``epsilon`` (at
            ``delta``), the noisy ``releases``, ``noise_multiplier``, ``clip``, ``mode``.
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

    _renamed_params: ClassVar[dict] = {"covariance_prior": "prior_strength"}
    _row_sources = True  # fit streams rows read in chunks (``docs/scaling.md``)
    _params = declare(
        Param(
            "mixture_weights",
            "personal",
            [StrOptions({"global", "personal"})],
            '``"personal"`` (FedGMM: one weight vector per client, shared Gaussians) or '
            '``"global"`` (DEM: one weight vector).',
        ),
        Param(
            "acceleration",
            "none",
            [StrOptions(set(ACCELERATIONS))],
            '``"none"`` (plain EM rounds) or ``"squarem"`` (the server extrapolates between '
            "EM maps; the next round's summed log-likelihood accepts or refuses each point; "
            '``mixture_weights="global"`` only).',
        ),
        COVARIANCE_POOLING,
        GLOBAL_WEIGHTS,
        option(Prior, fields=REMEDIES),
        option(Privacy, fields=DP),
    )

    def __init__(
        self,
        n_components=8,
        *,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        mixture_weights="personal",
        acceleration="none",
        covariance_pooling="exact",
        global_weights="pooled",
        init_params="kmeans",
        initialisation=None,
        prior=None,
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

    def _fit_em(self, data, seed, *, pca_components, round_offset=0):
        width = pca_components or data[0].shape[1]  # of the rows the Gaussians see
        options = self._em_options(seed, pca_components, width)
        plan = dp_plan(
            self,
            width,
            len(data),
            lambda private: FederatedEM(**options, **private).max_rounds,
            standardized=self._option("prior").standardize,
        )
        plan, box = run_private_bounds(self, plan, data, seed, round_offset=round_offset)
        algorithm = FederatedEM(**options, **(plan.settings if plan else {}))
        result = self._simulate(
            algorithm,
            data,
            seed,
            full=True,
            round_offset=round_offset + bounds_rounds(box),
            **self._em_engine(plan),
            **bounds_engine(box),
        )
        finish_private_fit(self, plan, algorithm, box)
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

    def decision_function(self, X, client=None) -> np.ndarray:
        """Anomaly score ``-log p(x)`` of each row, shape (n_samples,); higher = more novel.

        Args:
            X: rows (n_samples, n_features).
            client: ``None`` for the model's weights (what ``threshold_``, ``predict`` and
                ``predict_proba`` use), a client id seen in fit for its personal weights
                (``mixture_weights="personal"``), or a handle from :meth:`adapt`.
        """
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
            log_px = score_samples(self.model_, self._gmm_input(Xt), log_weights)
            return (log_px + self._residual(Xt)).cpu().numpy()

    def adapt(self, X, prior_rows="auto", max_iter: int = 100, tol: float = 1e-6) -> AdaptedClient:
        """Mixture weights for a client unseen in training, every Gaussian frozen (FedGMM
        Sec. 3: only ``pi`` is re-estimated, by EM from the global weights), MAP under a
        Dirichlet prior centred on the global weights: the M-step is
        ``pi = (counts + prior_rows * global) / (n + prior_rows)``
        (:func:`~fednovelty.mixture.em.fit_weights_map`), so a few rows barely move the
        global weights and many rows reach their own.

        The detector is not modified; the returned handle works as ``client=`` in
        :meth:`decision_function`, :meth:`score_samples_client` and the per-component
        methods.

        Args:
            X: the new client's rows (n_samples, n_features); at least 2.
            prior_rows: the prior's strength in pseudo-rows (a number >= 0; ``0`` is the
                paper's maximum-likelihood EM); ``"auto"`` is the number of components (on
                FEMNIST writers never below the global weights at 5, 20 or 50 rows;
                ``docs/joint.md``).
            max_iter: maximum EM iterations; tol: stop when the penalised log-likelihood per
                row changes by less than this.

        Returns:
            An :class:`AdaptedClient` (weights, their trace over iterations, log-likelihoods).
        """
        Xt = self._adapt_rows(X, max_iter)
        params = self.model_
        strength = check_prior_rows(params.n_components if prior_rows == "auto" else prior_rows)
        with torch.no_grad():
            log_n = log_gaussian_prob(
                self._gmm_input(Xt),
                params.means,
                params.precisions_cholesky,
                params.covariance_type,
            )
            result = fit_weights_map(
                log_n, params.weights.log(), strength, max_iter=max_iter, tol=tol
            )
        return self._adapted(result, Xt.shape[0], labelled=False)

    # -------------------------------------------------------------- persistence
    @classmethod
    def _upgrade_document(cls, document: dict, tensors: dict) -> tuple[type, dict, dict]:
        """A file saved before the joint model had its own class: a ``FedGMMDetector``
        fitted with ``y`` (``classes_`` saved) is read as a ``JointFedGMMDetector``, and the
        settings that do not apply to the class read are dropped (they had no effect on the
        saved model); see ``persistence.load``, which has put the settings under today's names
        first (``_saved_params.current_params``)."""
        from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector

        attrs = document.get("attrs")
        joint = isinstance(attrs, dict) and "classes_" in attrs
        target = JointFedGMMDetector if joint else cls
        params = document.get("params")
        if not isinstance(params, dict):
            return target, document, tensors
        names = target().get_params(deep=False)
        legacy = set(FedGMMDetector().get_params(deep=False)) | set(_JOINT_MODEL_PARAMS)
        dropped = {k for k in params if k not in names and k in legacy}
        kept = {k: v for k, v in params.items() if k not in dropped}
        unused = {f"param.{k}" for k in dropped}
        tensors = {k: v for k, v in tensors.items() if k not in unused}
        return target, {**document, "params": kept}, tensors
