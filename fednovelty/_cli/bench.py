"""``fednovelty bench``: a benchmark grid from the command line, resumed from its folder.

Methods are names of the registry (:mod:`fednovelty.methods`); without ``--methods`` the grid
runs :func:`~fednovelty.methods.method_names` (every novelty method but the ablation
variants). The run writes ``results.csv`` (appended cell by cell), then ``summary.md`` and
the figures, rewritten from the whole table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from fednovelty._cli.files import (
    UsageError,
    non_negative_int,
    positive_float,
    positive_int,
    write_atomically,
)
from fednovelty.methods import ABLATIONS, method_names

#: ``--quick``: a smoke grid of one federated EM, FedGenGMM and one PyOD method.
QUICK = {
    "datasets": ["4_breastw", "29_Pima"],
    "methods": ["FedGenGMM", "DEM-kmeans", "IForest"],
    "seeds": [0],
}
SWEEP_AXES = ("alpha", "n_clients", "n_components", "client_components")
METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1")


def client_components(text: str) -> int | None:
    """An argparse type: an int >= 1, or ``bic``/``none`` (None: chosen per client by BIC)."""
    if text.lower() in ("bic", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'bic', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'bic', got {value}")
    return value


def bench_figures(df: pd.DataFrame, out: Path, metric: str) -> list[Path]:
    """One bar chart of ``metric`` per protocol; AUC-PR vs every swept axis per dataset."""
    import matplotlib.pyplot as plt

    from fednovelty.evaluation.plots import plot_method_bars, plot_metric_vs

    paths = []
    for protocol, rows in df.groupby("protocol", sort=False):
        ax = plot_method_bars(rows, metric, title=f"{protocol} protocol")
        paths.append(out / f"{metric}_by_dataset_{protocol}.png")
        ax.figure.savefig(paths[-1], dpi=120)
        plt.close(ax.figure)
        for x in SWEEP_AXES:
            if rows[x].nunique() < 2:
                continue
            for dataset, part in rows.groupby("dataset", sort=False):
                ax = plot_metric_vs(part, x, "aupr_out", title=f"{dataset}, {protocol}")
                safe = dataset.replace(":", "-").replace("/", "-")
                paths.append(out / f"aupr_out_vs_{x}_{safe}_{protocol}.png")
                ax.figure.savefig(paths[-1], dpi=120)
                plt.close(ax.figure)
    return paths


def check_bench_folder(out: str) -> Path:
    """``bench --out``: an existing folder (resumed) or a new one in an existing folder."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {out} is a file; bench writes into a folder: name a folder.")
    parent = folder.absolute().parent
    if not folder.exists() and not parent.is_dir():
        raise UsageError(
            f"--out {out}: the folder {parent} does not exist; create it first "
            f"(mkdir -p {parent}) or choose another --out."
        )
    return folder


def run(args: argparse.Namespace) -> int:
    """Run the grid of ``args`` (see :func:`add_parser`); print the summary. Exit status 0."""
    from fednovelty.evaluation.benchmark import (
        check_grid,
        check_results_file,
        run_benchmark,
        summarize,
    )

    for name, value in QUICK.items():
        if getattr(args, name) is None:
            setattr(args, name, value if args.quick else None)
    if args.datasets is None:
        raise UsageError("name the datasets (--datasets 4_breastw 29_Pima, or 'all'), or --quick.")
    args.methods = args.methods or method_names()
    out = check_bench_folder(args.out)  # created by run_benchmark
    try:  # what run_benchmark checks before it runs anything, as usage errors
        check_grid(
            args.datasets,
            args.methods,
            protocols=args.protocols,
            alphas=args.alphas,
            partition=args.partition,
            data_dir=args.data_dir,
        )
        check_results_file(out / "results.csv")
    except ValueError as error:
        raise UsageError(str(error)) from None
    started = time.perf_counter()
    df = run_benchmark(
        args.datasets,
        args.methods,
        protocols=args.protocols,
        alphas=args.alphas,
        n_clients=args.clients,
        seeds=args.seeds or [0],
        n_components=args.components,
        client_components=args.client_components,
        partition=args.partition,
        covariance_type=args.covariance_type,
        max_train=args.max_train,
        max_test=args.max_test,
        min_size=args.min_size,
        out_csv=out / "results.csv",
        retry_errors=args.retry_errors,
        progress=not args.no_progress,
        data_dir=args.data_dir,
        threads=args.threads or None,
    )
    summary = summarize(df, args.metric)
    write_atomically(
        out / "summary.md",
        lambda path: Path(path).write_text(summary + "\n", encoding="utf-8"),
        overwrite=True,
    )
    figures = bench_figures(df, out, args.metric)
    seconds = time.perf_counter() - started
    print(summary)
    n_failed = int(df["error"].notna().sum())
    print(
        f"{len(df)} cells ({n_failed} failed) in {seconds:.1f} s: {out / 'results.csv'}, "
        f"{out / 'summary.md'}, {len(figures)} figure(s)"
    )
    return 0


