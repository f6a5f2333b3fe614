"""High dimension: every mixture family through the federated PCA front end, against KNN.

Data: the 17 ADBench CV sets in ``../shared/data/adbench_cv`` (512-d ResNet-18 embeddings:
CIFAR10_0, SVHN_0 and the 15 MVTec-AD categories), plus ``17_InternetAds`` (1,555 features)
where the data folder has it. Protocol: novelty (anomalies only among the test rows), 10
clients drawn by Dirichlet(0.5) over k-means clusters, at most 10,000 training and test
rows, one torch thread (``torch.set_num_threads(1)``).

For each set: PyOD's ``KNN`` (default settings) fitted on the pooled training rows, and each
mixture family with its scoreboard settings (the runner's shared K = 10), once with the
default ``pca_components="auto"`` (the front end: federated PCA, the family on the
projection, the residual term in ``log p(x)``) and once with ``pca_components=None`` (full
covariances on all features) where that fit finishes within ``--cap`` seconds (a fit past
the cap is stopped and reported as such). Times are fit plus scoring of the test rows;
``ratio`` is that time over KNN's. Every finished fit is appended to a CSV at once, so an
interrupted run resumes (``--csv``); the report is built from the CSV.

Run: ``python -m benchmarks.high_dim [--datasets ...] [--families ...] [--cap 60]
[--full-datasets ...] [--seeds 0] [--csv FILE] [--out FILE] [--quick]``.
"""

from __future__ import annotations

import argparse
import signal
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import (
    RESULTS,
    add_out,
    add_quick,
    add_seeds,
    command_line,
    emit_report,
    report_header,
)
from fednovelty.datasets import list_adbench
from fednovelty.datasets.protocols import make_task
from fednovelty.evaluation import auroc
from fednovelty.exceptions import FederationError
from fednovelty.methods import get_method

#: the mixture families compared (scoreboard method names). ``FedMFA`` (mixtures of factor
#: analysers) takes the full rows itself (no front end): its "front end" cells are its own
#: low-rank fit, its q the loadings' columns, and its full-covariance reference DEM-kmeans's.
FAMILIES = ("FedGMM", "DEM-kmeans", "FedVB", "FedGenGMM", "Local", "ClusteredGMM-IFCA", "FedMFA")
#: families without ``pca_components`` -> the family whose full-covariance fit they are
#: compared with.
OWN_LOW_RANK = {"FedMFA": "DEM-kmeans"}
#: ADBench's 1,555-feature set (Internet ads), run when present in the data folder.
TEXT_SET = "17_InternetAds"
#: the sets the full-covariance fits are tried on by default (four small MVTec categories,
#: where they finish within a minute or two, and CIFAR10_0, where they do not).
FULL_DEFAULT = (
    "MVTec-AD_bottle",
    "MVTec-AD_cable",
    "MVTec-AD_capsule",
    "MVTec-AD_carpet",
    "CIFAR10_0",
)
COLUMNS = ["dataset", "seed", "family", "variant", "n_train", "d", "q", "seconds", "auroc"]


class Timeout(BaseException):
    """A fit ran past the cap (a ``BaseException``: the engine counts an ``Exception`` in a
    client step as that client's failure and goes on)."""


def _alarm(signum, frame):
    raise Timeout


def cv_sets() -> list[str]:
    names = [n for n in list_adbench(include_cv=True) if n not in list_adbench()]
    try:
        list_adbench().index(TEXT_SET)
        names.append(TEXT_SET)
    except ValueError:
        pass
    return names


def knn_row(task) -> dict:
    """PyOD's KNN on the pooled training rows: fit plus scoring time, AUROC."""
    from pyod.models.knn import KNN

    started = time.perf_counter()
    scores = KNN().fit(task.X_train).decision_function(task.X_test)
    return {"seconds": time.perf_counter() - started, "auroc": auroc(task.y_test, scores), "q": 0}


