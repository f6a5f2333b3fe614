"""A detector's differential privacy: the noise its budget buys, the clients' policy, and the
record of what a fit spent (``docs/differential_privacy.md``).

An estimator that declares the ``DIFFERENTIAL_PRIVACY`` parameters (``dp_epsilon``,
``dp_delta``, ``dp_bounds``, ``dp_clip``, ``dp_mode``) plans its fit with :func:`dp_plan`:
the number of noisy releases the algorithm can make (every round that takes something from
the rows), the noise multiplier that spends at most ``dp_epsilon`` over them
(:func:`~fednovelty.federated.dp.calibrate_noise`), the algorithm's settings (what the
server knows) and each client's own :class:`~fednovelty.federated.dp.DPPolicy` (what the
client enforces: its noise, its clipping and a budget of exactly the planned releases,
after which it refuses). With learners that leave the clients (FedGMM's joint model) the
plan also buys their DP-SGD (:mod:`fednovelty.federated.dp_sgd`): the statistics' ``z`` and
the steps' ``sigma`` spend the budget together, split by ``dp_learner_share``. After the
fit, :func:`privacy_record` is ``privacy_spent_``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednovelty.federated.dp import DPPolicy, calibrate_noise, epsilon_spent
from fednovelty.federated.dp_sgd import (
    DPSGDSettings,
    calibrate_learning,
    learning_epsilon,
    release_blocks,
)


@dataclass(frozen=True)
class RoundCost:
    """What one round of a private kind spends of every client's budget.

    Attributes:
        releases: releases of summed statistics (3 Gaussian blocks each).
        histograms: released histograms of responsibilities (e.g. joint counts).
        sgd_steps: DP-SGD steps of the learners.
    """

    releases: int = 1
    histograms: int = 0
    sgd_steps: int = 0


@dataclass(frozen=True)
class LearningPlan:
    """The learners' part of a plan: ``rounds`` rounds of ``steps`` DP-SGD steps each
    (sample rate ``sample_rate``, clip ``clip``, public divisor ``batch``: the estimator's
    ``batch_size``) and one histogram each."""

    rounds: int
    steps: int
    sample_rate: float
    clip: float
    batch: float = 32.0


@dataclass(frozen=True)
class DPPlan:
    """One fit's differential privacy.

    Attributes:
        settings: the algorithm's settings (``dp_mode``, ``dp_noise_multiplier``,
            ``dp_clip``, ``bounds``).
        policy: every client's :class:`~fednovelty.federated.dp.DPPolicy`.
        releases: the most noisy releases the fit can make (the clients' budget).
        epsilon, delta: the budget.
        sgd: every client's DP-SGD for its learners (``None``: none leave the clients).
    """

    settings: dict[str, Any]
    policy: DPPolicy
    releases: int
    epsilon: float
    delta: float
    sgd: DPSGDSettings | None = None


def public_bounds(bounds: Any, n_features: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``dp_bounds`` as ``(low, high)`` tuples of ``n_features`` floats.

    Raises:
        ValueError: missing, or not two rows of ``n_features`` finite values with
            ``low < high``; the message says what to pass.
    """
    if bounds is None:
        raise ValueError(
            "dp_epsilon needs public feature bounds: pass dp_bounds=(low, high), two rows of "
            f"{n_features} values known without looking at the rows (a sensor's range, a "
            "questionnaire's scale); bounds taken from the rows would leak them."
        )
    try:
        array = np.asarray(bounds, dtype=np.float64)
    except (TypeError, ValueError):
        array = None
    if array is None or array.shape != (2, n_features) or not np.isfinite(array).all():
        shape = None if array is None else array.shape
        raise ValueError(
            f"dp_bounds must be (low, high) with {n_features} finite values each (shape (2, "
            f"{n_features})); got shape {shape}."
        )
    if not bool((array[0] < array[1]).all()):
        raise ValueError("dp_bounds must have low < high for every feature.")
    return tuple(array[0].tolist()), tuple(array[1].tolist())


def dp_plan(
    estimator: Any,
    n_features: int,
    n_clients: int,
    releases_for: Callable[[dict[str, Any]], int],
    standardized: bool = False,
    learning: LearningPlan | None = None,
    histograms: int = 0,
) -> DPPlan | None:
    """The fit's differential privacy, or ``None`` when ``dp_epsilon`` is ``None``.

    Args:
        estimator: declares ``dp_epsilon``, ``dp_delta``, ``dp_bounds``, ``dp_clip``,
            ``dp_mode``.
        n_features: the width of the rows (of the bounds, and of ``"auto"`` clipping).
        n_clients: the clients that share the noise in ``"distributed"`` mode.
        releases_for: settings -> the most noisy releases of the algorithm they build.
        standardized: the rounds work in z-scores (a private standardisation after the
            box), where ``dp_clip="auto"`` is ``1.5 * sqrt(n_features)``; else in the box's
            units, ``[-1, 1]`` per feature, where every row inside the bounds has norm at most
            ``sqrt(n_features)`` and ``"auto"`` is that (a larger radius would clip nothing
            more and only add noise).
        learning: the learners' DP-SGD, when they leave the clients: their rounds (among
            the releases, each with one histogram) and steps; ``z`` and ``sigma`` are then
            calibrated together (:func:`~fednovelty.federated.dp_sgd.calibrate_learning`,
            ``dp_learner_share`` of the budget to the learners).
        histograms: histograms of responsibilities released when no learners leave (a
            joint model's joint counts, one per round), among the releases: each costs
            :func:`~fednovelty.federated.dp_sgd.histogram_blocks` of a release, and the
            clients' ledgers charge it.

    Raises:
        ValueError: bad ``dp_bounds``; a plan that would spend more than ``dp_epsilon``.
    """
    epsilon = getattr(estimator, "dp_epsilon", None)
    if epsilon is None:
        return None
    delta = float(estimator.dp_delta)
    bounds = public_bounds(estimator.dp_bounds, n_features)
    if estimator.dp_clip == "auto":
        clip = (1.5 if standardized else 1.0) * math.sqrt(n_features)
    else:
        clip = float(estimator.dp_clip)
    settings = {
        "dp_mode": estimator.dp_mode,
        "dp_noise_multiplier": 0.0,
        "dp_clip": clip,
        "bounds": bounds,
    }
    releases = int(releases_for(settings))
    sgd = None
    if learning is None or learning.rounds * learning.steps == 0:
        blocks = release_blocks(releases, int(histograms))
        z = calibrate_noise(float(epsilon), delta, 1, blocks)
        spent = epsilon_spent(z, 1, delta, blocks)
    else:
        blocks = release_blocks(releases, learning.rounds)
        steps, rate = learning.rounds * learning.steps, learning.sample_rate
        share = 1.0 - float(estimator.dp_learner_share)
        z, sigma = calibrate_learning(float(epsilon), delta, blocks, steps, rate, share)
        spent = learning_epsilon(z, blocks, sigma, rate, steps, delta)
        sgd = DPSGDSettings(
            sigma, learning.clip, rate, learning.steps, expected_batch=float(learning.batch)
        )
    if spent > float(epsilon) * (1 + 1e-9):
        raise ValueError(
            f"the fit's {releases} noisy releases would spend epsilon={spent:.4g} at "
            f"delta={delta:g}, over the budget dp_epsilon={epsilon:g}; fewer rounds "
            "(max_iter, kmeans_rounds) or a larger budget."
        )
    policy = DPPolicy(
        z, clip, estimator.dp_mode, max(1, int(n_clients)), epsilon=float(epsilon), delta=delta
    )
    settings["dp_noise_multiplier"] = z
    return DPPlan(settings, policy, releases, float(epsilon), delta, sgd)


def privacy_record(plan: DPPlan, rounds: Iterable[dict], costs: Mapping[str, RoundCost]) -> dict:
    """``privacy_spent_``: what a fit under ``plan`` spent, from its ``history_`` records
    (``rounds``): every round of a private kind that ran spent its ``costs[kind]`` of every
    client's budget; epsilon is read from the accountant for the total.

    ``epsilon`` holds against whoever sees the model or the sum of the clients' releases;
    ``epsilon_against_server`` against a server that sees each client's reply: the same in
    ``"local"`` mode, ``inf`` in ``"central"`` (the server sees clipped, un-noised sums) and
    that of ``z / sqrt(m)`` in ``"distributed"`` mode unless a secure sum hides the replies
    (``docs/secure_sums.md``; the in-process engine does not). DP-SGD's noise is the
    client's own in every mode."""
    total = {"releases": 0, "histograms": 0, "sgd_steps": 0}
    for record in rounds:
        cost = costs.get(record.get("kind"))
        if cost is not None and not record.get("failed"):
            for name in total:
                total[name] += getattr(cost, name)
    policy, delta = plan.policy, plan.delta
    blocks = release_blocks(total["releases"], total["histograms"])
    steps = total["sgd_steps"]
    sigma, rate = (
        (0.0, 1.0) if plan.sgd is None else (plan.sgd.noise_multiplier, plan.sgd.sample_rate)
    )

    def epsilon(z: float) -> float:
        return learning_epsilon(z, blocks, sigma, rate, steps, delta)

    record = {
        "epsilon": epsilon(policy.noise_multiplier),
        "epsilon_against_server": epsilon(policy.client_noise),
        "delta": delta,
        "epsilon_budget": plan.epsilon,
        "releases": total["releases"],
        "planned_releases": plan.releases,
        "noise_multiplier": policy.noise_multiplier,
        "clip": policy.clip_norm,
        "mode": policy.mode,
        "accountant": "dp-accounting PLD, add/remove one row",
    }
    if steps:
        record.update(sgd_steps=steps, sgd_noise_multiplier=sigma, sample_rate=rate)
    return record


def round_costs(algorithm: Any, plan: DPPlan) -> dict[str, RoundCost]:
    """Each private kind of the chained ``algorithm`` and what one of its rounds spends
    under ``plan``: one release (none for a ``"parts"`` reply, which releases no
    statistics), one histogram per declared ``"histogram"`` part, and the plan's DP-SGD
    steps where learners are declared ``"dp_sgd"``."""
    costs = {}
    steps = 0 if plan.sgd is None else plan.sgd.steps
    for step in algorithm.steps:
        for kind, spec in step.replies.items():
            if not spec.private:
                continue
            parts = list(spec.private_parts.values())
            releases = 0 if spec.private == "parts" else 1
            costs[kind] = RoundCost(
                releases, parts.count("histogram"), steps if "dp_sgd" in parts else 0
            )
    return costs


def set_privacy_spent(estimator: Any, plan: DPPlan | None, algorithm: Any) -> None:
    """``estimator.privacy_spent_`` after a fit of the chained ``algorithm`` under ``plan``
    (:func:`privacy_record` of its ``history_`` over the kinds its steps release privately);
    removed after a fit without one."""
    if plan is None:
        if hasattr(estimator, "privacy_spent_"):
            del estimator.privacy_spent_
        return
    costs = round_costs(algorithm, plan)
    estimator.privacy_spent_ = privacy_record(plan, estimator.history_, costs)
