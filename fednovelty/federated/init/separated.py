"""Centres far apart in the clients' range (``init_params="separated"``, DEM init 1).

Protocol (:class:`RangeStep`, one round; one federated Lloyd round follows,
:class:`~fednovelty.federated.init.assign.AssignStep`):

1. server: ``range``;
2. client: each feature's low and high end, each the mean of its ``min_rows`` extreme
   values (a skipped reply below its privacy floor), and its row count;
3. server: the ends merged into one box; ``n_components`` centres far apart in it
   (:func:`separated_centers`, seeded by the round), ``state.centers``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import merge_ranges
from fednovelty.federated.core.base import ClientContext, Message, round_seed, skipped_reply
from fednovelty.federated.core.declarations import ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.units import row_count
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.floors import trimmed_range

RANGE_REPLY = ReplySpec(
    "range",
    shapes=lambda b, d: {"min": (d,), "max": (d,), "n_samples": ()},
    backing={"min": "client", "max": "client", "n_samples": "client"},
    box="means",
    points=("min", "max"),
)


def separated_centers(low: Tensor, high: Tensor, n_centers: int, seed: int) -> Tensor:
    """``n_centers`` points far apart in the box ``[low, high]`` (each (n_features,)).

    Greedy max-min selection over a scrambled Sobol set, starting at the point nearest the
    box centre. Returns shape (n_centers, n_features).
    """
    d = low.shape[0]
    engine = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed)
    unit = engine.draw(max(256, 64 * n_centers), dtype=torch.float64).to(low.device, low.dtype)
    candidates = low + unit * (high - low)
    middle = (low + high) / 2
    chosen = [int((candidates - middle).square().sum(1).argmin())]
    nearest = (candidates - candidates[chosen[0]]).square().sum(1)
    for _ in range(1, n_centers):
        chosen.append(int(nearest.argmax()))
        nearest = torch.minimum(nearest, (candidates - candidates[chosen[-1]]).square().sum(1))
    return candidates[chosen]


class RangeStep(Step):
    """Feature ranges merged on the server; ``n_components`` centres far apart in the box."""

    kinds = ("range",)
    replies = declare(RANGE_REPLY)

    def configure(self, state: Any) -> Message:
        return Message("range")

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        if not context.terms.releases(X.shape[0]):
            return skipped_reply("range", context.terms.below_floor)
        low, high = trimmed_range(X, context.terms.min_rows)
        # each end is the mean of the min_rows extreme values of its feature
        backing = client_backing(["min", "max"], context.terms.min_rows)
        backing.update(client_backing(["n_samples"], X.shape[0]))
        tensors = {"min": low, "max": high, "n_samples": row_count(X)}
        return Message("range", tensors, backing=backing)

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        low, high = merge_ranges(replies.values())
        low, high = low.to(config.device, config.dtype), high.to(config.device, config.dtype)
        seed = round_seed(config, state)
        state.centers = separated_centers(low, high, config.n_components, seed)
        return None, {"phase": "range"}
