"""``FedGMMDetector``: iterative federated EM (FedGMM Algorithm 2, DEM) as a PyOD detector."""

from __future__ import annotations

import warnings
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._validation import check_groups, split_by_client
from fednovelty.detectors.base import COMMON_CONSTRAINTS, MixtureDetector
from fednovelty.detectors.persistence import register
from fednovelty.federated import INIT_PARAMS, FederatedEM
from fednovelty.mixture import score_samples


@register
class FedGMMDetector(MixtureDetector):
    """Gaussian mixture trained by federated EM over clients; scores novelty as ``-log p(x)``.

    Every EM iteration is one communication round: the server broadcasts the parameters,
    each client replies with summed sufficient statistics of its rows, the server adds them
    and runs the M-step. With ``mixture_weights="global"`` this is exactly centralized EM
    on the pooled rows (scikit-learn's ``GaussianMixture``), whatever the split.

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
        kmeans_rounds: maximum federated Lloyd rounds of the ``kmeans`` init.
        subset_size: rows pooled by the ``subset`` init.
        fraction: share of clients asked each round; dropout: chance that one fails to reply.
        contamination: expected share of anomalies, sets ``threshold_`` (PyOD).
        random_state: seed (int, RandomState or None).
        device: ``"cpu"`` (default) or ``"cuda"``; dtype: ``"float64"`` (default) or ``"float32"``.
        progress: show a progress bar over rounds.

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: global mixture (numpy, as
            scikit-learn); with personal weights ``weights_`` is the sample-weighted average.
        client_weights_: (n_clients, n_components) personal weights, rows in ``client_ids_``
            order (``"personal"`` only).
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
        **COMMON_CONSTRAINTS,
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "mixture_weights": [StrOptions({"global", "personal"})],
        "init_params": [StrOptions(set(INIT_PARAMS))],
        "weights_init": ["array-like", None],
        "means_init": ["array-like", None],
        "precisions_init": ["array-like", None],
        "kmeans_rounds": [Interval(Integral, 1, None, closed="left")],
        "subset_size": [Interval(Integral, 1, None, closed="left")],
        "n_learners": [Interval(Integral, 1, None, closed="left")],
        "learner": [StrOptions({"linear", "mlp"}), callable],
        "local_epochs": [Interval(Integral, 1, None, closed="left")],
        "learning_rate": [Interval(Real, 0.0, None, closed="neither")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "mu_prox": [Interval(Real, 0.0, None, closed="left")],
        "fraction": [Interval(Real, 0.0, 1.0, closed="right")],
        "dropout": [Interval(Real, 0.0, 1.0, closed="left")],
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
        weights_init=None,
        means_init=None,
        precisions_init=None,
        kmeans_rounds=10,
        subset_size=100,
        n_learners=2,
        learner="linear",
        local_epochs=5,
        learning_rate=0.5,
        batch_size=32,
        mu_prox=0.0,
        fraction=1.0,
        dropout=0.0,
        contamination=0.1,
        random_state=None,
        device=None,
        dtype="float64",
        progress=False,
    ):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.mixture_weights = mixture_weights
        self.init_params = init_params
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.kmeans_rounds = kmeans_rounds
        self.subset_size = subset_size
        self.n_learners = n_learners
        self.learner = learner
        self.local_epochs = local_epochs
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.mu_prox = mu_prox
        self.fraction = fraction
        self.dropout = dropout
        self.contamination = contamination
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.progress = progress

    def _fit_clients(self, parts, clients, seed) -> None:
        n_total = sum(p.shape[0] for p in parts)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        label_parts = getattr(self, "_label_parts", None)
        if label_parts is not None:
            device = clients[0].device
            self._fit_joint(clients, seed, [torch.as_tensor(p, device=device) for p in label_parts])
            return
        algorithm = FederatedEM(
            self.n_components,
            mixture_weights=self.mixture_weights,
            weights_init=self.weights_init,
            means_init=self.means_init,
            precisions_init=self.precisions_init,
            **self._em_options(seed),
        )
        state = self._simulate(
            algorithm, clients, seed, fraction=self.fraction, dropout=self.dropout
        )
        self._set_mixture(state.params)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if self.mixture_weights == "personal":
            self.client_weights_ = self._client_weight_matrix(state.client_weights)
        elif hasattr(self, "client_weights_"):
            del self.client_weights_
        if not self.converged_:
            warnings.warn(
                f"Federated EM did not converge in max_iter={self.max_iter} rounds (last change "
                "in mean log-likelihood above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ joint model (y given)
    def fit(self, X, y=None, groups=None):
        """Fit on rows ``X`` split into clients by ``groups``.

        Without ``y``: the Gaussian mixture of ``x`` by federated EM. With ``y`` (one label per
        row, any hashable values; ``classes_`` keeps the mapping): FedGMM's joint model
        ``p_c(x, y) = sum pi_c(m1, m2) N(x; m1) P_m2(y | x)`` with ``n_components`` Gaussians
        and ``n_learners`` conditional models (first cut: scores and prediction; ``adapt``
        and saving of joint models come next).
        """
        if y is None:
            self._drop_joint_attributes()
            return super().fit(X, groups=groups)
        y_array = np.asarray(y)
        if y_array.ndim != 1:
            raise ValueError(f"y must be 1-D (one label per row), got shape {y_array.shape}.")
        if y_array.dtype.kind == "f" and not np.isfinite(y_array).all():
            raise ValueError("y contains NaN or inf; every row needs a label.")
        if len(y_array) != len(np.asarray(X)):
            raise ValueError(
                f"y has {len(y_array)} labels but X has {len(np.asarray(X))} rows; give one "
                "label per row."
            )
        self.classes_, codes = np.unique(y_array, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError("y has a single class; the joint model needs at least 2 classes.")
        client_ids, group_codes = check_groups(groups, len(y_array))
        self._label_parts = split_by_client(codes.astype(np.int64), group_codes, len(client_ids))
        try:
            return super().fit(X, groups=groups)
        finally:
            del self._label_parts

    def _drop_joint_attributes(self) -> None:
        for name in ("classes_", "joint_state_", "learner_template_", "client_joint_weights_"):
            if hasattr(self, name):
                delattr(self, name)

    def _em_options(self, seed: int) -> dict:
        """Arguments shared by the plain and the joint federated EM algorithms."""
        return {
            "covariance_type": self.covariance_type,
            "init_params": self.init_params,
            "reg_covar": self.reg_covar,
            "tol": self.tol,
            "max_iter": self.max_iter,
            "kmeans_rounds": self.kmeans_rounds,
            "subset_size": self.subset_size,
            "random_state": seed,
            **self._torch_options(),
        }

    def _fit_joint(self, clients, seed, label_parts) -> None:
        from fednovelty.federated.joint import JointFedGMM, linear_learner, mlp_learner

        factory = {"linear": linear_learner, "mlp": mlp_learner}.get(self.learner, self.learner)
        algorithm = JointFedGMM(
            self.n_components,
            self.n_learners,
            len(self.classes_),
            learner_factory=factory,
            local_epochs=self.local_epochs,
            learning_rate=self.learning_rate,
            batch_size=self.batch_size,
            mu_prox=self.mu_prox,
            **self._em_options(seed),
        )
        data = list(zip(clients, label_parts, strict=True))
        state = self._simulate(algorithm, data, seed, fraction=self.fraction, dropout=self.dropout)
        self.joint_state_ = state
        self.learner_template_ = algorithm._template(clients[0].shape[1])
        self._set_mixture(state.params)
        self.n_iter_, self.converged_ = state.n_iter, state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        self.client_weights_ = self._client_weight_matrix(state.client_weights)
        joint = [
            state.client_joint_weights.get(c, state.joint_counts / state.joint_counts.sum())
            for c in range(self.n_clients_)
        ]
        self.client_joint_weights_ = torch.stack(joint).cpu().numpy()

    def _joint_scores(self, X, y=None, client=None) -> dict[str, torch.Tensor]:
        from fednovelty.federated.joint import joint_log_scores

        Xt = self._check_score_input(X)
        if not hasattr(self, "joint_state_"):
            raise ValueError(
                "This FedGMMDetector was fitted without y; fit(X, y, groups=...) first."
            )
        log_pi = None
        if client is not None:
            log_pi = (
                torch.as_tensor(self.client_joint_weights_[self._client_index(client)]).to(Xt).log()
            )
        codes = None
        if y is not None:
            y_array = np.asarray(y)
            if len(y_array) != Xt.shape[0]:
                raise ValueError(f"y has {len(y_array)} labels but X has {Xt.shape[0]} rows.")
            unknown = ~np.isin(y_array, self.classes_)
            if unknown.any():
                raise ValueError(
                    f"y has label(s) {np.unique(y_array[unknown])[:5].tolist()} not seen in fit; "
                    f"known classes: {self.classes_.tolist()}."
                )
            codes = torch.as_tensor(np.searchsorted(self.classes_, y_array), device=Xt.device)
        with torch.no_grad():
            return joint_log_scores(self.joint_state_, self.learner_template_, Xt, codes, log_pi)

    def log_px(self, X, client=None) -> np.ndarray:
        """``log p(x)`` (covariate novelty), shape (n_samples,); ``client`` uses that client's
        weights, ``None`` the sample-weighted global ones."""
        return self._joint_scores(X, client=client)["log_px"].cpu().numpy()

    def log_py_given_x(self, X, y, client=None) -> np.ndarray:
        """``log p(y | x)`` (label novelty), shape (n_samples,)."""
        return self._joint_scores(X, y, client)["log_py_given_x"].cpu().numpy()

    def log_pxy(self, X, y, client=None) -> np.ndarray:
        """``log p(x, y)`` (joint novelty), shape (n_samples,)."""
        return self._joint_scores(X, y, client)["log_pxy"].cpu().numpy()

    def predict_proba_y(self, X, client=None) -> np.ndarray:
        """Class probabilities ``p(y | x)`` (the paper's Eq. 3), shape (n_samples, n_classes)."""
        return self._joint_scores(X, client=client)["proba_y"].cpu().numpy()

    def predict_y(self, X, client=None) -> np.ndarray:
        """Most probable label of each row, in the original label values."""
        return self.classes_[self.predict_proba_y(X, client).argmax(1)]

    def _client_index(self, client) -> int:
        matches = np.flatnonzero(self.client_ids_ == client)
        if matches.size == 0:
            raise ValueError(
                f"client {client!r} was not seen in fit; known clients: "
                f"{self.client_ids_[:10].tolist()}{'...' if self.n_clients_ > 10 else ''}."
            )
        return int(matches[0])

    def _client_weight_matrix(self, weights: dict[int, torch.Tensor]) -> np.ndarray:
        """(n_clients, n_components); a client that never replied gets the global weights."""
        rows = [weights.get(c, self.model_.weights) for c in range(self.n_clients_)]
        return torch.stack(rows).cpu().numpy()

    def _log_density(self, X: torch.Tensor) -> torch.Tensor:
        return score_samples(self.model_, X)

    def score_samples_client(self, X, client) -> np.ndarray:
        """``log p_c(x)`` under one client's personal weights (``"personal"`` only).

        Args:
            X: rows (n_samples, n_features).
            client: a client id as given in ``groups`` at fit time.
        """
        Xt = self._check_score_input(X)
        if not hasattr(self, "client_weights_"):
            raise ValueError("score_samples_client needs mixture_weights='personal'.")
        log_weights = torch.as_tensor(self.client_weights_[self._client_index(client)]).to(Xt).log()
        with torch.no_grad():
            return score_samples(self.model_, Xt, log_weights).cpu().numpy()

    def _get_state(self):
        if hasattr(self, "joint_state_"):
            raise NotImplementedError(
                "Saving a FedGMMDetector fitted with y (the joint model) is not supported yet; "
                "models fitted without y save as usual."
            )
        tensors = self._mixture_tensors(self.model_, "model")
        if hasattr(self, "client_weights_"):
            tensors["client_weights"] = torch.as_tensor(self.client_weights_)
        attrs = {
            "n_iter_": self.n_iter_,
            "converged_": self.converged_,
            "lower_bounds_": self.lower_bounds_,
        }
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        self._set_mixture(self._mixture_from(tensors, "model", self.covariance_type))
        self.n_iter_, self.converged_ = attrs["n_iter_"], attrs["converged_"]
        self.lower_bounds_ = attrs["lower_bounds_"]
        if "client_weights" in tensors:
            self.client_weights_ = tensors["client_weights"].numpy()
