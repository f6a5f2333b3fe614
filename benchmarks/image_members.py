"""Random-start ensembles of ``FedMFADetector`` on images, against pooled KNN.

FEMNIST writers' ``transforms`` set (``make_task("femnist:transforms")``: 100 writers, half
of the writers' test images shrunk, turned or mirrored, the task's polar features), seeds
0 1 2. Per seed, one ``FedMFADetector(n_components=K, n_members=M)`` fit (K = 60, M = 8,
20 EM rounds a member) and PyOD's KNN (defaults) on the pooled training rows. Since member
``m``'s seed does not depend on ``M``, the first ``m`` members of the fit are exactly the
fit with ``n_members=m``: the report reads the AUROC of every prefix from one fit, so that
the gain per member is measured on the same members. Beside the mean of log-densities (the
detector's score) it shows the mean of densities (the union of the members' components).

Report (``results/image_members.md``): AUROC % per seed and member count, the paired
difference with KNN (mean and its standard error over the seeds), and the cost per member
count (rounds, MB up, fit seconds as a ratio to KNN's fit-and-score seconds).

``--part cv``: the same member sweep on the 17 ADBench CV sets (512-d embeddings; novelty
protocol, 10 clients of Dirichlet(0.5), the scoreboard's K = 10, seeds as given), each
(set, seed) cell kept in ``results/image_members_cv.jsonl`` as it finishes (a rerun
resumes); the report (``results/image_members_cv.md``) gives the mean AUROC over the cells
per member count, paired with KNN, and each set's AUROC with one and with every member. A
set whose clients cannot back K = 10 under their floor is listed as refused.

Options: ``--part femnist|cv``, ``--seeds``, ``--components`` (default 60; 10 with ``cv``),
``--members``, ``--writers``, ``--quick`` (20 writers, K = 5, 3 members, seed 0; with
``cv`` two sets, K = 3), ``--threads``, ``--out``.
Run: ``python -m benchmarks.image_members``
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from pyod.models.knn import KNN
from sklearn.metrics import roc_auc_score

from benchmarks.common import (
    RESULTS,
    add_out,
    add_quick,
    add_seeds,
    add_threads,
    command_line,
    emit_report,
    markdown_table,
    mean_std,
    quick_seeds,
    report_header,
)
from benchmarks.high_dim import cv_sets
from fednovelty import FedMFADetector
from fednovelty.datasets.protocols import make_task
from fednovelty.exceptions import FederationError
from fednovelty.mixture.containers import split
from fednovelty.mixture.factor import factor_score_samples


def member_log_densities(det: FedMFADetector, X: np.ndarray) -> np.ndarray:
    """Each member's log-density of rows ``X``: (n_members, n_samples)."""
    rows = torch.as_tensor(np.asarray(X, dtype=np.float64))
    with torch.no_grad():
        members = split(det.model_, det.member_components_)
        return torch.stack([factor_score_samples(rows, m) for m in members]).numpy()


def prefix_scores(log_densities: np.ndarray, m: int, rule: str) -> np.ndarray:
    """Anomaly scores of the first ``m`` members: minus the mean of their log-densities
    (``"log-mean"``, the detector's) or minus the log of their mean density (``"union"``)."""
    first = log_densities[:m]
    if rule == "log-mean":
        return -first.mean(0)
    return -(np.logaddexp.reduce(first, axis=0) - np.log(m))


def run_seed(seed: int, args) -> dict:
    """One seed: KNN and the M-member fit's prefixes; AUROC %, rounds, bytes, seconds."""
    task = make_task("femnist:transforms", n_clients=args.writers, alpha=None, seed=seed)
    started = time.perf_counter()
    knn = KNN().fit(task.X_train).decision_function(task.X_test)
    knn_seconds = time.perf_counter() - started
    member_rounds, member_bytes, member_seconds = [], [], []
    record = {"KNN": 100 * roc_auc_score(task.y_test, knn), "knn_seconds": knn_seconds}
    started = time.perf_counter()
    rounds_seen = []
    det = FedMFADetector(n_components=args.components, n_members=args.members, random_state=seed)
    det.fit(
        task.X_train,
        groups=task.groups_train,
        callbacks=[lambda r: rounds_seen.append((r.round, time.perf_counter()))],
    )
    fit_seconds = time.perf_counter() - started
    # each member's rounds, bytes and seconds, in member order (history_ numbers them on)
    members = np.array([r.get("member", 0) for r in det.history_])
    ends = np.cumsum([0] + [int((members == i).sum()) for i in range(args.members)])
    for i in range(args.members):
        records = det.history_[ends[i] : ends[i + 1]]
        member_rounds.append(len(records))
        member_bytes.append(sum(r["bytes_up"] for r in records))
        first, last = ends[i], ends[i + 1] - 1
        start = started if i == 0 else rounds_seen[first - 1][1]
        member_seconds.append(rounds_seen[last][1] - start)
    log_p = member_log_densities(det, task.X_test)
    for m in range(1, args.members + 1):
        for rule in ("log-mean", "union"):
            scores = prefix_scores(log_p, m, rule)
            record[f"{rule} {m}"] = 100 * roc_auc_score(task.y_test, scores)
    record.update(
        member_rounds=member_rounds,
        member_mb=[b / 1e6 for b in member_bytes],
        member_seconds=member_seconds,
        fit_seconds=fit_seconds,
    )
    print(seed, {k: round(v, 2) for k, v in record.items() if isinstance(v, float)}, flush=True)
    return record


