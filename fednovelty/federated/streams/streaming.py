"""Streaming federated EM: one window of a stream of client data.

A stream is a sequence of windows; in each, every client holds new rows. One run of
:class:`StreamingEM` is one window and starts from the mixture the previous window left
(``weights_init``, ``means_init``, ``precisions_init``) and the summed statistics it carries
(``carry_*``, ``S_{t-1}``). In the window's first round each client scores its new rows under
the mixture it had (the window's *surprise*: mean and variance of ``log p(x)``),
re-estimates its own weights with the components frozen, and replies with the E-step
statistics, its drift values ``[mean log p, variance of log p, total variation, new]`` and
the statistics of its *far* rows (beyond the chi-square quantile ``far_quantile`` from every
component). The server forgets and adds, ``S_t = rho S_{t-1} + S_window``
(:func:`~fednovelty.mixture.streaming.forget_and_add`), re-bears the component with the
least carried mass on the far rows when they are at least ``birth_share`` of the window, and
runs the M-step on ``S_t``. ``rounds > 1`` adds personal EM rounds on the window's rows;
``rounds = 0`` only tracks the clients' weights. The rounds are stated on
:class:`StreamStep`.

Only statistics cross the wire. Each client keeps its weights in its own state
(``log_weights``) from window to window; an engine that starts a window passes each
client's state in (``run_simulation(client_states=...)``). Every client enforces its
privacy floor: below ``min_rows`` rows in the window it updates its weights but releases
nothing; a component backed by fewer effective rows is sent as zeros, and far rows count
only when at least ``min_rows`` of them are there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from scipy.special import gammaincinv
from torch import Tensor

from fednovelty.federated.core.aggregate import stats_message
from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.core.config import (
    ComponentSettings,
    CovarianceSettings,
    RobustSettings,
    as_tensor,
    at_least,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import InvalidReplyError, declare, stats_reply
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.combine import combine_stats
from fednovelty.federated.init.settings import GivenMixture
from fednovelty.federated.mixtures.em import client_e_step, kept_tied_second, personal_log_weights
from fednovelty.federated.streams.conformal_drift import check_drift_settings, drift_window
from fednovelty.federated.trust.backing import backed, effective_rows, stats_backing
from fednovelty.federated.trust.contrast import winsorised_row_values
from fednovelty.federated.trust.floors import suppress_components
from fednovelty.federated.trust.reply_form import Shape, covariance_shape, expectation
from fednovelty.federated.trust.value_checks import (
    check_counts_within,
    check_stats_tensors,
    relative_tolerance,
)
from fednovelty.mixture import MixtureParams, SufficientStats, params_from_stats, stats_from_resp
from fednovelty.mixture.covariance import log_det_cholesky
from fednovelty.mixture.density import Workspace, log_gaussian_prob
from fednovelty.mixture.em import fit_weights, moment_shift
from fednovelty.mixture.streaming import forget_and_add

__all__ = [
    "DRIFT_FIELDS",
    "STREAM_KIND",
    "StreamConfig",
    "StreamState",
    "StreamStep",
    "StreamingEM",
]

STREAM_KIND = "stream"
#: the values of a client's ``drift`` tensor, in order.
DRIFT_FIELDS = ("mean_log_likelihood", "var_log_likelihood", "total_variation", "new")
FAR_FIELDS = ("far_counts", "far_sums", "far_second")
#: the carried statistics' tensors (``StreamConfig.carry_*``).
CARRIED = ("carry_counts", "carry_sums", "carry_second", "carry_shift")


@settings_dataclass
class StreamConfig(RobustSettings, ComponentSettings, CovarianceSettings, GivenMixture):
    """Settings of one window of streaming federated EM (``StreamingEM``): the robust options
    (the window's and the far rows' statistics summed, or ``"trimmed"`` as federated EM's),
    ``n_components`` and ``chunk_size``, the covariance settings, seed and placement, the
    mixture going into the window (``weights_init``, ``means_init``, ``precisions_init``:
    the previous window's result, required), and

    Attributes:
        carry_counts, carry_sums, carry_second, carry_shift, carry_n_samples: the carried
            summed statistics ``S_{t-1}`` (``None``: the first window carries nothing).
        rho: forgetting factor in [0, 1]: ``S_t = rho S_{t-1} + S_window``.
        rounds: M-steps in the window (>= 0); 0 only tracks the clients' weights.
        far_quantile: a row is *far* when its squared Mahalanobis distance to every
            component exceeds this quantile of the chi-square law with d degrees of freedom
            (``None``: no births).
        birth_share: when the far rows are at least this share of the window's rows, the
            component with the least carried mass is re-born on their statistics.
        adapt_iter, adapt_tol: each client's EM over its weights at the window's start.
        conformal_drift: each client also tests its window's scores against its own
            latest rows' (:mod:`~fednovelty.federated.streams.conformal_drift`; kept in its
            state, never released), with ``drift_alpha``, a reference of the latest
            ``drift_reference`` rows and ``drift_resamples`` pseudo-windows.

    The M-steps are plain: no standardisation and no covariance prior, whose scales would
    change from window to window.
    """

    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = ("sum", "trimmed")

    carry_counts: Tensor | None = None
    carry_sums: Tensor | None = None
    carry_second: Tensor | None = None
    carry_shift: Tensor | None = None
    carry_n_samples: float = 0.0
    rho: float = 0.9
    rounds: int = 1
    far_quantile: float | None = 0.999
    birth_share: float = 0.05
    adapt_iter: int = 100
    adapt_tol: float = 1e-6
    conformal_drift: bool = False
    drift_alpha: float = 0.01
    drift_reference: int = 500
    drift_resamples: int = 999

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("rounds", int(at_least("rounds", self.rounds, 0)))
        self._set("adapt_iter", int(at_least("adapt_iter", self.adapt_iter, 1)))
        self._set("adapt_tol", float(at_least("adapt_tol", self.adapt_tol, 0)))
        check_drift_settings(self)
        for name in ("rho", "birth_share"):
            value = float(at_least(name, getattr(self, name), 0))
            if value > 1:
                raise ValueError(f"{name} must be in [0, 1]; got {getattr(self, name)!r}.")
            self._set(name, value)
        if self.far_quantile is not None and not 0.0 < float(self.far_quantile) < 1.0:
            raise ValueError(f"far_quantile must be in (0, 1) or None; got {self.far_quantile!r}.")
        if self.covariance_type == "tied" and self.far_quantile is not None:
            raise ValueError(
                "births re-bear one component's covariance, which covariance_type='tied' "
                "shares among all: use far_quantile=None with 'tied'."
            )
        self._set("carry_n_samples", float(at_least("carry_n_samples", self.carry_n_samples, 0)))
        for name in CARRIED:
            self._set(name, as_tensor(getattr(self, name), self.dtype, self.device))
        if not self.given_params:
            raise ValueError(
                "a streaming window starts from a mixture: give weights_init, means_init and "
                "precisions_init (the previous window's result)."
            )
        carried = [getattr(self, n) is None for n in CARRIED[:3]]
        if any(carried) and not all(carried):
            raise ValueError("give all of carry_counts, carry_sums, carry_second or none.")
        if not all(carried) and self.carry_shift is None:
            raise ValueError(
                "carried statistics need the shift they were taken about (carry_shift)."
            )


@dataclass
class StreamState:
    """Server state of one streaming window.

    Attributes:
        phase: ``"stream"`` or ``"done"``.
        params: the current mixture (the window's result when done).
        carry: the carried statistics ``S_t`` after the last M-step (``None`` before the
            first window's M-step, or the input carry with ``rounds=0``).
        window_round: rounds run in this window.
        rounds: rounds run (the round seeds' counter).
        lower_bounds: each M-step's mean log-likelihood of the window's rows (before it).
        client_weights: each replying client's weights after the window's first round.
        drift: each replying client's drift values (``DRIFT_FIELDS``) from the first round.
        births: the components re-born in this window.
        far_share: the share of the window's released rows that were far.
        window_rows: the window's released rows.
    """

    phase: str
    params: MixtureParams | None = None
    carry: SufficientStats | None = None
    window_round: int = 0
    rounds: int = 0
    lower_bounds: list[float] = field(default_factory=list)
    client_weights: dict[int, Tensor] = field(default_factory=dict)
    drift: dict[int, Tensor] = field(default_factory=dict)
    births: list[int] = field(default_factory=list)
    far_share: float = 0.0
    window_rows: float = 0.0


def far_threshold(far_quantile: float, n_features: int) -> float:
    """The squared Mahalanobis distance beyond which a row is far from a component: the
    ``far_quantile`` quantile of chi-squared with ``n_features`` degrees of freedom (as
    ``scipy.stats.chi2.ppf`` computes it, without importing ``scipy.stats``)."""
    return float(2.0 * gammaincinv(n_features / 2.0, far_quantile))


def far_rows(log_components: Tensor, params: MixtureParams, threshold: float) -> Tensor:
    """Rows whose squared Mahalanobis distance to *every* component exceeds ``threshold``:
    (n, K) log-densities -> (n,) bool. ``log N = log det U - (d log 2 pi + m^2) / 2``."""
    d = params.means.shape[1]
    log_det = log_det_cholesky(params.precisions_cholesky, params.covariance_type, d)
    squared = 2.0 * (log_det - log_components) - d * math.log(2.0 * math.pi)
    return squared.amin(dim=1) > threshold


def pooled_component(stats: SufficientStats) -> SufficientStats:
    """K-component statistics pooled into one component (counts, sums and per-component
    second moments added up): the statistics of the same rows under one Gaussian."""
    return replace(
        stats,
        counts=stats.counts.sum(0, keepdim=True),
        sums=stats.sums.sum(0, keepdim=True),
        second=stats.second.sum(0, keepdim=True),
    )


def rebirth(carry: SufficientStats, far: SufficientStats, component: int) -> SufficientStats:
    """``carry`` with ``component``'s counts and moments replaced by the (one-component,
    same shift) statistics ``far`` (not for ``tied``, whose second moment is shared)."""
    counts, sums, second = carry.counts.clone(), carry.sums.clone(), carry.second.clone()
    counts[component], sums[component] = far.counts[0], far.sums[0]
    second[component] = far.second[0]
    return SufficientStats(
        counts=counts,
        sums=sums,
        second=second,
        shift=carry.shift,
        log_likelihood=carry.log_likelihood,
        n_samples=carry.n_samples,
        covariance_type=carry.covariance_type,
    )


def stream_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A streaming window's reply: weighted row counts (and drift values in the window's
    first round); with M-steps the statistics too, and in the first round the far rows'."""
    k = int(broadcast.tensors["means"].shape[0])
    ct = str(expectation(broadcast, "covariance_type"))
    first = int(broadcast.scalars.get("window_round", 0)) == 0
    shapes: dict[str, Shape] = {"counts": (k,), "n_samples": ()}
    if first:
        shapes["drift"] = (4,)
    if not bool(expectation(broadcast, "track_only")):
        shapes.update(sums=(k, d), second=covariance_shape(ct, k, d), log_likelihood=())
        if first and bool(expectation(broadcast, "far")):
            shapes.update(far_counts=(k,), far_sums=(k, d), far_second=covariance_shape(ct, k, d))
    return shapes


def check_stream(reply: Message, broadcast: Message) -> None:
    """A streaming reply's values: drift values in range, counts within the rows, the
    statistics (and the far rows' statistics) those of some rows."""
    t = reply.tensors
    rtol = relative_tolerance(t["counts"].dtype)
    check_counts_within(reply, "counts", "component counts")
    if "drift" in t:
        _, variance, tv, new = (float(v) for v in t["drift"])
        if variance < 0 or not -rtol <= tv <= 1 + rtol or new not in (0.0, 1.0):
            raise InvalidReplyError(
                "drift values out of range (variance >= 0, total variation in [0, 1], new 0/1)."
            )
    if "sums" not in t:
        return
    ct = str(expectation(broadcast, "covariance_type"))
    check_stats_tensors(t["counts"], t["sums"], t["second"], float(t["n_samples"]), ct)
    if "far_counts" in t:
        slack = rtol * (t["counts"].abs() + 1.0)
        if bool((t["far_counts"] > t["counts"] + slack).any()):
            raise InvalidReplyError("a component has more far rows than rows.")
        far_n = float(t["far_counts"].sum())
        check_stats_tensors(t["far_counts"], t["far_sums"], t["far_second"], far_n, ct)


#: a ``stream`` reply (see :func:`stream_shapes`); with M-steps its statistics lie in the
#: client's box.
STREAM_REPLY = stats_reply(
    STREAM_KIND,
    stream_shapes,
    (check_stream,),
    {
        "drift": "client",
        "far_counts": "components",
        "far_sums": "components",
        "far_second": "components",
    },
)


class StreamStep(Step):
    """The rounds of one streaming window, all of kind ``"stream"``:

    - **the window's first round**: each client first scores its new rows under the mixture it
      had (its own weights ``pi_c``, or the global weights if it is new) and keeps their mean
      and variance of ``log p(x)`` (the window's *surprise*); then re-estimates ``pi_c`` by EM
      over the weights with every component frozen (:func:`~fednovelty.mixture.em.fit_weights`,
      nothing sent), and the total variation between its old and new weights. It replies with
      the E-step statistics under its new weights, the drift values ``[mean log p, variance of
      log p, total variation, new]`` and the statistics of its *far* rows: those whose squared
      Mahalanobis distance to every component exceeds the chi-square quantile ``far_quantile``
      (mass where no component sits).
    - the server adds the statistics, forgets: ``S_t = rho S_{t-1} + S_window``
      (:func:`~fednovelty.mixture.streaming.forget_and_add`), and when the far rows are at least
      ``birth_share`` of the window's rows it re-bears the component with the least carried mass
      on the far rows' statistics (a population that moved to where no component sits gets a
      component there at once, instead of dragging the nearest one over several windows). The
      M-step on ``S_t`` gives the new mixture.
    - ``rounds > 1``: further rounds are personal EM rounds (the clients' weights take one EM
      step each, as :class:`~fednovelty.federated.mixtures.em.EMStep`'s) on the window's rows, each
      M-step again on ``rho S_{t-1} + S_window``.
    - ``rounds = 0``: one round in which clients only track their weights and reply with their
      weighted row counts and drift values; the mixture and the carried statistics stay.
    """

    kinds = (STREAM_KIND,)
    replies = declare(STREAM_REPLY)

    def __init__(self, config: StreamConfig) -> None:
        self.config = config
        self.max_rounds = max(config.rounds, 1)
        self._workspace = Workspace()

    # ------------------------------------------------------------------ server half
    def configure(self, state: Any) -> Message:
        config = self.config
        return Message(
            STREAM_KIND,
            {**state.params.tensors(), "shift": moment_shift(state.params)},
            scalars={"window_round": state.window_round},
            expect={
                "covariance_type": config.covariance_type,
                "track_only": config.rounds == 0,
                "far": config.far_quantile is not None,
            },
        )

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        first = state.window_round == 0
        if first:
            for cid, reply in replies.items():
                counts = reply.tensors["counts"].to(config.device, config.dtype)
                state.client_weights[cid] = counts / counts.sum().clamp_min(1e-300)
                state.drift[cid] = reply.tensors["drift"].to(config.device, config.dtype)
        state.window_round += 1
        metrics: dict[str, Any] = {"phase": STREAM_KIND}
        if config.rounds == 0:
            state.window_rows = sum(float(r.tensors["n_samples"]) for r in replies.values())
            return None, metrics
        shift = moment_shift(state.params)
        window = combine_stats(replies, shift, config)
        if first:
            state.window_rows = float(window.n_samples)
            stats = self._births(state, replies, window, shift)
        else:
            stats = forget_and_add(state.carry, window, config.rho)
        state.params = params_from_stats(stats, config.reg_covar)
        state.carry = stats
        lower_bound = float(window.log_likelihood / window.n_samples)
        state.lower_bounds.append(lower_bound)
        metrics["mean_log_likelihood"] = lower_bound
        return (None if state.window_round >= config.rounds else STREAM_KIND), metrics

    def _births(
        self, state: Any, replies: dict[int, Message], window: SufficientStats, shift: Tensor
    ) -> SufficientStats:
        """``rho S_{t-1} + S_window``; when the far rows are at least ``birth_share`` of the
        window's rows, their statistics leave every component and re-bear the component with
        the least mass in the sum (module docstring)."""
        config = self.config
        if config.far_quantile is None:
            return forget_and_add(state.carry, window, config.rho)
        d = shift.shape[0]
        far_replies = {
            cid: Message(
                "far",
                {
                    "counts": r.tensors["far_counts"],
                    "sums": r.tensors["far_sums"],
                    "second": r.tensors["far_second"],
                    "log_likelihood": shift.new_zeros(()),
                    "n_samples": r.tensors["far_counts"].sum(),
                },
            )
            for cid, r in replies.items()
        }
        far = combine_stats(far_replies, shift, config)
        n_far = float(far.counts.sum())
        state.far_share = n_far / max(state.window_rows, 1.0)
        if n_far < max(config.birth_share * state.window_rows, d + 1.0, 1.0):
            return forget_and_add(state.carry, window, config.rho)
        near = replace(
            window,
            counts=(window.counts - far.counts).clamp_min(0),
            sums=window.sums - far.sums,
            second=window.second - far.second,
        )
        stats = forget_and_add(state.carry, near, config.rho)
        component = int(torch.argmin(stats.counts))
        state.births.append(component)
        return rebirth(stats, pooled_component(far), component)

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        config = self.config
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        ct = config.covariance_type
        params = MixtureParams(t["weights"], t["means"], t["precisions_cholesky"], ct)
        first = int(message.scalars.get("window_round", 0)) == 0
        n = X.shape[0]
        extra: dict[str, Tensor] = {}
        behind: dict[str, Tensor] = {}
        log_n = None
        if first:
            if n == 0:
                return skipped_reply(STREAM_KIND, "no rows in this window")
            extra["drift"], log_n, behind["drift"] = self._track(X, params, context)
        elif config.rounds == 0 or "log_weights" not in context.state:
            # the client's own config runs no later round (track only), or it never ran
            # this window's first: a crafted message, refused rather than answered
            return skipped_reply(
                STREAM_KIND, "refused: a later round of a window this client has not begun"
            )
        log_weights = context.state["log_weights"].to(X.device, X.dtype)
        terms = context.terms
        if not terms.releases(n):
            return skipped_reply(STREAM_KIND, terms.below_floor)
        rows_n = X.new_tensor(float(n))
        if config.rounds == 0:
            # the weighted row counts n pi_c (EM over the weights: the responsibilities' sums),
            # each backed by its responsibilities' effective rows
            resp = torch.softmax(log_n + log_weights, dim=1)
            counts = n * log_weights.exp()
            rows = effective_rows(resp.sum(0), resp.square().sum(0))
            return Message(
                STREAM_KIND,
                {"counts": counts, "n_samples": rows_n, **extra},
                backing={"counts": rows, "n_samples": rows_n, **behind},
            )
        stats, squared, _ = client_e_step(
            X, t, log_weights, config, self._workspace, terms.has_floor
        )
        if not first:  # one EM step on the client's weights per further round
            context.state["log_weights"] = personal_log_weights(stats.counts)
        if first and config.far_quantile is not None:
            far = self._far_stats(X, log_n, log_weights, params, t["shift"], terms, stats, squared)
            far_rows_behind, second_rows = far.pop("rows"), far.pop("second_rows")
            extra.update(far)
            behind.update(dict.fromkeys(far, far_rows_behind), far_second=second_rows)
        rows = torch.full_like(stats.counts, float(n))
        tied_rows = None
        if squared is not None:  # the gate zeroes the components below the floor
            rows = effective_rows(stats.counts, squared)
            stats, tied_rows = kept_tied_second(
                stats, X, log_weights, params.means, params.precisions_cholesky, rows, terms
            )
        reply = stats_message(stats, STREAM_KIND)
        reply.tensors.update(extra)
        reply.backing.update({**stats_backing(stats, rows, tied_rows), **behind})
        return reply

    def _track(
        self, X: Tensor, params: MixtureParams, context: ClientContext
    ) -> tuple[Tensor, Tensor]:
        """The window's first client work: surprise under the old weights, the weights
        re-estimated with the components frozen, their total variation. Stores the new
        weights in the client's state; returns the drift values (4,) and the rows'
        component log-densities (n, K)."""
        config = self.config
        stored = context.state.get("log_weights")
        new = stored is None or stored.shape != params.weights.shape
        old = params.weights.log() if new else stored.to(X.device, X.dtype)
        with torch.no_grad():
            log_n = log_gaussian_prob(
                X, params.means, params.precisions_cholesky, params.covariance_type
            )
            per_row = torch.logsumexp(log_n + old, dim=1)
            fit = fit_weights(log_n, old, max_iter=config.adapt_iter, tol=config.adapt_tol)
        context.state["log_weights"] = fit.log_weights
        if config.conformal_drift:  # the client's own test: nothing of it is released
            drift_window(per_row, context.state, config, context.client_id)
        kept, behind = winsorised_row_values(per_row, context.terms.min_rows, powers=(1, 2))
        variance = kept.var(unbiased=True) if kept.shape[0] > 1 else per_row.new_zeros(())
        tv = 0.5 * (fit.log_weights.exp() - old.exp()).abs().sum()
        drift = torch.stack([kept.mean(), variance, tv, per_row.new_tensor(float(new))])
        return drift, log_n, behind

    def _far_stats(
        self,
        X: Tensor,
        log_n: Tensor,
        log_weights: Tensor,
        params: MixtureParams,
        shift: Tensor,
        terms: Any,
        window: SufficientStats,
        squared: Tensor | None,
    ) -> dict[str, Tensor]:
        """The E-step statistics (K components, about ``shift``) of the client's far rows
        (``log_n``: every row's component log-densities, (n, K)). A component is sent as
        zeros unless its far rows and its other rows are each backed by ``min_rows``
        effective rows (the server subtracts one from the other); all zeros when fewer than
        ``min_rows`` rows are far or near. Also returns what backs them: ``rows`` (K,) and
        ``second_rows`` (the second moments' backing)."""
        mask = far_rows(log_n, params, far_threshold(self.config.far_quantile, X.shape[1]))
        resp = torch.softmax(log_n[mask] + log_weights, dim=1)
        far = stats_from_resp(X[mask], resp, params.covariance_type, shift)
        n_far, n = int(mask.sum()), X.shape[0]
        far_squared = resp.square().sum(0)
        # far and near rows are each backed (the server subtracts one from the other)
        rows = torch.minimum(
            effective_rows(far.counts, far_squared),
            effective_rows((window.counts - far.counts).clamp_min(0), (squared - far_squared))
            if squared is not None
            else torch.full_like(far.counts, float(n - n_far)),
        )
        if min(n_far, n - n_far) < max(terms.min_rows, 1):
            rows = torch.zeros_like(rows)
            far = suppress_components(far, X.new_zeros(params.n_components, dtype=torch.bool))
        elif squared is not None:
            far = suppress_components(far, backed(rows, terms.min_rows))
        second_rows = rows  # a tied second moment: one for all the far rows
        if params.covariance_type == "tied":
            second_rows = rows.new_tensor(float(min(n_far, n - n_far)))
        return {
            "far_counts": far.counts,
            "far_sums": far.sums,
            "far_second": far.second,
            "rows": rows,
            "second_rows": second_rows,
        }


class StreamingEM(ChainedAlgorithm):
    """One window of streaming federated EM (see the module docstring).

    ``StreamingEM(n_components, weights_init=..., means_init=..., precisions_init=...,
    **settings)`` with the settings of :class:`StreamConfig`,
    or ``StreamingEM.from_config(StreamConfig(...))``.
    """

    config_class = StreamConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(StreamConfig(n_components=n_components, **settings))

    def _setup(self, config: StreamConfig) -> None:
        super()._setup(config)
        self._chain([StreamStep(config)])

    def new_state(self) -> StreamState:
        config = self.config
        params = MixtureParams(
            config.weights_init, config.means_init, config.precisions_init, config.covariance_type
        )
        carry = None
        if config.carry_counts is not None:
            carry = SufficientStats(
                counts=config.carry_counts,
                sums=config.carry_sums,
                second=config.carry_second,
                shift=config.carry_shift,
                log_likelihood=torch.zeros((), dtype=config.dtype, device=config.device),
                n_samples=torch.tensor(
                    config.carry_n_samples, dtype=config.dtype, device=config.device
                ),
                covariance_type=config.covariance_type,
            )
        return StreamState(phase="", params=params, carry=carry)
