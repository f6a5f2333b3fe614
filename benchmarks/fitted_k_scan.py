"""Which ADBench cells the README's default cannot fit at K, and what it fits there.

The registry's ``DEM-kmeans`` (``FedGMMDetector(mixture_weights="global")``, k-FED start) with
the scoreboard's settings (K = 10, 10 Dirichlet(0.5) clients over k-means clusters, at most
10,000 training and test rows, the clients' floor of 5 rows) on every ADBench set in the data
folder (the tabular sets and the image embeddings), both protocols, the given seeds. One CSV
row a cell: the training rows of each client, the k-means centroids the clients sent, the
Lloyd-round merges of the centres, the K fitted (``n_components_``) and kept
(``effective_n_components_``), the warning categories, whether every test score is finite,
and the error if the fit failed.

    python -m benchmarks.fitted_k_scan --out benchmarks/results/adbench_small_sets/k_scan.csv
"""

from __future__ import annotations

import argparse
import csv
import warnings
from pathlib import Path

import numpy as np

from fednovelty.datasets import list_adbench
from fednovelty.datasets.protocols import make_task
from fednovelty.methods import get_method
from fednovelty.runtime.threads import torch_threads

FIELDS = (
    "dataset",
    "protocol",
    "seed",
    "n_train",
    "client_rows",
    "n_centroids",
    "merges",
    "n_components_",
    "effective_n_components_",
    "warnings",
    "finite_scores",
    "error",
)


def scan_cell(dataset: str, protocol: str, seed: int, data_dir, k: int) -> dict:
    """One cell's row of :data:`FIELDS` (the fit's exception, if any, in ``error``)."""
    row = {"dataset": dataset, "protocol": protocol, "seed": seed}
    try:
        task = make_task(
            dataset, protocol, n_clients=10, alpha=0.5, seed=seed, data_dir=data_dir,
            max_train=10_000, max_test=10_000,
        )  # fmt: skip
        rows = np.bincount(task.groups_train, minlength=10)
        row.update(n_train=int(rows.sum()), client_rows=" ".join(map(str, rows.tolist())))
        detector = get_method("DEM-kmeans").build(n_components=k, random_state=seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            detector.fit(task.X_train, groups=task.groups_train)
        history = detector.history_
        centroids = [h["n_centroids"] for h in history if h.get("kind") == "centroids"]
        merges = [h["merged_centres"] for h in history if h.get("merged_centres") is not None]
        scores = detector.decision_function(task.X_test)
        row.update(
            n_centroids=centroids[-1] if centroids else "",
            merges=" ".join(f"{m}->{(m + 1) // 2}" for m in merges),
            n_components_=int(detector.n_components_),
            effective_n_components_=int(detector.effective_n_components_),
            warnings=" ".join(sorted({w.category.__name__ for w in caught})),
            finite_scores=bool(np.isfinite(scores).all()),
        )
    except Exception as error:  # a failure is a result: recorded, the scan goes on
        row["error"] = f"{type(error).__name__}: {error}"[:400]
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV to write")
    parser.add_argument("--data-dir", default=None, help="folder holding adbench/")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--components", type=int, default=10)
    parser.add_argument("--datasets", nargs="+", default=None, help="default: every set")
    args = parser.parse_args(argv)
    names = args.datasets or list_adbench(args.data_dir, include_cv=True)
    with open(args.out, "w", newline="") as handle, torch_threads(1):
        writer = csv.DictWriter(handle, FIELDS)
        writer.writeheader()
        for name in names:
            for protocol in ("novelty", "outlier"):
                for seed in args.seeds:
                    row = scan_cell(name, protocol, seed, args.data_dir, args.components)
                    writer.writerow(row)
                    handle.flush()
                    print(row["dataset"], protocol, seed, row.get("n_components_"),
                          row.get("error", ""), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
