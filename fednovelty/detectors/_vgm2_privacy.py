"""A private VGM2 fit's plan (``VGM2Classifier`` with ``Privacy.epsilon``: VGM2, FedAvg and
Local).

What leaves a client is differentially private per client row: the markers or network by
DP-SGD (pairs of rows for VGM2), the row count by the gate's histogram noise;
:func:`vgm2_dp_plan` calibrates both for ``rounds`` replies of every client. Local releases
only the row count (its networks never leave the clients): no DP-SGD, the whole budget to
the count. VGM2 releases no row statistics: no public bounds, no row clipping.
"""

from __future__ import annotations

import math
import sys

from fednovelty.detectors._dp import DPPlan
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.federated.trust.dp_sgd import (
    DPSGDSettings,
    calibrate_learning,
    histogram_blocks,
    learning_epsilon,
)

__all__ = ["PRIVATE_HISTOGRAMS", "vgm2_dp_plan"]

#: what one round of a private fit spends of a client's budget: the row count's histogram
#: and ``steps`` DP-SGD steps (no summed statistics).
PRIVATE_HISTOGRAMS = 1


def vgm2_dp_plan(
    epsilon: float,
    delta: float,
    mode: str,
    rounds: int,
    steps: int,
    sample_rate: float,
    clip: float,
    learner_share: float,
    n_clients: int,
    batch_size: float = 32.0,
) -> DPPlan:
    """The differential privacy of a VGM2 fit of ``rounds`` rounds, each client answering
    every one (no amplification by the server's client sampling is claimed): per round one
    noisy row count (a one-bin histogram, noise ``HISTOGRAM_SHARE * z``) and ``steps``
    DP-SGD steps (rate ``sample_rate``, clip ``clip``; ``steps=0``: no network leaves the
    clients, no DP-SGD, ``z`` spends the whole budget). ``z`` and the steps' ``sigma``
    spend ``epsilon`` at ``delta`` together
    (:func:`~fednovelty.federated.trust.dp_sgd.calibrate_learning`, ``learner_share`` of the
    budget to the steps). The clients' policy has a budget of ``epsilon`` at ``delta`` and no
    row clipping (VGM2 sums no rows; DP-SGD clips the gradients); a step's noisy gradient
    sum is divided by the public ``batch_size``.

    Raises:
        ValueError: ``rounds`` below 1, ``steps`` below 0, or the budget out of range.
    """
    if rounds < 1 or steps < 0:
        raise ValueError(
            f"a private VGM2 fit needs rounds >= 1 and DP-SGD steps >= 0; got {rounds}, "
            f"{steps} (local_epochs >= 1)."
        )
    blocks = histogram_blocks(PRIVATE_HISTOGRAMS * rounds)
    total_steps = rounds * steps
    if total_steps == 0:  # only the row counts: Gaussian mechanisms compose to one of
        z = calibrate_noise(epsilon, delta, 1, 1) * math.sqrt(blocks)  # z / sqrt(blocks)
        spent = learning_epsilon(z, blocks, 0.0, 1.0, 0, delta)
    else:
        z, sigma = calibrate_learning(
            epsilon, delta, blocks, total_steps, sample_rate, 1.0 - learner_share
        )
        spent = learning_epsilon(z, blocks, sigma, sample_rate, total_steps, delta)
    if spent > epsilon * (1 + 1e-9):  # the accountant of record decides
        raise ValueError(f"the plan would spend epsilon={spent:.4g} > dp_epsilon={epsilon:g}.")
    policy = DPPolicy(
        z,
        sys.float_info.max,
        mode,
        max(1, int(n_clients)),
        epsilon=float(epsilon),
        delta=float(delta),
    )
    sgd = None
    if total_steps > 0:
        sgd = DPSGDSettings(
            sigma, float(clip), float(sample_rate), int(steps), expected_batch=float(batch_size)
        )
    return DPPlan({"dp_mode": mode}, policy, int(rounds), float(epsilon), float(delta), sgd)