def family_row(task, family: str, seed: int, pca_components, cap: float | None) -> dict:
    """One family fitted on the task's clients (``pca_components`` as given), scored on its
    test rows; ``seconds`` is NaN when the fit ran past ``cap`` seconds."""
    method = get_method(family)
    params = method.shared_params(n_components=10, random_state=seed)  # the scoreboard's K
    if family not in OWN_LOW_RANK:
        params["pca_components"] = pca_components
    detector = method.build(**params)
    if cap is not None:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, cap)
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            detector.fit(task.X_train, groups=task.groups_train)
            scores = detector.decision_function(task.X_test)
    except Timeout:
        return {"seconds": float("nan"), "auroc": float("nan"), "q": -1}
    except (ValueError, FederationError) as error:  # e.g. K = 10 above a tiny set's rows
        print(f"  {family} on {task.name}: {error}", flush=True)
        return {"seconds": float("nan"), "auroc": float("nan"), "q": -2}
    finally:
        if cap is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - started
    pca = getattr(detector, "pca_", None)
    q = task.n_features if pca is None else pca.n_components
    q = getattr(detector, "n_factors_", q)  # a mixture of factor analysers: its rank
    return {"seconds": seconds, "auroc": auroc(task.y_test, scores), "q": q}


def run(args) -> pd.DataFrame:
    csv = Path(args.csv)
    done = pd.read_csv(csv) if csv.exists() else pd.DataFrame(columns=COLUMNS)
    keys = {tuple(r) for r in done[["dataset", "seed", "family", "variant"]].astype(str).values}
    rows = done.to_dict("records")
    # the front end on every set first, then the (slow) full-covariance fits
    passes = [(name, False) for name in args.datasets]
    passes += [(name, True) for name in args.datasets if name in args.full_datasets]
    for seed in args.seeds:
        for name, full in passes:
            task = make_task(
                name,
                "novelty",
                n_clients=args.clients,
                alpha=0.5,
                seed=seed,
                max_train=10_000,
                max_test=10_000,
            )
            if full:
                plan = [(f, "full") for f in args.families if f not in OWN_LOW_RANK]
            else:
                plan = [("KNN", "knn")] + [(f, "front") for f in args.families]
            for family, variant in plan:
                if (name, str(seed), family, variant) in keys:
                    continue
                if family == "KNN":
                    result = knn_row(task)
                else:
                    pca = "auto" if variant == "front" else None
                    cap = args.cap if variant == "full" else None
                    result = family_row(task, family, seed, pca, cap)
                row = {
                    "dataset": name,
                    "seed": seed,
                    "family": family,
                    "variant": variant,
                    "n_train": task.X_train.shape[0],
                    "d": task.n_features,
                    **result,
                }
                rows.append(row)
                print(
                    f"{name:22s} {family:18s} {variant:5s} q={row['q']:4d} "
                    f"{row['seconds']:8.2f} s  AUROC {row['auroc']:.4f}",
                    flush=True,
                )
                csv.parent.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows, columns=COLUMNS).to_csv(csv, index=False)
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(seconds: float, knn: float, cap: float, q: int = 0) -> str:
    if q == -2:
        return "error (see the run's log)"
    if not np.isfinite(seconds):
        return f"> {cap:.0f} s"
    return f"{seconds:.2f} s ({seconds / knn:.1f}x)"


