"""A detector's differential privacy: the noise its budget buys, the clients' policy, and the
record of what a fit spent (``docs/differential_privacy.md``).

An estimator that declares the ``DIFFERENTIAL_PRIVACY`` parameters (``dp_epsilon``,
``dp_delta``, ``dp_bounds``, ``dp_clip``, ``dp_mode``) plans its fit with :func:`dp_plan`:
the number of noisy releases the algorithm can make (every round that takes something from
the rows), the noise multiplier that spends at most ``dp_epsilon`` over them
(:func:`~fednovelty.federated.dp.calibrate_noise`), the algorithm's settings (what the
server knows) and each client's own :class:`~fednovelty.federated.dp.DPPolicy` (what the
client enforces: its noise, its clipping and a budget of exactly the planned releases,
after which it refuses). After the fit, :func:`privacy_record` is ``privacy_spent_``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fednovelty.federated.dp import DPPolicy, calibrate_noise, epsilon_spent


@dataclass(frozen=True)
class DPPlan:
    """One fit's differential privacy.

    Attributes:
        settings: the algorithm's settings (``dp_mode``, ``dp_noise_multiplier``,
            ``dp_clip``, ``bounds``).
        policy: every client's :class:`~fednovelty.federated.dp.DPPolicy`.
        releases: the most noisy releases the fit can make (the clients' budget).
        epsilon, delta: the budget.
    """

    settings: dict[str, Any]
    policy: DPPolicy
    releases: int
    epsilon: float
    delta: float


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
    seed: int,
    releases_for: Callable[[dict[str, Any]], int],
    standardized: bool = False,
) -> DPPlan | None:
    """The fit's differential privacy, or ``None`` when ``dp_epsilon`` is ``None``.

    Args:
        estimator: declares ``dp_epsilon``, ``dp_delta``, ``dp_bounds``, ``dp_clip``,
            ``dp_mode``.
        n_features: the width of the rows (of the bounds, and of ``"auto"`` clipping).
        n_clients: the clients that share the noise in ``"distributed"`` mode.
        seed: seeds the clients' noise.
        releases_for: settings -> the most noisy releases of the algorithm they build.
        standardized: the rounds work in z-scores (a private standardisation after the
            box), where ``dp_clip="auto"`` is ``1.5 * sqrt(n_features)``; else in the box's
            units, ``[-1, 1]`` per feature, where every row inside the bounds has norm at most
            ``sqrt(n_features)`` and ``"auto"`` is that (a larger radius would clip nothing
            more and only add noise).

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
    z = calibrate_noise(float(epsilon), delta, releases)
    spent = epsilon_spent(z, releases, delta)
    if spent > float(epsilon) * (1 + 1e-9):
        raise ValueError(
            f"the fit's {releases} noisy releases would spend epsilon={spent:.4g} at "
            f"delta={delta:g}, over the budget dp_epsilon={epsilon:g}; fewer rounds "
            "(max_iter, kmeans_rounds) or a larger budget."
        )
    policy = DPPolicy(z, clip, estimator.dp_mode, max(1, int(n_clients)), releases, seed)
    return DPPlan({**settings, "dp_noise_multiplier": z}, policy, releases, float(epsilon), delta)


def privacy_record(plan: DPPlan, rounds: Iterable[dict], private_kinds: Iterable[str]) -> dict:
    """``privacy_spent_``: what a fit under ``plan`` spent, from its ``history_`` records
    (``rounds``): the rounds of a kind with a private form (``private_kinds``) that ran
    bound every client's releases; epsilon is read from the accountant for them.

    ``epsilon`` holds against whoever sees the model or the sum of the clients' releases;
    ``epsilon_against_server`` against a server that sees each client's reply: the same in
    ``"local"`` mode, ``inf`` in ``"central"`` (the server sees clipped, un-noised sums) and
    that of ``z / sqrt(m)`` in ``"distributed"`` mode unless a secure sum hides the replies
    (``docs/secure_sums.md``; the in-process engine does not)."""
    kinds = set(private_kinds)
    made = sum(1 for r in rounds if r.get("kind") in kinds and not r.get("failed"))
    policy = plan.policy
    z = policy.noise_multiplier
    return {
        "epsilon": epsilon_spent(z, made, plan.delta),
        "epsilon_against_server": epsilon_spent(policy.client_noise, made, plan.delta),
        "delta": plan.delta,
        "epsilon_budget": plan.epsilon,
        "releases": made,
        "planned_releases": plan.releases,
        "noise_multiplier": z,
        "clip": plan.policy.clip_norm,
        "mode": plan.policy.mode,
        "accountant": "dp-accounting PLD, add/remove one row",
    }


def set_privacy_spent(estimator: Any, plan: DPPlan | None, algorithm: Any) -> None:
    """``estimator.privacy_spent_`` after a fit of the chained ``algorithm`` under ``plan``
    (:func:`privacy_record` of its ``history_`` over the kinds its steps release privately);
    removed after a fit without one."""
    if plan is None:
        if hasattr(estimator, "privacy_spent_"):
            del estimator.privacy_spent_
        return
    kinds = [k for step in algorithm.steps for k, spec in step.replies.items() if spec.private]
    estimator.privacy_spent_ = privacy_record(plan, estimator.history_, kinds)
