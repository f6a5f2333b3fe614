"""Membership-inference benchmark: attack AUC against released statistics and trained detectors
at epsilon in {0.5, 1, 2, 4, 8, inf} (delta = 1e-5), beside the bounds DP implies.

Data: rows from N(0, I_d) (d = 2), one client of ``N_ROWS`` (30) rows, clip radius
``CLIP`` (2) around the origin (the public centre).

**Stats attack** (:func:`fednovelty.evaluation.membership.stats_attack`): the adversary knows
the client's other rows, the target, the clip bound, the responsibilities (one component) and
the noise; it sees one round's release of counts, first moments and second moments (3 blocks),
each with Gaussian noise of ``z`` times its sensitivity, ``z`` from
:func:`fednovelty.federated.dp.calibrate_noise` (epsilon, 1e-5, rounds, 3). Two targets:
``canary`` (the row (3, 0): beyond the clip radius along an axis, so every block moves by its
full sensitivity: the worst case the accounting assumes) and ``typical`` (a fresh row of the
population per trial). ``TRIALS`` (2000) trials each, half members; 95 % bootstrap intervals.

**Bounds**: ``GDP`` = ``Phi(mu / sqrt 2)`` with ``mu = sqrt(rounds * 3) / z`` (the best ROC
against the Gaussian mechanism); ``(eps, delta)`` = the area of the region
``TPR <= min(e^eps FPR + delta, 1 - e^-eps (1 - delta - FPR))`` (any (eps, delta)-DP
mechanism). The epsilon at which the GDP bound equals the product target 0.55 is printed.

**Score attack** (:func:`fednovelty.evaluation.membership.score_attack`): detectors fitted to
a 30-row client (two federated clients of 15 rows for the federated detector), the loss
attack (log-density of members vs 30 held-out rows) and its calibrated form (offline LiRA,
4 reference models on fresh rows), repeated over ``SEEDS`` (20) seeds: mean AUC and the
seed-repeated 95 % interval (mean +- 1.96 sd / sqrt(seeds)). Detectors: scikit-learn's
``GaussianMixture`` (10 components, overfits), ``FedGMMDetector`` (8 components, no prior,
no privacy floor: overfits) and ``FedGMMDetector`` with its defaults but the privacy floor
(prior, standardisation). With DP: ``FedGMMDetector`` (:data:`DP_DETECTOR`: 8 components, no
prior, 10 EM rounds, 3 k-means rounds) with ``dp_epsilon`` at each epsilon, public box
``dp_bounds = (-BOX, BOX)``, ``dp_clip="auto"``, central noise; the loss attack only (when the
detector has no ``dp_epsilon`` parameter the table says it was not run).

Usage::

    .venv/bin/python benchmarks/membership.py               # full run, ~1-2 min on 1 core
    .venv/bin/python benchmarks/membership.py --quick       # smoke run (fewer trials, seeds)
    .venv/bin/python benchmarks/membership.py --out benchmarks/membership.txt
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import brentq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import emit_report, report_header

from fednovelty.detectors import FedGMMDetector
from fednovelty.evaluation.membership import (
    dp_auc_bound,
    gdp_auc_bound,
    gdp_mu,
    gdp_mu_for_epsilon,
    score_attack,
    stats_attack,
)
from fednovelty.federated.dp import calibrate_noise

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
    "prior_strength": None,
    "privacy_min_rows": 1,
    "max_iter": 10,
    "kmeans_rounds": 3,
    "random_state": 0,
}
#: the public box of every feature (dp_bounds = (-BOX, BOX)).
BOX = 4.0


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


def _detectors(dp_epsilon: float | None):
    """(name, factory, fit kwargs) of the score attack's detectors."""
    groups = {"groups": np.repeat([0, 1], N_ROWS // 2)}
    if dp_epsilon is not None:
        params = dict(DP_DETECTOR)
        if not math.isinf(dp_epsilon):
            params.update(
                dp_epsilon=dp_epsilon,
                dp_delta=DELTA,
                dp_bounds=([-BOX] * D, [BOX] * D),
                dp_clip="auto",
                dp_mode="central",
            )
        return [("FedGMM 8, DP", lambda: FedGMMDetector(**params), groups)]
    from sklearn.mixture import GaussianMixture

    return [
        (
            "GaussianMixture 10",
            lambda: GaussianMixture(10, reg_covar=1e-3, random_state=0),
            {},
        ),
        (
            "FedGMM 8, no prior, no floor",
            lambda: FedGMMDetector(
                n_components=8, prior_strength=None, privacy_min_rows=1, random_state=0
            ),
            groups,
        ),
        (
            "FedGMM 3, defaults (prior)",
            lambda: FedGMMDetector(n_components=3, privacy_min_rows=1, random_state=0),
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
    """The score attack's tables: without DP, and with it where the detector has it."""
    lines = [
        f"## Score attack (clients of {N_ROWS} rows, {seeds} seeds; mean AUC [95% CI over seeds])",
        "",
        "| detector | loss attack AUC | calibrated (offline LiRA) AUC |",
        "|---|---|---|",
    ]
    for name, factory, fit_kwargs in _detectors(None):
        plain, calibrated = _score_rows(name, factory, fit_kwargs, seeds)
        lines.append(f"| {name} | {plain} | {calibrated} |")
    lines += ["", "### With DP-trained detectors", ""]
    if "dp_epsilon" not in FedGMMDetector().get_params():
        lines.append(
            "Not run: FedGMMDetector has no dp_epsilon parameter in this tree (the detectors' "
            "differential-privacy parameters have not landed)."
        )
        return "\n".join(lines)
    lines += [
        f"FedGMMDetector({', '.join(f'{k}={v}' for k, v in DP_DETECTOR.items())}), "
        f"dp_bounds = (-{BOX:g}, {BOX:g}) per feature, dp_clip auto (1.5 sqrt(d) in z-score "
        "units), central noise; two clients of 15 rows; the loss attack only (no reference "
        "models: a DP fit takes ~1 s). The bounds are those of the fit's whole budget.",
        "",
        "| epsilon | GDP AUC bound | (eps,delta) AUC bound | loss attack AUC | calibrated AUC |",
        "|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        bound = gdp_auc_bound(gdp_mu_for_epsilon(eps, DELTA))
        try:
            ((name, factory, fit_kwargs),) = _detectors(eps)
            plain, calibrated = _score_rows(name, factory, fit_kwargs, seeds, calibrate=False)
        except (TypeError, ValueError) as error:  # a parameter spelled otherwise than assumed
            plain, calibrated = f"failed: {error}", ""
        lines.append(
            f"| {eps:g} | {bound:.3f} | {dp_auc_bound(eps, DELTA):.3f} | {plain} | {calibrated} |"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 trials, 3 seeds")
    parser.add_argument("--rounds", type=int, default=1, help="releases of the statistics")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    """Run both attacks and print (and with ``--out`` write) the report."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    start = time.perf_counter()
    trials, seeds = (200, 3) if args.quick else (TRIALS, SEEDS)
    body = "\n\n".join([stats_table(trials, args.rounds), score_table(seeds)])
    command = "benchmarks/membership.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = report_header("Membership inference", command, args.quick, time.perf_counter() - start)
    return emit_report(header + "\n\n" + body + "\n", args.out)


if __name__ == "__main__":
    main()
