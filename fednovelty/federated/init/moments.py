"""The ``moments`` round: pooled feature moments set the working units and the prior.

Protocol (:class:`MomentsStep`, one round, only with ``standardize`` or
``prior_strength``):

1. server: ``moments``; with ``bounds`` it carries the public box's map
   (:func:`~fednovelty.federated.init.units.box_units`), which the client applies first;
2. client: its row count, feature means and sums of squared deviations (n_features,), or
   a skipped reply below its privacy floor;
3. server: the exact merge (or robust, or noisy: :func:`pooled_moments`,
   :func:`private_moments`) into the pooled moments, which set the standardisation
   ``z = (x - offset) / scale`` (``standardize``) and the covariance prior
   (``prior_strength``).

Once the working units differ from the user's (z-scores, the box's), every later round's
message carries their ``offset`` and ``scale`` and each client works in them (``view``);
at the end the mixture is mapped back to the user's units (``finish``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import ClientContext, Message, Scalar, skipped_reply
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.combine import private_stats
from fednovelty.federated.init.units import box_units, server_like
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.plausible import robust_moments
from fednovelty.federated.trust.private_robust import moments_stats, private_trimmed_moments
from fednovelty.mixture import (
    CovariancePrior,
    FeatureMoments,
    affine_params,
    feature_moments,
    merge_moments,
    prior_target,
    standardization,
)


def declared_moments(reply: Message) -> tuple[Tensor, Tensor, Tensor]:
    """The moments a ``moments`` reply declares: row count, per-feature mean and sum of
    squared deviations (n_features,)."""
    t = reply.tensors
    return t["n_samples"], t["mean"], t["m2"]


MOMENTS_REPLY = ReplySpec(
    "moments",
    shapes=lambda b, d: {"n_samples": (), "mean": (d,), "m2": (d,)},
    backing={"n_samples": "client", "mean": "client", "m2": "client"},
    moments=declared_moments,
    private="moments",
)


def pooled_moments(replies: dict[int, Message], config: Any) -> FeatureMoments:
    """The ``moments`` round's pooled moments: the exact merge of the clients' moments, or,
    with a robust option on (``aggregation`` other than ``"sum"``, or a
    ``client_weight_cap``), :func:`~fednovelty.federated.trust.plausible.robust_moments` (the
    coordinate-wise median for ``"median"``, else the trimmed mean with ``trim``), so one
    client cannot move the standardisation far. Under ``dp_mode`` a robust ``aggregation``
    is the coordinate-wise trimmed sum of the clients' counts, sums and sums of squares
    about the clipping centre (:func:`~fednovelty.federated.trust.private_robust.
    private_trimmed_moments`), which one row moves no more than the plain sum."""
    parts = [
        FeatureMoments(
            *(m.tensors[k].to(config.device, config.dtype) for k in ("n_samples", "mean", "m2"))
        )
        for m in replies.values()
    ]
    if config.aggregation == "sum" and config.client_weight_cap is None:
        return merge_moments(parts)
    if getattr(config, "dp_mode", None) is not None and config.aggregation != "sum":
        return private_trimmed_moments(parts, config.trim)
    method = "median" if config.aggregation == "median" else "trimmed"
    n, mean, m2 = (torch.stack([getattr(p, k) for p in parts]) for k in ("n_samples", "mean", "m2"))
    return robust_moments(n, mean, m2, method, config.trim)


def private_moments(
    moments: FeatureMoments, config: Any, n_replies: int, state: Any = None
) -> FeatureMoments:
    """Pooled noisy feature moments made usable as
    :func:`~fednovelty.federated.init.combine.private_stats` makes summed statistics (they
    are one component's ``diag`` statistics about the clipping centre,
    :func:`~fednovelty.federated.trust.private_robust.moments_stats`): in
    ``"central"`` mode first the trusted server's noise (the ``"moments"`` release's: count
    1, sum ``B``, sum of squares ``B**2``), then the count floored, the mean kept in the
    clipping ball and each variance between the noise's floor and ``B**2``."""
    stats = private_stats(moments_stats(moments), config, n_replies, state)
    n = stats.counts[0]
    mean = stats.sums[0] / n
    return FeatureMoments(n, mean, stats.second[0] - n * mean.square())


class MomentsStep(Step):
    """Pooled feature moments: the standardisation and the covariance prior (module
    docstring). Runs only with ``standardize`` or ``prior_strength``; with ``bounds`` the
    public box's units hold from the start (no round)."""

    kinds = ("moments",)
    replies = declare(MOMENTS_REPLY)
    streams = True  # feature moments merge chunk by chunk

    def __init__(self, config: Any) -> None:
        self.config = config
        self.max_rounds = int(config.needs_moments)

    def begin(self, state: Any) -> str | None:
        config = self.config
        if config.bounds is not None:  # the public box is the working units until moments
            state.offset, state.scale = box_units(config.bounds, server_like(config))
        return "moments" if config.needs_moments else None

    def configure(self, state: Any) -> Message:
        if self.config.bounds is None:
            return Message("moments")
        return Message("moments", {"box_offset": state.offset, "box_scale": state.scale})

    def rows(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        if "box_offset" not in message.tensors:
            return X
        offset = message.tensors["box_offset"].to(X.device, X.dtype)
        return (X - offset) / message.tensors["box_scale"].to(X.device, X.dtype)

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("moments", context.terms.below_floor)
        tensors = feature_moments(X).tensors()
        return Message("moments", tensors, backing=client_backing(tensors, X.shape[0]))

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        moments = pooled_moments(replies, config)
        if getattr(config, "dp_mode", None) is not None:
            moments = private_moments(moments, config, len(replies), state)
        if float(moments.n_samples) == 0:
            raise ValueError("no client with data replied in the moments round.")
        scale = torch.ones_like(moments.mean)
        if config.standardize:
            offset, scale = standardization(moments, config.covariance_type)
            if config.bounds is None:
                state.offset, state.scale = offset, scale
            else:  # z = (u - offset) / scale with u = (x - box offset) / box scale
                state.offset = state.offset + state.scale * offset
                state.scale = state.scale * scale
        if config.prior_strength is not None:
            target = prior_target(moments.variance, scale, config.prior_scale)
            state.prior = CovariancePrior(config.prior_strength, target)
        return None, {"phase": "moments", "n_samples": float(moments.n_samples)}

    def broadcast(self, state: Any) -> tuple[dict[str, Tensor], dict[str, Scalar]]:
        if state.scale is None:
            return {}, {}
        return {"offset": state.offset, "scale": state.scale}, {}

    def view(self, X: Tensor, message: Message, context: ClientContext) -> Tensor:
        if "scale" not in message.tensors:
            return X
        offset = message.tensors["offset"].to(X.device, X.dtype)
        return (X - offset) / message.tensors["scale"].to(X.device, X.dtype)

    def finish(self, state: Any) -> None:
        if state.scale is not None and state.params is not None:  # back to the user's units
            state.params = affine_params(state.params, state.offset, state.scale)
