"""Federated EM for mixtures of factor analysers (low-rank-plus-diagonal covariances).

``FederatedFactorEM`` chains ``[moments?] + k-means start + factor start + factor EM``: the
moments round (:class:`~fednovelty.federated.init.moments.MomentsStep`: standardisation, the noise
prior) and the k-means rounds (:func:`~fednovelty.federated.init.chain.init_steps` with ``diag``
statistics) are federated EM's own steps. :class:`FactorStartStep` (``factor_start``): every
client labels its rows by the k-means centres and sends, per part, counts, first and second
moments and a sketch ``sum (x - c)(x - c)^T Omega`` for a broadcast Gaussian ``Omega``
(n_features, n_factors + oversample); the server sums them and starts each component as
probabilistic PCA (:func:`~fednovelty.mixture.factor_fit.factor_params_from_sketch`).
:class:`FactorEMStep` (``factor_em``): the clients reply with the E-step's summed
statistics (:func:`~fednovelty.mixture.factor.factor_e_step`, O(n K d q) each); the server
sums them and runs the M-step, so any split of the rows follows centralized EM
(:func:`~fednovelty.mixture.factor_fit.fit_factor_em`) from the same start.

Both replies declare their tensors per component (the client gate zeroes a component
backed by fewer than ``min_rows`` effective rows; a client below its floor skips) and have
no private form (a client under differential privacy refuses them). The server refuses
statistics no rows have, by name: a sketch beyond Cauchy-Schwarz on its second moments
(:func:`check_sketch`), ``E[z]`` statistics beyond it on the counts and moments
(:func:`check_factor_stats`), ``E[z z^T]`` larger than the broadcast mixture gives such
rows (:func:`check_posterior_trace`). The result, ``state.factors``, is in the user's units.
A consistent liar passes those checks; ``aggregation="trimmed"`` combines the sketches and
factor statistics per component as federated EM's (:func:`_combined`, ``docs/robust.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import released
from fednovelty.federated.core.base import ClientContext, Message, skipped_reply
from fednovelty.federated.core.config import (
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    TorchSettings,
    at_least,
    settings_dataclass,
)
from fednovelty.federated.core.declarations import (
    InvalidReplyError,
    ReplySpec,
    components_limit,
    declare,
    stats_reply,
)
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.init.chain import init_steps
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.federated.init.settings import GivenMixture, InitSettings, MomentsSettings
from fednovelty.federated.mixtures.em import EMState
from fednovelty.federated.trust.backing import effective_rows
from fednovelty.federated.trust.contrast import winsorised_row_values
from fednovelty.federated.trust.reply_form import stats_shapes
from fednovelty.federated.trust.robust import trimmed_combination
from fednovelty.federated.trust.value_checks import (
    check_psd,
    check_stats,
    check_stats_tensors,
    relative_tolerance,
)
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.factor import (
    FactorParams,
    FactorStats,
    affine_factor_params,
    check_n_factors,
    factor_e_step,
    factor_m_step,
)
from fednovelty.mixture.factor_fit import (
    SketchStats,
    factor_params_from_sketch,
    factor_shift,
    sketch_matrix,
    sketch_stats,
)
from fednovelty.mixture.kmeans import assign, one_hot

__all__ = [
    "FactorEMConfig",
    "FactorEMState",
    "FactorEMStep",
    "FactorStartStep",
    "FederatedFactorEM",
    "sketch_for",
]

#: the start's partition comes from these ``init_params`` (centres, then Lloyd rounds).
FACTOR_INITS: tuple[str, ...] = ("kmeans", "separated")


@settings_dataclass
class FactorEMConfig(
    RobustSettings,
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    InitSettings,
    MomentsSettings,
    GivenMixture,
    TorchSettings,
):
    """Settings of :class:`FederatedFactorEM`: ``n_components``, ``chunk_size``,
    ``reg_covar`` (added to every noise variance), ``tol``, ``max_iter`` (factor EM
    rounds), the k-means start's ``init_params`` (``"kmeans"`` or ``"separated"``),
    ``kmeans_rounds``, ``kmeans_tol``, ``means_init`` / ``weights_init`` (the start's
    centres), the moments round's ``standardize``, ``prior_strength`` and ``prior_scale``
    (a MAP prior on the noise variances, :class:`~fednovelty.mixture.stats.CovariancePrior`),
    seed and placement, and

    Attributes:
        n_factors: q, the loadings' columns per component (1 <= q <= n_features - 1).
        isotropic: one noise variance per component (mixtures of probabilistic PCA).
        oversample: extra columns of the start's sketch (its width is q + oversample,
            at most n_features).

    ``covariance_type`` is ``"diag"``: the statistics of the k-means rounds (and the
    form the server gate checks the first and second moments in). ``aggregation`` is
    ``"sum"`` or ``"trimmed"`` (every round robust: the moments, the k-means start, the
    sketch and the factor statistics, :func:`_combined`); ``client_weight_cap`` scales every
    sum over rows, the factor statistics included.
    """

    AGGREGATION_CHOICES = ("sum", "trimmed")
    COVARIANCE_CHOICES = ("diag",)
    #: ``n_components`` is an upper bound where the clients' privacy floors leave fewer
    #: k-means centroids than K, as federated EM's: the start round fits as many
    #: components as there are centres.
    FEWER_CENTROIDS_OK: ClassVar[bool] = True

    n_factors: int
    isotropic: bool = False
    oversample: int = 10
    covariance_type: str = "diag"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("n_factors", int(at_least("n_factors", self.n_factors, 1)))
        self._set("oversample", int(at_least("oversample", self.oversample, 0)))
        self._set("isotropic", bool(self.isotropic))
        self._check_choice("init_params", FACTOR_INITS)
        if self.precisions_init is not None:
            raise ValueError(
                "FactorEMConfig starts from a k-means partition: give means_init (and "
                "weights_init) for its centres, not precisions_init."
            )


@dataclass
class FactorEMState(EMState):
    """Federated EM's state (:class:`~fednovelty.federated.mixtures.em.EMState`: the
    moments and k-means rounds fill ``offset``, ``scale``, ``prior``, ``centers`` and a
    ``diag`` mixture in ``params``), and

    Attributes:
        omega: the start's sketch matrix, (n_features, width).
        start: the mixture of factor analysers the EM rounds start from (working units).
        factors: the current mixture of factor analysers (user units once done).
    """

    omega: Tensor | None = None
    start: FactorParams | None = None
    factors: FactorParams | None = None


def sketch_for(config: FactorEMConfig, n_features: int, like: Tensor) -> Tensor:
    """The start's Gaussian test matrix, (n_features, min(n_features, n_factors +
    oversample)), drawn from ``config.random_state`` alone (in ``like``'s dtype/device)."""
    width = min(n_features, config.n_factors + config.oversample)
    generator = torch.Generator().manual_seed(config.random_state ^ 0x5CE7C4)
    return sketch_matrix(n_features, width, generator, like)


def _combined(
    replies: dict[int, Message], names: tuple[str, ...], like: Tensor, config: FactorEMConfig
) -> dict[str, Tensor]:
    """Each named tensor over the replies with rows, in ``like``'s dtype/device: their sum,
    or under ``aggregation="trimmed"`` the trimmed combination of federated EM's statistics
    (:func:`~fednovelty.federated.trust.robust.trimmed_combination`: per component, trimmed
    shares and the clients whose component mean lies nearest the median; ``sketch``,
    ``xz``, ``sum_z`` and ``zz`` are sums over a component's rows like its moments)."""
    kept = [m for m in released(replies.values()) if float(m.tensors["n_samples"]) > 0]
    if not kept:
        raise ValueError("no client with rows replied in this round.")
    stacked = {name: torch.stack([m.tensors[name].to(like) for m in kept]) for name in names}
    if config.aggregation == "trimmed":
        return trimmed_combination(stacked, config.trim)
    return {name: values.sum(0) for name, values in stacked.items()}


def subnormal_spacing(dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s subnormal numbers (``tiny * eps``: 1.4e-45 in float32):
    the absolute error of a value rounded to ``dtype`` near zero (float64 statistics sent
    as float32 with ``wire_dtype="float32"``), which no relative tolerance covers."""
    info = torch.finfo(dtype if dtype.is_floating_point else torch.float64)
    return info.tiny * info.eps


# ----------------------------------------------------------------------------- start
def check_sketch(reply: Message, broadcast: Message) -> None:
    """Counts, sums and per-feature second moments some rows could have produced
    (:func:`~fednovelty.federated.trust.value_checks.check_stats_tensors`, ``diag``), and a sketch
    ``Y_k = C_k Omega`` of a PSD ``C_k`` (K, d, width) whose diagonal is ``second_k``:
    ``|Y_kjp| <= sqrt(S_kj) sum_l |Omega_lp| sqrt(S_kl)`` (Cauchy-Schwarz on the rows and
    on ``C_k``'s entries) and ``Omega^T Y_k`` symmetric positive semi-definite, up to the
    relative tolerance of the reply's dtype and the rounding of values near zero
    (:func:`subnormal_spacing`)."""
    t = reply.tensors
    check_stats_tensors(t["counts"], t["sums"], t["second"], float(t["n_samples"]), "diag")
    rtol = relative_tolerance(t["sketch"].dtype)
    ulp = max(subnormal_spacing(t["sketch"].dtype), subnormal_spacing(t["second"].dtype))
    sketch = t["sketch"].double().cpu()
    omega = broadcast.tensors["omega"].double().cpu()
    root = (t["second"].double().cpu().clamp_min(0) + ulp).sqrt()  # (K, d)
    reach = root @ omega.abs()  # (K, width): sum_l |Omega_lp| sqrt(S_kl)
    bound = root.unsqueeze(2) * reach.unsqueeze(1)
    if not bool(torch.isfinite(bound).all()) or bool(
        (sketch.abs() > bound * (1 + rtol) + 2 * ulp + 1e-300).any()
    ):
        raise InvalidReplyError(
            "tensor 'sketch' is larger than its second moments allow (Cauchy-Schwarz): no "
            "rows have these statistics."
        )
    core = omega.T @ sketch  # (K, width, width): Omega^T C_k Omega
    rounding = 2 * ulp * omega.abs().sum(0).amax() * omega.shape[1] / rtol
    check_psd(core, reach.square().amax(1) + rounding, "sketch", rtol)


def _start_shapes(broadcast: Message, d: int) -> dict[str, tuple]:
    k = int(broadcast.tensors["centers"].shape[0])
    width = int(broadcast.tensors["omega"].shape[1])
    return {
        "counts": (k,),
        "sums": (k, d),
        "second": (k, d),
        "sketch": (k, d, width),
        "n_samples": (),
    }


START_REPLY = ReplySpec(
    "factor_start",
    shapes=_start_shapes,
    checks=(check_sketch,),
    backing={
        "counts": "components",
        "sums": "components",
        "second": "components",
        "sketch": "components",
        "n_samples": "client",
    },
    limit=components_limit,
    box="stats",
)


class FactorStartStep(Step):
    """One round: the k-means partition's summed sketch, then probabilistic PCA per part
    (module docstring)."""

    kinds = ("factor_start",)
    replies = declare(START_REPLY)

    def configure(self, state: Any) -> Message:
        centers = state.centers
        check_n_factors(self.config.n_factors, centers.shape[1])
        state.omega = sketch_for(self.config, centers.shape[1], centers)
        shift = moment_shift(state.params) if state.params is not None else centers.mean(0)
        return Message(
            "factor_start",
            {"centers": centers, "omega": state.omega, "shift": shift},
            expect={"covariance_type": "diag"},
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("factor_start", context.terms.below_floor)
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        labels, _ = assign(X, t["centers"])
        resp = one_hot(labels, t["centers"].shape[0], X)
        stats = sketch_stats(X, resp, t["omega"], t["shift"])
        n = torch.tensor(float(X.shape[0]), dtype=X.dtype)
        rows = stats.counts  # hard labels: a part's rows are its effective rows
        tensors = {
            "counts": stats.counts,
            "sums": stats.sums,
            "second": stats.second,
            "sketch": stats.sketch,
            "n_samples": n,
        }
        backing = {name: rows for name in ("counts", "sums", "second", "sketch")}
        backing["n_samples"] = n.double()
        return Message("factor_start", tensors, backing=backing)

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        omega = state.omega.to(config.device, config.dtype)
        shift = moment_shift(state.params) if state.params is not None else state.centers.mean(0)
        names = ("counts", "sums", "second", "sketch", "n_samples")
        t = _combined(replies, names, omega, config)
        stats = SketchStats(t["counts"], t["sums"], t["second"], t["sketch"], shift.to(omega))
        state.start = state.factors = factor_params_from_sketch(
            stats,
            omega,
            config.n_factors,
            reg_covar=config.reg_covar,
            prior=state.prior,
            isotropic=config.isotropic,
        )
        return None, {"phase": "factor_start", "n_samples": float(t["n_samples"])}


# ----------------------------------------------------------------------------- EM
def check_factor_stats(reply: Message, broadcast: Message) -> None:
    """``sum r E[z z^T]`` is symmetric positive semi-definite per component, and so is the
    Gram matrix of ``v_i = (x_ij - shift_j, 1, E[z | x_i])`` per component ``k`` and feature
    ``j`` (plus the posterior covariances in the ``zz`` block)
    ``G_kj = [[S_kj, b_kj^T], [b_kj, A_k]]`` with ``b_kj = (s_kj, xz_kj)`` and
    ``A_k = [[n_k, sum_z_k^T], [sum_z_k, zz_k]]`` ((q + 1, q + 1)): ``xz`` and ``sum_z``
    within what ``second``, ``counts`` and ``zz`` allow (:func:`gram_lowest_passes`)."""
    rtol = relative_tolerance(reply.tensors["zz"].dtype)
    zz = reply.tensors["zz"].double()
    q = zz.shape[-1]
    rounding = 2 * q * subnormal_spacing(reply.tensors["zz"].dtype) / rtol
    scale = (zz.abs().amax((1, 2)) if zz.numel() else zz.new_zeros(0)) + rounding
    check_psd(zz, scale, "zz", rtol)
    if bool((zz.diagonal(dim1=1, dim2=2) < -rtol * scale.unsqueeze(1) - 1e-300).any()):
        raise InvalidReplyError("tensor 'zz' has a negative diagonal: no rows have it.")
    t = {n: reply.tensors[n] for n in ("counts", "sums", "second", "xz", "sum_z", "zz")}
    ulp = max(subnormal_spacing(value.dtype) for value in t.values())
    if not gram_lowest_passes(**{n: v.double().cpu() for n, v in t.items()}, rtol=rtol, ulp=ulp):
        raise InvalidReplyError(
            "tensors 'xz' and 'sum_z' are larger than 'second', 'counts' and 'zz' allow "
            "(their Gram matrix per component and feature is not positive semi-definite): "
            "no rows have these statistics."
        )


def gram_lowest_passes(
    counts: Tensor,
    sums: Tensor,
    second: Tensor,
    xz: Tensor,
    sum_z: Tensor,
    zz: Tensor,
    rtol: float,
    ulp: float = 0.0,
) -> bool:
    """Whether every ``G_kj`` of :func:`check_factor_stats` (counts (K,), sums and second
    (K, d), xz (K, d, q), sum_z (K, q), zz (K, q, q), float64), in correlation form ``C``
    (each entry over the square roots of its two diagonal entries, so the test holds at any
    scale; each diagonal entry plus ``2 (q + 2) ulp`` for the rounding of values near zero),
    has its lowest eigenvalue at or above ``-rtol``: ``C + rtol I`` is PSD exactly when
    ``A' = C_A + rtol I`` is positive definite (its eigenvalues from one ``eigh`` per
    component) and ``1 + rtol - c^T A'^{-1} c >= 0`` (the Schur complement, ``c`` the
    correlation form of ``b_kj``): O(K q^3 + K d q^2), no (d, q, q) tensor."""
    k, _, q = xz.shape
    floor = 2 * (q + 2) * ulp
    A = torch.empty(k, q + 1, q + 1, dtype=torch.float64)
    A[:, 0, 0] = counts
    A[:, 0, 1:] = sum_z
    A[:, 1:, 0] = sum_z
    A[:, 1:, 1:] = zz
    A.diagonal(dim1=1, dim2=2).add_(floor)
    a_root = _unit_where_zero(A.diagonal(dim1=1, dim2=2).clamp_min(0).sqrt())  # (K, q + 1)
    s_root = _unit_where_zero((second + floor).clamp_min(0).sqrt())  # (K, d)
    A = A / (a_root.unsqueeze(2) * a_root.unsqueeze(1))
    c = torch.cat([sums.unsqueeze(2), xz], 2) / (s_root.unsqueeze(2) * a_root.unsqueeze(1))
    if not (bool(torch.isfinite(A).all()) and bool(torch.isfinite(c).all())):
        return False
    values, vectors = torch.linalg.eigh(0.5 * (A + A.transpose(1, 2)))
    shifted = values + rtol  # (K, q + 1)
    if not bool((shifted > 0).all()):
        return False
    quadratic = ((c @ vectors).square() / shifted.unsqueeze(1)).sum(2)  # (K, d)
    return bool((quadratic <= 1 + rtol).all())


def _unit_where_zero(roots: Tensor) -> Tensor:
    """``roots`` with its zeros replaced by 1 (an all-zero row and column stays zero)."""
    return torch.where(roots > 0, roots, torch.ones_like(roots))


def check_posterior_trace(reply: Message, broadcast: Message) -> None:
    """``tr zz_k`` at most what rows with these counts, sums and second moments give under
    the broadcast mixture: ``E[z | x] = M^{-1} W^T Psi^{-1} (x - mu)`` has gain at most
    ``g = max sigma / (1 + sigma^2)`` over the singular values ``sigma`` of ``Psi^{-1/2} W``
    (at most 1/2) in whitened units, so ``tr zz_k <= n_k tr M_k^{-1} + g_k^2 sum_j
    sum_i r_ik (x_ij - mu_kj)^2 / psi_kj``, the last sums from ``second``, ``sums`` and
    ``counts`` about the shift (up to the relative tolerance of the reply's dtype and the
    rounding of values near zero, :func:`subnormal_spacing`)."""
    b = {n: broadcast.tensors[n].double().cpu() for n in ("means", "factors", "psi", "shift")}
    t = {n: reply.tensors[n].double().cpu() for n in ("counts", "sums", "second", "zz")}
    rtol = relative_tolerance(reply.tensors["zz"].dtype)
    ulp = max(subnormal_spacing(reply.tensors[n].dtype) for n in t)
    sigma = torch.linalg.svdvals(b["factors"] / b["psi"].sqrt().unsqueeze(2))  # (K, q)
    gain = (sigma / (1 + sigma.square())).amax(1).square()
    posterior = (1 / (1 + sigma.square())).sum(1)  # tr M^{-1}
    delta = b["means"] - b["shift"]  # sum r (x - mu)^2 = S - 2 delta s + n delta^2
    cross, square = 2 * delta * t["sums"], t["counts"].unsqueeze(1) * delta.square()
    spread = t["second"] - cross + square + rtol * (t["second"].abs() + cross.abs() + square)
    spread = spread + 4 * ulp * (1 + delta.abs() + delta.square())
    bound = (t["counts"] + ulp) * posterior + gain * (spread.clamp_min(0) / b["psi"]).sum(1)
    trace = t["zz"].diagonal(dim1=1, dim2=2).sum(1)
    slack = 2 * sigma.shape[1] * ulp + 1e-300
    if not bool(torch.isfinite(bound).all()) or bool((trace > bound * (1 + rtol) + slack).any()):
        raise InvalidReplyError(
            "tensor 'zz' is larger than the broadcast mixture gives rows with these counts, "
            "sums and second moments: no rows have these statistics."
        )


def _em_shapes(broadcast: Message, d: int) -> dict[str, tuple]:
    k, _, q = broadcast.tensors["factors"].shape
    return {
        **stats_shapes(broadcast, d),
        "xz": (int(k), d, int(q)),
        "sum_z": (int(k), int(q)),
        "zz": (int(k), int(q), int(q)),
    }


EM_FACTOR_REPLY = stats_reply(
    "factor_em",
    _em_shapes,
    (check_stats, check_factor_stats, check_posterior_trace),
    {"xz": "components", "sum_z": "components", "zz": "components"},
)


class FactorEMStep(Step):
    """The EM rounds of :class:`FederatedFactorEM` (module docstring)."""

    kinds = ("factor_em",)
    replies = declare(EM_FACTOR_REPLY)

    def __init__(self, config: FactorEMConfig) -> None:
        self.config = config
        self.max_rounds = config.max_iter

    def configure(self, state: Any) -> Message:
        factors = state.factors
        return Message(
            "factor_em",
            {**factors.tensors(), "shift": factor_shift(factors)},
            expect={"covariance_type": "diag"},
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        if not terms.releases(X.shape[0]):
            return skipped_reply("factor_em", terms.below_floor)
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        params = FactorParams(t["weights"], t["means"], t["factors"], t["psi"])
        squared = X.new_zeros(params.n_components) if terms.has_floor else None
        per_row = X.new_empty(X.shape[0]) if terms.has_floor else None
        stats = factor_e_step(
            X,
            params,
            t["shift"],
            chunk_size=self.config.chunk_size,
            squared_counts=squared,
            row_log_likelihood=per_row,
        )
        n = torch.tensor(float(X.shape[0]), dtype=torch.float64)
        tensors = stats.tensors()
        if squared is None:  # no floor: every component backed by the client's rows
            rows, ll_rows = torch.full_like(stats.counts, float(X.shape[0])), n
        else:
            rows = effective_rows(stats.counts, squared)
            values, ll_rows = winsorised_row_values(per_row, terms.min_rows)
            tensors["log_likelihood"] = values.mean() * X.shape[0]
        backing = {name: rows for name in ("counts", "sums", "second", "xz", "sum_z", "zz")}
        backing.update(log_likelihood=ll_rows, n_samples=n)
        return Message("factor_em", tensors, backing=backing)

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        shift = factor_shift(state.factors)
        t = _combined(replies, FactorStats.SUMMED, shift, config)
        stats = FactorStats(shift=shift, **t)
        state.factors = factor_m_step(
            stats, config.reg_covar, prior=state.prior, isotropic=config.isotropic
        )
        lower_bound = float(stats.log_likelihood / stats.n_samples)
        if state.scale is not None:  # log p(x) = log p(z) - sum log scale
            lower_bound -= float(state.scale.log().sum())
        state.n_iter += 1
        previous = state.lower_bounds[-1] if state.lower_bounds else -math.inf
        state.converged = abs(lower_bound - previous) < config.tol
        state.lower_bounds.append(lower_bound)
        done = state.converged or state.n_iter >= config.max_iter
        metrics = {"phase": "factor_em", "mean_log_likelihood": lower_bound}
        return (None if done else "factor_em"), metrics

    def finish(self, state: Any) -> None:
        if state.scale is not None and state.factors is not None:  # back to the user's units
            state.factors = affine_factor_params(state.factors, state.offset, state.scale)


def factor_steps(config: FactorEMConfig) -> list[Step]:
    """``[moments?] + init steps + [factor start, factor EM]``."""
    steps: list[Step] = [MomentsStep(config)] if config.needs_moments else []
    return [*steps, *init_steps(config), FactorStartStep(config), FactorEMStep(config)]


class FederatedFactorEM(ChainedAlgorithm):
    """Federated EM for a mixture of factor analysers (module docstring).

    ``FederatedFactorEM(n_components, n_factors, **settings)`` with the settings of
    :class:`FactorEMConfig`; the fitted mixture is ``state.factors``
    (:class:`~fednovelty.mixture.factor.FactorParams`, in the user's units).
    """

    config_class = FactorEMConfig

    def __init__(self, n_components: int, n_factors: int, **settings: Any) -> None:
        self._setup(FactorEMConfig(n_components=n_components, n_factors=n_factors, **settings))

    def _setup(self, config: FactorEMConfig) -> None:
        super()._setup(config)
        self._chain(factor_steps(config))

    def new_state(self) -> FactorEMState:
        return FactorEMState(phase="")
