"""A detector's differential privacy: the noise its budget buys, the clients' policy, and the
record of what a fit spent (``docs/differential_privacy.md``).

An estimator that reads differential privacy from its ``privacy`` option
(:class:`~fednovelty.detectors.options.Privacy`: ``epsilon``, ``delta``, ``bounds``,
``clip``, ``mode``) plans its fit with :func:`dp_plan`: the number of noisy releases the
algorithm can make (every round that takes something from the rows), the noise multiplier
that spends at most ``epsilon`` over them
(:func:`~fednovelty.federated.trust.dp_calibration.calibrate_noise`), the algorithm's settings (what
the server knows) and each client's own :class:`~fednovelty.federated.trust.dp.DPPolicy` (what the
client enforces: its noise, its clipping and a budget of exactly the planned releases,
after which it refuses). With learners that leave the clients (FedGMM's joint model) the
plan also buys their DP-SGD (:mod:`fednovelty.federated.trust.dp_sgd`): the statistics' ``z`` and
the steps' ``sigma`` spend the budget together, split by ``learner_share``. After the
fit, :func:`privacy_record` is ``privacy_spent_``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise, epsilon_spent
from fednovelty.federated.trust.dp_quantile import private_quantile, score_grid
from fednovelty.federated.trust.dp_sgd import (
    HISTOGRAM_SHARE,
    DPSGDSettings,
    calibrate_learning,
    learning_epsilon,
    release_blocks,
)
from fednovelty.federated.trust.noise import noise_source
from fednovelty.federated.trust.private_bounds import (
    BOUNDS_KIND,
    PrivateBounds,
    PrivateBoundsConfig,
    log_grid,
)

#: the share of ``Privacy.epsilon`` a private detector keeps for its alarm threshold (the
#: exponential mechanism's quantile of the training scores, :func:`private_threshold`);
#: the rounds get the rest.
THRESHOLD_SHARE = 0.05


class DeltaAboveRowsWarning(UserWarning):
    """``Privacy.delta`` is above ``1 / n`` for the ``n`` training rows: an (epsilon, delta)
    mechanism may then release a whole row with probability delta, and ``n`` rows make
    that likely; the usual rule is ``delta`` well below ``1 / n``."""


def check_delta(delta: float, n_rows: int) -> None:
    """Warn (:class:`DeltaAboveRowsWarning`) when ``delta > 1 / n_rows``."""
    if n_rows > 0 and float(delta) > 1.0 / n_rows:
        warnings.warn(
            DeltaAboveRowsWarning(
                f"privacy.delta={delta:g} is above 1/n = {1 / n_rows:.3g} for these {n_rows} "
                f"rows; choose privacy.delta below {0.1 / n_rows:.1g} (a tenth of 1/n)."
            ),
            stacklevel=4,
        )


def private_threshold(detector: Any) -> float:
    """A private detector's ``threshold_``: the ``1 - contamination`` quantile of its
    training scores by the exponential mechanism over a public grid above the model's lowest
    score (``-`` its highest log-density; :mod:`fednovelty.federated.trust.dp_quantile`), with
    ``privacy_spent_["threshold_epsilon"]`` of the budget and fresh OS entropy. A detector
    without that share (or with a thresholder object for ``contamination``) keeps its
    threshold."""
    epsilon = detector.privacy_spent_.get("threshold_epsilon", 0.0)
    contamination = detector.contamination
    if not epsilon > 0 or not isinstance(contamination, int | float):
        return float(detector.threshold_)
    bound = getattr(detector, "_log_density_bound", lambda: None)()
    lowest = -float(bound) if bound is not None and math.isfinite(bound) else LOWEST_SCORE
    grid = score_grid(lowest)
    scores = np.asarray(detector.decision_scores_, dtype=np.float64)
    source = noise_source(None)  # fresh OS entropy
    return private_quantile(scores, 1.0 - float(contamination), epsilon, grid, source)


#: the lowest score of the threshold's grid for a model with no log-density bound.
LOWEST_SCORE = -1e4


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
        policy: every client's :class:`~fednovelty.federated.trust.dp.DPPolicy`.
        releases: the most noisy releases the fit can make (the clients' budget).
        epsilon, delta: the budget.
        sgd: every client's DP-SGD for its learners (``None``: none leave the clients).
        threshold_epsilon: the budget of the alarm threshold's private quantile
            (:data:`THRESHOLD_SHARE` of ``epsilon``; the rounds get the rest).
        bounds_copies: without ``Privacy.bounds``, the copies of each private bounds round's
            histogram (:func:`run_private_bounds`, :data:`BOUNDS_ROUNDS` rounds), among the
            planned cost; 0: public bounds.
    """

    settings: dict[str, Any]
    policy: DPPolicy
    releases: int
    epsilon: float
    delta: float
    sgd: DPSGDSettings | None = None
    threshold_epsilon: float = 0.0
    bounds_copies: int = 0


