"""Utility of differentially private federated EM against epsilon, beside the non-private fit.

The demo's task (ADBench Forest Covertype, ``10_cover``: the novelty protocol, 20 clients of
Dirichlet(0.5) feature skew) unless ``--datasets`` names others (``all``: the 25 of the
scoreboard; the summary then averages over datasets too). Each detector is the registry's
method (``DEM-kmeans``: global weights, ``FedGMM``: personal weights) fitted with
``Privacy.epsilon`` in {0.5, 1, 2, 4, 8} at ``delta=1e-5`` and without differential privacy
(``inf``).

Every fit sees the dataset's own units (the task's min-max scaling undone: that scaling reads
the rows, so bounds taken from it would be no public knowledge). ``--bounds private`` (the
default): no ``Privacy.bounds``, so the fit's first round estimates them privately
(``fednovelty.federated.trust.private_bounds``, charged to the budget). ``--bounds public``: the
documented ranges of :data:`PUBLIC_RANGES` (datasets without one are skipped).

A private fit's rounds are a *variant* (:data:`VARIANTS`: Lloyd and EM rounds, the moments
round, components); ``inf`` keeps the method's defaults (up to 100 rounds, stopping on
``tol``) and ``inf*`` is the non-private fit of the variant's rounds, which separates the
noise's cost from the rounds'.

Run: ``python -m benchmarks.dp_utility --datasets all --seeds 0 1 2 --csv FILE``; each
finished fit is appended to the CSV, and a run given the same CSV skips the fits it holds
(resume). Prints AUROC and AUC-PR per (method, variant, mode, epsilon) and their paired
differences from the non-private fit.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import add_quick, add_seeds, machine_facts, markdown_table
from fednovelty.datasets import list_adbench
from fednovelty.datasets.protocols import make_task
from fednovelty.detectors import Initialisation, Prior, Privacy
from fednovelty.evaluation import aupr_out, auroc
from fednovelty.methods import get_method

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
#: ranges known without the rows, from the datasets' documentation (every feature): the
#: Wisconsin breast cancer scores (1-10), optdigits' counts of set pixels in 4x4 blocks
#: (0-16), the letter recognition attributes (integers 0-15) and CelebA's binary
#: attributes (0/1). The other ADBench files ship already scaled or standardised with
#: statistics of their rows, which are no public knowledge.
PUBLIC_RANGES = {
    "4_breastw": (1.0, 10.0),
    "26_optdigits": (0.0, 16.0),
    "20_letter": (0.0, 15.0),
    "8_celeba": (0.0, 1.0),
}
#: fits in the box's units, without the private standardisation's moments round.
BOX = {"prior": Prior(standardize=False)}
#: a private fit's rounds: Lloyd (``Initialisation.kmeans_rounds``) and EM (``max_iter``)
#: rounds, the moments round (``Prior.standardize``) and anything else the detector takes.
VARIANTS = {
    "defaults": {},
    "em20": {"max_iter": 20, "initialisation": Initialisation(kmeans_rounds=3)},
    "em40": {"max_iter": 40, "initialisation": Initialisation(kmeans_rounds=3)},
    "em10": {"max_iter": 10, "initialisation": Initialisation(kmeans_rounds=3)},
    "em5": {"max_iter": 5, "initialisation": Initialisation(kmeans_rounds=2)},
    "em5-box": {"max_iter": 5, "initialisation": Initialisation(kmeans_rounds=2), **BOX},
    "em10-box": {"max_iter": 10, "initialisation": Initialisation(kmeans_rounds=3), **BOX},
    "em3-box": {"max_iter": 3, "initialisation": Initialisation(kmeans_rounds=1), **BOX},
    "em5-box-k4": {
        "max_iter": 5,
        "initialisation": Initialisation(kmeans_rounds=2),
        **BOX,
        "n_components": 4,
    },
    "em5-box-k2": {
        "max_iter": 5,
        "initialisation": Initialisation(kmeans_rounds=2),
        **BOX,
        "n_components": 2,
    },
    "em2-box-k1": {
        "max_iter": 2,
        "initialisation": Initialisation(kmeans_rounds=1),
        **BOX,
        "n_components": 1,
    },
    "em5-box-np": {
        "max_iter": 5,
        "initialisation": Initialisation(kmeans_rounds=2),
        "prior": Prior(standardize=False, strength=None),
    },
    "em5-box-clip": {
        "max_iter": 5,
        "initialisation": Initialisation(kmeans_rounds=2),
        **BOX,
        "clip_scale": 0.6,
    },
    "em3-box-k2-np": {
        "max_iter": 3,
        "initialisation": Initialisation(kmeans_rounds=1),
        "prior": Prior(standardize=False, strength=None),
        "n_components": 2,
    },
    "em5-box-diag": {
        "max_iter": 5,
        "initialisation": Initialisation(kmeans_rounds=2),
        **BOX,
        "covariance_type": "diag",
    },
}
#: the columns of the CSV; the first seven identify a fit (resume skips those it holds).
COLUMNS = (
    "dataset", "method", "variant", "bounds", "mode", "epsilon", "seed",
    "auroc", "aucpr", "spent", "releases", "z", "n_train", "n_features", "seconds",
)  # fmt: skip
KEY = COLUMNS[:7]


def raw_rows(task, X: np.ndarray) -> np.ndarray:
    """Rows in the dataset's own units: the task's min-max scaling undone, (n, d)."""
    low, high = task.scaling.data_min, task.scaling.data_max
    span = np.where(high > low, high - low, 1.0)
    return X * span + low


def public_bounds(dataset: str, n_features: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The dataset's documented range as ``Privacy.bounds`` (two rows of ``n_features``), or
    ``None``."""
    if dataset not in PUBLIC_RANGES:
        return None
    low, high = PUBLIC_RANGES[dataset]
    return np.full(n_features, low), np.full(n_features, high)


