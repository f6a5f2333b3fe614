"""Robust aggregation of private replies: the coordinate-wise trimmed sum.

Under differential privacy (``dp_mode``) a robust ``aggregation="trimmed"`` combines the
clients' statistics by :func:`~fednovelty.federated.trust.robust.trimmed_sum_stats`: every entry of
every block is the sum of the clients' values less the ``floor(trim * C)`` lowest and
highest, taken about the clipping centre (the origin of the working units). There one row
moves a client's counts, first and second moments by at most 1, ``B`` and ``B**2`` in L2,
and the trimmed sum by no more: in ``"central"`` mode the trusted server's noise, calibrated
for the plain sum, keeps its guarantee; in ``"local"`` mode every reply is private already
and any combination is post-processing (``docs/differential_privacy.md``, robust
aggregation of private replies). ``"distributed"`` mode refuses it
(:class:`~fednovelty.federated.init.settings.PrivateSettings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from fednovelty.federated.core.aggregate import STATS_FIELDS, released
from fednovelty.federated.core.base import Message
from fednovelty.federated.trust.dp_mechanism import recentre_stats
from fednovelty.federated.trust.robust import trimmed_sum_stats
from fednovelty.mixture import FeatureMoments
from fednovelty.mixture.stats import SufficientStats

__all__ = ["moments_stats", "private_trimmed_moments", "private_trimmed_stats"]


def private_trimmed_stats(
    replies: Mapping[int, Message], shift: Tensor, covariance_type: str, trim: float
) -> SufficientStats:
    """The trimmed sum of the clients' private statistics (clipped in ``"central"`` mode,
    noisy in ``"local"``), taken about the clipping centre and returned about ``shift``.

    Args:
        replies: client id -> a statistics reply about ``shift`` (skipped ones ignored).
        shift: (n_features,), in the server's dtype and device.
        covariance_type: of the statistics. trim: share of clients trimmed at each end.

    Returns:
        ``SufficientStats`` about ``shift`` of ``C - 2 floor(trim * C)`` clients' worth of
        rows.

    Raises:
        ValueError: no reply carries statistics.
    """
    origin = torch.zeros_like(shift)
    per_client = []
    for reply in released(replies.values()):
        t = {name: reply.tensors[name].to(shift) for name in STATS_FIELDS}
        t["sums"], t["second"] = recentre_stats(
            t["counts"], t["sums"], t["second"], shift, covariance_type
        )
        per_client.append(SufficientStats(shift=origin, covariance_type=covariance_type, **t))
    if not per_client:
        raise ValueError("no client with statistics replied in this round.")
    stats = trimmed_sum_stats(per_client, trim)
    sums, second = recentre_stats(stats.counts, stats.sums, stats.second, -shift, covariance_type)
    return replace(stats, sums=sums, second=second, shift=shift)


def moments_stats(moments: FeatureMoments) -> SufficientStats:
    """Feature moments as the ``diag`` statistics of one component about the origin: count
    ``n`` (1,), sum ``n * mean`` (1, d), sum of squares ``m2 + n * mean**2`` (1, d)."""
    n = moments.n_samples.reshape(())
    return SufficientStats(
        counts=n.reshape(1),
        sums=(n * moments.mean).unsqueeze(0),
        second=(moments.m2 + n * moments.mean.square()).unsqueeze(0),
        shift=torch.zeros_like(moments.mean),
        log_likelihood=n.new_zeros(()),
        n_samples=n,
        covariance_type="diag",
    )


def private_trimmed_moments(parts: Sequence[FeatureMoments], trim: float) -> FeatureMoments:
    """A private ``moments`` round's pooled moments: the trimmed sum of the clients' counts,
    sums and sums of squares about the clipping centre (:func:`moments_stats`), as moments
    (each (n_features,) beside the count)."""
    stats = trimmed_sum_stats([moments_stats(p) for p in parts], trim)
    n, total = stats.counts[0], stats.sums[0]
    return FeatureMoments(n, total / n, stats.second[0] - total * total / n)
