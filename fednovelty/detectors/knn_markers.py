"""``FedKNNMarkerDetector``: calibrated federated novelty from kNN-distance markers.

The VGM2 paper's Dir-NIG "mixture relation markers" used for novelty: a row is novel when its
distance to a client's rows is improbably large for that client. Each client takes, on its own
rows, every row's leave-one-out distance ``d_k`` to its ``n_neighbors``-th nearest other row;
exact federated VB (:class:`~fednovelty.federated.bayesian.knn_markers.FederatedKNNMarkers`) fits a
Dirichlet / Normal-Inverse-Gamma mixture of ``log(d_k + distance_floor)`` (``posterior_``),
so only one-dimensional distance statistics cross the wire; each client then updates it with
its own distances (``personal_strength`` pseudo-rows of prior: ``client_posteriors_``).

Scores (PyOD's contract, ``y`` ignored): ``tail_probability(X)`` is the predictive upper-tail
probability of a row's distance to each client's rows, combined over the clients
(``combine="max"``: a conservative p-value; ``"mixture"``: the rows-weighted mean), small =
novel; ``score_samples = log tail_probability`` (not a log-density) and ``decision_function``
its negative. A training row's distance to its own client's rows is taken leave-one-out.

A client with fewer than ``n_neighbors + 1`` rows, or below its privacy floor, takes no part
(``skipped_clients_``). ``save`` writes every scoring client's reference rows (scoring needs
them): a saved file is a copy of the training data. Log distances, one feature (so no
``covariance_type``), the k-th nearest distance as PyOD's ``KNN(method="largest")``; features
are used as given (scale them first). ``docs/knn_markers.md`` has the details and measurements.
"""

from __future__ import annotations

import math
import warnings
from numbers import Integral, Real

import numpy as np
import torch
from pyod.models.base import BaseDetector
from scipy.special import logsumexp
from sklearn.exceptions import ConvergenceWarning
from sklearn.neighbors import NearestNeighbors
from sklearn.utils._param_validation import Interval, StrOptions

from fednovelty.detectors._conformal import ConformalMixin
from fednovelty.detectors._option_fields import FLOOR
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors._probability import outlier_probability
from fednovelty.detectors._saved_state import SavedStateMixin
from fednovelty.detectors._vb_state import POSTERIOR_TENSORS, posterior_from
from fednovelty.detectors.base import SimulatedFitMixin
from fednovelty.detectors.options import ClientSampling, Initialisation, Prior, Privacy, Robustness
from fednovelty.detectors.persistence import (
    check_in_box,
    check_items,
    get_attr,
    get_tensor,
    iteration_record,
    restore_iteration_record,
)
from fednovelty.detectors.persistence_checks import check_at_least
from fednovelty.detectors.variational import WEIGHT_THRESHOLD
from fednovelty.exceptions import ClientDataError, ModelFormatError, SingularCovarianceError
from fednovelty.federated.bayesian.knn_markers import (
    CACHE_KEY,
    FederatedKNNMarkers,
    knn_log_distances,
    personal_posterior,
    predictive_log_tail,
)
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.variational import VBPosterior
from fednovelty.mixture.vb_predictive import active_components, vb_predictive_components
from fednovelty.runtime.threads import scoring_threads