def settings_of(args, dataset: str, d: int) -> list[tuple[str, str, object, dict]]:
    """``(variant, mode, epsilon, extra settings)`` of every fit on one dataset: the
    non-private references, then each variant's private fits."""
    fits = [("default", "-", "inf", {})]
    box = None if args.bounds == "private" else public_bounds(dataset, d)
    for variant in args.variants:
        rounds = VARIANTS[variant]
        fits.append((variant, "-", "inf*", rounds))
        for mode, eps in itertools.product(args.modes, args.epsilons):
            privacy = Privacy(epsilon=eps, mode=mode, bounds=box)
            fits.append((variant, mode, eps, {**rounds, "privacy": privacy}))
    return fits


def done_keys(path: Path | None) -> set[tuple[str, ...]]:
    """The fits a CSV already holds, by :data:`KEY` (as strings)."""
    if path is None or not path.exists():
        return set()
    with path.open() as handle:
        return {tuple(row[k] for k in KEY) for row in csv.DictReader(handle)}


def append(path: Path | None, row: dict) -> None:
    """Write one finished fit to the CSV (the header first when it is new)."""
    if path is None:
        return
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        if new:
            writer.writeheader()
        writer.writerow(row)


def fit_one(method, base: dict, extra: dict, task, X_train, X_test) -> dict:
    """One fit and its scores: AUROC, AUC-PR, what it spent, its rounds and seconds."""
    extra = dict(extra)
    scale = extra.pop("clip_scale", None)  # Privacy.clip as a multiple of sqrt(n_features)
    if scale is not None and "privacy" in extra:
        fields = extra["privacy"].get_params()
        extra["privacy"] = Privacy(**{**fields, "clip": scale * math.sqrt(X_train.shape[1])})
    detector = method.build(**{**base, **extra}, progress=False)  # a variant's K wins
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detector.fit(X_train, groups=task.groups_train)
    seconds = time.perf_counter() - started
    scores = detector.decision_function(X_test)
    spent = getattr(detector, "privacy_spent_", None)
    return {
        "auroc": auroc(task.y_test, scores),
        "aucpr": aupr_out(task.y_test, scores),
        "spent": spent["epsilon"] if spent else math.inf,
        "releases": spent["releases"] if spent else detector.n_rounds_,
        "z": spent["noise_multiplier"] if spent else 0.0,
        "seconds": round(seconds, 3),
    }


def run(args) -> pd.DataFrame:
    path = Path(args.csv) if args.csv else None
    done = done_keys(path)
    rows = []
    datasets = list_adbench() if args.datasets == ["all"] else args.datasets
    for dataset, seed in itertools.product(datasets, args.seeds):
        if args.bounds == "public" and dataset not in PUBLIC_RANGES:
            print(f"{dataset}: no public range documented; skipped", flush=True)
            continue
        task = None
        for name in args.methods:
            method = get_method(name)
            for variant, mode, eps, _ in settings_of(args, dataset, 0):
                key = (dataset, name, variant, args.bounds, mode, str(eps), str(seed))
                if key in done:
                    continue
                if task is None:
                    task = make_task(dataset, "novelty", n_clients=args.clients, alpha=0.5,
                                     seed=seed, max_train=args.max_train)  # fmt: skip
                    X_train, X_test = raw_rows(task, task.X_train), raw_rows(task, task.X_test)
                    fits = dict(
                        ((v, m, str(e)), x)
                        for v, m, e, x in settings_of(args, dataset, X_train.shape[1])
                    )
                base = method.shared_params(n_components=args.components, random_state=seed)
                try:
                    result = fit_one(method, base, fits[(variant, mode, str(eps))], task,
                                     X_train, X_test)  # fmt: skip
                except Exception as error:  # a fit that stops (e.g. a non-private floor)
                    print(f"{key}: {type(error).__name__}: {error}", flush=True)
                    result = dict.fromkeys(COLUMNS[7:11], math.nan) | {"seconds": math.nan}
                row = dict(zip(KEY, key, strict=True))
                row.update(result, n_train=len(X_train), n_features=X_train.shape[1])
                append(path, row)
                rows.append(row)
                print(row, flush=True)
    frame = pd.read_csv(path) if path is not None and path.exists() else pd.DataFrame(rows)
    return frame


