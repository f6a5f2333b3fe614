"""Conformal alarms on the scoreboard: the false-alarm rate each client gets, beside PyOD's.

The task of each cell (one ADBench set, one seed) is the scoreboard's: the novelty protocol,
10 clients of Dirichlet(0.5) over k-means clusters, at most 20,000 training and test rows
(the scoreboard's 10,000 leave few clients the 200 calibration rows the table counts).
The detector is the registry's ``DEM-kmeans`` with ``calibration="conformal"`` at ``alpha``
(0.01 and 0.05, one fit each). Per cell:

- clients 0-8 train; client 9 is the **unseen client** (none of its rows reach the fit);
- each training client first keeps 30 % of its rows aside as **fresh inliers** (never given
  to ``fit``); ``fit`` holds out ``calibration_share`` (20 %) of the rest for calibration;
- **conformal**: client ``c``'s alarms are ``predict(X, client=c)``; its achieved
  false-alarm rate is the share of its fresh inliers flagged, its power (TPR) the share of
  the task's novel test rows flagged by the same rule;
- **PyOD's rule** on the same fitted model: the ``1 - alpha`` quantile of the training rows'
  own scores (what ``contamination=alpha`` sets as ``threshold_``), one threshold for all;
- **unseen client**: the federation's threshold (``predict(X)``) on its rows, then
  ``calibrate`` with 20 and 50 of its own rows, each rate on the rows not used.

The report's first table counts the client-cells with at least 200 calibration rows (the
done-when's population): mean achieved rate against ``alpha`` (the target: within 20 %), the
share of client-cells above ``2 alpha`` and the share expected for an exact split-conformal
threshold with the same calibration and fresh-row counts (a beta-binomial: the achieved rate
of a conformal threshold is Beta(n + 1 - k, k) given the calibration rows, then binomial on
the fresh rows), the TPR, and PyOD's rule beside it. Every cell is kept under
``<out>/conformal_alarms_cells`` as it finishes; a later run resumes.

Run: ``python -m benchmarks.conformal_alarms [--seeds 0 1 2 3 4] [--datasets ...] [--quick]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks.checkpoints import Checkpoints, settings_signature
from benchmarks.common import (
    RESULTS,
    add_quick,
    add_seeds,
    command_line,
    emit_report,
    markdown_table,
    report_header,
)
from fednovelty.datasets.protocols import make_task
from fednovelty.federated.core.conformal import conformal_rank
from fednovelty.methods import get_method

ALPHAS = (0.01, 0.05)
FRESH_SHARE = 0.3
UNSEEN = 9
UNSEEN_ROWS = (20, 50)
MIN_CALIBRATION = 200


@dataclasses.dataclass(frozen=True)
class Settings:
    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    max_rows: int
    n_clients: int = 10
    method: str = "DEM-kmeans"
    calibration_share: float = 0.2


def split_fresh(task, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Training rows (client < UNSEEN), minus :data:`FRESH_SHARE` of each client's rows kept
    as fresh inliers; returns the fit's row indices, the fresh rows' indices and the unseen
    client's indices (all into ``task.X_train``)."""
    rng = np.random.default_rng([seed, 17])
    fit, fresh = [], []
    for c in range(UNSEEN):
        rows = rng.permutation(np.flatnonzero(task.groups_train == c))
        n_fresh = round(FRESH_SHARE * rows.size)
        fresh.append(rows[:n_fresh])
        fit.append(rows[n_fresh:])
    unseen = rng.permutation(np.flatnonzero(task.groups_train == UNSEEN))
    return np.concatenate(fit), np.concatenate(fresh), unseen


