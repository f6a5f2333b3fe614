"""Issue 7 diagnosis: where the training anomalies sit in a fitted federated mixture.

For each dataset it fits a federated detector with the robust defaults on the scoreboard's
task (10 clients, Dirichlet(0.5), at most 10,000 rows), assigns every training row to its
most probable component and prints one row per component: its weight, the rows it holds,
how many of them are anomalies, and the log-determinant of its covariance (small: tight).
The training labels are read **for the diagnosis only**; the detector never sees them::

    python benchmarks/robust_diagnose.py --datasets 26_optdigits 35_SpamBase --seed 0

It answers the question the remedies hinge on: do the anomalies get a small, tight component
of their own (then a weight-aware rule could help), do they hide inside a dominant component
(then no reweighting of components can), or are they a large share of the rows (a second
class rather than rare events)? The table is written to ``--out`` as
``robust_diagnose_<method>[-plain]_<protocol>_<seed>.csv``; ``--plain`` switches the
robust defaults off, to see the same datasets before issue 7.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from fednovelty.datasets.loaders import load_adbench
from fednovelty.datasets.protocols import make_task
from fednovelty.detectors import FedGenGMMDetector, FedGMMDetector
from fednovelty.evaluation.metrics import auroc
from fednovelty.mixture import predict_proba

OUT = Path(__file__).resolve().parent / "results" / "adbench"
METHODS = {
    "DEM-kmeans": lambda seed, **kw: FedGMMDetector(
        10, mixture_weights="global", random_state=seed, **kw
    ),
    "FedGenGMM": lambda seed, **kw: FedGenGMMDetector(n_components=10, random_state=seed, **kw),
}
PLAIN = {"standardize": False, "covariance_prior": None}  # the switches of docs/robust.md


def component_table(detector, X: np.ndarray, is_anomaly: np.ndarray) -> pd.DataFrame:
    """One row per component of a fitted detector's mixture, heaviest first.

    Args:
        detector: a fitted ``FedGMMDetector`` or ``FedGenGMMDetector``.
        X: (n, d) rows to assign, each to its most probable component.
        is_anomaly: (n,) 0/1 labels of those rows (read here only).

    Returns:
        Columns ``component``, ``weight``, ``rows``, ``anomalies``, ``anomaly_share`` (of the
        component's rows; NaN when it holds none), ``share_of_anomalies`` (of all anomalies
        in ``X``) and ``log_det_cov``.
    """
    is_anomaly = np.asarray(is_anomaly).astype(bool)
    model = detector.model_
    rows = torch.as_tensor(X, dtype=model.means.dtype, device=model.means.device)
    assigned = predict_proba(model, rows).argmax(1).cpu().numpy()
    counts = np.bincount(assigned, minlength=model.n_components)
    hits = np.bincount(assigned, weights=is_anomaly, minlength=model.n_components)
    log_det = np.linalg.slogdet(detector.covariances_)[1]
    if log_det.ndim == 0:  # tied: one shared covariance
        log_det = np.full(model.n_components, float(log_det))
    table = pd.DataFrame(
        {
            "component": np.arange(model.n_components),
            "weight": detector.weights_,
            "rows": counts,
            "anomalies": hits.astype(int),
            "anomaly_share": np.divide(
                hits, counts, out=np.full(len(counts), np.nan), where=counts > 0
            ),
            "share_of_anomalies": hits / max(int(is_anomaly.sum()), 1),
            "log_det_cov": log_det,
        }
    )
    return table.sort_values("weight", ascending=False, ignore_index=True)


def diagnose(
    name: str, method: str, protocol: str, seed: int, data_dir=None, plain: bool = False
) -> pd.DataFrame:
    """The component table of one dataset, with the test AUROC and anomaly share attached;
    ``plain`` switches the robust defaults off (the behaviour before issue 7)."""
    task = make_task(
        name,
        protocol,
        n_clients=10,
        alpha=0.5,
        seed=seed,
        data_dir=data_dir,
        max_train=10_000,
        max_test=10_000,
    )
    _, y = load_adbench(name, data_dir)
    y_train = y[task.train_index]
    detector = METHODS[method](seed, **(PLAIN if plain else {})).fit(
        task.X_train, groups=task.groups_train
    )
    table = component_table(detector, task.X_train, y_train)
    table.insert(0, "dataset", name)
    table["train_anomaly_share"] = float(y_train.mean())
    table["test_auroc"] = auroc(task.y_test, detector.decision_function(task.X_test))
    return table


def main(argv=None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", nargs="+", required=True)
    parser.add_argument("--method", default="DEM-kmeans", choices=sorted(METHODS))
    parser.add_argument("--protocol", default="outlier", choices=("outlier", "novelty"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="switch the robust defaults off")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    tables = [
        diagnose(name, args.method, args.protocol, args.seed, args.data_dir, args.plain)
        for name in args.datasets
    ]
    df = pd.concat(tables, ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = f"{args.method}{'-plain' if args.plain else ''}_{args.protocol}_{args.seed}"
    df.to_csv(args.out / f"robust_diagnose_{tag}.csv", index=False)
    for name, table in df.groupby("dataset", sort=False):
        head = table.iloc[0]
        print(
            f"\n{name}: {head.train_anomaly_share:.1%} of training rows are anomalies; "
            f"test AUROC {head.test_auroc:.3f}; {(table.weight >= 0.01).sum()} of "
            f"{len(table)} components weigh >= 1%"
        )
        shown = table[table.rows > 0].drop(columns=["dataset", "train_anomaly_share", "test_auroc"])
        print(shown.round(3).to_string(index=False))
    return df


if __name__ == "__main__":
    main()
