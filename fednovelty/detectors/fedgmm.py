"""``FedGMMDetector``: iterative federated EM (FedGMM Algorithm 2, DEM) as a PyOD detector."""

from __future__ import annotations

import warnings
from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import Interval, StrOptions

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
        algorithm = FederatedEM(
            self.n_components,
            covariance_type=self.covariance_type,
            mixture_weights=self.mixture_weights,
            init_params=self.init_params,
            reg_covar=self.reg_covar,
            tol=self.tol,
            max_iter=self.max_iter,
            kmeans_rounds=self.kmeans_rounds,
            subset_size=self.subset_size,
            weights_init=self.weights_init,
            means_init=self.means_init,
            precisions_init=self.precisions_init,
            random_state=seed,
            **self._torch_options(),
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
        matches = np.flatnonzero(self.client_ids_ == client)
        if matches.size == 0:
            raise ValueError(
                f"client {client!r} was not seen in fit; known clients: "
                f"{self.client_ids_[:10].tolist()}{'...' if self.n_clients_ > 10 else ''}."
            )
        log_weights = torch.as_tensor(self.client_weights_[matches[0]]).to(Xt).log()
        with torch.no_grad():
            return score_samples(self.model_, Xt, log_weights).cpu().numpy()

    def _get_state(self):
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