def report(per_seed: dict[int, dict], args, seconds: float) -> str:
    """The report: AUROC per member count and rule, paired with KNN, and the cost."""
    seeds = sorted(per_seed)
    header = ["score", *[f"seed {s}" for s in seeds], "mean", "minus KNN (s.e.)"]
    rows = [
        [
            "KNN (PyOD, pooled)",
            *[f"{per_seed[s]['KNN']:.2f}" for s in seeds],
            f"{np.mean([per_seed[s]['KNN'] for s in seeds]):.2f}",
            "",
        ]
    ]
    for rule in ("log-mean", "union"):
        for m in range(1, args.members + 1):
            values = [per_seed[s][f"{rule} {m}"] for s in seeds]
            diffs = np.array([v - per_seed[s]["KNN"] for v, s in zip(values, seeds, strict=True)])
            se = diffs.std(ddof=1) / np.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
            rows.append(
                [
                    f"{rule}, {m} member{'s' if m > 1 else ''}",
                    *[f"{v:.2f}" for v in values],
                    f"{np.mean(values):.2f}",
                    f"{diffs.mean():+.2f} ({se:.2f})",
                ]
            )
    cost_rows = []
    for m in range(1, args.members + 1):
        rounds = [sum(per_seed[s]["member_rounds"][:m]) for s in seeds]
        mb = [sum(per_seed[s]["member_mb"][:m]) for s in seeds]
        fit = [sum(per_seed[s]["member_seconds"][:m]) for s in seeds]
        ratio = [f / per_seed[s]["knn_seconds"] for f, s in zip(fit, seeds, strict=True)]
        cost_rows.append(
            [m, mean_std(rounds, 0), mean_std(mb, 2), mean_std(fit, 1), mean_std(ratio, 0)]
        )
    return "\n\n".join(
        [
            report_header(
                "Random-start ensembles of FedMFA on FEMNIST writers (transforms set)",
                command_line("image_members"),
                args.quick,
                seconds,
            ),
            f"{args.writers} writers, `FedMFADetector(n_components={args.components}, "
            f"n_members={args.members})` (10 factors, 20 EM rounds a member), PyOD KNN with "
            "its defaults on the pooled training rows. AUROC % of the first m members' "
            "scores (the fit with `n_members=m`): `log-mean` is the detector's score (minus "
            "the mean of the members' log-densities), `union` minus the log of their mean "
            "density. Difference with KNN paired by seed (s.e. over the seeds).",
            markdown_table(header, rows),
            "Cost per member count (mean ± std over the seeds; fit seconds of the members "
            "on one thread, and their ratio to KNN's fit and score seconds):",
            markdown_table(["members", "rounds", "MB up", "fit s", "x KNN"], cost_rows),
        ]
    )


# ----------------------------------------------------------------------------- the CV sets
def cv_cell(name: str, seed: int, args) -> dict:
    """One CV set and seed: KNN's AUROC and the AUROC of every member prefix (NaN and the
    reason where the federation cannot back K)."""
    task = make_task(
        name, "novelty", n_clients=10, alpha=0.5, seed=seed, max_train=10_000, max_test=10_000
    )
    cell = {"dataset": name, "seed": seed, "n_train": int(task.X_train.shape[0])}
    cell["KNN"] = roc_auc_score(task.y_test, KNN().fit(task.X_train).decision_function(task.X_test))
    det = FedMFADetector(n_components=args.components, n_members=args.members, random_state=seed)
    try:
        det.fit(task.X_train, groups=task.groups_train)
    except (ValueError, FederationError) as error:
        return {**cell, "refused": str(error).split(";")[0]}
    log_p = member_log_densities(det, task.X_test)
    for m in range(1, args.members + 1):
        cell[f"log-mean {m}"] = roc_auc_score(task.y_test, prefix_scores(log_p, m, "log-mean"))
    cell["rounds"] = det.n_rounds_
    return cell