def add_parser(sub) -> None:
    """Add ``bench`` and its options to the subcommands ``sub`` (argparse's subparsers)."""
    bench = sub.add_parser(
        "bench",
        help="run a benchmark grid; write results.csv, summary.md and PNG figures",
        description="Run every dataset x method x protocol x alpha x clients x seed cell; "
        "resumes from DIR/results.csv (finished cells are skipped; a torn last row is "
        "dropped and its cell run again); summary.md and the figures are rewritten.",
    )
    bench.add_argument(
        "--datasets",
        nargs="+",
        help="ADBench names, 'all', 'mnist', 'femnist' (writers as clients), 'digits' "
        "(scikit-learn's bundled digits); a suffix "
        "':noise' picks the Gaussian-noise OOD set",
    )
    ablations = ", ".join(f"NAME{suffix}" for suffix in ABLATIONS)
    bench.add_argument(
        "--methods",
        nargs="+",
        help=f"names of fednovelty.methods (default: {', '.join(method_names())}; "
        f"the ablation variants {ablations} when named)",
    )
    bench.add_argument(
        "--protocols", nargs="+", default=["novelty"], choices=["novelty", "outlier"]
    )
    bench.add_argument("--alphas", nargs="+", type=positive_float, default=[0.5])
    bench.add_argument("--clients", nargs="+", type=positive_int, default=[10])
    bench.add_argument("--seeds", nargs="+", type=non_negative_int, default=None, help="default: 0")
    bench.add_argument(
        "--components",
        nargs="+",
        type=positive_int,
        default=[10],
        help="K of the mixture methods (default 10)",
    )
    bench.add_argument(
        "--client-components",
        nargs="+",
        type=client_components,
        default=[None],
        help="K_c of the methods whose clients fit their own mixture (FedGenGMM, Local), or 'bic'",
    )
    bench.add_argument("--partition", choices=["dirichlet", "quantity", "iid"], default="dirichlet")
    bench.add_argument(
        "--covariance-type", default="full", choices=["full", "tied", "diag", "spherical"]
    )
    bench.add_argument("--max-train", type=positive_int, default=None, help="cap on training rows")
    bench.add_argument("--max-test", type=positive_int, default=None, help="cap on test rows")
    bench.add_argument(
        "--min-size",
        type=positive_int,
        default=None,
        help="rows every Dirichlet client must hold (default: 10, less for small data)",
    )
    bench.add_argument(
        "--metric",
        default="auroc",
        choices=METRICS,
        help="metric of summary.md and the bar chart (default auroc)",
    )
    bench.add_argument(
        "--out",
        required=True,
        help="output folder (created; its parent must exist); results.csv in it is resumed",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {' and '.join(QUICK['datasets'])}, {', '.join(QUICK['methods'])}, "
        "seed 0 (names given explicitly still win)",
    )
    bench.add_argument("--retry-errors", action="store_true", help="rerun failed cells")
    bench.add_argument(
        "--threads",
        type=non_negative_int,
        default=1,
        help="torch threads (default 1; 0 = torch's default)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument(
        "--data-dir", default=None, help="default: $FEDNOVELTY_DATA or ../shared/data"
    )
    bench.set_defaults(func=run)
