"""A Fed-CAM fit's differential privacy (``ClusteredFLClassifier`` with ``Privacy.epsilon``).

Every client trains the models it sends by DP-SGD and picks its cluster privately (IFCA,
IFCA-CAM: a report-noisy-min over clipped losses; FeSEM: from the model it released);
:func:`private_plan` calibrates both to the budget (:func:`sgd_noise` when only the steps
spend it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from fednovelty.detectors._dp import DPPlan, public_bounds
from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_step import CLUSTER_KIND
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_sgd import (
    DPSGDSettings,
    calibrate_learning,
    histogram_blocks,
    learning_epsilon,
)

__all__ = ["private_plan", "sgd_noise"]


def sgd_noise(epsilon: float, delta: float, steps: int, sample_rate: float) -> float:
    """The smallest DP-SGD multiplier ``sigma`` (within 0.2 %) whose ``steps``
    Poisson-subsampled Gaussian steps spend at most ``epsilon`` at ``delta``
    (:func:`~fednovelty.federated.trust.dp_sgd.learning_epsilon` with no statistics), by
    bisection; the accountant of record checks the result."""

    def spent(sigma: float, resolution: float = 1e-3) -> float:
        return learning_epsilon(0.0, 0, sigma, sample_rate, steps, delta, resolution)

    low, high = 0.5, 1.0
    while spent(high) > epsilon:
        low, high = high, high * 2
    while spent(low) <= epsilon and low > 0.05:
        high, low = low, low / 2
    while high - low > 2e-3 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if spent(middle) > epsilon else (low, middle)
    while spent(high, 1e-4) > epsilon:
        high *= 1.002
    return high


def private_plan(estimator: Any, algorithm: ClusteredAlgorithm, n_clients: int) -> DPPlan | None:
    """A Fed-CAM fit's differential privacy under the estimator's ``privacy.epsilon``, or
    ``None`` without it.

    Every round trains the models it sends by ``local_steps`` DP-SGD steps (rate
    ``Privacy.sample_rate``, clip ``Privacy.sgd_clip``); IFCA's and IFCA-CAM's clustered rounds also
    make one noisy cluster choice each (:meth:`ClusteredAlgorithm.private_choices`, the cost of a
    released histogram of multiplier ``z``). With choices, ``z`` and the steps' ``sigma``
    spend the budget together (``learner_share`` of ``mu**2`` to the steps:
    :func:`~fednovelty.federated.trust.dp_sgd.calibrate_learning`); without, the steps spend it
    all (:func:`sgd_noise`, ``z = 0``). Each client's budget is one noisy release a round;
    no statistics are released. The rows are mapped to the public box ``Privacy.bounds`` and
    clipped to ``Privacy.clip`` (``"auto"``: ``sqrt(n_features)``, which clips no row inside the
    bounds); the models' guarantee does not rest on that clipping.

    Raises:
        ValueError: bad ``Privacy.bounds``; settings without a private form (a robust
            ``aggregation``, a ``client_weight_cap``), before any calibration.
    """
    privacy = estimator._option("privacy")
    epsilon = privacy.epsilon
    if epsilon is None:
        return None
    config = algorithm.config
    d, epsilon, delta = config.n_features, float(epsilon), float(privacy.delta)
    bounds = public_bounds(privacy.bounds, d)
    clip = math.sqrt(d) if privacy.clip == "auto" else float(privacy.clip)
    replace(config, dp_mode="local", dp_clip=clip, bounds=bounds)  # refused before calibrating
    rate, steps = float(privacy.sample_rate), int(config.local_steps)
    rounds = config.rounds
    choices = algorithm.private_choices(CLUSTER_KIND) * (rounds - config.warmup_rounds)
    blocks, total = histogram_blocks(choices), rounds * steps
    if choices:
        share = 1.0 - float(privacy.learner_share)
        z, sigma = calibrate_learning(epsilon, delta, blocks, total, rate, share)
    else:
        z, sigma = 0.0, sgd_noise(epsilon, delta, total, rate)
    policy = DPPolicy(z, clip, "local", max(1, int(n_clients)), epsilon=epsilon, delta=delta)
    settings = {"dp_mode": "local", "dp_noise_multiplier": z, "dp_clip": clip, "bounds": bounds}
    # public: the divisor of a step's noisy sum
    batch = float(estimator._option("training").batch_size)
    sgd = DPSGDSettings(sigma, float(privacy.sgd_clip), rate, steps, expected_batch=batch)
    return DPPlan(settings, policy, 0, epsilon, delta, sgd)
