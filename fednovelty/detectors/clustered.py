"""``ClusteredFedGMMDetector``: a federated mixture of global components shared by every
client plus the components of each client's cluster (the algorithm is
:class:`~fednovelty.federated.clustered.clustered_em.ClusteredEM`).

Clients often come in near-homogeneous groups (hospital types, vehicle models). A single
federated mixture with personal weights (FedGMM) must spread its components over every
group; this one gives each discovered cluster ``cluster_components`` components of its own
on top of ``n_components`` global ones, and scores

- a row under the whole model (``decision_function(X)``: the pooled weights), a client's
  own mixture (``client=``) or a cluster's (``cluster=``);
- a *client* (``client_scores_`` for the fitted clients, :meth:`client_score` for new rows):
  minus the best mean log-likelihood per row that any cluster's mixture gives its rows,
  as a robust z-score against the fitted clients (median and MAD): a client whose rows fit
  no cluster (a misconfigured site, a malicious one) scores high.

``adapt(X)`` places an unseen client in the cluster whose mixture fits its rows best and
re-estimates its weights there with every component frozen.

Every log-density these report is of ``x``: with the PCA front end (``pca_``) the mixture's
log-density of the projection plus the probabilistic-PCA residual term, per row, or as its
mean over a client's rows in the mean log-likelihoods.
"""

from __future__ import annotations

from numbers import Integral
from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._em_detector import AdaptedClient, EMDetector
from fednovelty.detectors._front_end import ClientViews
from fednovelty.detectors._option_fields import FLOOR, KMEANS_START, REMEDIES
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors.options import Initialisation, Prior, Privacy
from fednovelty.detectors.persistence import check_probabilities, get_attr, get_tensor
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.clustered.clustered_em import CLUSTER_ASSIGNMENTS, ClusteredEM
from fednovelty.federated.clustered.mixture_clusters import (
    allowed_components,
    cluster_log_likelihoods,
)
from fednovelty.mixture import fit_weights, log_gaussian_prob, score_samples

__all__ = ["ClusteredClient", "ClusteredFedGMMDetector"]

_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]
#: MAD to standard deviation under a normal law.
_MAD_SCALE = 1.4826


class ClusteredClient(AdaptedClient):
    """An unseen client placed by :meth:`ClusteredFedGMMDetector.adapt`: an
    :class:`AdaptedClient` (pass it as ``client=``) with its ``cluster`` and the mean
    log-likelihood per row of its rows under each cluster (``cluster_log_likelihoods``)."""

    def __init__(self, adapted: AdaptedClient, cluster: int, log_likelihoods: np.ndarray):
        super().__init__(**{f: getattr(adapted, f) for f in adapted.__dataclass_fields__})
        object.__setattr__(self, "cluster", int(cluster))
        object.__setattr__(self, "cluster_log_likelihoods", log_likelihoods)


