"""Streams: novelty under drift, weight tracking and false alarms.

Run ``python -m benchmarks.stream_drift`` (both datasets, seeds 0 1 2) or ``--quick`` (a
smoke run of cifar10-svhn unless ``--dataset`` names more). ``--dataset cifar10-svhn
femnist``, ``--windows``, ``--clients``, ``--rows``, ``--components`` (each overrides the
per-dataset settings below), ``--rho``, ``--rounds``, ``--seeds``, ``--threads``, ``--out FILE``
(the report; the tidy table goes beside it as ``.csv`` and the figure as ``.png``, or
``--figure``); ``--part novelty alarms`` (both by default: sections 1-2, sections 3-4),
``--alarm-windows`` (the stationary stream's windows). Run it with one torch thread
(``OMP_NUM_THREADS=1``).

The streams, the detectors and the table are the library's
(:func:`fednovelty.datasets.streams.domain_stream`,
:func:`fednovelty.evaluation.run_stream_benchmark`; ``docs/streaming.md``); this script
chooses the settings, checks the targets below and adds the stationary stream.

Datasets (domain A's share follows the pFedEM paper's linear cycle 0 -> 1 -> 0 over the
windows, after a warm-up window with share 1/2 that every detector is first fitted on and
the features are learned from):

- ``cifar10-svhn``: ADBench's ResNet-18 embeddings of CIFAR-10 (``CIFAR10_0``, A) and SVHN
  (``SVHN_0``, B), 512 features on 16 principal axes; inliers split 70 / 30 into training and
  test pools; the novel rows are both sets' own anomalies. 10 clients x 100 rows per window,
  40 windows, K = 4.
- ``femnist``: 40 FEMNIST writers as the clients, digits = A, letters = B, each writer
  drawing 50 of its own training images per window; ``make_task("femnist")``'s polar
  features (direction on 24 principal axes + log norm, min-max scaled); the novel rows are
  held-out images scaled by 0.5, rotated 90 degrees or mirrored (``make_task``'s
  ``"transforms"``). 30 windows, K = 10.

Each window's test set: 300 test inliers in the window's mix + 30 novel rows.

1. **Novelty under drift**: per-window AUROC, bytes and seconds of ``streaming``
   (``StreamingFedGMMDetector``, ``--rho`` 0.7, ``--rounds`` 1 per window), ``static``
   (FedGMM fitted on the warm-up window only), ``refit`` (FedGMM from scratch every window)
   and ``FedGenGMM`` (from scratch every window); the mixtures are plain maximum likelihood
   (their ``plain`` ablations ``FedGMM-plain`` and ``FedGenGMM-plain``,
   :mod:`fednovelty.evaluation.ablations`), as the streaming detector's.
2. **Weight tracking**: each client's weight on A's components (those holding mostly A's
   warm-up rows) against its share of A, mean absolute error after the first half-cycle.
3. **False alarms** on a stationary stream (share 1/2 throughout, ``rho=0.7``): alarms per
   client and window of both drift tests, ``drift_test="cusum"`` and ``"conformal"``,
   against the documented ``false_alarm_rate`` (0.01).
4. **Detection delay** of both tests on two documented shifts (A's share 1/2 -> 1; 20 % of
   every client's rows novel), from window 21 of 30. Sections 3-4:
   :mod:`benchmarks.stream_alarms`.

Targets: streaming AUROC within 0.01 of refitting at <= 1/5 of its bytes and well
above the static detector once the mix has moved; tracking error <= 0.05; false alarms of the
conformal test within +-30 % of the documented rate, of the CUSUM <= it.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from benchmarks.common import (
    add_out,
    add_quick,
    add_seeds,
    add_threads,
    check,
    command_line,
    emit_report,
    markdown_table,
    mean_std,
    report_header,
)
from benchmarks.stream_alarms import (
    ALARM_WINDOWS,
    SHIFT_AT,
    SHIFT_WINDOWS,
    run_alarms,
    shift_report,
    stationary_report,
)
from fednovelty.evaluation import run_stream_benchmark

DATASETS = ("cifar10-svhn", "femnist")
#: Methods of run_stream_benchmark and their names in the report.
METHODS = {"streaming": "streaming", "static": "static", "refit": "refit"}
METHODS["FedGenGMM-plain"] = "FedGenGMM"
TEST_INLIERS, TEST_NOVEL = 300, 30


@dataclass(frozen=True)
class Settings:
    n_windows: int
    n_clients: int
    rows: int
    n_components: int
    seeds: tuple[int, ...]
    rho: float = 0.7
    rounds: int = 1


#: Per-dataset settings (module docstring); ``--quick`` and the options override them.
DEFAULTS = {
    "cifar10-svhn": Settings(40, 10, 100, 4, (0, 1, 2)),
    "femnist": Settings(30, 40, 50, 10, (0, 1, 2)),
}
QUICK = {"n_windows": 4, "n_clients": 3, "rows": 60, "n_components": 4}
#: ``--quick``'s alarm streams: stationary windows, shift windows, the last one before the shift.
QUICK_ALARMS = (8, 8, 5)
PARTS = ("novelty", "alarms")


# ----------------------------------------------------------------------------- 1 and 2
def run_linear(dataset: str, settings: Settings, progress: bool) -> pd.DataFrame:
    """The library's stream benchmark on the linear cycle (one row per method x window x
    seed)."""
    df = run_stream_benchmark(
        dataset,
        list(METHODS),
        seeds=settings.seeds,
        n_windows=settings.n_windows,
        schedule="linear",
        n_clients=settings.n_clients,
        rows_per_window=settings.rows,
        test_inliers=TEST_INLIERS,
        test_novel=TEST_NOVEL,
        n_components=settings.n_components,
        rho=settings.rho,
        rounds=settings.rounds,
        progress=progress,
        threads=None,  # main() set them
    )
    scored = df[df["window"] >= 1]
    for seed, rows in scored.groupby("seed"):
        means = rows.groupby("method", sort=False)["auroc"].mean()
        tracking = rows.loc[
            (rows["method"] == "streaming") & (rows["window"] > settings.n_windows // 2),
            "tracking_error",
        ].mean()
        print(
            f"  {dataset} seed {seed}: "
            + ", ".join(f"{METHODS[m]} {100 * v:.2f}" for m, v in means.items())
            + f", tracking {tracking:.3f}",
            flush=True,
        )
    return df


def per_seed(df: pd.DataFrame, method: str, column: str, mask=None) -> list[float]:
    """``column``'s mean over the windows (>= 1, or ``mask``) of ``method``, per seed."""
    rows = df[(df["method"] == method) & (df["window"] >= 1)]
    if mask is not None:
        rows = rows[mask(rows)]
    return rows.groupby("seed")[column].mean().tolist()