class FedKNNMarkerDetector(ConformalMixin, SimulatedFitMixin, BaseDetector):
    """Federated kNN-distance novelty with a Dir-NIG mixture of log distances; scores a row
    by the predictive tail probability of its distances to the clients' rows (module doc).

    Attributes:
        posterior_: global one-feature ``VBPosterior`` of ``log(d_k + distance_floor)``.
        client_posteriors_: list of the scoring clients' posteriors (``scoring_clients_``
            order); the global one when ``personal_strength`` is None.
        scoring_clients_: ids of the clients that score, (n_scoring_clients,).
        client_weights_: their shares of the rows with distances, (n_scoring_clients,).
        skipped_clients_: dict client id -> why it does not take part.
        effective_n_components_: components of ``posterior_`` above ``weight_threshold``.
        n_iter_, converged_, lower_bounds_: federated VB's record.
        history_, n_rounds_, bytes_up_, bytes_down_: communication record.
        decision_scores_, threshold_, labels_: PyOD's training-set outputs.

    Examples:
        >>> import numpy as np
        >>> from fednovelty.detectors.knn_markers import FedKNNMarkerDetector
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(400, 2))
        >>> det = FedKNNMarkerDetector(random_state=0).fit(X, groups=np.repeat([0, 1], 200))
        >>> bool(det.tail_probability([[6.0, 6.0]])[0] < 0.01)
        True
    """

    PRUNES_COMPONENTS = True

    _params = declare(
        Param(
            "n_neighbors",
            5,
            [Interval(Integral, 1, None, closed="left")],
            "``k``, the neighbour whose distance is modelled.",
        ),
        Param(
            "personal_strength",
            10.0,
            [Interval(Real, 0.0, None, closed="neither"), None],
            "pseudo-rows the global posterior is worth as each client's prior; ``None``: "
            "every client scores with the global posterior.",
            "estimator",
        ),
        Param(
            "personal_iter",
            10,
            [Interval(Integral, 1, None, closed="left")],
            "local variational iterations of the personal update.",
            "estimator",
        ),
        Param(
            "combine",
            "max",
            [StrOptions({"max", "mixture"})],
            '``"max"`` (a conservative p-value) or ``"mixture"`` (the rows-weighted mean of '
            "the clients' tail probabilities); ``docs/knn_markers.md``.",
            "estimator",
        ),
        Param(
            "distance_floor",
            1e-6,
            [Interval(Real, 0.0, None, closed="neither")],
            "added to distances before the log (rows' units).",
        ),
        WEIGHT_THRESHOLD,
        option(Initialisation, fields=("kmeans_rounds",)),
        option(
            Prior,
            fields=(
                "mean_precision",
                "degrees_of_freedom",
                "weight_concentration_type",
                "weight_concentration",
            ),
        ),
        option(
            Robustness,
            docs={"aggregation": '``"trimmed"`` also screens the k-means round\'s centroids.'},
        ),
        option(
            ClientSampling,
            fields=("engine",),
            docs={"engine": "Every round asks every client (exact federated VB)."},
        ),
        option(Privacy, fields=FLOOR),
        docs={
            "n_components": "An upper bound: the Dirichlet-process prior prunes.",
        },
    )

    def __init__(
        self,
        n_neighbors=5,
        n_components=10,
        *,
        personal_strength=10.0,
        personal_iter=10,
        combine="max",
        distance_floor=1e-06,
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        weight_threshold=0.01,
        initialisation=None,
        prior=None,
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
    def fit(self, X, y=None, groups=None, *, callbacks=()):
        """Fit on rows ``X`` (n_samples, n_features) split into clients by ``groups``.

        Args:
            X: numpy array or pandas DataFrame of numeric features (scaled as wanted).
            y: ignored (PyOD's contract).
            groups: client id of each row, shape (n_samples,); ``None`` means one client.
            callbacks: callables called with each round's ``RoundRecord`` (as every
                fednovelty detector).

        Returns:
            self

        Raises:
            ValueError: bad settings or ``X``/``groups`` (naming the argument).
            ClientDataError: no client has ``n_neighbors + 1`` rows (and its privacy floor).
        """
        return self._fit(X, y, groups, callbacks)

    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        """Federated VB of the clients' log kNN distances, then the scoring clients' rows
        and personal posteriors."""
        self.skipped_clients_ = self._skipped(parts, self.client_ids_)
        if len(self.skipped_clients_) == self.n_clients_:
            raise ClientDataError(
                f"no client has the n_neighbors + 1 = {self.n_neighbors + 1} rows (and at least "
                f"privacy.min_rows={self._option('privacy').min_rows}) a leave-one-out "
                "distance needs; "
                f"largest client: {max(p.shape[0] for p in parts)} rows. Lower n_neighbors or "
                "merge clients."
            )
        result = self._run(parts, clients, seed)
        active = [i for i, cid in enumerate(self.client_ids_) if cid not in self.skipped_clients_]
        self.scoring_clients_ = self.client_ids_[active]
        self._set_references([np.array(parts[i], dtype=np.float64) for i in active])
        self._own = []  # each scoring client's leave-one-out log distances (fit only)
        options = self._torch_options()
        for i in active:
            cached = result.client_states.get(i, {}).get(CACHE_KEY)
            if cached is None:  # e.g. a client that the engine never asked (not expected)
                cached = knn_log_distances(
                    torch.as_tensor(parts[i]), self.n_neighbors, self.distance_floor
                )
            self._own.append(cached.to(**options))
        self.client_posteriors_ = [self._personal(d) for d in self._own]
        self._active = active

    def _after_fit(self, array: np.ndarray, group_codes: np.ndarray) -> None:
        """PyOD's training-set outputs, each row's distance to its own client's rows taken
        leave-one-out."""
        self._classes = 2
        scores = self._training_scores(array, group_codes, self._active, self._own)
        del self._own, self._active
        self.decision_scores_ = scores
        self._process_decision_scores()

    def _skipped(self, parts: list[np.ndarray], client_ids: np.ndarray) -> dict:
        """Clients that cannot take part, with the reason (module docstring)."""
        need = self.n_neighbors + 1
        min_rows = self._option("privacy").min_rows
        out = {}
        for cid, part in zip(client_ids.tolist(), parts, strict=True):
            if part.shape[0] < need:
                out[cid] = f"{part.shape[0]} row(s); n_neighbors={self.n_neighbors} needs >= {need}"
            elif part.shape[0] < min_rows:
                out[cid] = f"{part.shape[0]} row(s), below privacy.min_rows={min_rows}"
        return out

    def _run(self, parts: list[np.ndarray], clients: list[torch.Tensor], seed: int):
        """Federated VB of the log kNN distances on the simulated clients."""
        n_total = sum(p.shape[0] for p in parts if p.shape[0] > self.n_neighbors)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= the {n_total} rows that have "
                "leave-one-out distances; lower n_components."
            )
        algorithm = FederatedKNNMarkers(
            **self._settings(1), random_state=seed, **self._torch_options()
        )
        result = self._simulate(algorithm, clients, seed, full=True)
        state = result.state
        self._set_global(state.posterior)
        self.n_iter_ = state.n_iter
        self.converged_ = state.converged
        self.lower_bounds_ = list(state.lower_bounds)
        if not self.converged_:
            warnings.warn(
                f"Federated VB of the kNN distances did not converge in max_iter={self.max_iter} "
                "rounds (last change in the ELBO above tol). Increase max_iter or tol.",
                ConvergenceWarning,
                stacklevel=6,  # the caller of fit(...)
            )
        return result

    def _set_global(self, posterior: VBPosterior) -> None:
        self.posterior_ = posterior
        mask = active_components(posterior, self.weight_threshold)
        self.effective_n_components_ = int(mask.sum())

    def _personal(self, log_distances: torch.Tensor) -> VBPosterior:
        """A scoring client's posterior from its own log distances (module docstring)."""
        if self.personal_strength is None:
            return self.posterior_
        return personal_posterior(
            log_distances,
            self.posterior_,
            strength=float(self.personal_strength),
            n_iter=self.personal_iter,
            reg_covar=self.reg_covar,
        )

    def _set_references(self, references: list[np.ndarray]) -> None:
        """The scoring clients' rows (what each client holds), their neighbour indexes and
        their shares of the rows."""
        self._references = references
        self._indexes = [
            NearestNeighbors(n_neighbors=self.n_neighbors).fit(rows) for rows in references
        ]
        counts = np.array([rows.shape[0] for rows in references], dtype=np.float64)
        self.client_weights_ = counts / counts.sum()

    def _combined(self, log_tails: np.ndarray) -> np.ndarray:
        """``log p(x)`` from the clients' ``log p_c(x)`` (n_samples, n_scoring_clients)."""
        if self.combine == "mixture":
            return logsumexp(log_tails + np.log(self.client_weights_), axis=1)
        return log_tails.max(axis=1)

    def _training_scores(self, array, codes, active, own) -> np.ndarray:
        """``decision_function`` of the training rows, with each row's distance to its own
        client's rows taken leave-one-out."""
        log_tails = self._log_tails(array)
        for column, (position, log_d) in enumerate(zip(active, own, strict=True)):
            rows = np.flatnonzero(codes == position)
            values = log_d[:, 0].cpu().double().numpy()
            # split_by_client keeps the rows of a client in their original order.
            log_tails[rows, column] = predictive_log_tail(values, self.client_posteriors_[column])
        return -self._combined(log_tails)

    # -------------------------------------------------------------- scoring
    def _log_tails(self, array: np.ndarray) -> np.ndarray:
        """``log p_c(x)`` of checked rows, (n_samples, n_scoring_clients)."""
        columns = []
        for index, posterior in zip(self._indexes, self.client_posteriors_, strict=True):
            distances, _ = index.kneighbors(array)
            values = np.log(distances[:, -1] + self.distance_floor)
            columns.append(predictive_log_tail(values, posterior))
        return np.column_stack(columns)

    def _checked(self, X) -> np.ndarray:
        return self._check_score_array(X)

    _checked_array = _checked

    def tail_probability(self, X, *, per_client: bool = False) -> np.ndarray:
        """Predictive upper-tail probability of each row's kNN distance (module docstring).

        Args:
            X: rows (n_samples, n_features).
            per_client: return every scoring client's ``p_c(x)``, shape (n_samples,
                n_scoring_clients) in ``scoring_clients_`` order, instead of the combined one.

        Returns:
            Probabilities in [0, 1], shape (n_samples,) (or per client); small = novel.
        """
        array = self._checked(X)
        with torch.no_grad(), scoring_threads(*array.shape, self.n_components):
            log_tails = self._log_tails(array)
        return np.exp(log_tails if per_client else self._combined(log_tails))

    def score_samples(self, X) -> np.ndarray:
        """``log tail_probability(X)``, shape (n_samples,), <= 0; higher = more normal."""
        array = self._checked(X)
        with torch.no_grad(), scoring_threads(*array.shape, self.n_components):
            return self._combined(self._log_tails(array))

    def decision_function(self, X) -> np.ndarray:
        """Anomaly score ``-log tail_probability(X)``, shape (n_samples,), >= 0; higher =
        more anomalous."""
        return -self.score_samples(X)

    def predict_proba(self, X, method="linear", return_confidence=False):
        """PyOD's outlier probabilities from ``decision_scores_``, shape (n_samples, 2) (as
        every fednovelty detector); the calibrated probability is :meth:`tail_probability`."""
        self._check_fitted()
        if method not in ("linear", "unify"):
            raise ValueError(f"method must be 'linear' or 'unify', got {method!r}.")
        array = self._checked(X)
        anomaly = outlier_probability(
            self.decision_function(array), np.asarray(self.decision_scores_, np.float64), method
        )
        probs = np.column_stack([1.0 - anomaly, anomaly])
        if return_confidence:
            return probs, self.predict_confidence(array)
        return probs

    # -------------------------------------------------------------- persistence
    # The file layout shared by every detector (decision scores, threshold, history, client
    # ids): SavedStateMixin's helpers call no super(), so they serve here unchanged.
    save = SavedStateMixin.save
    load = SavedStateMixin.__dict__["load"]
    _saved_state = SavedStateMixin._saved_state

    def _log_density_bound(self) -> float:
        """The highest ``score_samples`` of any row: a tail probability is at most 1."""
        return 0.0

    def _get_state(self):
        tensors = {f"posterior.{k}": getattr(self.posterior_, k) for k in POSTERIOR_TENSORS}
        for i, (rows, posterior) in enumerate(
            zip(self._references, self.client_posteriors_, strict=True)
        ):
            tensors[f"client.{i}.rows"] = torch.as_tensor(rows)
            if self.personal_strength is not None:
                for k in POSTERIOR_TENSORS:
                    tensors[f"client.{i}.posterior.{k}"] = getattr(posterior, k)
        attrs = {
            "scoring_clients_": self.scoring_clients_.tolist(),
            "skipped_clients_": [[cid, why] for cid, why in self.skipped_clients_.items()],
            **iteration_record(self),
        }
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        SavedStateMixin._set_state(self, tensors, attrs)
        known = self.client_ids_.tolist()
        scoring = get_attr(attrs, "scoring_clients_", list)
        skipped = check_items(get_attr(attrs, "skipped_clients_", list), "skipped_clients_", list)
        if not scoring or any(c not in known for c in scoring) or len(set(scoring)) < len(scoring):
            raise ModelFormatError(
                "scoring_clients_ must be distinct ids of client_ids_, at least one."
            )
        if any(len(s) != 2 or s[0] not in known or not isinstance(s[1], str) for s in skipped):
            raise ModelFormatError("skipped_clients_ must hold [client id, reason] pairs.")
        self.scoring_clients_ = np.asarray(scoring)
        self.skipped_clients_ = {cid: why for cid, why in skipped}
        restore_iteration_record(self, attrs)
        self._set_global(
            self._posterior(tensors, "posterior", self._option("prior").weight_concentration_type)
        )
        references, self.client_posteriors_ = [], []
        for i in range(len(scoring)):
            rows = get_tensor(tensors, f"client.{i}.rows")
            if rows.ndim != 2 or rows.shape[1] != self.n_features_in_:
                raise ModelFormatError(
                    f"the tensor 'client.{i}.rows' has shape {tuple(rows.shape)}; the model "
                    f"implies (n_rows, {self.n_features_in_})."
                )
            if rows.shape[0] < self.n_neighbors:
                raise ModelFormatError(
                    f"the tensor 'client.{i}.rows' holds {rows.shape[0]} row(s); scoring "
                    f"needs >= n_neighbors={self.n_neighbors}."
                )
            references.append(rows.double().numpy())
            if self.personal_strength is None:
                self.client_posteriors_.append(self.posterior_)
            else:
                prefix = f"client.{i}.posterior"
                self.client_posteriors_.append(
                    self._posterior(tensors, prefix, "dirichlet_distribution")
                )
        low, high = log_distance_box(references, self.distance_floor)
        posteriors = {"posterior": self.posterior_}
        if self.personal_strength is not None:
            posteriors |= {
                f"client.{i}.posterior": p for i, p in enumerate(self.client_posteriors_)
            }
        prior_dof = self._option("prior").degrees_of_freedom  # n_features = 1 unless lower
        floor = 1.0 if prior_dof is None else min(1.0, float(prior_dof))
        for prefix, posterior in posteriors.items():
            check_in_box(
                tensors[f"{prefix}.means"],
                f"the tensor '{prefix}.means'",
                low,
                high,
                "posterior means of log kNN distances lie between log(distance_floor) and "
                "the log of the widest client's diameter (from 'client.<i>.rows')",
            )
            check_predictive(posterior, prefix, high - low, floor, self.reg_covar)
        self._set_references(references)

    def _posterior(self, tensors, prefix: str, weight_type: str) -> VBPosterior:
        """A saved one-feature posterior under ``prefix``, validated (``ModelFormatError``)."""
        shown = {
            f"posterior.{k}": tensors.get(f"{prefix}.{k}")
            for k in POSTERIOR_TENSORS
            if f"{prefix}.{k}" in tensors
        }
        try:
            parts = posterior_from(shown, self.n_components, 1, "full", weight_type)
        except ModelFormatError as error:
            raise ModelFormatError(str(error).replace("'posterior.", f"'{prefix}.")) from None
        options = self._torch_options()
        moved = {k: v.to(**options) for k, v in parts.items()}
        try:
            factors = precisions_cholesky_from_covariances(moved["covariances"], "full")
        except SingularCovarianceError as error:
            raise ModelFormatError(f"the tensor '{prefix}.covariances': {error}") from None
        posterior = VBPosterior(
            **moved,
            precisions_cholesky=factors,
            covariance_type="full",
            weight_concentration_prior_type=weight_type,
        )
        if not bool(torch.isfinite(posterior.weights).all()) or not math.isfinite(
            float(posterior.weights.sum())
        ):
            raise ModelFormatError(f"the tensor '{prefix}.weight_concentration' is damaged.")
        return posterior


