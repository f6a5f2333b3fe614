"""Split-conformal calibration of a detector's alarm threshold (``calibration="conformal"``).

PyOD's threshold (``calibration="contamination"``, the default, unchanged) is the
``1 - contamination`` quantile of the training rows' own scores: it promises no false-alarm
rate, and the rows a model was fitted on score lower than new rows of the same law. Split
conformal calibration promises one, per client:

1. ``fit`` holds out ``calibration_share`` of each client's rows and trains on the rest
   (:func:`held_out_rows`: ``floor(share * n_c)`` of client ``c``'s ``n_c`` rows, drawn
   without replacement by ``numpy.random.default_rng([seed, c])``, ``seed`` the fit's
   integer seed from ``random_state`` and ``c`` the client's index in ``client_ids_``; their
   positions in ``X``: ``calibration_index_``). The held-out rows never enter a round, and
   ``decision_scores_`` and ``labels_`` are those of the training rows.
2. Each client scores its held-out rows with the fitted model, under its own mixture weights
   where the detector has personal weights (``decision_function(X, client=c)``; the shared
   model's scores otherwise: :meth:`ConformalMixin._client_scores`), and keeps the ``k``-th
   smallest, ``k = ceil((1 - alpha) (n + 1))`` of its ``n`` held-out scores
   (``client_thresholds_``). If the client's held-out rows and a new row of that client are
   exchangeable, the new row's score exceeds it (an alarm is ``score > threshold``, ties
   included) with probability at most ``alpha``.
3. One more round, :class:`~fednovelty.federated.calibration.quantile.FederatedCalibration`,
   sums the clients' binned scores under the shared model (the scores ``predict(X)``
   without a client reads, also where a client's own threshold uses its personal weights;
   a histogram over a public grid of bin edges fixed from
   the model before any score is read, ``calibration_edges_``; the runtime's gates apply,
   the floor on rows included): ``threshold_`` is the conservative conformal threshold of the
   sum (the upper edge of the bin holding its ``k``-th smallest score), what ``predict(X)``
   without a client uses. Its round follows the fit's in ``history_`` (``n_rounds_`` counts
   it); the fit's data-loss warnings are about the training rounds alone.

A client with fewer than ``ceil(1 / alpha) - 1`` held-out rows cannot have a finite
threshold of its own; it takes the federation's, with a
:class:`~fednovelty.exceptions.ConformalCalibrationWarning` naming it and the rows it would
need (``calibration_sources_`` says where each client's threshold comes from). With
differential privacy (``Privacy.epsilon``), a client's threshold is the exponential
mechanism's ``k / n`` quantile of its held-out scores over the same grid
(:func:`~fednovelty.federated.trust.dp_quantile.private_quantile`, with half of the
threshold's budget share, ``privacy_spent_["threshold_epsilon"]``; the histogram round gets
the other half): an estimate of the conformal threshold, not a finite-sample guarantee, and
the clients' own histograms are not kept (their p-values use the federation's).

``p_values(X, client=None)`` are the conservative conformal p-values of the binned scores,
``(1 + #{binned scores in bins whose upper edge > s}) / (n + 1)``, against the client's
histogram (or the federation's); ``discoveries`` applies Benjamini-Hochberg to them.
``calibrate(X, client)`` gives a client (one unseen in fit, or one seen) a threshold from rows
of its own, shrunk towards the federation's histogram with ``ceil(1 / alpha) - 1`` pseudo-rows
(:func:`~fednovelty.federated.core.conformal.shrunk_threshold`: an estimate whose achieved
rate is measured, not guaranteed); the model is not changed.

``partial_fit`` (a stream's windows, a joint model's new rows) recalibrates the same way: it
holds out ``calibration_share`` of each client's window rows (seeded by the window's seed),
trains on the rest and sets every threshold again from the held-out rows' scores under the
updated model; a client absent from the window has no held-out rows, so it takes the
federation's threshold, with the warning (an earlier threshold was of the earlier model), and
the thresholds ``calibrate`` set are dropped.

``save`` keeps the thresholds, the histograms (per client and the federation's), the bin
edges and ``calibration_rows_``; never a score. ``calibration_index_`` is the last fit's
record and is not saved.
"""

from __future__ import annotations

import inspect
import math
import warnings

import numpy as np
import torch

