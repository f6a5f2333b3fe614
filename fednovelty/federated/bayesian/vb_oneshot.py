"""One-shot federated variational Bayes: local posteriors, matched and combined once.

Two rounds (after a standardising ``moments`` round with ``standardize``), whatever K:

1. ``vb_prior`` (:class:`~fednovelty.federated.bayesian.variational.VBPriorStep`, skipped when
   ``mean_prior`` and ``covariance_prior`` are both given): the pooled mean and covariance
   for scikit-learn's default Normal-Wishart prior, so every client fits under one shared
   prior; each client's declared row count is recorded.
2. ``vb_local`` (:class:`VBLocalStep`): each client runs variational EM on its own rows under
   the broadcast prior (from local k-means labels, at most :func:`local_clusters`) and replies
   with the statistics of its converged responsibilities, which under the shared prior *are*
   its posterior: the server rebuilds it exactly and validates every reply like a statistics
   reply; a bad one is dropped with its reason (``state.dropped``), never the run.

The server then matches the clients' components into at most ``n_components`` slots
(:func:`match_components`: symmetric KL relative to the pooled data's Gaussian), combines each
slot (:func:`~fednovelty.mixture.vb_aggregate.aggregate_posteriors`, ``"moment"`` or
``"natural"``), with ``total_evidence`` scales each slot's evidence to its total, and with
``refine_iter`` runs variational iterations on the clients' component statistics
(:func:`~fednovelty.mixture.variational.fit_vb_groups`). The same step is the one-shot start
of :class:`~fednovelty.federated.bayesian.variational.FederatedVB`. Robust options
(``"trimmed"``, ``"median"``) weigh every client as the typical client's rows and leave out
outlying client posteriors. A client below its privacy floor skips both rounds and suppresses
every component backed by fewer than ``min_rows`` effective rows (sent as zeros).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from fednovelty.federated.aggregate import stats_message
from fednovelty.federated.base import (
    ClientContext,
    Message,
    client_generator,
    derived_seed,
    skipped_reply,
)
from fednovelty.federated.bayesian.variational import (
    OneShotSettings,
    PosteriorUnitsStep,
    VBConfig,
    VBMomentsSettings,
    VBPriorSettings,
    VBPriorStep,
)
from fednovelty.federated.config import (
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    RobustSettings,
    settings_dataclass,
)
from fednovelty.federated.declarations import STATS_BACKING, ReplySpec, components_limit, declare
from fednovelty.federated.init import MomentsStep
from fednovelty.federated.privacy import backed, resp_rows, stats_backing, unfloored
from fednovelty.federated.robust import (
    AGGREGATIONS,
    outlying_models,
    scale_stats,
    typical_row_factors,
)
from fednovelty.federated.steps import ChainedAlgorithm, Step
from fednovelty.federated.validation import (
    InvalidReplyError,
    Shape,
    check_reply,
    check_stats,
    covariance_shape,
    expectation,
)
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.stats import SufficientStats, stats_from_resp
from fednovelty.mixture.variational import (
    InvalidPriorError,
    VBPosterior,
    VBPrior,
    effective_n_components,
    fit_vb,
    fit_vb_groups,
    vb_log_resp,
    vb_m_step,
    vb_plugin_params,
)
from fednovelty.mixture.vb_aggregate import aggregate_posteriors, scale_evidence

__all__ = [
    "FederatedVBOneShot",
    "VBLocalStep",
    "VBOneShotConfig",
    "VBOneShotState",
    "combine_slots",
    "gaussian_jeffreys",
    "match_components",
    "stack_groups",
]


@settings_dataclass
class VBOneShotConfig(
    RobustSettings,
    ComponentSettings,
    CovarianceSettings,
    IterationSettings,
    VBMomentsSettings,
    VBPriorSettings,
    OneShotSettings,
):
    """Settings of one-shot federated variational Bayes (``FederatedVBOneShot``,
    :mod:`fednovelty.federated.bayesian.vb_oneshot`): ``n_components`` and ``chunk_size``, the
    covariance settings (``full``, ``diag`` or ``spherical``: the clients' fits do not
    align one shared Wishart), the iteration settings (of each client's local variational
    EM, which local k-means initialises), the priors
    (:class:`~fednovelty.federated.bayesian.variational.VBPriorSettings`), how the server
    combines the local posteriors
    (:class:`~fednovelty.federated.bayesian.variational.OneShotSettings`:
    ``posterior_aggregation``, ``match_threshold``, ``total_evidence``, ``refine_iter``
    (default 0 here), ``local_max_iter``), seed and placement, and the robust options
    (:class:`RobustSettings`): ``aggregation`` ``"trimmed"`` leaves out the
    ``ceil(trim * C)`` most outlying client posteriors, ``"median"`` those whose robust
    z-score exceeds 3.5, and both count every client as the typical client's rows (trimmed
    mean or median of the row counts); ``client_weight_cap`` applies.
    """

    #: ``"trimmed"`` / ``"median"``: every client counts as the typical client's rows, and
    #: outlying client posteriors are left out before the matching
    #: (:func:`fednovelty.federated.robust.outlying_models`); ``client_weight_cap`` applies.
    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = AGGREGATIONS
    COVARIANCE_CHOICES: ClassVar[tuple[str, ...]] = ("full", "diag", "spherical")


#: expected count (rows) below which a client's component takes no part in the matching.
MIN_COMPONENT_COUNT = 1.0


@dataclass
class VBOneShotState:
    """Server state of one-shot federated VB.

    Attributes:
        phase, rounds: the chain's (``vb_prior``, ``vb_local``, ``done``).
        vb_prior: the shared Normal-Wishart prior once known.
        client_rows: client id -> row count declared in the ``vb_prior`` round.
        client_posteriors: client id -> its local posterior (rebuilt from its statistics,
            counted as the typical client's rows under a robust ``aggregation``).
        assignments: client id -> slot of each of its components, (n_components,) long
            (-1: the component was empty or suppressed).
        dropped: client id -> why its reply was refused.
        left_out: clients whose posteriors the robust ``aggregation`` left out of the
            matching and combination (outlying plug-in mixtures).
        posterior: the combined posterior.
        n_iter: most local VB iterations a client ran; ``converged``: every client's local
            fit converged.
        lower_bounds: empty (no global ELBO is computed in one shot); kept so detectors
            read the same fields as from ``FederatedVB``.
        effective_n_components: components whose expected weight exceeds the threshold.
    """

    phase: str
    rounds: int = 0
    vb_prior: VBPrior | None = None
    client_rows: dict[int, float] = field(default_factory=dict)
    client_posteriors: dict[int, VBPosterior] = field(default_factory=dict)
    assignments: dict[int, Tensor] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    left_out: list[int] = field(default_factory=list)
    posterior: VBPosterior | None = None
    n_iter: int = 0
    converged: bool = True
    lower_bounds: list[float] = field(default_factory=list)
    effective_n_components: int = 0
    offset: Tensor | None = None
    scale: Tensor | None = None
    prior: Any = None
    params: Any = None
    reference: VBPrior | None = None


# --------------------------------------------------------------------------- matching


def _full_covariances(covariances: Tensor, covariance_type: str, d: int) -> Tensor:
    """Covariances of full, diag or spherical components (or one prior covariance of
    that type, with a leading axis) as full matrices, (n_components, d, d)."""
    if covariance_type == "full":
        return covariances
    if covariance_type == "diag":
        return torch.diag_embed(covariances)
    eye = torch.eye(d, dtype=covariances.dtype, device=covariances.device)
    return covariances.reshape(-1, 1, 1) * eye


def gaussian_jeffreys(means_a: Tensor, cov_a: Tensor, means_b: Tensor, cov_b: Tensor) -> Tensor:
    """Symmetric KL divergence ``(KL(a || b) + KL(b || a)) / 2`` between Gaussians, pairwise.

    Args:
        means_a, cov_a: (m, d) and (m, d, d).
        means_b, cov_b: (s, d) and (s, d, d).

    Returns:
        (m, s): ``(tr(B^-1 A) + tr(A^-1 B) - 2 d + delta^T (A^-1 + B^-1) delta) / 4``.
    """
    d = means_a.shape[1]
    inv_a, inv_b = torch.linalg.inv(cov_a), torch.linalg.inv(cov_b)
    traces = torch.einsum("sde,med->ms", inv_b, cov_a) + torch.einsum("mde,sed->ms", inv_a, cov_b)
    delta = means_a.unsqueeze(1) - means_b.unsqueeze(0)  # (m, s, d)
    quad = torch.einsum("msd,mde,mse->ms", delta, inv_a, delta) + torch.einsum(
        "msd,sde,mse->ms", delta, inv_b, delta
    )
    return 0.25 * (traces - 2 * d + quad)


def match_components(
    means: Tensor,
    covariances: Tensor,
    counts: Tensor,
    owners: Tensor,
    reference: tuple[Tensor, Tensor],
    n_slots: int,
    threshold: float,
) -> Tensor:
    """Slots for pooled components (module docstring).

    Args:
        means: (m, d) component means; covariances: (m, d, d); counts: (m,) > 0 expected
            counts; owners: (m,) client id of each component.
        reference: mean (d,) and covariance (d, d) of the pooled data.
        n_slots: most slots (K).
        threshold: a component opens a new slot when its divergence to the closest slot
            exceeds ``threshold`` times its divergence to ``reference``.

    Returns:
        (m,) long: the slot of each component, slots numbered in the order they opened.
    """
    m = means.shape[0]
    slot = torch.full((m,), -1, dtype=torch.long)
    if m == 0:
        return slot
    to_reference = gaussian_jeffreys(
        means, covariances, reference[0].unsqueeze(0), reference[1].unsqueeze(0)
    )[:, 0]
    slot_means: list[Tensor] = []
    slot_covs: list[Tensor] = []
    members: list[list[int]] = []
    for j in torch.argsort(counts, descending=True, stable=True).tolist():
        if slot_means:
            cost = gaussian_jeffreys(
                means[j : j + 1],
                covariances[j : j + 1],
                torch.stack(slot_means),
                torch.stack(slot_covs),
            )[0]
            free = torch.tensor(
                [all(owners[i] != owners[j] for i in group) for group in members],
                device=cost.device,
            )
            pool = free if bool(free.any()) else torch.ones_like(free)
            best = int(torch.where(pool, cost, torch.full_like(cost, math.inf)).argmin())
            room = len(members) < n_slots
            far = float(cost[best]) > threshold * float(to_reference[j]) or not bool(free.any())
            if not (room and far):
                slot[j] = best
                members[best].append(j)
                group = torch.tensor(members[best])
                w = counts[group] / counts[group].sum()
                mean = w @ means[group]
                diff = means[group] - mean
                slot_means[best] = mean
                slot_covs[best] = torch.einsum("g,gde->de", w, covariances[group]) + torch.einsum(
                    "g,gd,ge->de", w, diff, diff
                )
                continue
        slot[j] = len(members)
        members.append([j])
        slot_means.append(means[j])
        slot_covs.append(covariances[j])
    return slot


def _component(posterior: VBPosterior, index: int) -> VBPosterior:
    """Component ``index`` of ``posterior`` (not tied) as a one-component posterior (its
    weight concentration is a placeholder: only the component is combined)."""
    ct = posterior.covariance_type
    part = slice(index, index + 1)
    ones = posterior.mean_precision.new_ones(
        (2, 1) if posterior.weight_concentration_prior_type == "dirichlet_process" else (1,)
    )
    return VBPosterior(
        weight_concentration=ones,
        mean_precision=posterior.mean_precision[part],
        means=posterior.means[part],
        degrees_of_freedom=posterior.degrees_of_freedom[part],
        covariances=posterior.covariances[part],
        precisions_cholesky=posterior.precisions_cholesky[part],
        covariance_type=ct,
        weight_concentration_prior_type=posterior.weight_concentration_prior_type,
    )


def _weight_concentration(prior: VBPrior, counts: Tensor) -> Tensor:
    """The M-step's weight concentration from per-slot counts (n_slots,)."""
    gamma0 = float(prior.weight_concentration)
    if prior.weight_concentration_prior_type == "dirichlet_process":
        tail = torch.flip(torch.cumsum(torch.flip(counts, [0]), 0), [0])
        tail = torch.cat([tail[1:], counts.new_zeros(1)])
        return torch.stack([1.0 + counts, gamma0 + tail])
    return gamma0 + counts


def combine_slots(
    posteriors: list[VBPosterior],
    counts: list[Tensor],
    slots: list[Tensor],
    prior: VBPrior,
    how: str,
    reg_covar: float = 1e-6,
    total_evidence: bool = True,
) -> VBPosterior:
    """The combined posterior of matched client posteriors.

    Args:
        posteriors: each client's local posterior (K components, one family).
        counts: each client's expected counts per component, (K,).
        slots: each client's slot per component, (K,) long, -1 for none.
        prior: the shared prior (empty slots keep it; the weights use it).
        how: ``"moment"`` or ``"natural"`` (:func:`aggregate_posteriors`).
        reg_covar: of the M-step that makes an empty slot's posterior.
        total_evidence: scale each combined component's evidence from the average
            contribution's to the slot's total (:func:`~fednovelty.mixture.vb_aggregate.
            scale_evidence` by ``N_s^2 / sum_i n_is^2``), so that the prior counts once.

    Returns:
        A K-component posterior: used slots by decreasing summed count, then empty ones.
    """
    k = posteriors[0].n_components
    d = posteriors[0].n_features
    ct = prior.covariance_type
    like = {"dtype": posteriors[0].means.dtype, "device": posteriors[0].means.device}
    empty = vb_m_step(_zero_stats(k, d, ct, prior.mean.to(**like)), prior, reg_covar)
    entries: dict[int, list[tuple[VBPosterior, Tensor]]] = {}
    for post, count, slot in zip(posteriors, counts, slots, strict=True):
        for c in range(k):
            s = int(slot[c])
            if s >= 0:
                entries.setdefault(s, []).append((_component(post, c), count[c]))
    totals = {s: float(sum(float(w) for _, w in group)) for s, group in entries.items()}
    order = sorted(entries, key=lambda s: (-totals[s], s))
    parts = []
    for s in order:
        weights = torch.stack([w for _, w in entries[s]])
        part = aggregate_posteriors([p for p, _ in entries[s]], weights, how)
        if total_evidence:
            factor = (weights.sum().square() / weights.square().sum()).clamp_min(1.0)
            part = scale_evidence(part, prior, factor.reshape(1))
        parts.append(part)
    slot_counts = torch.zeros(k, **like)
    slot_counts[: len(parts)] = torch.tensor([totals[s] for s in order], **like)
    tensors = {
        name: getattr(empty, name).clone()
        for name in ("mean_precision", "means", "degrees_of_freedom", "covariances")
    }
    for i, part in enumerate(parts):
        for name, value in tensors.items():
            value[i] = getattr(part, name)[0]
    covariances = tensors["covariances"]
    return VBPosterior(
        weight_concentration=_weight_concentration(prior, slot_counts),
        mean_precision=tensors["mean_precision"],
        means=tensors["means"],
        degrees_of_freedom=tensors["degrees_of_freedom"],
        covariances=covariances,
        precisions_cholesky=precisions_cholesky_from_covariances(covariances, ct),
        covariance_type=ct,
        weight_concentration_prior_type=prior.weight_concentration_prior_type,
    )


def _zero_stats(k: int, d: int, covariance_type: str, shift: Tensor) -> SufficientStats:
    like = {"dtype": shift.dtype, "device": shift.device}
    second_shape = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    return SufficientStats(
        counts=torch.zeros(k, **like),
        sums=torch.zeros(k, d, **like),
        second=torch.zeros(second_shape[covariance_type], **like),
        shift=shift,
        log_likelihood=torch.zeros((), **like),
        n_samples=torch.zeros((), **like),
        covariance_type=covariance_type,
    )


# --------------------------------------------------------------------------- steps


def _prior_message(prior: VBPrior) -> dict[str, Tensor]:
    return {**prior.tensors(), "shift": prior.mean}


def local_clusters(
    n_rows: int, n_features: int, n_components: int, min_rows: int, covariance_type: str
) -> int:
    """k-means clusters a client's local fit starts from: at most ``n_components``, at most
    ``n_rows // min_rows`` (privacy) and, for ``full`` covariances, at most one per
    ``n_features + 1`` rows (a full covariance needs more rows than features: started
    with fewer, the local components are mostly prior and match poorly); at least one."""
    per_cluster = min_rows if covariance_type != "full" else max(min_rows, n_features + 1)
    return max(1, min(n_components, n_rows // per_cluster))


def vb_local_shapes(broadcast: Message, d: int) -> dict[str, Shape]:
    """A ``vb_local`` reply: the statistics of the client's converged responsibilities over
    some K components (the server's step holds K to its ``n_components``)."""
    ct = str(expectation(broadcast, "covariance_type"))
    return {
        "counts": ("k",),
        "sums": ("k", d),
        "second": covariance_shape(ct, "k", d),
        "log_likelihood": (),
        "n_samples": (),
    }


#: a ``vb_local`` reply: statistics (about the prior's mean, the broadcast ``shift``) in the
#: client's box.
VB_LOCAL_REPLY = ReplySpec(
    "vb_local",
    shapes=vb_local_shapes,
    checks=(check_stats,),
    backing=STATS_BACKING,
    limit=components_limit,
    box="stats",
)


class VBLocalStep(Step):
    """The ``vb_local`` round: local VB fits, matched, combined and refined (module
    docstring). Used by ``FederatedVBOneShot`` and as the ``init_params="oneshot"`` start
    of ``FederatedVB``: either config carries the settings it reads (the prior,
    :class:`~fednovelty.federated.bayesian.variational.OneShotSettings`, the
    iteration and robust settings); the state needs ``vb_prior``, ``client_rows`` and the
    record fields of :class:`VBOneShotState`."""

    kinds = ("vb_local",)
    replies = declare(VB_LOCAL_REPLY)

    def __init__(self, config: VBOneShotConfig | VBConfig) -> None:
        self.config = config

    def configure(self, state: Any) -> Message:
        return Message(
            "vb_local",
            _prior_message(state.vb_prior),
            {"seed": derived_seed(self.config.random_state, 0)},
            expect={"covariance_type": self.config.covariance_type},
        )

    # ------------------------------------------------------------------ client half
    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        config = self.config
        policy = context.policy
        n = X.shape[0]
        if not policy.releases(n):
            return skipped_reply("vb_local", policy.below_floor)
        t = {name: value.to(X.device, X.dtype) for name, value in message.tensors.items()}
        try:
            prior = VBPrior(
                config.weight_concentration_prior_type,
                float(t["weight_concentration"]),
                float(t["mean_precision"]),
                t["mean"],
                float(t["degrees_of_freedom"]),
                t["covariance"],
                config.covariance_type,
            )
        except (InvalidPriorError, KeyError) as error:
            return skipped_reply("vb_local", f"the broadcast prior is invalid: {error}")
        k = config.n_components
        clusters = local_clusters(n, X.shape[1], k, policy.min_rows, config.covariance_type)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        _, labels = kmeans(X, clusters, generator=generator)
        shift = t["shift"]
        resp = one_hot(labels, k, X)
        init = vb_m_step(
            stats_from_resp(X, resp, config.covariance_type, shift), prior, config.reg_covar
        )
        result = fit_vb(
            X,
            init,
            prior,
            reg_covar=config.reg_covar,
            tol=config.tol,
            max_iter=config.local_iterations,
            chunk_size=config.chunk_size,
        )
        resp = vb_log_resp(X, result.posterior)[1].exp()
        rows = unfloored(resp_rows(resp), n, policy)
        ct = config.covariance_type
        # a tied second moment is one for all components: of the kept components' rows only
        weight = resp * backed(rows, policy.min_rows).to(X.dtype) if ct == "tied" else resp
        stats = stats_from_resp(X, weight, ct, shift)
        reply = stats_message(stats, "vb_local")
        reply.backing.update(stats_backing(stats, rows, resp_rows(weight.sum(1, keepdim=True))[0]))
        reply.scalars.update(converged=bool(result.converged), n_iter=int(result.n_iter))
        return reply

    # ------------------------------------------------------------------ server half
    def _valid_stats(self, state: Any, cid: int, reply: Message, d: int) -> SufficientStats:
        """The reply's statistics, or :class:`InvalidReplyError` (what a ``vb`` statistics
        reply must satisfy, plus the row count declared in the ``vb_prior`` round)."""
        config = self.config
        k = config.n_components
        like = {"dtype": config.dtype, "device": config.device}
        expected = Message(
            "vb",
            {"means": torch.zeros(k, d, **like)},
            expect={"covariance_type": config.covariance_type},
        )
        tensors = dict(reply.tensors)
        check_reply(Message("vb", tensors), expected, d)
        n = float(tensors["n_samples"])
        declared = state.client_rows.get(cid)
        if declared is not None and abs(n - declared) > 1e-9 * max(declared, 1.0):
            raise InvalidReplyError(f"reply claims {n:g} rows; the client declared {declared:g}.")
        t = {name: value.to(**like) for name, value in tensors.items()}
        return SufficientStats(
            shift=state.vb_prior.mean.to(**like), covariance_type=config.covariance_type, **t
        )

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        prior = state.vb_prior
        d = prior.n_features
        valid = {}
        for cid in sorted(replies):
            try:
                valid[cid] = self._valid_stats(state, cid, replies[cid], d)
            except (InvalidReplyError, ValueError) as error:
                state.dropped[cid] = str(error)
        # under a robust option every client counts as the typical client's rows
        sizes = {cid: float(stats.n_samples) for cid, stats in valid.items()}
        factors = typical_row_factors(sizes, config.aggregation, config.trim)
        posteriors, client_stats = {}, {}
        local_iter, local_converged = 0, True
        for cid, stats in valid.items():
            stats = scale_stats(stats, factors[cid])
            try:
                posteriors[cid] = vb_m_step(stats, prior, config.reg_covar)
            except ValueError as error:
                state.dropped[cid] = str(error)
                continue
            client_stats[cid] = stats
            local_iter = max(local_iter, int(replies[cid].scalars.get("n_iter", 0)))
            local_converged = local_converged and bool(replies[cid].scalars.get("converged", True))
        if not posteriors:
            raise ValueError(
                f"no client sent a valid local posterior in the vb_local round: {state.dropped}."
            )
        state.n_iter, state.converged = local_iter, local_converged
        plugins = {cid: vb_plugin_params(post) for cid, post in posteriors.items()}
        state.left_out = outlying_models(plugins, config.aggregation, config.trim)
        ids = [cid for cid in sorted(posteriors) if cid not in state.left_out]
        counts = {cid: client_stats[cid].counts for cid in ids}
        slots = self._match(posteriors, counts, ids, prior, state.reference)
        state.client_posteriors = posteriors
        state.assignments = slots
        state.posterior = combine_slots(
            [posteriors[cid] for cid in ids],
            [counts[cid] for cid in ids],
            [slots[cid] for cid in ids],
            prior,
            config.posterior_aggregation,
            config.reg_covar,
            config.total_evidence,
        )
        metrics: dict[str, Any] = {"phase": "vb_local"}
        if config.refine_iter > 0:
            refined = fit_vb_groups(
                stack_groups([client_stats[cid] for cid in ids]),
                state.posterior,
                prior,
                reg_covar=config.reg_covar,
                tol=config.tol,
                max_iter=config.refine_iter,
            )
            state.posterior = refined.posterior
            metrics.update(refine_iter=refined.n_iter, refine_bound=refined.lower_bounds[-1])
        state.effective_n_components = effective_n_components(
            state.posterior, config.weight_threshold
        )
        return None, {
            **metrics,
            "n_clients": len(posteriors),
            "n_dropped": len(state.dropped),
            "n_left_out": len(state.left_out),
            "local_n_iter": local_iter,
            "effective_n_components": state.effective_n_components,
        }

    def _match(
        self,
        posteriors: dict[int, VBPosterior],
        counts: dict[int, Tensor],
        ids: list[int],
        prior: VBPrior,
        reference: VBPrior | None,
    ) -> dict[int, Tensor]:
        """The slot of every component of the clients ``ids``, (n_components,) long each
        (-1: left out, its expected count below ``MIN_COMPONENT_COUNT``); ``reference``:
        scikit-learn's default prior from the ``vb_prior`` round, whose mean and covariance
        are the pooled data's (``None`` when every prior was given: ``prior`` stands in)."""
        config = self.config
        k, d, ct = config.n_components, prior.n_features, config.covariance_type
        pooled = [
            (cid, c) for cid in ids for c in range(k) if counts[cid][c] >= MIN_COMPONENT_COUNT
        ]
        slots = {cid: torch.full((k,), -1, dtype=torch.long) for cid in ids}
        if not pooled:
            return slots
        means = torch.stack([posteriors[cid].means[c] for cid, c in pooled])
        covs = torch.stack(
            [
                _full_covariances(posteriors[cid].covariances[c : c + 1], ct, d)[0]
                for cid, c in pooled
            ]
        )
        weights = torch.stack([counts[cid][c] for cid, c in pooled])
        owner = torch.tensor([cid for cid, _ in pooled])
        ref = prior if reference is None else reference
        pooled_gaussian = (ref.mean, _full_covariances(ref.covariance.unsqueeze(0), ct, d)[0])
        found = match_components(
            means, covs, weights, owner, pooled_gaussian, k, config.match_threshold
        )
        for (cid, c), s in zip(pooled, found.tolist(), strict=True):
            slots[cid][c] = s
        return slots


def stack_groups(parts: list[SufficientStats]) -> SufficientStats:
    """The clients' per-component statistics (about one shift) as one set of groups: the
    components of every part in turn, (sum of the parts' components,) counts."""
    first = parts[0]
    return SufficientStats(
        counts=torch.cat([p.counts for p in parts]),
        sums=torch.cat([p.sums for p in parts]),
        second=torch.cat([p.second for p in parts]),
        shift=first.shift,
        log_likelihood=sum(p.log_likelihood for p in parts),
        n_samples=sum(p.n_samples for p in parts),
        covariance_type=first.covariance_type,
    )


class FederatedVBOneShot(ChainedAlgorithm):
    """One-shot federated variational Bayes Gaussian mixture (see the module docstring).

    ``FederatedVBOneShot(n_components, **settings)`` with the settings of
    :class:`VBOneShotConfig`, or
    ``FederatedVBOneShot.from_config(VBOneShotConfig(...))``. The result is
    ``state.posterior``; ``state.assignments`` records the matching and ``state.dropped``
    the refused replies.

    Matching (:func:`match_components`). The clients' components are pooled (each weighted by
    its expected count ``n_ic``), largest first; each joins the open *slot* whose count-weighted
    Gaussian is closest in symmetric KL divergence (a slot holding another component of the same
    client is used only when no other is left), unless that divergence exceeds
    ``match_threshold`` times the component's divergence to the pooled data's Gaussian (the
    prior's mean and covariance): then it opens a new slot, while fewer than ``n_components``
    are open. The threshold is relative, so it needs no units: a component joins a slot that
    explains it much better than the whole data does.

    Combining. Each slot's components are combined with
    :func:`~fednovelty.mixture.vb_aggregate.aggregate_posteriors` (``posterior_aggregation``:
    ``"moment"``, moment matching, the minimiser of ``sum w KL(q_i || p)``, or ``"natural"``,
    natural-parameter averaging, the minimiser of ``sum w KL(p || q_i)``), the weights being the
    clients' expected counts. The weight distribution comes from the slots' summed counts and
    the prior, as the exact M-step would make it (Dirichlet ``alpha_0 + N_s``; sticks ``(1 +
    N_s, gamma_0 + sum_{t > s} N_t)``), slots ordered by decreasing count; unused slots keep the
    prior (an empty component).

    Evidence (``total_evidence``, default on). Either rule gives an *average* of the clients'
    posteriors: the prior counted once per client's worth of rows, the mean precision and
    degrees of freedom of one typical client. That costs the predictive density: every client's
    covariance carries ``W_0^-1 / (nu_0 + n_ic)`` of prior, which the exact posterior dilutes
    over all rows. So the server then raises the combined likelihood factor ``p / p_0`` to the
    power ``S = N_s^2 / sum_i n_is^2`` (the slot's total count over the count-weighted average
    contribution; 1 for one client, the number of clients for equal shares):
    :func:`~fednovelty.mixture.vb_aggregate.scale_evidence`. For natural averaging with equal
    shares this is exactly the product of the clients' likelihood factors, the posterior of the
    matched statistics summed. ``total_evidence=False`` keeps the average (what VGM2 uses as the
    next round's prior).

    Robust options (``aggregation`` ``"trimmed"`` or ``"median"``, :mod:`fednovelty.federated.
    robust`). Before the matching, every client's statistics are rescaled to the typical
    client's row count (:func:`~fednovelty.federated.robust.typical_row_factors`: the trimmed
    mean or median of the declared counts), so a claimed row count sets no weight, and the
    clients whose posteriors' plug-in mixtures are outlying
    (:func:`~fednovelty.federated.robust.outlying_models`: the ``ceil(trim * C)`` most outlying,
    or every one with a robust z-score above 3.5) are left out (``state.left_out``). The
    ``vb_prior`` round is still the plain sum. ``client_weight_cap`` scales down a client's
    statistics before either.

    Components with an expected count below ``MIN_COMPONENT_COUNT`` (one row) are left out of
    the matching. Privacy: a client below its floor skips both rounds; a client suppresses every
    component backed by fewer than ``min_rows`` effective rows (Kish) by sending it as zeros.
    """

    config_class = VBOneShotConfig

    def __init__(self, n_components: int, **settings: Any) -> None:
        self._setup(VBOneShotConfig(n_components=n_components, **settings))

    def _setup(self, config: VBOneShotConfig) -> None:
        super()._setup(config)
        self._chain(
            [MomentsStep(config), VBPriorStep(config), VBLocalStep(config), PosteriorUnitsStep()]
        )

    def new_state(self) -> VBOneShotState:
        return VBOneShotState(phase="")