def run_cell(dataset: str, seed: int, settings: Settings) -> list[dict]:
    """One dataset and seed: a record per (alpha, client) and per (alpha, unseen stage)."""
    task = make_task(
        dataset,
        "novelty",
        n_clients=settings.n_clients,
        alpha=0.5,
        seed=seed,
        max_train=settings.max_rows,
        max_test=settings.max_rows,
    )
    fit_rows, fresh_rows, unseen_rows = split_fresh(task, seed)
    X, groups = task.X_train, task.groups_train
    novel = task.X_test[task.y_test == 1]
    records = []
    for alpha in ALPHAS:
        detector = get_method(settings.method).build(random_state=seed, progress=False)
        detector.set_params(
            calibration="conformal", alpha=alpha, calibration_share=settings.calibration_share
        )
        started = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                detector.fit(X[fit_rows], groups=groups[fit_rows])
        except ValueError as error:  # e.g. no client holds the rows to calibrate
            print(f"{dataset} seed {seed} alpha {alpha}: {error}", flush=True)
            records.append({"dataset": dataset, "seed": seed, "alpha": alpha,
                            "client": "refused", "error": str(error)[:120]})  # fmt: skip
            continue
        seconds = time.perf_counter() - started
        pyod = float(np.percentile(detector.decision_scores_, 100 * (1 - alpha)))
        for c in range(UNSEEN):
            if c not in detector.client_thresholds_:
                continue
            mine = fresh_rows[groups[fresh_rows] == c]
            scores = detector.decision_function(X[mine])
            novel_scores = detector.decision_function(novel)
            records.append(
                {
                    "dataset": dataset,
                    "seed": seed,
                    "alpha": alpha,
                    "client": c,
                    "calibration_rows": int(detector.calibration_rows_[c]),
                    "fresh_rows": int(mine.size),
                    "source": detector.calibration_sources_[c],
                    "far": float(np.mean(detector.predict(X[mine], client=c))),
                    "tpr": float(np.mean(detector.predict(novel, client=c))),
                    "far_pyod": float(np.mean(scores > pyod)),
                    "tpr_pyod": float(np.mean(novel_scores > pyod)),
                    "seconds": seconds,
                }
            )
        records += unseen_records(detector, X[unseen_rows], dataset, seed, alpha)
    return records


def unseen_records(detector, rows: np.ndarray, dataset: str, seed: int, alpha: float):
    """The unseen client's achieved rate: the federation's threshold, then after
    ``calibrate`` with the first 20 and 50 of its rows (each measured on its rows from the
    50th on, the same rows for all three)."""
    test = rows[max(UNSEEN_ROWS) :]
    if test.shape[0] < 20:
        return []
    out = [{"stage": 0, "far": float(np.mean(detector.predict(test)))}]
    for n in UNSEEN_ROWS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            detector.calibrate(rows[:n], client="unseen")
        out.append({"stage": n, "far": float(np.mean(detector.predict(test, client="unseen")))})
    base = {"dataset": dataset, "seed": seed, "alpha": alpha, "client": "unseen"}
    return [{**base, **r, "fresh_rows": int(test.shape[0])} for r in out]


def expected_rate(n_cal: int, alpha: float) -> float:
    """The mean false-alarm rate of an exact split-conformal threshold on ``n_cal``
    continuous scores: ``(n + 1 - k) / (n + 1)``, k the conformal rank."""
    k = conformal_rank(n_cal, alpha)
    return (n_cal + 1 - k) / (n_cal + 1) if k <= n_cal else 0.0


def expected_above(n_cal: np.ndarray, m: np.ndarray, alpha: float, factor: float = 2.0):
    """P(achieved rate > factor * alpha) for an exact split-conformal threshold on ``n_cal``
    calibration rows, measured on ``m`` fresh rows: the count of alarms is beta-binomial
    (m, n + 1 - k, k), k the conformal rank. Shapes (n,) -> (n,)."""
    out = []
    for n, rows in zip(n_cal, m, strict=True):
        k = conformal_rank(int(n), alpha)
        if k > n or rows == 0:
            out.append(np.nan)
            continue
        limit = np.floor(factor * alpha * rows)  # more alarms than this are above
        out.append(float(stats.betabinom(int(rows), int(n) + 1 - k, k).sf(limit)))
    return np.array(out)


def summary(clients: pd.DataFrame) -> str:
    """The done-when's table: client-cells with >= MIN_CALIBRATION calibration rows."""
    rows = []
    groups = [
        (alpha, least, part[(part.calibration_rows >= least) & (part.source == "own")])
        for least in (MIN_CALIBRATION, 500)
        for alpha, part in clients.groupby("alpha")
    ]
    for alpha, least, big in groups:
        if big.empty:
            continue
        mean = big.far.mean()
        exact = np.mean([expected_rate(int(n), alpha) for n in big.calibration_rows])
        sem = big.far.std(ddof=1) / np.sqrt(len(big)) if len(big) > 1 else np.nan
        expected = np.nanmean(expected_above(big.calibration_rows, big.fresh_rows, alpha))
        rows.append(
            [
                f"{alpha:g}",
                f">= {least}",
                len(big),
                f"{mean:.4f} ± {sem:.4f}",
                f"{mean / alpha - 1:+.0%}",
                f"{exact:.4f}",
                f"{np.mean(big.far > 2 * alpha):.1%}",
                f"{expected:.1%}",
                f"{big.tpr.mean():.3f}",
                f"{big.far_pyod.mean():.4f}",
                f"{np.mean(big.far_pyod > 2 * alpha):.1%}",
                f"{big.tpr_pyod.mean():.3f}",
            ]
        )
    header = [
        "alpha",
        "calibration rows",
        "client-cells",
        "conformal: mean rate ± s.e.",
        "vs alpha",
        "exact conformal's mean rate",
        "above 2 alpha",
        "expected above 2 alpha (exact conformal)",
        "TPR",
        "PyOD rule: mean rate",
        "above 2 alpha",
        "TPR",
    ]
    return markdown_table(header, rows)