from fednovelty.detectors._columns import mark_checked
from fednovelty.detectors._conformal_state import (
    FITTED,
    calibration_state,
    client_key,
    restore_calibration,
)
from fednovelty.detectors._dp import LOWEST_SCORE
from fednovelty.detectors._probability import outlier_labels
from fednovelty.detectors.persistence import residual_bound
from fednovelty.exceptions import ConformalCalibrationWarning
from fednovelty.federated.calibration.quantile import FederatedCalibration
from fednovelty.federated.core.conformal import (
    benjamini_hochberg,
    calibration_edges,
    conformal_rank,
    conformal_threshold,
    histogram_counts,
    histogram_p_values,
    histogram_threshold,
    min_calibration_rows,
    shrunk_threshold,
)
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.federated.trust.dp_quantile import private_quantile
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE
from fednovelty.federated.trust.noise import noise_source

__all__ = ["ConformalMixin", "held_out_rows", "split_for_calibration"]


#: clients named in a warning; more are counted.
MAX_NAMED = 10


def held_out_rows(n_rows: int, share: float, seed: int, client: int) -> np.ndarray:
    """Which of a client's ``n_rows`` rows calibration holds out: ``floor(share * n_rows)``
    positions (to round-off), drawn without replacement by
    ``numpy.random.default_rng([seed, client])``, sorted, int64 (n_held,).

    Args:
        n_rows: the client's rows, in the order they appear in ``X``.
        share: ``calibration_share``, in (0, 0.5].
        seed: the fit's (or window's) integer seed (>= 0).
        client: the client's index in ``client_ids_`` (>= 0).
    """
    n_held = math.floor(share * n_rows + 1e-9)
    rng = np.random.default_rng([int(seed), int(client)])
    return np.sort(rng.permutation(int(n_rows))[:n_held]).astype(np.int64)


def split_for_calibration(estimator, array, labels, group_codes, seed, clients=None):
    """The rows a fit trains on and those it holds out, by ``estimator.calibration``.

    Args:
        array: the checked rows (n_samples, n_features).
        labels: their label codes (n_samples,) (a labelled fit), or None.
        group_codes: each row's group (n_samples,), ``0..n_groups - 1``.
        seed: the fit's integer seed.
        clients: each group's index in ``client_ids_`` (default: the group's code).

    Returns:
        ``(array, labels, group_codes, held)``: the training rows, their labels and groups
        (the input unchanged and ``held=None`` unless ``calibration="conformal"``), and each
        group's held-out rows (n_held_g, n_features). Sets ``calibration_index_`` (the
        held-out rows' positions in ``array``, sorted); a contamination fit removes every
        conformal attribute.
    """
    if getattr(estimator, "calibration", "contamination") != "conformal":
        for name in FITTED:
            estimator.__dict__.pop(name, None)
        return array, labels, group_codes, None
    n_groups = int(group_codes.max()) + 1 if group_codes.size else 0
    indexes = range(n_groups) if clients is None else clients
    share = float(estimator.calibration_share)
    positions = []
    for code, index in zip(range(n_groups), indexes, strict=True):
        rows = np.flatnonzero(group_codes == code)
        positions.append(rows[held_out_rows(rows.size, share, seed, index)])
    held_index = np.sort(np.concatenate(positions)) if positions else np.empty(0, np.int64)
    keep = np.ones(array.shape[0], dtype=bool)
    keep[held_index] = False
    estimator.calibration_index_ = held_index
    held = [mark_checked(np.ascontiguousarray(array[p])) for p in positions]
    train = mark_checked(np.ascontiguousarray(array[keep]))
    return train, None if labels is None else labels[keep], group_codes[keep], held


def _ids(client_ids) -> list:
    return [client_key(c) for c in np.asarray(client_ids).tolist()]