def report(frame: pd.DataFrame, cap: float) -> str:
    """Markdown tables: per set and family, and a summary per family."""
    frame = frame.copy()
    lines = []
    families = [f for f in FAMILIES if f in set(frame.family)]
    knn = frame[frame.variant == "knn"].set_index(["dataset", "seed"])
    lines += [
        "",
        "## Per set (seed 0): fit + score time (ratio to KNN's) and AUROC",
        "",
        "| set | rows | d | KNN | family | q | front end | AUROC | full covariance | AUROC "
        "| diff |",
        "|---|---:|---:|---|---|---:|---|---:|---|---:|---:|",
    ]
    summary = {f: {"ratios": [], "diffs": [], "timeouts": 0} for f in families}
    for (name, seed), k in knn.iterrows():
        for family in families:
            front = frame[
                (frame.dataset == name)
                & (frame.seed == seed)
                & (frame.family == family)
                & (frame.variant == "front")
            ]
            full = frame[
                (frame.dataset == name)
                & (frame.seed == seed)
                & (frame.family == OWN_LOW_RANK.get(family, family))
                & (frame.variant == "full")
            ]
            if front.empty:
                continue
            f = front.iloc[0]
            if f.q == -2:
                lines.append(
                    f"| {name} | {int(f.n_train)} | {int(f.d)} | {k.seconds:.2f} s "
                    f"({k.auroc:.4f}) | {family} | | {_cell(f.seconds, k.seconds, cap, -2)} "
                    "| | | | |"
                )
                continue
            ratio = f.seconds / k.seconds
            summary[family]["ratios"].append(ratio)
            full_text, full_auc, diff = "not run", "", ""
            if not full.empty:
                g = full.iloc[0]
                full_text = _cell(g.seconds, k.seconds, cap, int(g.q))
                if np.isfinite(g.seconds):
                    full_auc = f"{g.auroc:.4f}"
                    diff = f"{f.auroc - g.auroc:+.4f}"
                    summary[family]["diffs"].append(f.auroc - g.auroc)
                elif g.q == -1:
                    summary[family]["timeouts"] += 1
            lines.append(
                f"| {name} | {int(f.n_train)} | {int(f.d)} | {k.seconds:.2f} s ({k.auroc:.4f}) "
                f"| {family} | {int(f.q)} | {_cell(f.seconds, k.seconds, cap)} | {f.auroc:.4f} "
                f"| {full_text} | {full_auc} | {diff} |"
            )
    lines += [
        "",
        "## Per family",
        "",
        "| family | sets | median ratio to KNN | max ratio | sets under 10x | full fits finished "
        "| mean AUROC diff (front - full) | worst diff | within 0.01 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for family, s in summary.items():
        ratios, diffs = np.array(s["ratios"]), np.array(s["diffs"])
        if ratios.size == 0:
            continue
        finished = f"{diffs.size} of {diffs.size + s['timeouts']}"
        mean = f"{diffs.mean():+.4f}" if diffs.size else ""
        worst = f"{diffs.min():+.4f}" if diffs.size else ""
        within = f"{int((diffs >= -0.01).sum())} of {diffs.size}" if diffs.size else ""
        lines.append(
            f"| {family} | {ratios.size} | {np.median(ratios):.1f} | {ratios.max():.1f} "
            f"| {int((ratios < 10).sum())} | {finished} | {mean} | {worst} | {within} |"
        )
    knn_mean = knn.auroc.mean()
    fronts = frame[(frame.variant == "front") & (frame.q > 0)].groupby("family").auroc.mean()
    lines += [
        "",
        f"Mean AUROC over the sets: KNN {knn_mean:.4f}; "
        + ", ".join(f"{f} {fronts[f]:.4f}" for f in families if f in fronts)
        + ".",
    ]
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument("--families", nargs="+", default=list(FAMILIES))
    parser.add_argument("--full-datasets", nargs="*", default=list(FULL_DEFAULT))
    parser.add_argument("--cap", type=float, default=90.0, help="seconds a full fit may take")
    add_seeds(parser, (0,))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--csv", default=str(RESULTS / "high_dim.csv"))
    add_out(parser)
    add_quick(parser, "one small set, two families")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.datasets is None:
        args.datasets = cv_sets()
    if args.quick:
        args.datasets, args.families = ["MVTec-AD_bottle"], ["DEM-kmeans", "FedVB"]
        args.full_datasets, args.cap, args.clients = [], args.cap, 4
    started = time.perf_counter()
    frame = run(args)
    command = command_line("high_dim", argv)
    header = report_header(
        "Mixture families in high dimension: the federated PCA front end against KNN",
        command,
        args.quick,
        time.perf_counter() - started,
    )
    return emit_report(header + "\n" + report(frame, args.cap), args.out)


if __name__ == "__main__":
    main()
