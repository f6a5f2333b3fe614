"""Utility of differentially private federated EM against epsilon, beside the non-private fit.

The demo's task (ADBench Forest Covertype, ``10_cover``: the novelty protocol, 20 clients of
Dirichlet(0.5) feature skew, features min-max scaled to [0, 1]) unless ``--datasets`` names
others (``all``: the 25 of the scoreboard; the summary then averages over datasets too).
Each detector is the registry's method (``DEM-kmeans``: global weights, ``FedGMM``: personal
weights; 15 components) fitted with ``dp_epsilon`` in {0.5, 1, 2, 4, 8} at
``dp_delta=1e-5`` and without differential privacy (``inf``). The public bounds are the
scaled features' range ``[0, 1]`` (the task scales them; a deployment takes them from domain
knowledge). Private fits run ``max_iter`` EM rounds after ``kmeans_rounds`` Lloyd rounds
(every round spends budget; 40 and 3 by default); the non-private fit keeps the method's
defaults (up to 100 rounds, stopping on ``tol``), and a non-private fit with the private
fit's rounds is shown too (``inf*``) to separate the noise's cost from the rounds'.

Run: ``python benchmarks/dp_utility.py [--seeds 0 1 2] [--modes central local] [--quick]``;
prints one row per (method, mode, epsilon): AUROC and AUC-PR (mean and spread over seeds)
and their differences from the non-private fit.
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np
import pandas as pd
import torch

from fednovelty.datasets import list_adbench
from fednovelty.datasets.protocols import make_task
from fednovelty.evaluation import aupr_out, auroc
from fednovelty.methods import get_method

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)


def run(args) -> pd.DataFrame:
    rows = []
    datasets = list_adbench() if args.datasets == ["all"] else args.datasets
    for dataset, seed in itertools.product(datasets, args.seeds):
        task = make_task(
            dataset,
            "novelty",
            n_clients=args.clients,
            alpha=0.5,
            seed=seed,
            max_train=args.max_train,
        )
        d = task.X_train.shape[1]
        bounds = (np.zeros(d), np.ones(d))
        for name in args.methods:
            method = get_method(name)
            base = method.shared_params(n_components=args.components, random_state=seed)
            settings = [
                ("inf", None, {}),
                ("inf*", None, {"max_iter": args.max_iter, "kmeans_rounds": args.kmeans_rounds}),
            ]
            for mode in args.modes:
                for eps in args.epsilons:
                    settings.append(
                        (
                            eps,
                            mode,
                            {
                                "dp_epsilon": eps,
                                "dp_bounds": bounds,
                                "dp_mode": mode,
                                "max_iter": args.max_iter,
                                "kmeans_rounds": args.kmeans_rounds,
                            },
                        )
                    )
            for eps, mode, extra in settings:
                detector = method.build(**base, **extra, progress=False)
                started = time.perf_counter()
                detector.fit(task.X_train, groups=task.groups_train)
                seconds = time.perf_counter() - started
                scores = detector.decision_function(task.X_test)
                spent = getattr(detector, "privacy_spent_", None)
                rows.append(
                    {
                        "dataset": dataset,
                        "method": name,
                        "mode": mode or "-",
                        "epsilon": eps,
                        "seed": seed,
                        "auroc": auroc(task.y_test, scores),
                        "aucpr": aupr_out(task.y_test, scores),
                        "spent": spent["epsilon"] if spent else math.inf,
                        "releases": spent["releases"] if spent else detector.n_rounds_,
                        "z": spent["noise_multiplier"] if spent else 0.0,
                        "seconds": seconds,
                    }
                )
                print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    keys = ["dataset", "method", "seed"]
    reference = frame[frame.epsilon == "inf"].set_index(keys)[["auroc", "aucpr"]]
    reference.columns = [f"{name}_ref" for name in reference.columns]
    frame = frame.join(reference, on=keys)
    frame["d_auroc"] = frame.auroc - frame.auroc_ref
    frame["d_aucpr"] = frame.aucpr - frame.aucpr_ref
    frame["epsilon"] = frame.epsilon.astype(str)
    # over seeds and datasets (d_auroc_worst: the worst dataset and seed)
    table = frame.groupby(["method", "mode", "epsilon"], sort=False).agg(
        auroc=("auroc", "mean"),
        auroc_sd=("auroc", "std"),
        aucpr=("aucpr", "mean"),
        d_auroc=("d_auroc", "mean"),
        d_auroc_worst=("d_auroc", "min"),
        d_aucpr=("d_aucpr", "mean"),
        z=("z", "mean"),
        releases=("releases", "mean"),
        seconds=("seconds", "mean"),
    )
    return table.round(4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets", nargs="+", default=["10_cover"], help='ADBench names, or "all" (25)'
    )
    parser.add_argument("--methods", nargs="+", default=["DEM-kmeans", "FedGMM"])
    parser.add_argument("--modes", nargs="+", default=["central", "local"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--components", type=int, default=15)
    parser.add_argument("--max-iter", type=int, default=40)
    parser.add_argument("--kmeans-rounds", type=int, default=3)
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--out", default=None, help="also write the per-run rows as CSV")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: one seed, DEM-kmeans, 20,000 rows"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.methods, args.modes = [0], ["DEM-kmeans"], ["central"]
        args.max_train, args.max_iter, args.epsilons = 20_000, 5, [1.0]
    torch.set_num_threads(1)
    frame = run(args)
    if args.out:
        frame.to_csv(args.out, index=False)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summarise(frame).to_string())


if __name__ == "__main__":
    main()