class ConformalMixin:
    """The conformal side of a novelty detector (the module doc): the per-client thresholds
    of ``calibration="conformal"``, ``predict`` with ``client=``, ``p_values``,
    ``discoveries``, ``calibrate`` and their saved state.

    Attributes (``calibration="conformal"`` only; a contamination fit removes them):
        client_thresholds_: dict client id -> its alarm threshold (``score > threshold``).
        calibration_rows_: dict client id -> the held-out rows behind its threshold (the
            rows given to ``calibrate`` for a calibrated client).
        calibration_sources_: dict client id -> ``"own"``, ``"private"``,
            ``"federation"`` (too few rows of its own) or ``"calibrated"``.
        calibration_edges_: (B + 1,) the public bin edges; calibration_counts_: (B + 2,)
            the federation's histogram (noisy under differential privacy, clipped at 0).
        client_calibration_counts_: dict client id -> (B + 2,) its histogram, for the
            clients with a threshold of their own or calibrated (none under differential
            privacy).
        calibration_index_: (n_held,) positions in the last ``fit``'s (or window's) ``X``
            of the held-out rows, sorted (not saved).
        threshold_: the federation's threshold (PyOD's ``predict(X)``); ``labels_`` from
            it.
    """

    # -------------------------------------------------------------- scores
    def _personal_scores(self) -> bool:
        """Whether a fitted client's scores use its own mixture weights: the detector's
        ``decision_function`` takes ``client=`` and it holds ``client_weights_``."""
        takes = "client" in inspect.signature(self.decision_function).parameters
        return takes and getattr(self, "client_weights_", None) is not None

    def _client_scores(self, X, client) -> np.ndarray:
        """Anomaly scores (n_samples,) of rows ``X`` for ``client`` (an id): under its
        personal weights (``decision_function(X, client=client)``) when it was fitted and
        the detector has them, else the shared model's ``decision_function(X)``."""
        if self._personal_scores() and client in _ids(self.client_ids_):
            scores = self.decision_function(X, client=client)
        else:
            scores = self.decision_function(X)
        return np.asarray(scores, dtype=np.float64)

    def _lowest_score(self) -> float:
        """The lowest score the model can give a row, public once the model is: minus its
        highest log-density (with the PCA front end's residual bound), or
        ``fednovelty.detectors._dp.LOWEST_SCORE`` without a bound."""
        bound = getattr(self, "_log_density_bound", lambda: None)()
        if bound is None or not math.isfinite(bound):
            return LOWEST_SCORE
        pca = None if getattr(self, "_labelled", False) else getattr(self, "pca_", None)
        return -(float(bound) + residual_bound(pca))

    # -------------------------------------------------------------- fit
    def _calibrate_clients(self, held: dict, seed: int, stacklevel: int, method: str) -> None:
        """Set every threshold from the clients' held-out rows (the module doc).

        Args:
            held: client index (``client_ids_`` order) -> its held-out rows (n, n_features);
                a client not in it has none.
            seed: the seed of the histogram round.
            stacklevel: the caller's frame for the warnings; method: ``"fit"`` or
                ``"partial_fit"``, for their text.
        """
        ids = _ids(self.client_ids_)
        alpha = float(self.alpha)
        need = min_calibration_rows(alpha)
        edges = calibration_edges(self._lowest_score())
        epsilon = self._quantile_epsilon()
        scores, shared = [], []  # each client's own scores; the shared model's, for the
        personal = self._personal_scores()  # federation's histogram (what predict(X) reads)
        for index, client in enumerate(ids):
            rows = held.get(index)
            empty = rows is None or rows.shape[0] == 0
            scores.append(np.empty(0) if empty else self._client_scores(rows, client))
            shared.append(
                np.asarray(self.decision_function(rows), dtype=np.float64)
                if personal and not empty
                else scores[-1]
            )
        thresholds, sources, counts = {}, {}, {}
        for client, values in zip(ids, scores, strict=True):
            if values.size < need:
                continue
            if epsilon is None:
                thresholds[client] = float(conformal_threshold(values, alpha))
                counts[client] = histogram_counts(values, edges)
                sources[client] = "own"
            else:
                q = min(1.0, conformal_rank(values.size, alpha) / values.size)
                thresholds[client] = private_quantile(values, q, epsilon, edges, noise_source(None))
                sources[client] = "private"
        federation, silent = self._federated_counts(shared, edges, seed)
        threshold = float(histogram_threshold(federation, edges, alpha))
        rows = {client: int(values.size) for client, values in zip(ids, scores, strict=True)}
        few = {client: n for client, n in rows.items() if client not in thresholds}
        for client in few:
            thresholds[client], sources[client] = threshold, "federation"
        self.calibration_edges_ = edges
        self.calibration_counts_ = federation
        self.client_thresholds_ = {c: thresholds[c] for c in ids}
        self.calibration_sources_ = {c: sources[c] for c in ids}
        self.calibration_rows_ = rows
        self.client_calibration_counts_ = counts
        self.threshold_ = threshold
        if hasattr(self, "decision_scores_"):
            self.labels_ = outlier_labels(np.asarray(self.decision_scores_), threshold)
        name = f"{type(self).__name__}.{method}"
        for message in (
            self._few_rows_message(name, few, need, len(ids), threshold),
            self._silent_message(name, [ids[i] for i in silent], rows),
            self._no_threshold_message(name, federation, need),
        ):
            if message:
                warnings.warn(message, ConformalCalibrationWarning, stacklevel=stacklevel)

    def _quantile_epsilon(self) -> float | None:
        """The budget of each client's private threshold under differential privacy (half
        of ``privacy_spent_["threshold_epsilon"]``); None without differential privacy."""
        spent = getattr(self, "privacy_spent_", None)
        if spent is None:
            return None
        epsilon = float(spent.get("threshold_epsilon", 0.0))
        if not epsilon > 0:
            raise ValueError(
                "calibration='conformal' under privacy.epsilon needs the threshold's share of "
                "the budget, and this fit planned none; use calibration='contamination'."
            )
        return epsilon / 2

    def _federated_counts(self, scores: list[np.ndarray], edges: np.ndarray, seed: int):
        """The federation's histogram (B+2,) of the clients' ``scores`` over ``edges`` and the
        clients (indexes) with scores that released none: one ``FederatedCalibration`` round
        on the in-process engine (the clients with scores) under the clients' floor (and,
        with differential privacy, the histogram's budget), appended to ``history_``
        (numbered after the rounds before it), its bytes added to the totals.

        Raises:
            ValueError: no client holds the floor's rows (``Privacy.min_rows``).
        """
        floor = int(self._option("privacy").min_rows)
        if not any(values.size >= floor for values in scores):
            raise ValueError(
                f"calibration='conformal': no client holds privacy.min_rows={floor} held-out "
                f"rows to release its calibration histogram (most: "
                f"{max(values.size for values in scores)}); raise calibration_share, give the "
                "clients more rows, or use calibration='contamination'."
            )
        settings, privacy = self._histogram_privacy(len(scores))
        before = list(self.history_), int(self.n_rounds_), self.bytes_up_, self.bytes_down_
        clients = {  # a client without held-out rows (not in a window) takes no part
            i: torch.as_tensor(values, dtype=torch.float64).reshape(-1, 1)
            for i, values in enumerate(scores)
            if values.size
        }
        algorithm = FederatedCalibration(edges=edges, **settings)
        result = self._simulate(
            algorithm, clients, seed, full=True, round_offset=before[1], privacy=privacy
        )
        self.history_ = before[0] + self.history_
        self.n_rounds_ = before[1] + self.n_rounds_
        added = self.bytes_up_, self.bytes_down_
        self.bytes_up_, self.bytes_down_ = before[2] + added[0], before[3] + added[1]
        if hasattr(self, "total_bytes_up_"):  # a stream's totals over every window
            self.total_bytes_up_ += added[0]
            self.total_bytes_down_ += added[1]
        released = {c for record in result.history for c in record.replied}
        released -= {c for record in result.history for c, _ in record.skipped}
        silent = [i for i in clients if i not in released]
        counts = np.asarray(result.state.counts.detach().cpu().numpy(), dtype=np.float64)
        return np.clip(counts, 0.0, None), silent

    def _histogram_privacy(self, n_clients: int):
        """The histogram round's settings and the clients' policy: the floor; with
        differential privacy also the noise that spends :meth:`_quantile_epsilon` on one
        histogram, the clients' own policy with that budget."""
        epsilon = self._quantile_epsilon()  # the histogram's share is the quantiles'
        if epsilon is None:
            return {}, self._privacy_policy()
        privacy = self._option("privacy")
        delta = float(privacy.delta)
        # one histogram, noise HISTOGRAM_SHARE * z at sensitivity 1: one Gaussian mechanism
        z = calibrate_noise(epsilon, delta, 1, 1) / HISTOGRAM_SHARE
        policy = DPPolicy(z, 1.0, privacy.mode, max(1, n_clients), epsilon=epsilon, delta=delta)
        settings = {"dp_mode": privacy.mode, "dp_noise_multiplier": z}
        return settings, self._privacy_policy(dp=policy)

    def _few_rows_message(self, name, few: dict, need: int, n_clients: int, threshold):
        if not few:
            return None
        share = float(self.calibration_share)
        listed = "; ".join(
            f"client {client!r} ({n} row{'' if n == 1 else 's'})"
            for client, n in list(few.items())[:MAX_NAMED]
        )
        more = f"; and {len(few) - MAX_NAMED} more" if len(few) > MAX_NAMED else ""
        return (
            f"{name}: {len(few)} of {n_clients} clients have fewer held-out calibration rows "
            f"than alpha={float(self.alpha):g} needs for a threshold of their own ({need} = "
            f"ceil(1 / alpha) - 1, about {math.ceil(need / share)} rows of a client at "
            f"calibration_share={share:g}): {listed}{more}. They take the federation's "
            f"threshold ({threshold:.6g}), which holds for the federation's rows, not for "
            "each of theirs. Give them more rows, raise calibration_share or alpha, or "
            "calibrate(X_c, client=c) them later."
        )

    def _silent_message(self, name, silent: list, rows: dict):
        if not silent:
            return None
        listed = "; ".join(
            f"client {client!r} ({rows[client]} row{'' if rows[client] == 1 else 's'})"
            for client in silent[:MAX_NAMED]
        )
        more = f"; and {len(silent) - MAX_NAMED} more" if len(silent) > MAX_NAMED else ""
        floor = int(self._option("privacy").min_rows)
        return (
            f"{name}: {len(silent)} of {len(rows)} clients released no calibration histogram "
            f"(fewer held-out rows than privacy.min_rows={floor}): {listed}{more}. Their "
            "scores are not in the federation's threshold_ or p-values."
        )

    def _no_threshold_message(self, name, federation: np.ndarray, need: int):
        n = round(float(federation.sum()))
        if conformal_rank(n, float(self.alpha)) <= n:
            return None
        return (
            f"{name}: the federation released {n} calibration score(s); alpha="
            f"{float(self.alpha):g} needs at least {need}: threshold_ is +inf and predict(X) "
            "raises no alarm. Give the clients more rows, raise calibration_share or alpha."
        )

    # -------------------------------------------------------------- public methods
    def _check_conformal(self, what: str) -> None:
        """The fitted detector was calibrated by ``calibration="conformal"``."""
        self._check_fitted()
        if not hasattr(self, "client_thresholds_"):
            raise ValueError(
                f"{what} needs a detector fitted with calibration='conformal' (its per-client "
                f"thresholds and calibration histograms); this one has none (calibration="
                f"{getattr(self, 'calibration', 'contamination')!r}). Set "
                "calibration='conformal' (set_params) and fit again."
            )

    def _calibrated(self, client, what: str):
        """``client``'s key in ``client_thresholds_``, or a ValueError saying what to do (a
        client neither fitted nor calibrated is named with the known ones first)."""
        self._check_fitted()
        key = client_key(client)
        known = list(getattr(self, "client_thresholds_", {})) or _ids(self.client_ids_)
        if key not in known:
            raise ValueError(
                f"client {key!r} was not seen in fit (nor calibrated); known clients: "
                f"{known[:10]}{'...' if len(known) > 10 else ''}. Give it a threshold of its "
                f"own with calibrate(X_c, client={key!r}) (calibration='conformal'), or leave "
                "client=None for the federation's threshold."
            )
        self._check_conformal(what)
        return key

    def predict(self, X, return_confidence=False, *, client=None):
        """Binary labels, shape (n_samples,): 1 = anomaly (``score > threshold``; a score that
        is not a number counts as an anomaly).

        Args:
            X: rows (n_samples, n_features).
            return_confidence: also return PyOD's confidence (from the training scores and
                ``threshold_``).
            client: ``None``: ``decision_function(X) > threshold_`` (PyOD's labels; with
                ``calibration="conformal"`` the federation's threshold). A client id (with
                ``calibration="conformal"`` only): that client's scores (its personal
                weights where the detector has them) against its own threshold,
                ``client_thresholds_[client]``.
        """
        self._check_fitted()
        array = self._checked_array(X)
        if client is None:
            scores, threshold = self.decision_function(array), self.threshold_
        else:
            key = self._calibrated(client, "predict(X, client=...)")
            scores, threshold = self._client_scores(array, key), self.client_thresholds_[key]
        labels = outlier_labels(scores, threshold)
        if return_confidence:
            return labels, self.predict_confidence(array)
        return labels

    def p_values(self, X, client=None) -> np.ndarray:
        """Conformal p-values of rows (``calibration="conformal"``), shape (n_samples,): small
        = novel. ``(1 + #{calibration scores in bins whose upper edge > s}) / (n + 1)``
        for a row of score ``s``, against ``client``'s calibration histogram (its personal
        scores; the federation's histogram for a client without one of its own) or, with
        ``client=None``, the federation's; never below the exact conformal p-value.
        """
        self._check_conformal("p_values")
        array = self._checked_array(X)
        if client is None:
            scores, counts = self.decision_function(array), self.calibration_counts_
        else:
            key = self._calibrated(client, "p_values(X, client=...)")
            scores = self._client_scores(array, key)
            counts = self.client_calibration_counts_.get(key, self.calibration_counts_)
        scores = np.asarray(scores, dtype=np.float64)
        return histogram_p_values(scores, counts, self.calibration_edges_)

    def discoveries(self, X, q: float = 0.1, client=None) -> np.ndarray:
        """Rows declared novel by Benjamini-Hochberg at false discovery rate ``q`` on
        :meth:`p_values` (``client`` as there), shape (n_samples,) bool."""
        return benjamini_hochberg(self.p_values(X, client=client), q)

    def calibrate(self, X, client):
        """Give ``client`` a threshold from rows of its own (``calibration="conformal"``):
        ``shrunk_threshold`` of their scores towards the federation's histogram with
        ``ceil(1 / alpha) - 1`` pseudo-rows (an estimate: its false-alarm rate is measured,
        not guaranteed). Its histogram becomes its own counts plus the federation's scaled
        to those pseudo-rows (its ``p_values``); ``calibration_sources_[client]`` is
        ``"calibrated"``. The model is not changed.

        Args:
            X: normal rows of the client (n_samples, n_features), not used in fit.
            client: its id: one seen in fit (its personal weights score the rows where the
                detector has them) or a new one (the shared model's scores).

        Returns:
            self

        Raises:
            ValueError: not fitted with ``calibration="conformal"``; under
                ``Privacy.epsilon`` (the rows' threshold would spend budget the fit did not
                plan).
        """
        self._check_conformal("calibrate")
        key = client_key(client)
        if hasattr(self, "privacy_spent_"):
            raise ValueError(
                "calibrate under privacy.epsilon would spend budget beyond what fit planned and "
                "reported; fit again with the client's rows among the others."
            )
        scores = self._client_scores(self._checked_array(X), key)
        alpha, edges = float(self.alpha), self.calibration_edges_
        prior = float(min_calibration_rows(alpha))
        federation = self.calibration_counts_
        threshold = shrunk_threshold(scores, federation, edges, alpha, prior)
        counts = histogram_counts(scores, edges)
        total = float(federation.sum())
        if total > 0:
            counts = counts + (prior / total) * federation
        self.client_thresholds_ = {**self.client_thresholds_, key: float(threshold)}
        self.calibration_rows_ = {**self.calibration_rows_, key: int(scores.size)}
        self.calibration_sources_ = {**self.calibration_sources_, key: "calibrated"}
        self.client_calibration_counts_ = {**self.client_calibration_counts_, key: counts}
        return self

    # -------------------------------------------------------------- persistence
    def _calibration_state(self) -> tuple[dict[str, torch.Tensor], dict]:
        """The tensors and JSON attributes ``save`` writes for the calibration (none with
        ``calibration="contamination"``; :mod:`fednovelty.detectors._conformal_state`)."""
        return calibration_state(self)

    def _restore_calibration(self, tensors: dict[str, torch.Tensor], attrs: dict) -> None:
        """Restore the calibration ``save`` wrote (``threshold_`` recomputed from the
        federation's histogram), validated; with ``calibration="contamination"``, remove it.

        Raises:
            ModelFormatError: naming the tensor or attribute that is missing, damaged or
                inconsistent with the others.
        """
        for name in FITTED:
            self.__dict__.pop(name, None)
        if getattr(self, "calibration", "contamination") != "conformal":
            return
        private = getattr(self, "privacy_spent_", None) is not None
        restored = restore_calibration(
            tensors, attrs, float(self.alpha), _ids(self.client_ids_), private
        )
        for name, value in restored.items():
            setattr(self, name, value)