def check_predictive(
    posterior: VBPosterior, prefix: str, width: float, dof_floor: float, reg_covar: float
) -> None:
    """A loaded one-feature posterior of log kNN distances (saved under ``prefix``) whose
    features lie in a box ``width`` wide has the predictive the fit gives them: degrees of
    freedom at least ``dof_floor`` (the prior's, ``n_features`` = 1 unless set lower, plus
    counts) and a predictive spread ``sum_k E[pi_k] f_k covariances_k`` (Student-t scale
    factor ``f_k = nu_k (1 + beta_k) / ((nu_k + 1 - d) beta_k)``) at most ``4 width^2 +
    reg_covar``: a covariance of values in the box is at most ``1.25 width^2`` (scatter,
    prior and the mean's term), and the expected weights keep ``E[pi_k] (1 + 1 / beta_k)``
    summed below 2, a component's mean precision growing with its weight.

    Raises:
        ModelFormatError: naming the tensors of ``prefix``.
    """
    check_at_least(
        posterior.degrees_of_freedom,
        dof_floor,
        f"the tensor '{prefix}.degrees_of_freedom'",
        "a posterior's degrees of freedom are its prior's plus counts",
    )
    _, factor, _ = vb_predictive_components(posterior)
    spread = (posterior.weights * factor * posterior.covariances.reshape(-1)).sum()
    check_in_box(
        spread,
        f"the predictive spread of '{prefix}' (its covariances, mean_precision and weights)",
        0.0,
        4 * width**2 + reg_covar,
        "log kNN distances lie in a box of that width (from 'client.<i>.rows'), and their "
        "posterior's spread does not exceed a few times its squared width",
    )


def log_distance_box(references: list[np.ndarray], distance_floor: float) -> tuple[float, float]:
    """The range ``[log(floor), log(D + floor)]`` of every training feature
    ``log(d_k + floor)``, ``D`` the largest diagonal of a client's bounding box (each
    reference (n_c, n_features) is one client's rows; a kNN distance within a client is at
    most that client's diameter). Posterior means are weighted means of these features and
    of the prior mean (their pooled mean), so they lie in it too."""
    diameter = max(float(np.linalg.norm(r.max(0) - r.min(0))) for r in references)
    return math.log(distance_floor), math.log(diameter + distance_floor)


__all__ = ["FedKNNMarkerDetector"]