def summarise(frame: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC / AUC-PR per (method, variant, bounds, mode, epsilon) over datasets and
    seeds, with the paired difference from the non-private default fit (``d_auroc``, its
    worst case over datasets and seeds)."""
    frame = frame.copy()
    frame["epsilon"] = frame.epsilon.astype(str)
    keys = ["dataset", "method", "seed"]
    reference = frame[frame.epsilon == "inf"].drop_duplicates(keys).set_index(keys)
    reference = reference[["auroc", "aucpr"]].add_suffix("_ref")
    frame = frame.join(reference, on=keys)
    frame["d_auroc"] = frame.auroc - frame.auroc_ref
    frame["d_aucpr"] = frame.aucpr - frame.aucpr_ref
    table = frame.groupby(["method", "variant", "bounds", "mode", "epsilon"], sort=False).agg(
        n=("auroc", "size"),
        auroc=("auroc", "mean"),
        aucpr=("aucpr", "mean"),
        d_auroc=("d_auroc", "mean"),
        d_auroc_worst=("d_auroc", "min"),
        d_aucpr=("d_aucpr", "mean"),
        z=("z", "mean"),
        releases=("releases", "mean"),
        seconds=("seconds", "mean"),
    )
    return table.round(4)


def by_dataset(frame: pd.DataFrame, epsilon: str = "1.0") -> pd.DataFrame:
    """AUROC per dataset (mean over seeds): the non-private fit (``inf``), each variant's
    ``inf*`` and its private fits at ``epsilon`` per mode, and the paired differences."""
    frame = frame.copy()
    frame["epsilon"] = frame.epsilon.astype(str)
    picked = frame[frame.epsilon.isin(["inf", "inf*", epsilon])]
    label = picked.variant + " " + picked["mode"].where(picked["mode"] != "-", "") + " "
    picked = picked.assign(column=(label + picked.epsilon).str.replace("  ", " "))
    table = picked.pivot_table(index="dataset", columns="column", values="auroc")
    table.insert(0, "n_train", frame.groupby("dataset").n_train.first())
    table.insert(1, "n_features", frame.groupby("dataset").n_features.first())
    return table.sort_values("n_train").round(3)


def markdown(table: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (index included)."""
    table = table.reset_index()
    return markdown_table(list(table.columns), list(table.itertuples(index=False)))


def report(frame: pd.DataFrame, command: str) -> str:
    """The run's report: header (command, date, commit, machine), the summary over datasets
    and seeds, and AUROC per dataset at epsilon 1."""
    import subprocess

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return "\n".join(
        [
            "# Differentially private federated EM against epsilon (benchmarks/dp_utility.py)",
            "",
            f"- command: `{command}`",
            f"- date: {time.strftime('%Y-%m-%d')}; commit {commit or 'unknown'}",
            f"- {machine_facts()}",
            "",
            "Mean over datasets and seeds; d_auroc: paired difference from the non-private fit"
            " (inf), d_auroc_worst: the worst dataset and seed.",
            "",
            markdown(summarise(frame)),
            "",
            "AUROC per dataset at epsilon 1 (mean over seeds), by training rows:",
            "",
            markdown(by_dataset(frame)),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets", nargs="+", default=["10_cover"], help='ADBench names, or "all" (25)'
    )
    parser.add_argument("--methods", nargs="+", default=["DEM-kmeans"])
    parser.add_argument("--variants", nargs="+", default=["em40"], choices=sorted(VARIANTS))
    parser.add_argument("--bounds", choices=("private", "public"), default="private")
    parser.add_argument("--modes", nargs="+", default=["central", "local"])
    parser.add_argument("--epsilons", nargs="+", type=float, default=list(EPSILONS))
    add_seeds(parser, (0,))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--components", type=int, default=8)
    parser.add_argument("--max-train", type=int, default=20_000, help="0: every row")
    parser.add_argument("--csv", default=None, help="append each fit here; skip those it holds")
    parser.add_argument("--report", default=None, help="write the markdown report here")
    add_quick(parser, "smoke run: one seed, DEM-kmeans, 5,000 rows")
    args = parser.parse_args(argv)
    args.max_train = args.max_train or None
    if args.quick:
        args.seeds, args.methods, args.modes = [0], ["DEM-kmeans"], ["central"]
        args.max_train, args.epsilons = 5_000, [1.0]
    torch.set_num_threads(1)
    frame = run(args)
    table = summarise(frame)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string())
    if args.report:
        given = sys.argv[1:] if argv is None else argv
        command = "python -m benchmarks.dp_utility " + " ".join(given)
        Path(args.report).write_text(report(frame, command))
    return table


if __name__ == "__main__":
    main()
