"""A subset of raw rows fitted on the server (``init_params="subset"``, DEM init 2).

**Raw rows leave the clients**: :class:`SubsetStep` warns when it begins, and only clients
whose privacy policy allows raw rows (``allow_raw_rows``) answer its second round.

Protocol (:class:`SubsetStep`, two rounds):

1. server: ``count``; client: its row count (a skipped reply below its privacy floor);
2. server: ``subset`` with a round seed and the fraction ``subset_size / total rows``
   (at least ``n_components`` rows in all); client: that fraction of its rows, drawn at
   random, and its row count;
3. server: a mixture fitted on the pooled rows (``fit_gmm``, seeded by the round) is the
   initial mixture.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    round_seed,
    server_generator,
    skipped_reply,
)
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec, declare
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.units import check_enough, row_count
from fednovelty.federated.trust.backing import client_backing
from fednovelty.mixture import fit_gmm


def check_subset(reply: Message, broadcast: Message) -> None:
    """At most as many rows as the client holds."""
    r, n = int(reply.tensors["rows"].shape[0]), float(reply.tensors["n_samples"])
    if r > n:
        raise InvalidReplyError(f"reply sends {r} rows of a client declaring {n:g}.")


COUNT_REPLY = ReplySpec(
    "count", shapes=lambda b, d: {"n_samples": ()}, backing={"n_samples": "client"}
)
SUBSET_REPLY = ReplySpec(
    "subset",
    shapes=lambda b, d: {"rows": ("r", d), "n_samples": ()},
    checks=(check_subset,),
    backing={"rows": "client", "n_samples": "client"},
)


class SubsetStep(Step):
    """Row counts, then a random ``subset_size`` rows in all; the server fits a mixture on
    them (raw rows leave the clients: only clients whose policy allows it answer)."""

    kinds = ("count", "subset")
    replies = declare(COUNT_REPLY, SUBSET_REPLY)
    max_rounds = 2

    def begin(self, state: Any) -> str:
        warnings.warn(
            "init_params='subset' sends raw rows of every client to the server; use "
            "'kmeans' (the default) where data must stay on the clients.",
            UserWarning,
            stacklevel=2,
        )
        return "count"

    def configure(self, state: Any) -> Message:
        if state.phase == "count":
            return Message("count")
        seed = round_seed(self.config, state)
        return Message("subset", scalars={"fraction": state.subset_fraction, "seed": seed})

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        if message.kind == "count":
            if not terms.releases(X.shape[0]):
                return skipped_reply("count", terms.below_floor)
            n_rows = {"n_samples": row_count(X)}
            return Message("count", n_rows, backing=client_backing(n_rows, X.shape[0]))
        if not terms.allow_raw_rows:
            return skipped_reply(
                "subset", "the client's privacy policy does not allow raw rows (allow_raw_rows)"
            )
        n = X.shape[0]
        m = min(n, math.ceil(float(message.scalars["fraction"]) * n))
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        index = torch.randperm(n, generator=generator)[:m].to(X.device)
        tensors = {"rows": X[index], "n_samples": row_count(X)}
        # raw rows leave only by the client's own consent (allow_raw_rows, checked above);
        # the floor then asks for the client's rows behind the round, not behind each row
        return Message("subset", tensors, backing=client_backing(tensors, n))

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[str | None, dict]:
        config = self.config
        if state.phase == "count":
            total = sum(float(m.tensors["n_samples"]) for m in replies.values())
            check_enough(total, config.n_components)
            state.subset_fraction = min(1.0, max(config.subset_size, config.n_components) / total)
            return "subset", {"phase": "count", "n_samples": total}
        rows = torch.cat([m.tensors["rows"] for m in replies.values()])
        rows = rows.to(config.device, config.dtype)
        k = config.n_components
        if rows.shape[0] < k:
            raise ValueError(f"the subset has {rows.shape[0]} rows, fewer than n_components={k}.")
        result = fit_gmm(
            rows,
            k,
            covariance_type=config.covariance_type,
            reg_covar=config.reg_covar,
            tol=config.tol,
            max_iter=config.max_iter,
            generator=server_generator(config, state),
            prior=state.prior,
        )
        state.params = result.params
        return None, {"phase": "subset", "rows_shared": int(rows.shape[0])}