def linear_report(dataset: str, df: pd.DataFrame, settings: Settings) -> str:
    half = settings.n_windows // 2

    def moved(rows):
        return rows["moved"].astype(bool)

    def auroc(name, mask=None):
        return [100 * v for v in per_seed(df, name, "auroc", mask)]

    rows = [
        [
            METHODS[name],
            mean_std(auroc(name), 2),
            mean_std(auroc(name, moved), 2),
            mean_std([v / 1e3 for v in per_seed(df, name, "bytes")], 1),
            mean_std(per_seed(df, name, "fit_seconds"), 2),
        ]
        for name in METHODS
    ]
    stream, refit = (float(np.mean(auroc(n))) for n in ("streaming", "refit"))
    moved_stream = float(np.mean(auroc("streaming", moved)))
    moved_static = float(np.mean(auroc("static", moved)))
    moved_refit = float(np.mean(auroc("refit", moved)))
    ratio = float(np.mean(per_seed(df, "streaming", "bytes"))) / float(
        np.mean(per_seed(df, "refit", "bytes"))
    )
    tracking = per_seed(df, "streaming", "tracking_error", lambda r: r["window"] > half)
    checks = [
        check(
            f"streaming AUROC within 1 point of refitting ({stream:.2f} vs {refit:.2f}; "
            f"once the mix moved {moved_stream:.2f} vs {moved_refit:.2f})",
            refit - stream <= 1.0,
        ),
        check(f"streaming bytes <= 1/5 of refitting's (ratio {ratio:.3f})", ratio <= 0.2),
        check(
            f"streaming well above static once the mix moved ({moved_stream:.2f} vs "
            f"{moved_static:.2f}, windows with |share - 1/2| >= 0.3)",
            moved_stream - moved_static >= 2.0,
        ),
        check(
            f"weight tracking error <= 0.05 after the first half-cycle ({np.mean(tracking):.3f})",
            float(np.mean(tracking)) <= 0.05,
        ),
    ]
    return "\n".join(
        [
            f"## 1-2. Novelty under drift and weight tracking ({settings.n_clients} clients x "
            f"{settings.rows} rows, {settings.n_windows} windows, linear cycle, rho "
            f"{settings.rho}, {settings.rounds} round(s) per window, K = "
            f"{settings.n_components}, seeds {list(settings.seeds)}): {dataset}",
            "",
            f"Per-window AUROC % of the window's test set ({TEST_INLIERS} inliers in the "
            f"window's mix + {TEST_NOVEL} novel rows), mean over windows 1..{settings.n_windows} "
            "(mean ± std over seeds); bytes per window (up + down, KB); fit seconds per window. "
            "static and refit are FedGMM's plain ablation FedGMM-plain, FedGenGMM is "
            "FedGenGMM-plain.",
            "",
            markdown_table(
                [
                    "method",
                    "AUROC % (all windows)",
                    "AUROC % (mix moved)",
                    "KB / window",
                    "s / window",
                ],
                rows,
            ),
            "",
            f"Tracking: mean |weight on A's components - the client's share of A| over clients, "
            f"windows {half + 1}..{settings.n_windows}: {mean_std(tracking, 3)}.",
            "",
            *checks,
        ]
    )