def unseen_summary(unseen: pd.DataFrame) -> str:
    rows = []
    for (alpha, stage), part in unseen.groupby(["alpha", "stage"]):
        label = "federation's threshold" if stage == 0 else f"after {int(stage)} own rows"
        rows.append(
            [
                f"{alpha:g}",
                label,
                len(part),
                f"{part.far.mean():.4f}",
                f"{part.far.median():.4f}",
                f"{np.mean(part.far > 2 * alpha):.1%}",
            ]
        )
    header = ["alpha", "threshold", "cells", "mean rate", "median rate", "above 2 alpha"]
    return markdown_table(header, rows)


def per_dataset(clients: pd.DataFrame) -> str:
    big = clients[(clients.calibration_rows >= MIN_CALIBRATION) & (clients.source == "own")]
    table = big.pivot_table(index="dataset", columns="alpha", values="far", aggfunc="mean")
    counts = big.pivot_table(index="dataset", columns="alpha", values="far", aggfunc="size")
    rows = [
        [name, *(f"{table.loc[name, a]:.4f} ({int(counts.loc[name, a])})" for a in table)]
        for name in table.index
    ]
    return markdown_table(["dataset", *(f"alpha {a:g}: rate (cells)" for a in table)], rows)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_seeds(parser, default=(0, 1, 2, 3, 4))
    add_quick(parser, help="two small sets, one seed, at most 3,000 rows: about a minute")
    parser.add_argument("--datasets", nargs="+", default=None, help="default: all 25")
    parser.add_argument("--out", type=Path, default=RESULTS / "conformal_alarms.md")
    return parser.parse_args(argv)


def main(argv=None) -> str:
    from fednovelty.datasets.loaders import list_adbench

    args = parse_args(argv)
    started = time.perf_counter()
    names = args.datasets or (["4_breastw", "29_Pima"] if args.quick else list_adbench())
    settings = Settings(
        datasets=tuple(names),
        seeds=tuple(args.seeds[:1] if args.quick else args.seeds),
        max_rows=3000 if args.quick else 20000,
    )
    folder = None if args.quick else args.out.parent / "conformal_alarms_cells"
    signature = settings_signature({k: v for k, v in vars(settings).items() if k != "datasets"})
    checkpoints = Checkpoints(folder, signature)
    records = []
    for name in settings.datasets:
        for seed in settings.seeds:
            cell = checkpoints.get(
                f"{name}-seed{seed}", lambda n=name, s=seed: run_cell(n, s, settings)
            )
            records += cell
            print(f"{name} seed {seed}: {len(cell)} records", flush=True)
    frame = pd.DataFrame(records)
    refused = frame[frame.client == "refused"]
    clients = frame[~frame.client.isin(["unseen", "refused"])].copy()
    unseen = frame[frame.client == "unseen"].copy()
    refusals = (
        "none"
        if refused.empty
        else "; ".join(
            f"{name} ({len(part)} fits): {part.error.iloc[0]}"
            for name, part in refused.groupby("dataset")
        )
    )
    report = "\n\n".join(
        [
            report_header(
                "Conformal alarms: achieved false-alarm rates per client",
                command_line("conformal_alarms", argv),
                args.quick,
                time.perf_counter() - started,
            ),
            f"{len(settings.datasets)} ADBench sets x seeds {list(settings.seeds)}; "
            f"{settings.method}, novelty protocol, clients 0-8 train, client 9 unseen; "
            f"client-cells with at least {MIN_CALIBRATION} calibration rows whose threshold is "
            "their own.",
            f"Fits refused: {refusals}.",
            "## Per client (conformal beside PyOD's rule on the same model)",
            summary(clients),
            "## The unseen client",
            unseen_summary(unseen) if len(unseen) else "no unseen client with enough rows.",
            "## Per dataset (conformal mean rate)",
            per_dataset(clients),
            "## Kept cells\n\n- " + checkpoints.provenance(),
        ]
    )
    return emit_report(report, None if args.quick else args.out)


if __name__ == "__main__":
    main()
