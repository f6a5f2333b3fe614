"""``StreamingFedGMMDetector``: a federated mixture that learns online, window by window,
and says when a client's data has drifted.

``fit(X, groups=...)`` is the stream's first window: federated EM with personal weights
(as ``FedGMMDetector``'s, plain M-steps), closed by one streaming round that sets the carried
statistics and each client's reference. Each ``partial_fit(X, groups=...)`` is one more
window, one run of :class:`~fednovelty.federated.streams.streaming.StreamingEM`: clients re-estimate
their weights with the components frozen (nothing sent), ``rounds`` federated rounds refresh
the components from ``S_t = rho S_{t-1} + S_window``, and rows far from every component
re-bear a component where they are.

Drift, per client and window (``drift_history_``):

- ``total_variation``: how far the client's weights moved, ``0.5 sum_k |pi_k(t) - pi_k(t-1)|``.
- ``surprise``: the window's mean ``log p(x)`` under the model the client had before the
  window, as a z-score against the client's reference (the mean of its earlier windows'
  values, discounted by ``rho``; positive = less likely than usual). Its scale is the
  larger of the row-level standard error and the spread of the client's own window means
  (discounted alike): windows that are not independent draws of rows (a writer's few
  images resampled) spread wider than their rows say.
- ``cusum`` and ``alarm``: a one-sided CUSUM on the surprise with reference ``cusum_k`` and
  the threshold whose false-alarm rate per window on a stationary stream is
  ``false_alarm_rate`` (Siegmund's approximation, :mod:`fednovelty.mixture.drift`). A
  client's alarms start once its reference holds ``REFERENCE_WINDOWS`` (3) windows, the
  first being ``fit``'s (statistical process control's Phase I: the reference's mean and
  spread are estimated before monitoring).
- with ``drift_test="conformal"`` instead: ``p_value`` and ``alarm``, each client's own
  permutation test of its window's mean ``-log p(x)`` against the scores of its latest
  ``drift_reference`` rows, an alarm when ``p <= false_alarm_rate`` (exact when the rows
  are exchangeable), and a conformal test martingale beside it (``martingale``,
  ``martingale_alarm``), from the client's second streamed window on
  (:mod:`fednovelty.detectors._stream_alarms`).
- a global alarm (``global_alarms_``) when at least ``global_alarm_share`` of the window's
  clients alarm together.

A client seen for the first time starts from the global weights; a client absent from a
window keeps its weights and reference (its record says ``absent``); a client below its
privacy floor tracks its weights but releases nothing (``below floor``). The PyOD contract
holds on the current window: ``decision_scores_``, ``threshold_`` and ``labels_`` are those of
the last window's rows.
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import ClassVar

import numpy as np
import torch
from sklearn.utils._param_validation import Interval

from fednovelty.detectors import _stream_alarms as stream_alarms
from fednovelty.detectors._conformal import split_for_calibration
from fednovelty.detectors._em_detector import EMDetector
from fednovelty.detectors._fit_state import atomic_fit
from fednovelty.detectors._option_fields import FLOOR, KMEANS_START
from fednovelty.detectors._params import Param, declare, option, store
from fednovelty.detectors._validation import check_groups, split_by_client
from fednovelty.detectors.fedgmm import FedGMMDetector
from fednovelty.detectors.options import ClientSampling, Initialisation, Privacy
from fednovelty.detectors.persistence import (
    check_items,
    check_positive,
    check_probabilities,
    check_second_moments,
    get_attr,
    get_tensor,
)
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated import EMConfig, FederatedEM, StreamConfig
from fednovelty.federated.streams.streaming import DRIFT_FIELDS, StreamingEM
from fednovelty.federated.trust.privacy import DEFAULT_MAX_CLUSTERS
from fednovelty.mixture import MixtureParams, SufficientStats, score_samples
from fednovelty.mixture.drift import cusum_step, cusum_threshold

__all__ = ["StreamingFedGMMDetector"]

#: windows in a client's reference before its alarms start (SPC's Phase I: the reference's
#: mean and the spread of its window means are estimated first).
REFERENCE_WINDOWS = 3

_CARRY = ("counts", "sums", "second", "shift", "n_samples")


class StreamingFedGMMDetector(EMDetector):
    """A federated Gaussian mixture updated window by window with ``partial_fit``, with
    per-client weights and drift alarms (see the module docstring).

    Attributes:
        weights_, means_, covariances_, precisions_cholesky_: the current mixture; its
            weights are the last window's mix (its clients' weights, weighted by their rows),
            which ``decision_function`` without ``client=`` uses.
        client_ids_, client_weights_: every client seen so far and its current weights.
        window_: windows fitted after ``fit``'s (0 after ``fit``).
        weights_history_: per window, ``{client id: weights}`` of the clients that replied.
        drift_history_: one dict per client and window (``window``, ``client``, ``status``,
            ``n_rows``, ``total_variation``, ``mean_log_likelihood``, ``surprise``,
            ``cusum``, ``alarm``, ``p_value``, ``martingale``, ``martingale_alarm``,
            ``births``).
        global_alarms_: windows with a global alarm.
        alarm_threshold_: the CUSUM threshold ``h`` from ``false_alarm_rate``.
        carry_: the carried statistics ``S_t``.
        history_, n_rounds_, bytes_up_, bytes_down_: the last window's rounds;
        total_bytes_up_, total_bytes_down_: over the whole stream.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> det = StreamingFedGMMDetector(2, random_state=0)
        >>> X0 = np.r_[rng.normal(0, 1, (200, 2)), rng.normal(6, 1, (200, 2))]
        >>> det = det.fit(X0, groups=np.repeat([0, 1], 200))
        >>> X1 = np.r_[rng.normal(0, 1, (200, 2)), rng.normal(0, 1, (200, 2))]
        >>> det = det.partial_fit(X1, groups=np.repeat([0, 1], 200))
        >>> det.client_weights_.round(1).tolist()  # client 1 moved to the first component
        [[1.0, 0.0], [1.0, 0.0]]
    """

    #: files saved when the rounds per window were ``rounds`` (total rounds elsewhere).
    _renamed_params: ClassVar[dict] = {"rounds": "window_rounds"}
    _params = declare(
        Param(
            "rho",
            0.9,
            [Interval(Real, 0.0, 1.0, closed="both")],
            "forgetting factor per window in [0, 1] (the statistics hold about "
            "``window rows / (1 - rho)`` rows of a stationary stream).",
        ),
        Param(
            "window_rounds",
            1,
            [Interval(Integral, 0, None, closed="left")],
            "federated rounds per window that refresh the components (0: the clients' "
            "weights are tracked, the components stay).",
            setting="rounds",
        ),
        Param(
            "far_quantile",
            0.999,
            [Interval(Real, 0.0, 1.0, closed="neither"), None],
            "rows beyond this chi-square quantile of every component are *far* (``None``: no "
            'births; required for ``covariance_type="tied"``).',
        ),
        Param(
            "birth_share",
            0.05,
            [Interval(Real, 0.0, 1.0, closed="both")],
            "far rows at least this share of a window re-bear a component.",
        ),
        Param(
            "false_alarm_rate",
            0.01,
            [Interval(Real, 0.0, 1.0, closed="neither")],
            "a client's false alarms per window on a stationary stream.",
            "estimator",
        ),
        Param(
            "cusum_k",
            0.5,
            [Interval(Real, 0.0, None, closed="neither")],
            "the CUSUM's reference value (tuned to shifts of about ``2 k`` standard errors).",
            "estimator",
        ),
        *stream_alarms.DRIFT_PARAMS,
        Param(
            "global_alarm_share",
            0.5,
            [Interval(Real, 0.0, 1.0, closed="right")],
            "share of a window's clients whose alarms make a global alarm.",
            "estimator",
        ),
        option(Initialisation, fields=KMEANS_START),
        option(
            ClientSampling,
            fields=("engine",),
            docs={
                "engine": "Of ``fit``'s rounds and every window's (``partial_fit``); every "
                "round asks every client of its window."
            },
        ),
        option(Privacy, fields=FLOOR),
        docs={"n_components": "K Gaussians shared by all clients."},
    )

    def __init__(
        self,
        n_components=8,
        *,
        rho=0.9,
        window_rounds=1,
        far_quantile=0.999,
        birth_share=0.05,
        false_alarm_rate=0.01,
        cusum_k=0.5,
        drift_test="cusum",
        drift_reference=500,
        drift_resamples=999,
        global_alarm_share=0.5,
        covariance_type="full",
        reg_covar=1e-06,
        tol=0.001,
        max_iter=100,
        init_params="kmeans",
        initialisation=None,
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

    # -------------------------------------------------------------- first window
    def _fit_clients(self, parts, clients, seed, labels=None) -> None:
        if self.covariance_type == "tied" and self.far_quantile is not None:
            raise ValueError(
                "births re-bear one component's covariance, which covariance_type='tied' "
                "shares among all: use far_quantile=None with 'tied'."
            )
        n_total = sum(c.shape[0] for c in clients)
        if self.n_components > n_total:
            raise ValueError(
                f"n_components={self.n_components} must be <= n_samples={n_total}; lower "
                "n_components or provide more rows."
            )
        stream_alarms.check_drift_params(self)
        self._seed = seed
        width = clients[0].shape[1]
        em = FederatedEM(
            mixture_weights="personal", **self._em_options(seed, None, width, EMConfig)
        )
        result = self._simulate(em, clients, seed, full=True, **self._em_engine())
        self._set_em_state(result.state)
        self._warn_if_not_converged()
        offset, history = result.history, list(self.history_)
        up, down = self.bytes_up_, self.bytes_down_
        self._client_state = {}
        self.carry_ = None
        self.window_ = 0
        self.weights_history_, self.drift_history_, self.global_alarms_ = [], [], []
        self._reference: dict[int, list[float]] = {}
        self._cusum: dict[int, float] = {}
        self.alarm_threshold_ = cusum_threshold(self.false_alarm_rate, self.cusum_k)
        kept = {i: result.client_states.get(i, {}) for i in range(len(clients))}
        self._window(dict(enumerate(clients)), kept, rho=0.0, rounds=1, record=False)
        self.history_ = history + [{**r, "round": r["round"] + len(offset)} for r in self.history_]
        self.n_rounds_ = len(self.history_)
        self.bytes_up_ += up
        self.bytes_down_ += down
        self.total_bytes_up_, self.total_bytes_down_ = self.bytes_up_, self.bytes_down_

    # -------------------------------------------------------------- later windows
    @atomic_fit
    def partial_fit(self, X, y=None, groups=None):
        """Update the model with one window of rows ``X`` split into clients by ``groups``.

        Args:
            X: the window's rows (n_samples, n_features), the width ``fit`` saw.
            y: ignored (PyOD's contract).
            groups: client id of each row (ids seen before keep their weights; new ids
                start from the global weights); ``None``: one client, the first seen.

        With ``calibration="conformal"`` each client's window rows are split as ``fit``'s
        (``fednovelty.detectors._conformal``) and every threshold is set again under the
        updated model; a client absent from the window takes the federation's, with a
        ``ConformalCalibrationWarning``.

        Returns:
            self

        Raises:
            NotFittedError: before ``fit``. ValueError: another width, NaN or inf, empty
                ``X`` or bad ``groups``. On any error the model is unchanged.
        """
        self._validate_params()
        stream_alarms.check_drift_params(self)
        self._check_fitted()
        array = self._check_X(X, fitted=True)
        if groups is None:
            groups = np.full(array.shape[0], self.client_ids_[0])
        ids, codes = check_groups(groups, array.shape[0])
        known = {c: i for i, c in enumerate(self.client_ids_.tolist())}
        new_ids = [c for c in ids.tolist() if c not in known]
        if new_ids and not _same_kind(self.client_ids_, np.asarray(new_ids)):
            raise ValueError(
                f"groups holds ids {new_ids[:3]} of another kind than the clients seen so far "
                f"({self.client_ids_[:3].tolist()}); use one kind of id (all strings or all "
                "numbers)."
            )
        all_ids = self.client_ids_.tolist() + new_ids
        index = {c: i for i, c in enumerate(all_ids)}
        seed = self._seed + self.window_ + 1  # the window's (as _window's run)
        order = [index[c] for c in ids.tolist()]
        array, _, codes, held = split_for_calibration(self, array, None, codes, seed, order)
        parts = split_by_client(array, codes, len(ids))
        clients = {index[c]: self._as_tensor(p) for c, p in zip(ids.tolist(), parts, strict=True)}
        self.client_ids_ = np.asarray(all_ids)
        self.n_clients_ = len(all_ids)
        kept = {i: self._client_state[i] for i in clients if i in self._client_state}
        rows = [int(clients[i].shape[0]) if i in clients else 0 for i in range(len(all_ids))]
        with self._data_losses("partial_fit", rows, len(clients)):
            self._window(clients, kept, rho=self.rho, rounds=self.window_rounds, record=True)
            self.total_bytes_up_ += self.bytes_up_
            self.total_bytes_down_ += self.bytes_down_
            self.decision_scores_ = self.decision_function(array)
            self._process_decision_scores()
        if held is not None:  # every threshold again, under the updated model
            held_by_client = dict(zip(order, held, strict=True))
            self._calibrate_clients(held_by_client, seed, 4, "partial_fit")
        return self

    def _window(self, clients, kept, *, rho, rounds, record) -> None:
        """Run one streaming window on ``clients`` (internal index -> rows) and fold its
        result into the fitted attributes and, with ``record``, the drift history."""
        params = self.model_
        settings = {
            **self._settings(self.n_features_in_, StreamConfig),
            "weights_init": params.weights,
            "means_init": params.means,
            "precisions_init": params.precisions_cholesky,
            "rho": rho,
            "rounds": rounds,
            "random_state": self._seed,
            **self._torch_options(),
            **(stream_alarms.conformal_settings(self) if record else {}),
        }
        if self.carry_ is not None:
            settings.update({f"carry_{k}": getattr(self.carry_, k) for k in _CARRY})
            settings["carry_n_samples"] = float(self.carry_.n_samples)
        algorithm = StreamingEM(**settings)
        privacy = self._privacy_policy(max_clusters=max(DEFAULT_MAX_CLUSTERS, self.n_components))
        result = self._simulate(
            algorithm,
            clients,
            self._seed + self.window_ + 1,
            full=True,
            privacy=privacy,
            client_states=kept,
        )
        state = result.state
        for i, client_state in result.client_states.items():
            self._client_state[i] = client_state
        if state.carry is not None:
            self.carry_ = state.carry
        self._set_mixture(self._current_mix(state.params, clients))
        self.client_weights_ = self._weights_matrix()
        if not record:
            for i, values in state.drift.items():
                self._reference[i] = [float(values[0]), float(values[1]), 1.0, 0.0, 1]
            return
        self.window_ += 1
        self.weights_history_.append(
            {self.client_ids_[i].item(): w.cpu().numpy() for i, w in state.client_weights.items()}
        )
        records = [self._drift_record(i, clients, state) for i in range(self.n_clients_)]
        self.drift_history_.extend(records)
        present = [r for r in records if r["status"] in ("ok", "new")]
        alarms = sum(r["alarm"] for r in present)
        if present and alarms >= self.global_alarm_share * len(present):
            self.global_alarms_.append(self.window_)

    def _current_mix(self, params: MixtureParams, clients) -> MixtureParams:
        """``params`` with the window's mix as weights: its clients' kept weights, weighted
        by their rows (the M-step's weights average the forgotten windows too, so they lag
        a moving mix); the M-step's weights if no client kept any."""
        rows, total = None, 0.0
        for i, X in clients.items():
            log_w = self._client_state.get(i, {}).get("log_weights")
            if log_w is None or X.shape[0] == 0:
                continue
            part = X.shape[0] * log_w.exp().to(params.weights)
            rows = part if rows is None else rows + part
            total += X.shape[0]
        if rows is None:
            return params
        return MixtureParams(
            rows / total, params.means, params.precisions_cholesky, params.covariance_type
        )

    def _weights_matrix(self) -> np.ndarray:
        """(n_clients, K) each client's kept weights; the global weights for one without."""
        rows = []
        for i in range(self.n_clients_):
            log_w = self._client_state.get(i, {}).get("log_weights")
            rows.append(self.model_.weights if log_w is None else log_w.exp())
        return torch.stack(rows).cpu().numpy()

    def _drift_record(self, i: int, clients, state) -> dict:
        """Client ``i``'s drift values for the window just run (module docstring)."""
        record = {
            "window": self.window_,
            "client": self.client_ids_[i].item(),
            "status": "ok",
            "n_rows": int(clients[i].shape[0]) if i in clients else 0,
            "total_variation": float("nan"),
            "mean_log_likelihood": float("nan"),
            "surprise": float("nan"),
            "cusum": self._cusum.get(i, 0.0) if self.drift_test == "cusum" else float("nan"),
            "alarm": False,
            **stream_alarms.NO_CONFORMAL,
            "births": list(state.births),
        }
        if i not in clients:
            return {**record, "status": "absent"}
        record.update(stream_alarms.conformal_fields(self, i))
        if i not in state.drift:
            return {**record, "status": "below floor" if record["n_rows"] else "empty"}
        mean_ll, var_ll, tv, new = (float(v) for v in state.drift[i][: len(DRIFT_FIELDS)])
        record.update(total_variation=tv, mean_log_likelihood=mean_ll)
        reference = self._reference.get(i)
        n = record["n_rows"]
        if reference is None or new:
            record["status"] = "new"
        else:
            ref_mean, ref_var, ref_weight, between, count = _with_spread(reference)
            spread = np.sqrt(
                max(var_ll, 1e-12) / n + max(ref_var, 1e-12) / max(ref_weight * n, 1.0)
            )
            monitored = count >= REFERENCE_WINDOWS
            if monitored:  # the client's window means spread wider than its rows say: use it
                spread = max(spread, float(np.sqrt(between * (1.0 + 1.0 / ref_weight))))
            record["surprise"] = float((ref_mean - mean_ll) / spread)
            if monitored and self.drift_test == "cusum":
                statistic, alarm = cusum_step(
                    self._cusum.get(i, 0.0), record["surprise"], self.cusum_k, self.alarm_threshold_
                )
                self._cusum[i] = statistic
                record.update(cusum=statistic, alarm=alarm)
        self._reference[i] = _updated_reference(reference, mean_ll, var_ll, self.rho)
        return record

    def drift_frame(self):
        """``drift_history_`` as a pandas DataFrame (one row per client and window)."""
        import pandas as pd

        self._check_fitted()
        return pd.DataFrame(self.drift_history_)

    # -------------------------------------------------------------- scoring
    def _personal_weights(self) -> np.ndarray:
        return self.client_weights_

    def decision_function(self, X, *, client=None) -> np.ndarray:
        """``-log p(x)`` of rows (n_samples, n_features) under the current mixture: global
        weights, or those of ``client`` (an id seen so far, or an ``adapt`` handle)."""
        if client is None:
            return super().decision_function(X)
        Xt = self._check_score_input(X)
        with torch.no_grad():
            return -score_samples(self.model_, Xt, self._log_pi(client, Xt)).cpu().numpy()

    def adapt(self, X, *, max_iter: int = 100, tol: float = 1e-6):
        """Weights for a client not in the stream from its rows, every component frozen:
        ``FedGMMDetector.adapt`` on the current mixture."""
        return FedGMMDetector.adapt(self, X, max_iter=max_iter, tol=tol)

    # -------------------------------------------------------------- persistence
    def _get_state(self):
        tensors, attrs = super()._get_state()
        for i, state in self._client_state.items():
            if "log_weights" in state:
                tensors[f"client_state.{i}"] = state["log_weights"]
        if self.carry_ is not None:
            tensors.update({f"carry.{k}": getattr(self.carry_, k) for k in _CARRY})
        tensors.update(stream_alarms.drift_tensors(self._client_state))
        attrs.update(
            window_=self.window_,
            weights_history_=[
                {"clients": [_json_id(c) for c in w], "weights": [v.tolist() for v in w.values()]}
                for w in self.weights_history_
            ],
            drift_history_=[_json_record(r) for r in self.drift_history_],
            global_alarms_=list(self.global_alarms_),
            alarm_threshold_=self.alarm_threshold_,
            total_bytes_up_=self.total_bytes_up_,
            total_bytes_down_=self.total_bytes_down_,
            reference={str(i): v for i, v in self._reference.items()},
            cusum={str(i): v for i, v in self._cusum.items()},
            seed=self._seed,
        )
        return tensors, attrs

    def _set_state(self, tensors, attrs) -> None:
        super()._set_state(tensors, attrs)
        k, d = self.n_components_, self.n_features_in_
        self._client_state = {}
        for name, value in tensors.items():
            if name.startswith("client_state."):
                i = int(name.split(".", 1)[1])
                if not 0 <= i < self.n_clients_ or tuple(value.shape) != (k,):
                    raise ModelFormatError(
                        f"the tensor {name!r} is not one client's {k} log weights."
                    )
                value = get_tensor(tensors, name, (k,), allow_inf=True)  # log 0 = -inf
                check_probabilities(value.exp(), f"the weights exp({name!r})")
                self._client_state[i] = {"log_weights": value.to(**self._torch_options())}
        stream_alarms.restore_drift_states(tensors, self._client_state, self.n_clients_)
        self.carry_ = None
        if "carry.counts" in tensors:
            parts = {
                n: get_tensor(tensors, f"carry.{n}").to(**self._torch_options()) for n in _CARRY
            }
            if tuple(parts["sums"].shape) != (k, d):
                raise ModelFormatError(f"the carried sums must have shape ({k}, {d}).")
            if tuple(parts["shift"].shape) != (d,) or parts["n_samples"].ndim != 0:
                raise ModelFormatError(
                    f"'carry.shift' must have shape ({d},) and 'carry.n_samples' shape ()."
                )
            rows = parts["n_samples"]
            check_positive(rows, "the tensor 'carry.n_samples'", "it counts rows", allow_zero=True)
            check_second_moments(
                parts["counts"], parts["sums"], parts["second"], self.covariance_type, "carry"
            )
            self.carry_ = SufficientStats(
                log_likelihood=torch.zeros((), **self._torch_options()),
                covariance_type=self.covariance_type,
                **parts,
            )
        self.window_ = get_attr(attrs, "window_", int, minimum=0)
        self.weights_history_ = [
            {c: np.asarray(v) for c, v in zip(w["clients"], w["weights"], strict=True)}
            for w in get_attr(attrs, "weights_history_", list)
        ]
        self.drift_history_ = list(get_attr(attrs, "drift_history_", list))
        self.global_alarms_ = list(get_attr(attrs, "global_alarms_", list))
        self.alarm_threshold_ = get_attr(attrs, "alarm_threshold_", float, minimum=0)
        self.total_bytes_up_ = get_attr(attrs, "total_bytes_up_", float, minimum=0)
        self.total_bytes_down_ = get_attr(attrs, "total_bytes_down_", float, minimum=0)
        self._reference = {int(i): list(v) for i, v in get_attr(attrs, "reference", dict).items()}
        for values in self._reference.values():
            if len(values) not in (3, 5) or not all(
                isinstance(v, int | float) and -1e300 < v < 1e300 for v in values
            ):
                raise ModelFormatError(
                    "each client's 'reference' must be 5 numbers within +-1e300 (mean, "
                    "variance, weight, spread, windows; 3 in files before the spread)."
                )
            _, variance, weight, spread, count = _with_spread(values)
            if variance < 0 or weight <= 0 or spread < 0 or count < 1:
                raise ModelFormatError(
                    "a client's 'reference' needs a variance >= 0, a weight > 0 (the drift "
                    f"test divides by it), a spread >= 0 and >= 1 window; got {values}."
                )
        cusum = get_attr(attrs, "cusum", dict)
        check_items(cusum.values(), "cusum", float)
        self._cusum = {int(i): float(v) for i, v in cusum.items()}
        self._seed = get_attr(attrs, "seed", int)


def _updated_reference(reference, mean_ll: float, var_ll: float, rho: float) -> list[float]:
    """The client's reference ``[mean, variance, weight, spread, count]`` after one more
    window: the mean of its windows' mean ``log p``, the mean within-window variance of
    per-row ``log p``, the windows' weight, the variance of the window means about their
    mean (earlier windows discounted by ``rho``) and the number of windows."""
    if reference is None:
        return [mean_ll, var_ll, 1.0, 0.0, 1]
    mean, var, weight, between, count = _with_spread(reference)
    weight = rho * weight
    total = weight + 1.0
    new_mean = (weight * mean + mean_ll) / total
    between = (weight * (between + (mean - new_mean) ** 2) + (mean_ll - new_mean) ** 2) / total
    return [new_mean, (weight * var + var_ll) / total, total, between, int(count) + 1]


def _with_spread(reference) -> list[float]:
    """A reference with the spread of its window means and its window count (a file written
    before them has three values: its client is monitored, without the spread)."""
    if len(reference) == 5:
        return list(reference)
    return [*reference[:3], 0.0, REFERENCE_WINDOWS]


def _same_kind(a: np.ndarray, b: np.ndarray) -> bool:
    return (a.dtype.kind in "US") == (b.dtype.kind in "US")


def _json_id(client):
    return client.item() if isinstance(client, np.generic) else client


def _json_record(record: dict) -> dict:
    return {k: (_json_id(v) if k == "client" else v) for k, v in record.items()}