def public_bounds(bounds: Any, n_features: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``Privacy.bounds`` as ``(low, high)`` tuples of ``n_features`` floats.

    Raises:
        ValueError: missing, or not two rows of ``n_features`` finite values with
            ``low < high``; the message says what to pass.
    """
    if bounds is None:
        raise ValueError(
            "privacy.epsilon needs public feature bounds: pass Privacy(bounds=(low, high)), "
            "two rows of "
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
            f"privacy.bounds must be (low, high) with {n_features} finite values each (shape (2, "
            f"{n_features})); got shape {shape}."
        )
    if not bool((array[0] < array[1]).all()):
        raise ValueError("privacy.bounds must have low < high for every feature.")
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
    """The fit's differential privacy, or ``None`` when ``Privacy.epsilon`` is ``None``.

    Args:
        estimator: reads ``Privacy``'s ``epsilon``, ``delta``, ``bounds``, ``clip``,
            ``mode`` (and ``learner_share`` with ``learning``).
        n_features: the width of the rows (of the bounds, and of ``"auto"`` clipping).
        n_clients: the clients that share the noise in ``"distributed"`` mode.
        releases_for: settings -> the most noisy releases of the algorithm they build.
        standardized: the rounds work in z-scores (a private standardisation after the
            box), where ``clip="auto"`` is ``1.5 * sqrt(n_features)``; else in the box's
            units, ``[-1, 1]`` per feature, where every row inside the bounds has norm at most
            ``sqrt(n_features)`` and ``"auto"`` is that (a larger radius would clip nothing
            more and only add noise).
        learning: the learners' DP-SGD, when they leave the clients: their rounds (among
            the releases, each with one histogram) and steps; ``z`` and ``sigma`` are then
            calibrated together (:func:`~fednovelty.federated.trust.dp_sgd.calibrate_learning`,
            ``learner_share`` of the budget to the learners).
        histograms: histograms of responsibilities released when no learners leave (a
            joint model's joint counts, one per round), among the releases: each costs
            :func:`~fednovelty.federated.trust.dp_sgd.histogram_blocks` of a release, and the
            clients' ledgers charge it.

    Without ``bounds`` the plan also buys the private bounds round
    (:func:`run_private_bounds`): :data:`BOUNDS_ROUNDS` rounds of :func:`bounds_copies`
    histograms, charged with the rest,
    and ``settings["bounds"]`` waits for the round's result.

    Raises:
        ValueError: bad ``bounds``; a plan that would spend more than ``epsilon``.
    """
    privacy = estimator._option("privacy")
    epsilon = privacy.epsilon
    if epsilon is None:
        return None
    rounds_budget = float(epsilon) * (1 - THRESHOLD_SHARE)  # the rest: the threshold
    delta = float(privacy.delta)
    private_box = privacy.bounds is None  # estimated by the private bounds round
    bounds = (
        ((-1.0,) * n_features, (1.0,) * n_features)  # to count the rounds; replaced later
        if private_box
        else public_bounds(privacy.bounds, n_features)
    )
    if privacy.clip == "auto":
        clip = (1.5 if standardized else 1.0) * math.sqrt(n_features)
    else:
        clip = float(privacy.clip)
    settings = {
        "dp_mode": privacy.mode,
        "dp_noise_multiplier": 0.0,
        "dp_clip": clip,
        "bounds": bounds,
    }
    releases = int(releases_for(settings))
    sgd = None
    learns = learning is not None and learning.rounds * learning.steps > 0
    planned = learning.rounds if learns else int(histograms)
    copies = bounds_copies(release_blocks(releases, planned), n_features) if private_box else 0
    bounds_histograms = BOUNDS_ROUNDS * copies
    if not learns:
        blocks = release_blocks(releases, int(histograms) + bounds_histograms)
        z = calibrate_noise(rounds_budget, delta, 1, blocks)
        spent = epsilon_spent(z, 1, delta, blocks)
    else:
        blocks = release_blocks(releases, learning.rounds + bounds_histograms)
        steps, rate = learning.rounds * learning.steps, learning.sample_rate
        share = 1.0 - float(privacy.learner_share)
        z, sigma = calibrate_learning(rounds_budget, delta, blocks, steps, rate, share)
        spent = learning_epsilon(z, blocks, sigma, rate, steps, delta)
        sgd = DPSGDSettings(
            sigma, learning.clip, rate, learning.steps, expected_batch=float(learning.batch)
        )
    if spent > rounds_budget * (1 + 1e-9):
        raise ValueError(
            f"the fit's {releases} noisy releases would spend epsilon={spent:.4g} at "
            f"delta={delta:g}, over the budget privacy.epsilon={epsilon:g}; fewer rounds "
            "(max_iter, initialisation.kmeans_rounds) or a larger budget."
        )
    policy = DPPolicy(
        z, clip, privacy.mode, max(1, int(n_clients)), epsilon=rounds_budget, delta=delta
    )
    settings["dp_noise_multiplier"] = z
    if private_box:
        settings["bounds"] = PENDING_BOUNDS  # refused by the algorithm until the round ran
    threshold = float(epsilon) - rounds_budget
    return DPPlan(
        settings, policy, releases, float(epsilon), delta, sgd, threshold, bounds_copies=copies
    )


def privacy_record(plan: DPPlan, rounds: Iterable[dict], costs: Mapping[str, RoundCost]) -> dict:
    """``privacy_spent_``: what a fit under ``plan`` spent, from its ``history_`` records
    (``rounds``): every round of a private kind that ran spent its ``costs[kind]`` of every
    client's budget; epsilon is read from the accountant for the total.

    ``epsilon`` holds against whoever sees the model or the sum of the clients' releases;
    ``epsilon_against_server`` against a server that sees each client's reply: the same in
    ``"local"`` mode, ``inf`` in ``"central"`` (the server sees clipped, un-noised sums) and
    that of ``z / sqrt(m)`` in ``"distributed"`` mode unless a secure sum hides the replies
    (``docs/secure_sums.md``; the in-process engine does not). DP-SGD's noise is the
    client's own in every mode.

    In ``"distributed"`` mode each client adds ``z / sqrt(m)`` (``m = policy.n_clients``),
    so a round whose sum holds ``m'`` replies carries the multiplier ``z sqrt(m' / m)``:
    ``epsilon`` is what the rounds achieved with the replies they summed (a round of fewer
    than ``m`` costs ``m / m'`` times its blocks), and ``min_senders`` the fewest replies
    a private round summed."""
    total = {"releases": 0, "histograms": 0, "sgd_steps": 0}
    blocks = 0.0  # Gaussian mechanisms of multiplier z the sums achieved
    fewest = None
    policy, delta = plan.policy, plan.delta
    for record in rounds:
        cost = costs.get(record.get("kind"))
        if cost is None or record.get("failed"):
            continue
        for name in total:
            total[name] += getattr(cost, name)
        round_blocks = release_blocks(cost.releases, cost.histograms)
        senders = _senders(record)
        if policy.mode == "distributed" and senders is not None and round_blocks > 0:
            fewest = senders if fewest is None else min(fewest, senders)
            round_blocks *= policy.n_clients / max(senders, 1)
        blocks += round_blocks
    planned_blocks = release_blocks(total["releases"], total["histograms"])
    steps = total["sgd_steps"]
    sigma, rate = (
        (0.0, 1.0) if plan.sgd is None else (plan.sgd.noise_multiplier, plan.sgd.sample_rate)
    )

    def epsilon(z: float, stat_blocks: float) -> float:
        return learning_epsilon(z, stat_blocks, sigma, rate, steps, delta)

    record = {
        # basic composition with the threshold's pure-epsilon quantile
        "epsilon": epsilon(policy.noise_multiplier, blocks) + plan.threshold_epsilon,
        "threshold_epsilon": plan.threshold_epsilon,
        "epsilon_against_server": epsilon(policy.client_noise, planned_blocks)
        + plan.threshold_epsilon,
        "delta": delta,
        "epsilon_budget": plan.epsilon,
        "releases": total["releases"],
        "planned_releases": plan.releases,
        "noise_multiplier": policy.noise_multiplier,
        "clip": policy.clip_norm,
        "mode": policy.mode,
        "accountant": "dp-accounting PLD, add/remove one row",
    }
    if policy.mode == "distributed":
        record.update(n_clients=policy.n_clients, min_senders=fewest)
    if steps:
        record.update(sgd_steps=steps, sgd_noise_multiplier=sigma, sample_rate=rate)
    return record


def _senders(record: Mapping[str, Any]) -> int | None:
    """The replies a round's sum held: replied, less dropped and skipped; ``None`` where
    the record does not say."""
    if "n_replied" not in record:
        return None
    return (
        int(record["n_replied"]) - int(record.get("n_dropped", 0)) - int(record.get("n_skipped", 0))
    )


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


# --------------------------------------------------------------------------- private bounds
#: the share of the rounds' budget (of ``mu^2``, Gaussian differential privacy) that the
#: private bounds round spends when ``Privacy.bounds`` is not given.
BOUNDS_SHARE = 0.1
#: the most values one client's reply of the bounds round carries (copies x features x
#: bins): past it, fewer copies and a smaller share.
MAX_BOUNDS_VALUES = 2**21
#: the private bounds rounds (the public log grid, then the linear one between its bounds).
BOUNDS_ROUNDS = PrivateBoundsConfig().rounds
#: ``settings["bounds"]`` of a plan whose bounds round has not run (any algorithm refuses
#: it as bounds).
PENDING_BOUNDS = "estimated by the private bounds round"


def bounds_copies(blocks: float, n_features: int, share: float = BOUNDS_SHARE) -> int:
    """The copies of each private bounds round's histogram beside rounds of ``blocks``
    Gaussian mechanisms of multiplier ``z``: each copy costs ``1 / HISTOGRAM_SHARE**2`` of
    one (:func:`~fednovelty.federated.trust.dp_sgd.histogram_blocks`), so ``share`` of the total
    is ``64 * share / (1 - share) * blocks`` copies over the :data:`BOUNDS_ROUNDS` rounds;
    at least 1 a round, at most :data:`MAX_BOUNDS_VALUES` values per reply of
    ``n_features`` rows of the public grid's bins.

    Raises:
        ValueError: ``share`` outside (0, 1).
    """
    if not 0 < float(share) < 1:
        raise ValueError(f"share must be in (0, 1); got {share!r}.")
    total = HISTOGRAM_SHARE**2 * float(share) / (1 - float(share)) * float(blocks)
    wanted = round(total / BOUNDS_ROUNDS)
    most = MAX_BOUNDS_VALUES // (max(1, int(n_features)) * (log_grid().shape[0] + 1))
    return int(max(1, min(wanted, most)))


@dataclass(frozen=True)
class BoundsRun:
    """The private bounds round of a fit: its ``history`` (round records), the clients'
    ``ledgers`` after it (the fit's rounds charge on from them), its bytes and the
    ``bounds`` ``(low, high)`` it estimated."""

    history: list[dict]
    ledgers: dict
    bytes_up: int
    bytes_down: int
    bounds: tuple[tuple[float, ...], tuple[float, ...]]


def run_private_bounds(
    estimator: Any,
    plan: DPPlan | None,
    rows: list,
    seed: int,
    *,
    round_offset: int = 0,
    mode: str | None = None,
) -> tuple[DPPlan | None, BoundsRun | None]:
    """Run the private bounds round of ``plan`` (``bounds_copies`` > 0: no ``Privacy.bounds``)
    on the clients' ``rows`` (each (n_c, n_features), the rows the box maps), under the
    plan's client policy (``mode`` in its place where given: a one-shot fit's clients add
    all of their noise), numbered after ``round_offset`` rounds. Returns the plan with the
    estimated bounds in its settings, and the round's :class:`BoundsRun` for
    :func:`bounds_engine` and :func:`finish_private_fit`; ``(plan, None)`` when there is
    nothing to run."""
    if plan is None or not plan.bounds_copies:
        return plan, None
    policy = plan.policy if mode is None else replace(plan.policy, mode=mode)
    algorithm = PrivateBounds(
        dp_mode=policy.mode, dp_noise_multiplier=policy.noise_multiplier, copies=plan.bounds_copies
    )
    result = estimator._simulate(
        algorithm,
        list(rows),
        seed,
        full=True,
        round_offset=round_offset,
        privacy=estimator._privacy_policy(dp=policy),
        **estimator._engine_settings(),
    )
    low, high = (tuple(float(v) for v in t) for t in result.state.bounds)
    run = BoundsRun(
        list(estimator.history_),
        dict(result.ledgers),
        int(result.bytes_up),
        int(result.bytes_down),
        (low, high),
    )
    return replace(plan, settings={**plan.settings, "bounds": run.bounds}), run


def bounds_engine(run: BoundsRun | None) -> dict:
    """The fit's engine options after the bounds round: the clients' ledgers and the
    round numbering go on from it (``{}`` without one)."""
    return {} if run is None else {"ledgers": run.ledgers}


def bounds_rounds(run: BoundsRun | None) -> int:
    """The rounds the bounds round took (0 without one)."""
    return 0 if run is None else len(run.history)


def bounds_costs(plan: DPPlan | None) -> dict[str, RoundCost]:
    """What a private bounds round of ``plan`` spends, by its kind (``{}`` with public
    bounds): ``bounds_copies`` histograms."""
    if plan is None or not plan.bounds_copies:
        return {}
    return {BOUNDS_KIND: RoundCost(releases=0, histograms=int(plan.bounds_copies))}


def bounds_record(plan: DPPlan | None) -> dict:
    """What ``privacy_spent_`` says of the box: with the bounds round, ``bounds``
    ``"private"``, its ``bounds_histograms`` and the estimated ``bounds_low`` and
    ``bounds_high``; ``bounds`` ``"public"`` with ``Privacy.bounds``."""
    if plan is None:
        return {}
    if not plan.bounds_copies:
        return {"bounds": "public"}
    low, high = plan.settings["bounds"]
    return {
        "bounds": "private",
        "bounds_histograms": BOUNDS_ROUNDS * int(plan.bounds_copies),
        "bounds_low": list(low),
        "bounds_high": list(high),
    }


def join_private_bounds(estimator: Any, run: BoundsRun | None) -> None:
    """Put the bounds round first in ``history_`` and add its bytes to the totals (the
    fit's rounds, numbered after it, are already there)."""
    if run is None:
        return
    estimator.history_ = [*run.history, *estimator.history_]
    estimator.n_rounds_ = len(estimator.history_)
    estimator.bytes_up_ += run.bytes_up
    estimator.bytes_down_ += run.bytes_down


def finish_private_fit(
    estimator: Any, plan: DPPlan | None, algorithm: Any, run: BoundsRun | None
) -> None:
    """After a fit of the chained ``algorithm`` under ``plan``: the bounds round joined to
    the record (:func:`join_private_bounds`) and ``privacy_spent_``, the
    :func:`privacy_record` of ``history_`` over the kinds the steps release privately and
    the bounds round (:func:`bounds_costs`, :func:`bounds_record`); removed after a fit
    without a plan."""
    join_private_bounds(estimator, run)
    if plan is None:
        estimator.__dict__.pop("privacy_spent_", None)
        return
    costs = {**round_costs(algorithm, plan), **bounds_costs(plan)}
    record = privacy_record(plan, estimator.history_, costs)
    estimator.privacy_spent_ = {**record, **bounds_record(plan)}
