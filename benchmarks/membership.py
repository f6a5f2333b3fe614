"""Membership-inference benchmark: attack AUC against released statistics and trained detectors
at epsilon in {0.5, 1, 2, 4, 8, inf} (delta = 1e-5), beside the bounds DP implies.

Data: rows from N(0, I_d) (d = 2), one client of ``N_ROWS`` (30) rows, clip radius
``CLIP`` (2) around the origin (the public centre).

**Stats attack** (:func:`fednovelty.evaluation.membership.stats_attack`): the adversary knows
the client's other rows, the target, the clip bound, the responsibilities (one component) and
the noise; it sees one round's release of counts, first moments and second moments (3 blocks),
each with Gaussian noise of ``z`` times its sensitivity, ``z`` from
:func:`fednovelty.federated.trust.dp_calibration.calibrate_noise` (epsilon, 1e-5, rounds, 3). Two
targets: ``canary`` (the row (3, 0): beyond the clip radius along an axis, so every block moves by
its full sensitivity: the worst case the accounting assumes) and ``typical`` (a fresh row of the
population per trial). ``TRIALS`` (2000) trials each, half members; 95 % bootstrap intervals.

**Bounds**: ``GDP`` = ``Phi(mu / sqrt 2)`` with ``mu = sqrt(rounds * 3) / z`` (the best ROC
against the Gaussian mechanism); ``(eps, delta)`` = the area of the region
``TPR <= min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR))`` (any (eps, delta)-DP
mechanism). The epsilon at which the GDP bound equals the product target 0.55 is printed.

**Through the real client gate** (:func:`fednovelty.evaluation.membership.gate_attack`): a
one-component ``FederatedEM(dp_mode="local", dp_noise_multiplier=z, dp_clip=B, bounds=(-BOX,
BOX))`` and its ``em`` broadcast after ``start()``; one client of ``N_ROWS`` rows answers it
through ``algorithm.answer`` under ``PrivacyPolicy(dp=DPPolicy(z, B, "local"))`` (a fresh
noise seed per trial), with and without the target; the adversary knows the noiseless
releases of both neighbours and the calibrated spreads. ``B = 1.5 sqrt(d)`` box units (the
detectors' ``Privacy.clip="auto"``). One release at ``z`` calibrated to (epsilon, 1e-5) for one
release: the canary (16, 0) (4 box units out along an axis: full sensitivity in every block)
and typical targets (``GATE_PAIRS`` (20) pairs of rows drawn from the population, their trials
pooled); then the whole-fit budget: ``releases`` (the DP detector's planned releases)
releases of the canary's statistics at the ``z`` that spends epsilon over all of them. The
measured noise spread of each block over its calibrated value is printed (1 = as calibrated).

**Score attack** (:func:`fednovelty.evaluation.membership.score_attack`): detectors fitted to
a 30-row client (two federated clients of 15 rows for the federated detector), the loss
attack (log-density of members vs 30 held-out rows) and its calibrated form (offline LiRA,
4 reference models on fresh rows), repeated over ``SEEDS`` (20) seeds: mean AUC and the
seed-repeated 95 % interval (mean +- 1.96 sd / sqrt(seeds)). Detectors: scikit-learn's
``GaussianMixture`` (10 components, overfits), ``FedGMMDetector`` (8 components, no prior,
no privacy floor: overfits) and ``FedGMMDetector`` with its defaults but the privacy floor
(prior, standardisation).

**DP-trained detector** (``DP_SEEDS`` (30) seeds): ``FedGMMDetector`` (:data:`DP_DETECTOR`:
8 components, no prior, no floor, 10 EM rounds, 3 k-means rounds) on ``DP_CLIENTS`` (4)
clients of ``DP_ROWS`` (10) rows of N(0, I_2) with ``Privacy.epsilon`` at each epsilon,
``bounds = (-BOX, BOX)``, ``clip="auto"``, central noise; the loss attack against 40
held-out rows; epsilon = inf is the same detector without DP. Bounds are those of the fit's
whole budget (its ``noise_multiplier`` and ``releases`` from ``privacy_spent_``): the
add/remove test of one row, ``Phi(mu / sqrt 2)``, and the members-vs-held-out AUC,
``Phi(mu)`` (a replacement; :func:`~fednovelty.evaluation.membership_bounds.gdp_heldout_auc_bound`)
and its (epsilon, delta) form.

Usage::

    .venv/bin/python -m benchmarks.membership               # full run, ~6-10 min on 1 core
    .venv/bin/python -m benchmarks.membership --quick       # smoke run (fewer trials, seeds)
    .venv/bin/python -m benchmarks.membership --out benchmarks/membership.txt
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np
import torch
from scipy.optimize import brentq

from benchmarks.common import add_out, add_quick, command_line, emit_report, report_header
from fednovelty.detectors import FedGMMDetector
from fednovelty.detectors.options import Initialisation, Prior, Privacy
from fednovelty.evaluation.membership import GateAttack, gate_attack, score_attack, stats_attack
from fednovelty.evaluation.membership_audit import auc_interval
from fednovelty.evaluation.membership_bounds import (
    dp_auc_bound,
    dp_heldout_auc_bound,
    gdp_auc_bound,
    gdp_heldout_auc_bound,
    gdp_mu,
    gdp_mu_for_epsilon,
)
from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
DELTA = 1e-5
N_ROWS = 30
CLIP = 2.0
D = 2
CANARY = np.array([3.0, 0.0])
TRIALS = 2000
SEEDS = 20
N_REFERENCE = 4
TARGET_AUC = 0.55
#: the DP-trained detector (and its non-private twin at epsilon = inf): overfits without
#: noise; few rounds, since every round spends budget.
DP_DETECTOR = {
    "n_components": 8,
    "prior": Prior(strength=None),
    "privacy": Privacy(min_rows=1),
    "max_iter": 10,
    "initialisation": Initialisation(kmeans_rounds=3),
    "random_state": 0,
}
#: the public box of every feature (Privacy.bounds = (-BOX, BOX)).
BOX = 4.0
#: the DP detector's clients and rows per client, and the seeds of its table.
DP_CLIENTS, DP_ROWS, DP_SEEDS = 4, 10, 30
#: the gate attack's clip radius in box units (dp_clip="auto") and its canary (user units).
GATE_CLIP = 1.5 * math.sqrt(D)
GATE_CANARY = np.array([4 * BOX, 0.0])
#: typical targets of the gate attack: pairs of (client rows, target) drawn from the population.
GATE_PAIRS = 20
#: trials per epsilon of the whole-fit (many releases) gate attack.
FIT_TRIALS = 400


GATE_NOTE = (
    "Rows of N(0, I) in the box (-4, 4) are about 0.3 box units from the origin, far inside "
    "the clip radius, so a typical target moves the statistics much less than the canary; "
    "every row reuses the same seeds (common random numbers), hence the equal spread ratios."
)
DP_NOTE = (
    "At every finite epsilon the noise on 40 rows' statistics (counts sd 8 z, z >= 3.9) "
    "swamps them: the fitted mixture is post-processed noise, nearly the same for every "
    "epsilon under the shared seeds, and the attack sees no members. Bounds: add/remove "
    "Phi(mu/sqrt2) is the test of one fixed row; a members-vs-held-out AUC compares rows a "
    "replacement apart, bounded by Phi(mu)."
)


def _population(seed: int = 0, n: int = 20_000) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, D))


def _noise(epsilon: float, rounds: int) -> float:
    return 0.0 if math.isinf(epsilon) else calibrate_noise(epsilon, DELTA, rounds, 3)


def _fmt(auc: float, low: float, high: float) -> str:
    return f"{auc:.3f} [{low:.3f}, {high:.3f}]"


def stats_table(trials: int, rounds: int) -> str:
    """The stats attack's table, one row per epsilon."""
    population = _population()
    lines = [
        f"## Stats attack (one client of {N_ROWS} rows, clip {CLIP}, {rounds} round(s), "
        f"3 blocks, {trials} trials)",
        "",
        "| epsilon | z | mu | GDP AUC bound | (eps,delta) AUC bound | canary AUC [95% CI] "
        "| typical AUC [95% CI] |",
        "|---|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        z = _noise(eps, rounds)
        mu = gdp_mu(z, rounds, 3)
        canary = stats_attack(
            population, N_ROWS, CLIP, z, n_trials=trials, rounds=rounds, target=CANARY, seed=1
        )
        typical = stats_attack(population, N_ROWS, CLIP, z, n_trials=trials, rounds=rounds, seed=2)
        lines.append(
            f"| {eps:g} | {z:.3f} | {mu:.3f} | {gdp_auc_bound(mu):.3f} | "
            f"{dp_auc_bound(eps, DELTA):.3f} | {_fmt(*canary.interval(n_boot=300))} | "
            f"{_fmt(*typical.interval(n_boot=300))} |"
        )
    eps_target = brentq(
        lambda e: gdp_auc_bound(gdp_mu_for_epsilon(e, DELTA)) - TARGET_AUC, 1e-3, 8.0
    )
    lines += [
        "",
        f"The GDP bound equals the target AUC {TARGET_AUC} at epsilon = {eps_target:.3f} "
        f"(delta = {DELTA:g}): a worst-case target meets the target only at or below it.",
        "Every row uses the same seeds (common random numbers: the same members, targets and "
        "standard-normal noise, scaled by each z), so the rows' deviations from the bound move "
        "together.",
    ]
    return "\n".join(lines)


def _detectors():
    """(name, factory, fit kwargs) of the score attack's non-private detectors."""
    from sklearn.mixture import GaussianMixture

    groups = {"groups": np.repeat([0, 1], N_ROWS // 2)}
    return [
        (
            "GaussianMixture 10",
            lambda: GaussianMixture(10, reg_covar=1e-3, random_state=0),
            {},
        ),
        (
            "FedGMM 8, no prior, no floor",
            lambda: FedGMMDetector(
                n_components=8,
                random_state=0,
                prior=Prior(strength=None),
                privacy=Privacy(min_rows=1),
            ),
            groups,
        ),
        (
            "FedGMM 3, defaults (prior)",
            lambda: FedGMMDetector(n_components=3, random_state=0, privacy=Privacy(min_rows=1)),
            groups,
        ),
    ]


def _seed_interval(values) -> str:
    values = np.asarray(values, float)
    half = 1.96 * values.std(ddof=1) / math.sqrt(values.size) if values.size > 1 else math.nan
    return f"{values.mean():.3f} [{values.mean() - half:.3f}, {values.mean() + half:.3f}]"


def _score_rows(name, factory, fit_kwargs, seeds, calibrate=True) -> tuple[str, str]:
    """Mean AUCs with seed intervals of the loss attack and (``calibrate``) its calibrated
    form over ``seeds`` fresh clients."""
    plain, calibrated = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(1000 + seed)
        X_in, X_out = rng.normal(size=(N_ROWS, D)), rng.normal(size=(N_ROWS, D))
        X_ref = rng.normal(size=(10 * N_ROWS, D))
        result = score_attack(
            factory,
            X_in,
            X_out,
            X_ref if calibrate else None,
            N_REFERENCE,
            fit_kwargs=fit_kwargs,
            seed=seed,
        )
        plain.append(result.auc)
        calibrated.append(result.calibrated_auc)
    return _seed_interval(plain), _seed_interval(calibrated) if calibrate else "not run"


def score_table(seeds: int) -> str:
    """The score attack's table on non-private detectors."""
    lines = [
        f"## Score attack (clients of {N_ROWS} rows, {seeds} seeds; mean AUC [95% CI over seeds])",
        "",
        "| detector | loss attack AUC | calibrated (offline LiRA) AUC |",
        "|---|---|---|",
    ]
    for name, factory, fit_kwargs in _detectors():
        plain, calibrated = _score_rows(name, factory, fit_kwargs, seeds)
        lines.append(f"| {name} | {plain} | {calibrated} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- through the gate
def _gate(z: float) -> tuple[FederatedEM, object, PrivacyPolicy]:
    """A one-component private federated EM, its ``em`` broadcast and the client's policy."""
    algorithm = FederatedEM(
        1,
        dp_mode="local",
        dp_noise_multiplier=z,
        dp_clip=GATE_CLIP,
        bounds=([-BOX] * D, [BOX] * D),
        weights_init=np.array([1.0]),
        means_init=np.zeros((1, D)),
        precisions_init=np.eye(D)[None],
        max_iter=1,
    )
    message = algorithm.configure(algorithm.start())
    return algorithm, message, PrivacyPolicy(min_rows=1, dp=DPPolicy(z, GATE_CLIP, "local"))


def _spread(result: GateAttack) -> str:
    """Each block's measured noise spread over its calibrated one."""
    if not all(s > 0 for s in result.sigma.values()):
        return "no noise"
    return " / ".join(f"{result.noise[b].std() / result.sigma[b]:.3f}" for b in result.sigma)


def gate_table(trials: int, fit_trials: int, fit_releases: int) -> str:
    """The gate attack's tables: one release, then the whole fit's releases."""
    rng = np.random.default_rng(0)
    population = _population(seed=1)
    lines = [
        f"## Through the real client gate (one client of {N_ROWS} rows, local noise, "
        f"clip {GATE_CLIP:.3f} box units)",
        "",
        f"One release, {trials} trials per target kind (typical: {GATE_PAIRS} pairs pooled).",
        "",
        "| epsilon | z | mu | GDP AUC bound | canary AUC [95% CI] | typical AUC [95% CI] "
        "| noise sd / calibrated (counts / sums / second) |",
        "|---|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        z = _noise(eps, 1)
        algorithm, message, policy = _gate(z)
        canary = gate_attack(
            algorithm, message, policy, population[: N_ROWS - 1], GATE_CANARY, n_trials=trials
        )
        members, nonmembers = [], []
        for pair in range(GATE_PAIRS):
            picked = rng.choice(population.shape[0], N_ROWS, replace=False)
            rows = population[picked]
            result = gate_attack(
                algorithm,
                message,
                policy,
                rows[1:],
                rows[0],
                n_trials=max(2, trials // GATE_PAIRS),
                seed=pair,
            )
            members.append(result.scores[result.members])
            nonmembers.append(result.scores[~result.members])
        typical = auc_interval(np.concatenate(members), np.concatenate(nonmembers), n_boot=300)
        lines.append(
            f"| {eps:g} | {z:.3f} | {canary.mu:.3f} | {canary.bound:.3f} | "
            f"{_fmt(*canary.interval(n_boot=300))} | {_fmt(*typical)} | {_spread(canary)} |"
        )
    lines += [
        "",
        GATE_NOTE,
        "",
        f"The whole fit's budget: {fit_releases} releases (the DP detector's plan) of the "
        f"canary's statistics, z spending epsilon over all of them, {fit_trials} trials.",
        "",
        "| epsilon | z | mu | GDP AUC bound | canary AUC [95% CI] | noise sd / calibrated |",
        "|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS[:-1]:
        z = _noise(eps, fit_releases)
        algorithm, message, policy = _gate(z)
        result = gate_attack(
            algorithm,
            message,
            policy,
            population[: N_ROWS - 1],
            GATE_CANARY,
            n_trials=fit_trials,
            releases=fit_releases,
            seed=3,
        )
        lines.append(
            f"| {eps:g} | {z:.3f} | {result.mu:.3f} | {result.bound:.3f} | "
            f"{_fmt(*result.interval(n_boot=300))} | {_spread(result)} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- DP detector
def _dp_params(eps: float) -> dict:
    params = dict(DP_DETECTOR)
    if not math.isinf(eps):
        params["privacy"] = Privacy(
            min_rows=1,
            epsilon=eps,
            delta=DELTA,
            bounds=([-BOX] * D, [BOX] * D),
            clip="auto",
            mode="central",
        )
    return params


def _dp_fit_aucs(eps: float, seeds: int) -> tuple[np.ndarray, dict]:
    """Loss-attack AUCs over ``seeds`` datasets and the first fit's ``privacy_spent_``."""
    n = DP_CLIENTS * DP_ROWS
    groups = {"groups": np.repeat(np.arange(DP_CLIENTS), DP_ROWS)}
    aucs, record = [], {}
    for seed in range(seeds):
        rng = np.random.default_rng(2000 + seed)
        members, held_out = rng.normal(size=(n, D)), rng.normal(size=(n, D))
        fitted = []

        def factory(seed=seed, fitted=fitted):
            fitted.append(FedGMMDetector(**{**_dp_params(eps), "random_state": seed}))
            return fitted[-1]

        aucs.append(score_attack(factory, members, held_out, fit_kwargs=groups).auc)
        record = record or dict(getattr(fitted[0], "privacy_spent_", {}))
    return np.array(aucs), record


def dp_releases() -> int:
    """The DP detector's planned noisy releases (one fit at epsilon 1)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(DP_CLIENTS * DP_ROWS, D))
    detector = FedGMMDetector(**_dp_params(1.0)).fit(
        X, groups=np.repeat(np.arange(DP_CLIENTS), DP_ROWS)
    )
    return int(detector.privacy_spent_["planned_releases"])


def dp_score_table(seeds: int) -> str:
    """The loss attack against the DP-trained detector, one row per epsilon."""
    n = DP_CLIENTS * DP_ROWS
    lines = [
        f"## Score attack on the DP-trained detector ({DP_CLIENTS} clients of {DP_ROWS} rows, "
        f"d = {D}, {seeds} seeds; mean AUC [95% CI over seeds])",
        "",
        f"FedGMMDetector({', '.join(f'{k}={v}' for k, v in DP_DETECTOR.items())}), "
        f"bounds = (-{BOX:g}, {BOX:g}) per feature, clip auto, central noise; "
        f"{n} members against {n} held-out rows. epsilon = inf: the same detector without DP.",
        "",
        "| epsilon | z | releases | eps spent | mu | add/remove bound Phi(mu/sqrt2) "
        "| held-out bound Phi(mu) | (eps,delta) held-out bound | loss attack AUC "
        "| share of seeds > 0.55 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        aucs, record = _dp_fit_aucs(eps, seeds)
        if record:
            z, releases = record["noise_multiplier"], record["releases"]
            mu = gdp_mu(z, releases, 3)
            spent = f"{record['epsilon']:.3f}"
        else:
            z, releases, mu, spent = 0.0, 0, math.inf, "inf"
        lines.append(
            f"| {eps:g} | {z:.3f} | {releases} | {spent} | {mu:.3f} | {gdp_auc_bound(mu):.3f} | "
            f"{gdp_heldout_auc_bound(mu):.3f} | {dp_heldout_auc_bound(eps, DELTA):.3f} | "
            f"{_seed_interval(aucs)} | {np.mean(aucs > TARGET_AUC):.2f} |"
        )
    return "\n".join([*lines, "", DP_NOTE])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(parser, "100 trials, 2 seeds (2 DP seeds)")
    parser.add_argument("--rounds", type=int, default=1, help="releases of the statistics")
    add_out(parser, "also write the report here")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    """Run both attacks and print (and with ``--out`` write) the report."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    trials, seeds, dp_seeds, fit_trials = (
        (100, 2, 2, 20) if args.quick else (TRIALS, SEEDS, DP_SEEDS, FIT_TRIALS)
    )
    releases = dp_releases()
    body = "\n\n".join(
        [
            stats_table(trials, args.rounds),
            gate_table(trials, fit_trials, releases),
            score_table(seeds),
            dp_score_table(dp_seeds),
        ]
    )
    command = command_line("membership", argv)
    header = report_header("Membership inference", command, args.quick, time.perf_counter() - start)
    return emit_report(header + "\n\n" + body + "\n", args.out)


if __name__ == "__main__":
    main()