def figure(frames: dict[str, pd.DataFrame], path: Path) -> None:
    """AUROC per window (mean over seeds) per method, one panel per dataset, with A's share."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fednovelty.evaluation.plots import plot_stream_metric

    fig, axes = plt.subplots(
        len(frames), 1, figsize=(9.0, 3.6 * len(frames)), layout="constrained", squeeze=False
    )
    for ax, (dataset, df) in zip(axes[:, 0], frames.items(), strict=True):
        labelled = df.assign(method=df["method"].map(METHODS))
        plot_stream_metric(labelled, "auroc", ax, title=f"{dataset}: AUROC per window")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_quick(parser)
    parser.add_argument("--dataset", nargs="+", choices=DATASETS, default=None)
    parser.add_argument("--windows", type=int, default=None)
    parser.add_argument("--clients", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--components", type=int, default=None)
    add_seeds(parser)
    parser.add_argument("--rho", type=float, default=0.7)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--part", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--alarm-windows", type=int, default=None)
    add_threads(parser)
    add_out(parser)
    parser.add_argument("--figure", type=Path, default=None, help="default: --out with .png")
    return parser.parse_args(argv)


def settings_for(dataset: str, args) -> Settings:
    settings = replace(DEFAULTS[dataset], seeds=tuple(args.seeds), rho=args.rho, rounds=args.rounds)
    if args.quick:
        settings = replace(settings, seeds=(args.seeds[0],), **QUICK)
    given = {
        "n_windows": args.windows,
        "n_clients": args.clients,
        "rows": args.rows,
        "n_components": args.components,
    }
    return replace(settings, **{k: v for k, v in given.items() if v is not None})


def main(argv=None) -> str:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    datasets = args.dataset or (["cifar10-svhn"] if args.quick else list(DATASETS))
    command = command_line("stream_drift", argv)
    started = time.perf_counter()
    sections, frames = [], {}
    for dataset in datasets:
        settings = settings_for(dataset, args)
        if "novelty" in args.part:
            print(f"Linear stream: {dataset}", flush=True)
            frames[dataset] = run_linear(dataset, settings, progress=sys.stderr.isatty())
            sections.append(linear_report(dataset, frames[dataset], settings))
        if "alarms" in args.part:
            stationary, shifted, shift_at = (
                QUICK_ALARMS if args.quick else (ALARM_WINDOWS[dataset], SHIFT_WINDOWS, SHIFT_AT)
            )
            stationary = args.alarm_windows or stationary
            print(f"Drift alarms: {dataset}", flush=True)
            alarms = run_alarms(dataset, settings, stationary, shifted, shift_at)
            sections += [
                stationary_report(dataset, alarms, stationary, settings.seeds),
                shift_report(dataset, alarms, shifted, shift_at, settings.seeds),
            ]
    elapsed = time.perf_counter() - started
    header = report_header(
        "Streams: novelty under drift, weight tracking, drift alarms", command, args.quick, elapsed
    )
    if args.out is not None and frames:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table = pd.concat(frames.values(), ignore_index=True)
        table.to_csv(args.out.with_suffix(".csv"), index=False)
    figure_path = args.figure or (args.out.with_suffix(".png") if args.out else None)
    if figure_path is not None and frames:
        figure(frames, figure_path)
    return emit_report("\n\n".join([header, *sections]) + "\n", args.out)


if __name__ == "__main__":
    main()