def run_cv(args) -> list[dict]:
    """Every (set, seed) cell, resumed from ``args.cells`` and appended to it as it ends."""
    done = []
    if args.cells.exists():
        done = [json.loads(line) for line in args.cells.read_text().splitlines() if line]
    keys = {(c["dataset"], c["seed"]) for c in done}
    names = cv_sets()[:2] if args.quick else cv_sets()
    args.cells.parent.mkdir(parents=True, exist_ok=True)
    for seed in quick_seeds(args.seeds, args.quick):
        for name in names:
            if (name, seed) in keys:
                continue
            cell = cv_cell(name, seed, args)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in cell.items()})
            done.append(cell)
            with args.cells.open("a") as fh:
                fh.write(json.dumps(cell) + "\n")
    return [c for c in done if c["dataset"] in names]


def cv_report(cells: list[dict], args, seconds: float) -> str:
    """Mean AUROC over the fitted cells per member count, paired with KNN (s.e. over the
    seeds of the per-seed mean differences), each set's one- and all-member AUROC, the
    refused cells."""
    fitted = [c for c in cells if "refused" not in c]
    seeds = sorted({c["seed"] for c in fitted})
    rows = [["KNN (PyOD, pooled)", f"{np.mean([c['KNN'] for c in fitted]):.4f}", ""]]
    for m in range(1, args.members + 1):
        key = f"log-mean {m}"
        per_seed = [np.mean([c[key] - c["KNN"] for c in fitted if c["seed"] == s]) for s in seeds]
        se = np.std(per_seed, ddof=1) / np.sqrt(len(per_seed)) if len(seeds) > 1 else np.nan
        rows.append(
            [
                f"FedMFA, {m} member{'s' if m > 1 else ''}",
                f"{np.mean([c[key] for c in fitted]):.4f}",
                f"{np.mean([c[key] - c['KNN'] for c in fitted]):+.4f} ({se:.4f})",
            ]
        )
    by_set = []
    last = f"log-mean {args.members}"
    for name in dict.fromkeys(c["dataset"] for c in cells):
        mine = [c for c in fitted if c["dataset"] == name]
        if not mine:
            by_set.append(
                [
                    name,
                    "",
                    "",
                    "",
                    "refused: " + next(c["refused"] for c in cells if c["dataset"] == name),
                ]
            )
            continue
        by_set.append(
            [
                name,
                f"{np.mean([c['KNN'] for c in mine]):.4f}",
                f"{np.mean([c['log-mean 1'] for c in mine]):.4f}",
                f"{np.mean([c[last] for c in mine]):.4f}",
                len(mine),
            ]
        )
    return "\n\n".join(
        [
            report_header(
                "Random-start ensembles of FedMFA on the ADBench CV sets (512-d embeddings)",
                command_line("image_members"),
                args.quick,
                seconds,
            ),
            f"Novelty protocol, 10 clients of Dirichlet(0.5), `FedMFADetector(n_components="
            f"{args.components}, n_members={args.members})` with its other defaults, PyOD "
            f"KNN on the pooled training rows; {len(fitted)} fitted cells (sets x seeds "
            f"{', '.join(map(str, seeds))}). Mean AUROC of the first m members' score, "
            "paired with KNN (s.e. over the seeds):",
            markdown_table(["score", "mean AUROC", "minus KNN (s.e.)"], rows),
            "Per set (mean over the seeds):",
            markdown_table(["set", "KNN", "1 member", f"{args.members} members", "seeds"], by_set),
        ]
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("femnist", "cv"), default="femnist")
    add_seeds(parser)
    parser.add_argument("--components", type=int, default=None)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--cells", type=Path, default=RESULTS / "image_members_cv.jsonl")
    add_quick(parser, help="20 writers, K = 5, 3 members, the first seed")
    add_threads(parser)
    add_out(parser)
    args = parser.parse_args(argv)
    if args.components is None:
        args.components = 60 if args.part == "femnist" else 10
    if args.out is None:
        args.out = RESULTS / (
            "image_members.md" if args.part == "femnist" else "image_members_cv.md"
        )
    if args.members < 1 or args.components < 1:
        parser.error("--members and --components must be >= 1")
    if args.quick:
        args.writers, args.members = 20, 3
        args.components = 5 if args.part == "femnist" else 3
    return args


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    if args.part == "cv":
        cells = run_cv(args)
        text = cv_report(cells, args, time.perf_counter() - started)
    else:
        per_seed = {s: run_seed(s, args) for s in quick_seeds(args.seeds, args.quick)}
        text = report(per_seed, args, time.perf_counter() - started)
    return emit_report(text, None if args.quick else args.out)


if __name__ == "__main__":
    main()
