"""One-shot variational Bayes' local round (:class:`VBLocalStep`): each client fits a
VB mixture to its own rows and sends its posterior's statistics once; the server matches the
clients' components (:func:`match_components`, symmetric Jeffreys divergence), combines
them slot by slot (:func:`combine_slots`) and sets the global posterior. The one-shot
algorithm (:mod:`fednovelty.federated.bayesian.vb_oneshot`) and federated VB's one-shot start
(:mod:`fednovelty.federated.bayesian.variational`) both chain it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import stats_message
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    derived_seed,
    skipped_reply,
)
from fednovelty.federated.core.declarations import InvalidReplyError, declare, stats_reply
from fednovelty.federated.core.steps import Step
from fednovelty.federated.trust.backing import backed, resp_rows, stats_backing
from fednovelty.federated.trust.privacy import unfloored
from fednovelty.federated.trust.reply_form import Shape, check_reply, stats_shapes
from fednovelty.federated.trust.robust import outlying_models, scale_stats, typical_row_factors
from fednovelty.federated.trust.value_checks import check_stats
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.stats import SufficientStats, stats_from_resp
from fednovelty.mixture.variational import VBPosterior, fit_vb, vb_log_resp, vb_m_step
from fednovelty.mixture.vb_aggregate import aggregate_posteriors, scale_evidence
from fednovelty.mixture.vb_groups import fit_vb_groups
from fednovelty.mixture.vb_predictive import effective_n_components, vb_plugin_params
from fednovelty.mixture.vb_prior import InvalidPriorError, VBPrior

#: a matched slot needs at least this much count to be kept.
MIN_COMPONENT_COUNT = 1.0


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
    return stats_shapes(broadcast, d, k="k")


#: a ``vb_local`` reply: statistics (about the prior's mean, the broadcast ``shift``) in the
#: client's box.
VB_LOCAL_REPLY = stats_reply("vb_local", vb_local_shapes, (check_stats,))


#: ``vb_init`` and ``vb`` replies: summed statistics under the broadcast mixture or
#: posterior, in the client's box; under differential privacy, noisy statistics.
VB_REPLIES = declare(
    *(
        stats_reply(kind, stats_shapes, (check_stats,), covariance=True, private="stats")
        for kind in ("vb_init", "vb")
    )
)


class VBLocalStep(Step):
    """The ``vb_local`` round: local VB fits, matched, combined and refined (module
    docstring). Used by ``FederatedVBOneShot`` and as the ``init_params="oneshot"`` start
    of ``FederatedVB``: either config carries the settings it reads (the prior,
    :class:`~fednovelty.federated.bayesian.vb_settings.OneShotSettings`, the
    iteration and robust settings); the state needs ``vb_prior``, ``client_rows`` and the
    record fields of :class:`VBOneShotState`."""

    kinds = ("vb_local",)
    replies = declare(VB_LOCAL_REPLY)

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
        terms = context.terms
        n = X.shape[0]
        if not terms.releases(n):
            return skipped_reply("vb_local", terms.below_floor)
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
        clusters = local_clusters(n, X.shape[1], k, terms.min_rows, config.covariance_type)
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
        rows = unfloored(resp_rows(resp), n, terms)
        ct = config.covariance_type
        # a tied second moment is one for all components: of the kept components' rows only
        weight = resp * backed(rows, terms.min_rows).to(X.dtype) if ct == "tied" else resp
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
        check_reply(Message("vb", tensors), expected, d, VB_REPLIES["vb"])
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
