"""Federated Lloyd rounds from the centres: the initial mixture of hard k-means.

Protocol (:class:`AssignStep`, at most ``budget`` rounds, after the centres are set:
:mod:`~fednovelty.federated.init.centroids`, :mod:`~fednovelty.federated.init.separated`,
:mod:`~fednovelty.federated.init.given`):

1. server: ``assign`` with the centres (k, n_features) and a moment shift;
2. client: each row to its nearest centre; the summed statistics of those hard
   responsibilities, those of a centre backed by fewer than ``min_rows`` rows suppressed
   (a skipped reply below its privacy floor);
3. server: the statistics combined, plain, robust or private
   (:func:`~fednovelty.federated.init.combine.combine_stats`); each occupied centre moves
   to its rows' mean; from public centres (a private start) an empty centre is moved
   beside the centre with most rows, to split its rows in the next round
   (:func:`relocate_empty`). After ``budget`` rounds, or once no centre moves more than
   ``kmeans_tol`` times the mean feature variance, the M-step of those statistics is the
   initial mixture (scikit-learn's ``init_params="kmeans"``), with the given initial
   parameters in place. Where ``n_components`` is an upper bound (the config's
   ``FEWER_CENTROIDS_OK``) and the clients' floors back fewer rows than there are k-means
   centres (small clients whose rows split over many centres; a round every client skipped
   included, :meth:`AssignStep.all_skipped`), the server merges k-FED's centres into half
   as many (k-means of the centres) and asks again, instead of refusing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import stats_message, total_variance
from fednovelty.federated.core.base import ClientContext, Message, server_generator, skipped_reply
from fednovelty.federated.core.declarations import declare, stats_reply
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.combine import combine_stats, count_floor
from fednovelty.federated.init.units import check_enough, to_working_units
from fednovelty.federated.trust.backing import backed, stats_backing
from fednovelty.federated.trust.reply_form import stats_shapes
from fednovelty.federated.trust.value_checks import check_stats
from fednovelty.mixture import (
    MixtureParams,
    affine_params,
    params_from_stats,
    precisions_cholesky_from_precisions,
    stats_from_resp,
)
from fednovelty.mixture.kmeans import assign, kmeans, one_hot
from fednovelty.mixture.rows import chunks, is_row_source

ASSIGN_REPLY = stats_reply(
    "assign",
    lambda b, d: stats_shapes(b, d, centers="centers"),
    (check_stats,),
    covariance=True,
    private="stats",
)


def apply_user_init(params: MixtureParams, config: Any, state: Any) -> MixtureParams:
    """``params`` with the user's ``weights_init``, ``means_init`` and ``precisions_init``
    (those given) in their place, in the units the rounds work in."""
    weights = params.weights if config.weights_init is None else config.weights_init
    means, prec = params.means, params.precisions_cholesky
    if config.means_init is not None:
        means = to_working_units(state, config.means_init)
    if config.precisions_init is not None:
        ct = config.covariance_type
        prec = precisions_cholesky_from_precisions(config.precisions_init, ct)
        if state.scale is not None:  # x = offset + scale * z: U_z = D U_x
            prec = affine_params(
                MixtureParams(weights, means, prec, ct),
                means.new_zeros(means.shape[1]),
                1 / state.scale,
            ).precisions_cholesky
    return MixtureParams(weights, means, prec, config.covariance_type)


def may_merge_centres(config: Any) -> bool:
    """Whether k-means centres may be merged into fewer: K is an upper bound
    (``FEWER_CENTROIDS_OK``), the centres are k-FED's (``init_params="kmeans"``) and no
    initial means were given."""
    return (
        config.FEWER_CENTROIDS_OK
        and config.init_params == "kmeans"
        and getattr(config, "means_init", None) is None
    )


def split_axis(stats: Any, component: int, generator: torch.Generator) -> Tensor:
    """The unit direction (n_features,) along which ``component``'s rows spread most: the
    feature of its largest variance where the statistics hold one per feature (``full``:
    the diagonal of its second moments; ``diag``; ``tied``: the shared one's diagonal), a
    direction drawn from ``generator`` where they do not (``spherical``) or no variance is
    positive (noisy statistics)."""
    d = stats.sums.shape[1]
    count = stats.counts[component].clamp_min(1e-300)
    mean = stats.sums[component] / count
    ct = stats.covariance_type
    if ct == "full":
        spread = torch.diagonal(stats.second[component]) / count - mean.square()
    elif ct == "diag":
        spread = stats.second[component] / count - mean.square()
    elif ct == "tied":
        spread = torch.diagonal(stats.second) / stats.counts.sum().clamp_min(1e-300)
    else:
        spread = None
    if spread is not None and bool((spread > 0).any()):
        return torch.nn.functional.one_hot(spread.argmax(), d).to(stats.sums.dtype)
    direction = torch.randn(d, generator=generator, dtype=torch.float64)
    return (direction / direction.norm()).to(stats.sums.device, stats.sums.dtype)


def relocate_empty(
    centers: Tensor,
    stats: Any,
    generator: torch.Generator,
    step: float = 1e-3,
    floor: float = 0.0,
) -> tuple[Tensor, int]:
    """Each empty centre of ``centers`` (k, n_features), its count at most ``floor`` (0; under
    differential privacy the noise floor, :func:`~.combine.count_floor`, below which a count
    and the mean it divides are noise), moved beside the centre with the most rows, the pair
    ``step`` on either side of it along :func:`split_axis`: the next Lloyd round splits that
    centre's rows by the plane between them (bisecting k-means). The centres with most rows
    are split first, each split halving the count it is ranked by. Returns the centres (a
    new tensor) and how many were moved."""
    counts = stats.counts.clone()
    empty_mask = counts <= floor * (1 + 1e-9)
    empty = [int(j) for j in torch.nonzero(empty_mask).flatten()]
    if not empty or bool(empty_mask.all()):
        return centers, 0
    out = centers.clone()
    for j in empty:
        full = int(counts.argmax())
        axis = split_axis(stats, full, generator) * step
        out[j], out[full] = out[full] + axis, out[full] - axis
        counts[full] = counts[j] = counts[full] / 2
    return out, len(empty)


def centre_rows(X: Tensor, centers: Tensor) -> Tensor:
    """Each centre's rows (n_centers,): the rows of ``X`` (n, d) nearest to it, chunk by
    chunk."""
    k = centers.shape[0]
    return sum(one_hot(assign(chunk, centers)[0], k, chunk).sum(0) for chunk in chunks(X))


class AssignStep(Step):
    """Federated Lloyd rounds from ``state.centers``; at most ``budget`` rounds, fewer when
    the centres stop moving. Ends with the initial mixture in ``state.params``. A client's
    rows may be a row source: its statistics are summed chunk by chunk."""

    kinds = ("assign",)
    replies = declare(ASSIGN_REPLY)
    streams = True

    def __init__(self, config: Any, budget: int, relocate: bool = False) -> None:
        self.config = config
        self.budget = int(budget)
        self.max_rounds = self.budget
        self.relocate = relocate  # empty centres split the fullest (:func:`relocate_empty`)

    def configure(self, state: Any) -> Message:
        return Message(
            "assign",
            {"centers": state.centers, "shift": state.centers.mean(0)},
            expect={"covariance_type": self.config.covariance_type},
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        if not terms.releases(X.shape[0]):
            return skipped_reply("assign", terms.below_floor)
        centers = message.tensors["centers"].to(X.device, X.dtype)
        shift = message.tensors["shift"].to(X.device, X.dtype)
        ct = self.config.covariance_type
        # a tied second moment is one for all centres: of the kept centres' rows only, which
        # a source's rows tell in a first pass (a tensor is one chunk)
        every = centre_rows(X, centers) if ct == "tied" and is_row_source(X) else None
        stats = rows = None
        for chunk in chunks(X):
            resp = one_hot(assign(chunk, centers)[0], centers.shape[0], chunk)
            part = resp.sum(0)  # hard responsibilities: a centre's rows are its effective rows
            keep = backed(part if every is None else every, terms.floor)
            hard = resp * keep.to(chunk.dtype) if ct == "tied" else resp
            chunk_stats = stats_from_resp(chunk, hard, ct, shift)
            stats = chunk_stats if stats is None else stats + chunk_stats
            rows = part if rows is None else rows + part
        keep = backed(rows, terms.floor)
        reply = stats_message(stats, "assign")
        reply.backing.update(stats_backing(stats, rows, (rows * keep).sum()))
        return reply

    def all_skipped(self, state: Any) -> bool:
        """Too few rows backed the centres (every client skipped, or fewer rows than
        centres): where K is an upper bound (:func:`may_merge_centres`), merge the centres
        into half as many (k-means of the centres) and ask again."""
        k = state.centers.shape[0]
        if k < 2 or not may_merge_centres(self.config):
            return False
        generator = server_generator(self.config, state)
        state.centers, _ = kmeans(state.centers, (k + 1) // 2, generator=generator)
        return True

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        stats = combine_stats(replies, state.centers.mean(0), config, state)
        k = state.centers.shape[0]
        if float(stats.n_samples) < k and self.all_skipped(state):
            return "assign", {"phase": "assign", "merged_centres": k}
        check_enough(float(stats.n_samples), k)
        occupied = stats.counts > 0
        moved = stats.shift + stats.sums / stats.counts.clamp_min(1e-300).unsqueeze(1)
        new_centers = torch.where(occupied.unsqueeze(1), moved, state.centers)
        relocated = 0
        if self.relocate and state.lloyd_rounds + 1 < self.budget:
            generator = server_generator(config, state)
            floor = count_floor(config, len(replies))
            new_centers, relocated = relocate_empty(new_centers, stats, generator, floor=floor)
        movement = float((new_centers - state.centers).square().sum(1).max())
        state.lloyd_rounds += 1
        threshold = config.kmeans_tol * total_variance(stats)
        metrics = {"phase": "assign", "center_shift": movement}
        if relocated:
            metrics["relocated_centres"] = relocated
            movement = float("inf")  # the split needs its round
        if state.lloyd_rounds >= self.budget or movement <= threshold:
            params = params_from_stats(stats, config.reg_covar, state.prior)
            state.params = apply_user_init(params, config, state)
            return None, metrics
        state.centers = new_centers
        return "assign", metrics
