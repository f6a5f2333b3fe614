"""Federated EM in few rounds: a one-shot start, exact EM rounds, SQUAREM on the server.

The demo's task (ADBench ``10_cover``, the novelty protocol, 20 clients of Dirichlet(0.5)
over k-means clusters, K = 15 full, the registry's DEM-kmeans settings: standardisation and
the covariance prior) and, with ``--scoreboard``, the 25 ADBench sets of the scoreboard
(10 clients, K = 10, at most 10,000 training and test rows). Fits, side by side from one run:

- ``DEM-kmeans``: federated k-means then plain EM rounds until the mean log-likelihood changes
  by less than ``tol`` = 1e-3 (the reference, "run to convergence");
- ``DEM-kmeans squarem``: the same start, SQUAREM on the server, run to convergence;
- ``oneshot+r``: one round of local fits reduced on the server (FedGenGMM's round), then
  ``r`` exact EM rounds (plain, or ``squarem``); ``oneshot conv``: run to convergence;
- ``FedGenGMM``: the one-shot mixture alone.

Every row gives EM rounds (after the start) and all rounds, AUROC and AUC-PR (novel =
positive) and their differences from DEM-kmeans of the same seed, the mean training
log-likelihood per row, and bytes up per client per EM round. The ``DEM seed spread`` row is
the spread of DEM-kmeans's own AUROC / AUC-PR over the method seeds (same task): the noise
floor of "within 0.002".

Run: ``python -m benchmarks.few_rounds [--seeds 0 1 2] [--scoreboard] [--out FILE]
[--quick]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pandas as pd
import torch

from benchmarks.common import (
    add_out,
    add_quick,
    add_seeds,
    command_line,
    emit_report,
    report_header,
)
from fednovelty.datasets.protocols import make_task
from fednovelty.evaluation import aupr_out, auroc
from fednovelty.methods import get_method

#: (label, FedGMMDetector settings over the registry's DEM-kmeans).
VARIANTS: tuple[tuple[str, dict], ...] = (
    ("DEM-kmeans", {}),
    ("DEM-kmeans squarem", {"acceleration": "squarem"}),
    ("oneshot+1", {"init_params": "oneshot", "max_iter": 1}),
    ("oneshot+2", {"init_params": "oneshot", "max_iter": 2}),
    ("oneshot+3", {"init_params": "oneshot", "max_iter": 3}),
    ("oneshot+3 squarem", {"init_params": "oneshot", "max_iter": 3, "acceleration": "squarem"}),
    ("oneshot+5 squarem", {"init_params": "oneshot", "max_iter": 5, "acceleration": "squarem"}),
    ("oneshot conv", {"init_params": "oneshot"}),
    ("oneshot conv squarem", {"init_params": "oneshot", "acceleration": "squarem"}),
)


def fit_variant(task, base_params: dict, settings: dict) -> dict:
    """Fit one variant on ``task``; its figures."""
    method = get_method("DEM-kmeans")
    detector = method.build(**base_params).set_params(**settings)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector.fit(task.X_train, groups=task.groups_train)
    seconds = time.perf_counter() - started
    scores = detector.decision_function(task.X_test)
    em = [h for h in detector.history_ if h["kind"] == "em"]
    n_clients = max(h["n_replied"] for h in detector.history_)
    return {
        "em_rounds": len(em),
        "rounds": detector.n_rounds_,
        "auroc": auroc(task.y_test, scores),
        "aupr": aupr_out(task.y_test, scores),
        "train_ll": float(np.mean(detector.score_samples(task.X_train))),
        "bytes_per_client_round": em[-1]["bytes_up"] / n_clients if em else 0.0,
        "seconds": seconds,
    }


def fit_fedgengmm(task, k: int, seed: int) -> dict:
    """The one-shot FedGenGMM mixture alone (client K = global K, as the start's)."""
    method = get_method("FedGenGMM")
    detector = method.build(n_components=k, client_components=k, random_state=seed)
    started = time.perf_counter()
    detector.fit(task.X_train, groups=task.groups_train)
    scores = detector.decision_function(task.X_test)
    return {
        "em_rounds": 0,
        "rounds": detector.n_rounds_,
        "auroc": auroc(task.y_test, scores),
        "aupr": aupr_out(task.y_test, scores),
        "train_ll": float(np.mean(detector.score_samples(task.X_train))),
        "bytes_per_client_round": 0.0,
        "seconds": time.perf_counter() - started,
    }


def run_task(dataset: str, seeds, *, n_clients, k, max_train, max_test, variants) -> pd.DataFrame:
    """Every variant on one dataset's task for each method seed (the task of seed 0)."""
    task = make_task(
        dataset,
        "novelty",
        n_clients=n_clients,
        alpha=0.5,
        seed=0,
        max_train=max_train,
        max_test=max_test,
    )
    rows = []
    for seed in seeds:
        base = {"n_components": k, "random_state": seed, "progress": False}
        fits = [(label, lambda s=s, b=base: fit_variant(task, b, s)) for label, s in variants]
        fits.append(("FedGenGMM", lambda seed=seed: fit_fedgengmm(task, k, seed)))
        for label, fit in fits:
            try:
                figures = fit()
            except ValueError as error:  # e.g. clients too small for K local components
                print(f"{dataset} seed {seed} {label}: {error}", flush=True)
                figures = {"auroc": np.nan, "aupr": np.nan, "error": str(error)[:80]}
            rows.append({"dataset": dataset, "seed": seed, "variant": label, **figures})
        print(f"{dataset} seed {seed} done", flush=True)
    return pd.DataFrame(rows)


def with_differences(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each row's AUROC / AUC-PR minus DEM-kmeans's of its dataset and seed."""
    reference = table[table.variant == "DEM-kmeans"].set_index(["dataset", "seed"])
    keys = list(zip(table.dataset, table.seed, strict=True))
    table = table.copy()
    table["d_auroc"] = table.auroc.to_numpy() - reference.loc[keys, "auroc"].to_numpy()
    table["d_aupr"] = table.aupr.to_numpy() - reference.loc[keys, "aupr"].to_numpy()
    return table


def summary(table: pd.DataFrame, order: list[str]) -> str:
    """One markdown row per variant: means over datasets and seeds, and the share of cells
    within 0.002 of DEM-kmeans on both metrics."""
    lines = [
        "| variant | EM rounds | all rounds | AUROC | AUC-PR | dAUROC mean (max abs) "
        "| dAUC-PR mean (max abs) | within 0.002 (both) | train LL | bytes/client/EM round "
        "| fit s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in order:
        part = table[table.variant == name]
        within = ((part.d_auroc.abs() <= 0.002) & (part.d_aupr.abs() <= 0.002)).mean()
        lines.append(
            f"| {name} | {part.em_rounds.mean():.1f} | {part.rounds.mean():.1f} | "
            f"{part.auroc.mean():.4f} | {part.aupr.mean():.4f} | "
            f"{part.d_auroc.mean():+.4f} ({part.d_auroc.abs().max():.4f}) | "
            f"{part.d_aupr.mean():+.4f} ({part.d_aupr.abs().max():.4f}) | "
            f"{within:.0%} | {part.train_ll.mean():.4f} | "
            f"{part.bytes_per_client_round.mean():,.0f} | {part.seconds.mean():.1f} |"
        )
    return "\n".join(lines)


def seed_spread(table: pd.DataFrame) -> str:
    """DEM-kmeans's own AUROC / AUC-PR range over the method seeds, per dataset (mean)."""
    dem = table[table.variant == "DEM-kmeans"].groupby("dataset")
    auroc_range = (dem.auroc.max() - dem.auroc.min()).mean()
    aupr_range = (dem.aupr.max() - dem.aupr.min()).mean()
    return (
        f"DEM seed spread (max - min over seeds, mean over datasets): AUROC {auroc_range:.4f}, "
        f"AUC-PR {aupr_range:.4f}"
    )


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_seeds(parser)
    parser.add_argument("--scoreboard", action="store_true", help="also the 25 ADBench sets")
    parser.add_argument("--datasets", nargs="+", default=None, help="scoreboard subset")
    parser.add_argument(
        "--variants", nargs="+", default=None, help="labels of VARIANTS to run (default: all)"
    )
    add_out(parser)
    add_quick(parser, "smoke run: small, one seed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    seeds = args.seeds[:1] if args.quick else args.seeds
    variants = VARIANTS[:3] if args.quick else VARIANTS
    if args.variants:
        variants = tuple(v for v in VARIANTS if v[0] in args.variants or v[0] == "DEM-kmeans")
    order = [label for label, _ in variants] + ["FedGenGMM"]
    max_train = 3000 if args.quick else None
    cover = with_differences(
        run_task(
            "10_cover",
            seeds,
            n_clients=20,
            k=15,
            max_train=max_train,
            max_test=max_train,
            variants=variants,
        )
    )
    sections = [
        "## Covertype (the demo's task: 20 clients, K = 15)",
        "",
        summary(cover, order),
        "",
        seed_spread(cover),
    ]
    if args.scoreboard:
        from fednovelty.datasets.loaders import list_adbench

        names = args.datasets or list_adbench()
        board = pd.concat(
            [
                run_task(
                    name,
                    seeds[:1],
                    n_clients=10,
                    k=10,
                    max_train=10000,
                    max_test=10000,
                    variants=variants,
                )
                for name in names
            ]
        )
        board = with_differences(board)
        sections += [
            "",
            f"## {len(names)} ADBench sets (10 clients, K = 10, seed {seeds[0]})",
            "",
            summary(board, order),
        ]
    report = report_header(
        "Federated EM in few rounds",
        command_line("few_rounds", argv),
        args.quick,
        time.perf_counter() - started,
    )
    return emit_report(report + "\n\n" + "\n".join(sections) + "\n", args.out)


if __name__ == "__main__":
    main()
