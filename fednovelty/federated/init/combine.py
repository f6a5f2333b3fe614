"""How a server combines the clients' summed statistics under the trust options.

:func:`combine_stats` is the one place every statistics round (Lloyd assignment, EM,
variational Bayes, a stream's window) turns replies into the M-step's statistics: the
plain sum, the robust ``aggregation="trimmed"`` combination, or under ``dp_mode`` the noisy
sum (trimmed where asked) made usable by :func:`private_stats`, post-processing that costs
no privacy (``docs/differential_privacy.md``).
"""

from __future__ import annotations

import math
from typing import Any

from torch import Tensor

from fednovelty.federated.core.aggregate import stats_from_message, sum_stats
from fednovelty.federated.core.base import Message
from fednovelty.federated.trust.dp import server_noise
from fednovelty.federated.trust.dp_mechanism import private_sum
from fednovelty.federated.trust.dp_postprocess import plausible_stats
from fednovelty.federated.trust.dp_split import block_multipliers
from fednovelty.federated.trust.private_robust import private_trimmed_stats
from fednovelty.federated.trust.robust import robust_stats
from fednovelty.mixture.stats import SufficientStats


def combine_stats(
    replies: dict[int, Message], shift: Tensor, config: Any, state: Any = None
) -> SufficientStats:
    """The M-step's statistics from the clients' replies about ``shift`` (n_features,): the
    plain sum, or the robust combination ``aggregation="trimmed"``
    (:func:`~fednovelty.federated.trust.robust.robust_stats`). With the clients' noisy statistics
    (``config.dp_mode``) the sum, or under ``"trimmed"`` the trimmed sum
    (:func:`~fednovelty.federated.trust.private_robust.private_trimmed_stats`), then the trusted
    server's noise in ``"central"`` mode (drawn after ``state.rounds``) and
    :func:`private_stats`."""
    if getattr(config, "dp_mode", None) is not None:
        if config.aggregation == "trimmed":
            stats = private_trimmed_stats(replies, shift, config.covariance_type, config.trim)
        else:
            stats = sum_stats(replies.values(), shift, config.covariance_type, noisy=True)
        return private_stats(stats, config, len(replies), state)
    if config.aggregation == "sum":
        return sum_stats(replies.values(), shift, config.covariance_type)
    ct = config.covariance_type
    per_client = {c: stats_from_message(m, shift, ct) for c, m in replies.items()}
    return robust_stats(per_client, config.trim)


def private_stats(
    stats: SufficientStats, config: Any, n_replies: int, state: Any = None
) -> SufficientStats:
    """Summed noisy statistics made usable (post-processing, no privacy cost): in
    ``"central"`` mode first the server's noise (``dp_noise_multiplier`` times each block's
    sensitivity); then :func:`~.dp_postprocess.plausible_stats` with counts at
    least twice the noise the summed counts carry (a component no row backs keeps a small
    weight instead of a negative one) and variances at least ``1e-4 * dp_clip**2`` and the
    noise's spectral norm on each covariance."""
    z, bound = config.dp_noise_multiplier, config.dp_clip
    if config.dp_mode == "central":
        source = server_noise(config, 0 if state is None else state.rounds)
        stats = private_sum(stats, z, bound, source)
    share = block_multipliers(_spread(config, n_replies))
    return plausible_stats(
        stats,
        bound,
        count_floor(config, n_replies),
        1e-4 * bound**2,
        share["second"] * bound**2,
    )


def _spread(config: Any, n_replies: int) -> float:
    """The noise multiplier of the summed statistics: ``z``, times ``sqrt(n_replies)`` when
    every client added its own noise (``"local"``)."""
    z = config.dp_noise_multiplier
    return z * (math.sqrt(n_replies) if config.dp_mode == "local" else 1.0)


def count_floor(config: Any, n_replies: int) -> float:
    """The least count :func:`private_stats` leaves a component under ``dp_mode``: twice the
    noise the summed counts carry (at least 1); 0 without differential privacy. A count at
    this floor is noise: no rows may back it."""
    if getattr(config, "dp_mode", None) is None:
        return 0.0
    return max(1.0, 2 * block_multipliers(_spread(config, n_replies))["counts"])
