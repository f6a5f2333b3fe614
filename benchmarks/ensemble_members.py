"""Gain of an ensemble of FedGenGMM fits per member count, and per combination rule.

On a subset of the ADBench scoreboard (default: 6 sets x seeds 0-1 x both protocols, 10
clients, Dirichlet(0.5), K = 10 full, privacy floor 5 rows, at most 10,000 training and
test rows), fits 16 members once per cell: member 0 is ``FedGenGMMDetector`` on every
column, member ``m >= 1`` ``FedGenGMMDetector`` on a random subset of ``ceil(d/2)..d-1``
columns (one subset draw per cell, seed ``[seed, 7]``; member seeds ``1000 * seed + m``).
The members' training and test scores ``-log p`` are kept (``--cache``, one ``.npz`` a cell,
resumable); the first ``M`` members (M = 1, 2, 4, 8, 16; with member 0, or members 1..M
without it) are then combined by the plain mean, the mean of z-scores (training scores'
mean and standard deviation), the mean of training-rank quantiles and the max z-score,
and the mean AUROC over cells is printed per protocol (``--out``: a markdown table).

    OMP_NUM_THREADS=1 python benchmarks/ensemble_members.py \\
        --out benchmarks/results/adbench_ensemble/members.md
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

SETS = ["1_ALOI", "12_fault", "26_optdigits", "35_SpamBase", "7_Cardiotocography", "22_magic.gamma"]
COUNTS = (1, 2, 4, 8, 16)


def fit_cell(dataset: str, protocol: str, seed: int, members: int, path: Path) -> None:
    """Fit the members of one cell and save their scores to ``path``."""
    from fednovelty.datasets.protocols import make_task
    from fednovelty.detectors import FedGenGMMDetector

    task = make_task(
        dataset, protocol, n_clients=10, alpha=0.5, seed=seed, max_train=10000, max_test=10000
    )
    d = task.X_train.shape[1]
    rng = np.random.default_rng([seed, 7])
    train, test = [], []
    for m in range(members):
        if m == 0:
            columns = np.arange(d)
        else:
            width = rng.integers(max(1, int(np.ceil(d / 2))), max(int(np.ceil(d / 2)), d - 1) + 1)
            columns = np.sort(rng.choice(d, width, replace=False))
        det = FedGenGMMDetector(
            n_components=10, covariance_type="full", random_state=seed * 1000 + m
        )
        det.fit(task.X_train[:, columns], groups=task.groups_train)
        train.append(det.decision_scores_)
        test.append(det.decision_function(task.X_test[:, columns]))
    np.savez(path, tr=np.array(train), te=np.array(test), y=task.y_test, d=d)


def combined(tr: np.ndarray, te: np.ndarray, rule: str) -> np.ndarray:
    """The combined test score of members' training ``tr`` and test ``te`` scores
    (members, rows)."""
    mean, std = tr.mean(1, keepdims=True), tr.std(1, keepdims=True)
    if rule == "mean":
        return te.mean(0)
    if rule == "zscore":
        return ((te - mean) / std).mean(0)
    if rule == "zmax":
        return ((te - mean) / std).max(0)
    ranks = [np.searchsorted(np.sort(t), s) / len(t) for t, s in zip(tr, te, strict=True)]
    return np.mean(ranks, 0)


def table(cache: Path, sets: list[str]) -> str:
    lines = []
    for protocol in ("novelty", "outlier"):
        files = [f for s in sets for f in sorted(cache.glob(f"{s}_{protocol}_*.npz"))]
        lines += [f"\n{protocol} ({len(files)} cells): mean AUROC by members M\n",
                  "| rule | " + " | ".join(f"M={m}" for m in COUNTS) + " |",
                  "|---|" + "---|" * len(COUNTS)]  # fmt: skip
        for first, tag in ((0, "with member 0"), (1, "subsets only")):
            for rule in ("mean", "zscore", "rank", "zmax"):
                cells = []
                for m in COUNTS:
                    values = []
                    for f in files:
                        z = np.load(f)
                        if first + m > len(z["te"]):
                            break
                        idx = slice(first, first + m)
                        values.append(
                            roc_auc_score(z["y"], combined(z["tr"][idx], z["te"][idx], rule))
                        )
                    cells.append(f"{np.mean(values):.4f}" if len(values) == len(files) else "")
                lines.append(f"| {rule}, {tag} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=SETS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ensemble_members"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    args.cache.mkdir(parents=True, exist_ok=True)
    for dataset in args.sets:
        for protocol in ("novelty", "outlier"):
            for seed in args.seeds:
                path = args.cache / f"{dataset}_{protocol}_{seed}.npz"
                if path.exists():
                    continue
                started = time.perf_counter()
                fit_cell(dataset, protocol, seed, args.members, path)
                print(dataset, protocol, seed, f"{time.perf_counter() - started:.1f} s", flush=True)
    text = table(args.cache, args.sets)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
