"""k-FED seeds (``init_params="kmeans"``, DEM init 3): local centroids pooled on the server.

Protocol (:class:`CentroidsStep`, one round; federated Lloyd rounds follow,
:class:`~fednovelty.federated.init.assign.AssignStep`):

1. server: ``centroids`` with a round seed and ``n_clusters = n_components``;
2. client: k-means on its rows into at most ``min(n_components, max_clusters, n_rows //
   min_rows)`` clusters (none: a skipped reply), the rows of a cluster under ``min_rows``
   joining the nearest larger one; it replies the centroids (k, n_features), their row
   counts (k,) and its row count;
3. server: with a robust ``aggregation``, the clients whose centroids are outlying left
   out (:func:`robust_centroid_replies`); the pooled centroids clustered by weighted
   k-means++ and Lloyd into ``n_components`` centres, ``state.centers``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import pool_centroids
from fednovelty.federated.core.base import (
    ClientContext,
    Message,
    client_generator,
    round_seed,
    server_generator,
    skipped_reply,
)
from fednovelty.federated.core.declarations import (
    InvalidReplyError,
    ReplySpec,
    components_limit,
    components_setting,
    declare,
)
from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.units import row_count
from fednovelty.federated.trust.backing import client_backing
from fednovelty.federated.trust.floors import merge_small_clusters
from fednovelty.federated.trust.reply_form import expectation
from fednovelty.federated.trust.robust import coordinate_median, outlying_points
from fednovelty.federated.trust.value_checks import RTOL
from fednovelty.mixture import kmeans


def check_centroids(reply: Message, broadcast: Message) -> None:
    """At most the ``n_clusters`` centroids the round asked for, their counts adding up to
    the row count."""
    k, asked = int(reply.tensors["centers"].shape[0]), int(expectation(broadcast, "n_clusters"))
    if k > asked:
        raise InvalidReplyError(f"reply has {k} centroids; at most {asked} asked.")
    total, n = float(reply.tensors["counts"].sum()), float(reply.tensors["n_samples"])
    if abs(total - n) > RTOL * max(n, 1.0):
        raise InvalidReplyError(f"centroid counts add up to {total:g}, not the {n:g} rows sent.")


CENTROIDS_REPLY = ReplySpec(
    "centroids",
    shapes=lambda b, d: {"centers": ("k", d), "counts": ("k",), "n_samples": ()},
    checks=(check_centroids,),
    backing={"centers": "components", "counts": "components", "n_samples": "client"},
    limit=components_limit,
    box="means",
    points=("centers",),
    components=components_setting,
)


def robust_centroid_replies(replies: dict[int, Message], aggregation: str) -> dict[int, Message]:
    """The ``centroids`` replies a robust ``aggregation`` keeps (``"sum"``: all).

    Each client is summarised by the count-weighted mean of its centroids, (n_features,);
    the clients whose summary :func:`~fednovelty.federated.trust.robust.outlying_points` calls
    outlying are left out, the spread floored at the median client's own spread of its
    centroids (clients of different clusters are not outlying). One client's centroid far
    from every row (e.g. at 1e133) would otherwise seed a centre that no row joins, and
    the first M-step would fail. Only the seeds are affected: every client's rows still
    join the Lloyd rounds."""
    ids = [c for c, m in replies.items() if m.tensors["centers"].shape[0] > 0]
    if aggregation == "sum" or len(ids) < 3:
        return replies
    summaries, spreads = [], []
    for c in ids:
        t = replies[c].tensors
        centers = t["centers"].double().cpu()
        weights = t["counts"].double().cpu().clamp_min(0) + 1e-12
        weights = weights / weights.sum()
        mean = weights @ centers
        summaries.append(mean)
        spreads.append((weights @ (centers - mean).square()).sqrt())
    floor = coordinate_median(torch.nan_to_num(torch.stack(spreads), nan=math.inf))
    out = outlying_points(torch.stack(summaries), floor)
    left_out = {c for c, o in zip(ids, out.tolist(), strict=True) if o}
    return {c: m for c, m in replies.items() if c not in left_out}


def too_few_centroids(n_components: int, n_centroids: int, n_rows: int) -> str:
    """The refusal of a start whose K is exact (no ``FEWER_CENTROIDS_OK``) when the clients
    sent ``n_centroids`` < ``n_components`` centroids from ``n_rows`` rows in all."""
    fits = f"n_components={n_centroids} or fewer, " if n_centroids else ""
    return (
        f"n_components={n_components} needs {n_components} k-means centroids from the "
        f"clients, and they sent {n_centroids} from the {n_rows} row(s) they reported (a client "
        "forms at most n_rows // min_rows clusters under its privacy floor, none below it). "
        f"Pass {fits}give the small clients more rows, or lower their floor "
        "(Privacy(min_rows=...)) only where their privacy allows it."
    )


class CentroidsStep(Step):
    """k-FED: local k-means centroids, pooled and clustered by weighted k-means++ and Lloyd
    on the server into ``n_components`` centres (when fewer centroids arrive and the config's
    ``FEWER_CENTROIDS_OK``, K an upper bound: into half as many centres as centroids; the
    Lloyd rounds merge them further where the clients' floors back none,
    :meth:`~fednovelty.federated.init.assign.AssignStep.all_skipped`)."""

    kinds = ("centroids",)
    replies = declare(CENTROIDS_REPLY)
    streams = True  # k-means of a row source runs pass by pass (mixture.kmeans_rows)

    def configure(self, state: Any) -> Message:
        return Message(
            "centroids",
            scalars={"seed": round_seed(self.config, state)},
            expect={"n_clusters": self.config.n_components},
        )

    def client_step(self, X: Tensor, message: Message, context: ClientContext) -> Message:
        terms = context.terms
        k = terms.cluster_bound(self.config.n_components, X.shape[0])
        if k == 0:
            return skipped_reply("centroids", terms.below_floor)
        generator = client_generator(int(message.scalars["seed"]), context.client_id)
        centers, labels = kmeans(X, k, generator=generator)
        centers, counts = merge_small_clusters(X, labels, centers, terms.min_rows)
        tensors = {"centers": centers, "counts": counts, "n_samples": row_count(X)}
        # each centroid is the mean of its (merged) cluster's rows
        backing = {"centers": counts, "counts": counts}
        backing.update(client_backing(["n_samples"], X.shape[0]))
        return Message("centroids", tensors, backing=backing)

    def server_step(self, state: Any, replies: dict[int, Message]) -> tuple[None, dict]:
        config = self.config
        screened = robust_centroid_replies(replies, config.aggregation)
        if sum(int(m.tensors["centers"].shape[0]) for m in screened.values()) >= (
            config.n_components
        ):
            replies = screened  # else too few seeds remain: small honest clients, kept
        centers, counts = pool_centroids(replies.values())
        n_centers = config.n_components
        if config.FEWER_CENTROIDS_OK and 0 < centers.shape[0] < n_centers:
            # small clients under their privacy floors: each centre pools about two of their
            # centroids, so that after Lloyd's reassignment it still holds min_rows rows of
            # some client (one centroid a centre leaves every centre under the floor often)
            n_centers = (centers.shape[0] + 1) // 2
        if centers.shape[0] < n_centers:
            n_rows = int(sum(float(m.tensors["n_samples"]) for m in replies.values()))
            raise ValueError(too_few_centroids(config.n_components, centers.shape[0], n_rows))
        centers = centers.to(config.device, config.dtype)
        counts = counts.to(config.device, config.dtype)
        state.centers, _ = kmeans(
            centers,
            n_centers,
            generator=server_generator(config, state),
            sample_weight=counts,
        )
        return None, {"phase": "centroids", "n_centroids": int(centers.shape[0])}