class ClusteredFedGMMDetector(EMDetector):
    """Clustered additive Gaussian mixture over clients (see the module docstring).

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: the M = K_g + C K_c
            components; ``weights_`` the row-weighted pooled weights.
        component_clusters_: (M,) each component's cluster (-1: global).
        cluster_weights_: (C, M) each cluster's pooled weights (0 outside its components).
        client_clusters_: (n_clients,) each client's cluster, in ``client_ids_`` order (-1:
            a client that never replied, e.g. below its privacy floor).
        client_weights_: (n_clients, M) personal weights (a client that never replied: its
            cluster's, or the pooled ones).
        client_log_likelihoods_: (n_clients, C) each client's rows' mean log-likelihood per
            row under each cluster's mixture (last round; NaN: never replied), with the PCA
            front end plus the mean of the client's rows' residual term.
        client_scores_: (n_clients,) the client-level anomaly score (higher = fits no
            cluster; robust z-score against the fitted clients).
        cluster_sizes_history_: clients per cluster, one list per clustered round.
        cluster_events_: empty clusters and what was done, one dict per event.
        n_iter_, converged_, lower_bounds_: EM rounds, convergence, mean log-likelihoods.
        history_, n_rounds_, bytes_up_, bytes_down_: the rounds and their bytes.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> places = [[6, 0], [0, 6], [-6, -6]]
        >>> X = np.vstack([np.r_[rng.normal(0, 1, (50, 2)), rng.normal(places[c % 3], 1, (50, 2))]
        ...                for c in range(9)])
        >>> groups = np.repeat(np.arange(9), 100)
        >>> det = ClusteredFedGMMDetector(3, n_clusters=3, cluster_components=1,
        ...                               random_state=0).fit(X, groups=groups)
        >>> clusters = det.client_clusters_.tolist()
        >>> clusters[:3] == clusters[3:6] == clusters[6:] and len(set(clusters)) == 3
        True
    """

    _renamed_params: ClassVar[dict] = {"covariance_prior": "prior_strength"}
    _params = declare(
        Param("n_clusters", 2, _POSITIVE_INT, "C client clusters."),
        Param("cluster_components", 2, _POSITIVE_INT, "K_c components per cluster."),
        Param(
            "assignment",
            "likelihood",
            [StrOptions(set(CLUSTER_ASSIGNMENTS))],
            '``"likelihood"`` (IFCA\'s rule: a client joins the cluster whose mixture fits '
            "its rows best) or ``\"summary\"`` (FeSEM's: the server clusters the clients' "
            "weight summaries by k-means).",
        ),
        Param(
            "warmup",
            10,
            _POSITIVE_INT,
            "federated EM rounds on all ``n_components + n_clusters * cluster_components`` "
            "components before the clusters form and take their own.",
        ),
        option(Initialisation, fields=KMEANS_START),
        option(Prior, fields=REMEDIES),
        option(Privacy, fields=FLOOR),
        docs={
            "n_components": "K_g global components, shared by every client.",
            "max_iter": "Counted after the warm-up.",
        },
    )

    def __init__(
        self,
        n_components=4,
        *,
        n_clusters=2,
        cluster_components=2,
        assignment="likelihood",
        warmup=10,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=50,
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

    # -------------------------------------------------------------- fitting
    def _fit_em(self, data, seed, *, pca_components, round_offset=0):
        if self.n_clusters > len(data):
            raise ValueError(
                f"n_clusters={self.n_clusters} exceeds the {len(data)} client(s) in groups: "
                "lower n_clusters or add clients."
            )
        width = pca_components or data[0].shape[1]
        algorithm = ClusteredEM(**self._em_options(seed, pca_components, width))
        result = self._simulate(
            algorithm, data, seed, full=True, round_offset=round_offset, **self._em_engine()
        )
        state = result.state
        self._set_em_state(state)
        self._set_clusters(state, self._client_residuals(data))
        self._warn_if_not_converged()
        return result

    def _client_residuals(self, data: list) -> np.ndarray:
        """(n_clients,) the mean PCA-front-end residual term of each client's rows (zeros
        without the front end): the clients' rows behind the projected ``data`` the
        algorithm saw (the front end's :class:`~fednovelty.detectors._front_end.ClientViews`)."""
        if not isinstance(data, ClientViews):
            return np.zeros(len(data))
        with torch.no_grad():
            return np.array([float(self._residual(rows).mean()) for rows in data.rows])

    def _set_clusters(self, state, residuals: np.ndarray) -> None:
        """The fitted cluster attributes from a finished ``ClusteredEMState`` and each
        client's mean residual term ``residuals`` (n_clients,), added to its mean
        log-likelihoods."""
        n, c = self.n_clients_, self.n_clusters
        self.component_clusters_ = state.component_clusters.cpu().numpy().astype(np.int64)
        self.cluster_weights_ = state.cluster_log_weights.exp().cpu().numpy()
        clusters = np.full(n, -1, dtype=np.int64)
        weights = np.tile(self.model_.weights.cpu().numpy(), (n, 1))
        lls = np.full((n, c), np.nan)
        for i in range(n):
            if i in state.client_clusters:
                clusters[i] = state.client_clusters[i]
                lls[i] = state.client_log_likelihoods[i].cpu().numpy() + residuals[i]
            if i in state.client_weights:
                weights[i] = state.client_weights[i].cpu().numpy()
            elif clusters[i] >= 0:
                weights[i] = self.cluster_weights_[clusters[i]]
        self.client_clusters_ = clusters
        self.client_weights_ = weights
        self.client_log_likelihoods_ = lls
        self.cluster_sizes_history_ = [list(s) for s in state.cluster_sizes]
        self.cluster_events_ = [dict(e) for e in state.events]
        self._set_client_scores()

    def _set_client_scores(self) -> None:
        raw = -np.nanmax(self.client_log_likelihoods_, axis=1, initial=-np.inf)
        fitted = raw[np.isfinite(raw)]
        if fitted.size:
            center = float(np.median(fitted))
            spread = _MAD_SCALE * float(np.median(np.abs(fitted - center)))
            spread = spread if spread > 0 else max(float(np.std(fitted)), 1e-12)
        else:
            center, spread = 0.0, 1.0
        self._client_score_center, self._client_score_scale = center, spread
        self.client_scores_ = np.where(np.isfinite(raw), (raw - center) / spread, np.nan)

    # -------------------------------------------------------------- scoring
    def _personal_weights(self) -> np.ndarray:
        return self.client_weights_

    def _cluster_scores(self, Xt: torch.Tensor) -> torch.Tensor:
        """(C,) mean log-likelihood per row of ``Xt`` (n, n_features) under each cluster's
        mixture, a log-density of ``x`` (the PCA front end's residual term included)."""
        params = self.model_
        log_prob = log_gaussian_prob(
            self._gmm_input(Xt), params.means, params.precisions_cholesky, params.covariance_type
        )
        weights = torch.as_tensor(self.cluster_weights_).to(log_prob)
        return cluster_log_likelihoods(log_prob, weights.log()) + self._residual(Xt).mean()

    def decision_function(self, X, *, client=None, cluster=None) -> np.ndarray:
        """Anomaly score ``-log p(x)`` of each row, shape (n_samples,); higher = more novel.

        Args:
            X: rows (n_samples, n_features).
            client: ``None``, a client id seen in fit (its own weights), or a handle from
                :meth:`adapt`.
            cluster: a cluster index (its pooled weights); not with ``client``.
        """
        if client is not None and cluster is not None:
            raise ValueError("pass client= or cluster=, not both.")
        if client is None and cluster is None:
            return super().decision_function(X)
        Xt = self._check_score_input(X)
        if cluster is not None:
            if not isinstance(cluster, Integral) or not 0 <= int(cluster) < self.n_clusters:
                raise ValueError(
                    f"cluster must be an integer in [0, {self.n_clusters}); got {cluster!r}."
                )
            log_weights = torch.as_tensor(self.cluster_weights_[int(cluster)]).to(Xt).log()
        else:
            log_weights = self._log_pi(client, Xt)
        with torch.no_grad():
            log_px = score_samples(self.model_, self._gmm_input(Xt), log_weights)
            return -(log_px + self._residual(Xt)).cpu().numpy()

    def client_score(self, X) -> float:
        """Client-level anomaly score of a client's rows (n_samples, n_features): minus the
        best mean log-likelihood per row any cluster's mixture gives them, on the scale of
        ``client_scores_`` (higher = fits no cluster)."""
        Xt = self._check_score_input(X)
        if Xt.shape[0] < 1:
            raise ValueError("client_score needs at least 1 row of the client.")
        with torch.no_grad():
            best = float(self._cluster_scores(Xt).max())
        return (-best - self._client_score_center) / self._client_score_scale

    def adapt(self, X, *, max_iter: int = 100, tol: float = 1e-6) -> ClusteredClient:
        """Place a client unseen in training in a cluster and fit its weights there.

        The cluster is the one whose mixture gives the rows the highest mean log-likelihood
        (ties: the lowest index); the weights start from that cluster's and are
        re-estimated by EM with every component frozen (zero outside the cluster's
        components). The detector is not modified.

        Args:
            X: the new client's rows (n_samples, n_features); at least 2.
            max_iter, tol: the weights' EM.

        Returns:
            A :class:`ClusteredClient` (``cluster``, ``weights``, ...); pass it as
            ``client=`` to :meth:`decision_function`.
        """
        Xt = self._adapt_rows(X, max_iter)
        params = self.model_
        with torch.no_grad():
            scores = self._cluster_scores(Xt)
            cluster = int(torch.argmax(scores))
            log_n = log_gaussian_prob(
                self._gmm_input(Xt),
                params.means,
                params.precisions_cholesky,
                params.covariance_type,
            )
            start = torch.as_tensor(self.cluster_weights_[cluster]).to(log_n).log()
            result = fit_weights(log_n, start, max_iter=max_iter, tol=tol)
        adapted = self._adapted(result, Xt.shape[0], labelled=False)
        return ClusteredClient(adapted, cluster, scores.cpu().numpy())

    # -------------------------------------------------------------- persistence
    def _get_state(self):
        tensors, attrs = super()._get_state()
        tensors["component_clusters"] = torch.as_tensor(self.component_clusters_, dtype=float)
        tensors["cluster_weights"] = torch.as_tensor(self.cluster_weights_)
        tensors["client_clusters"] = torch.as_tensor(self.client_clusters_, dtype=float)
        lls = np.nan_to_num(self.client_log_likelihoods_, nan=-np.inf)  # never replied
        tensors["client_log_likelihoods"] = torch.as_tensor(lls)
        attrs = {
            **attrs,
            "cluster_sizes_history_": self.cluster_sizes_history_,
            "cluster_events_": self.cluster_events_,
        }
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        m, n, c = self.n_components_, self.n_clients_, self.n_clusters
        if m != self.n_components + c * self.cluster_components:
            raise ModelFormatError(
                f"the mixture has {m} components; n_components={self.n_components}, "
                f"n_clusters={c} and cluster_components={self.cluster_components} make "
                f"{self.n_components + c * self.cluster_components}."
            )
        owners = _integers(get_tensor(tensors, "component_clusters", (m,)), "component_clusters")
        if bool(((owners < -1) | (owners >= c)).any()):
            raise ModelFormatError("'component_clusters' holds a cluster outside [-1, n_clusters).")
        weights = get_tensor(tensors, "cluster_weights", (c, m))
        allowed = allowed_components(owners, c)
        if bool((weights[~allowed] != 0).any()) or bool((weights < 0).any()):
            raise ModelFormatError("'cluster_weights' puts weight outside a cluster's components.")
        check_probabilities(weights, "the rows of 'cluster_weights'")
        clusters = _integers(get_tensor(tensors, "client_clusters", (n,)), "client_clusters")
        if bool(((clusters < -1) | (clusters >= c)).any()):
            raise ModelFormatError("'client_clusters' holds a cluster outside [-1, n_clusters).")
        self.component_clusters_ = owners.numpy()
        self.cluster_weights_ = weights.numpy()
        self.client_clusters_ = clusters.numpy()
        lls = get_tensor(tensors, "client_log_likelihoods", (n, c), allow_inf=True).numpy()
        if np.isposinf(lls).any():
            raise ModelFormatError("'client_log_likelihoods' holds +inf.")
        self.client_log_likelihoods_ = np.where(np.isneginf(lls), np.nan, lls)
        sizes = get_attr(attrs, "cluster_sizes_history_", list)
        if not all(isinstance(s, list) and len(s) == c for s in sizes):
            raise ModelFormatError(f"'cluster_sizes_history_' must hold lists of {c} sizes.")
        self.cluster_sizes_history_ = [[int(v) for v in s] for s in sizes]
        self.cluster_events_ = [dict(e) for e in get_attr(attrs, "cluster_events_", list)]
        self._set_client_scores()


def _integers(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """A saved float tensor of integer values as int64 (ModelFormatError otherwise)."""
    if bool((tensor != tensor.round()).any()):
        raise ModelFormatError(f"the tensor {name!r} must hold integers.")
    return tensor.to(torch.int64)
