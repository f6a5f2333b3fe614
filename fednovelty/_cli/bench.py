"""``fednovelty bench``: a benchmark grid from the command line, resumed from its folder.

Methods are names of the registry (:mod:`fednovelty.methods`); without ``--methods`` the grid
runs :func:`~fednovelty.methods.method_names` (every novelty method but the variants).
``--ablations plain,std,prior`` runs each chosen method that takes them also with the
robust defaults switched off (:mod:`fednovelty.evaluation.ablations`), named
``METHOD-plain`` etc. in the results; such a name given to ``--methods`` runs that ablation
alone. The run writes ``results.csv`` (appended cell by cell), then ``summary.md`` and the
figures, rewritten from the whole table.

``--stream linear|cosine|constant`` runs novelty under drift instead
(:func:`~fednovelty.evaluation.streams.run_stream_benchmark`): each dataset is a two-domain
stream (``cifar10-svhn``, ``femnist``, ``A+B`` of two ADBench names of one width) whose share
of domain A follows the schedule over ``--windows`` windows (``--cycles``, ``--share`` for
``constant``); the methods are the registry's stream methods (``streaming``), ``static``,
``refit`` and federated registry methods (or their ablations) refitted every window
(``--baseline`` is the method of ``static`` and ``refit``); ``--clients`` (one value:
clients, FEMNIST's writers), ``--rows`` per client and window, ``--components`` (one value,
default 4), ``--rho`` and ``--rounds`` the stream methods'. It writes ``results.csv`` (one
row per method x window x seed), ``summary.md`` and one figure per dataset (AUROC per window
with the share), and does not resume: ``--out`` must not hold a ``results.csv`` yet. Grid
options (``--alphas``, ``--protocols``, ``--ablations``, ...) are refused with ``--stream``
and stream options without it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fednovelty._cli.choices import (
    ABLATION_NAMES,
    COVARIANCE_TYPES,
    DEFAULT_REFITTED,
    METRICS,
    PARTITIONS,
    SCHEDULES,
    STREAM_ROLES,
)
from fednovelty._cli.files import UsageError, non_negative_int, positive_float, positive_int
from fednovelty._cli.progress import add_progress_option, progress_of
from fednovelty.methods import method_names

if TYPE_CHECKING:  # pandas and the bench's outputs are imported when a grid runs
    import pandas as pd

    from fednovelty._cli.bench_outputs import BenchOutputs

#: Grid options and the value a grid run takes when one is not given (argparse default None,
#: so that ``--stream`` can refuse the ones given).
GRID_DEFAULTS = {
    "ablations": [],
    "protocols": ["novelty"],
    "alphas": [0.5],
    "partition": "dirichlet",
    "client_components": [None],
    "max_train": None,
    "max_test": None,
    "min_size": None,
    "metric": "auroc",
}
#: Stream options and their defaults (None in argparse: refused without ``--stream``).
STREAM_DEFAULTS = {
    "windows": 40,
    "cycles": 1,
    "share": 0.5,
    "rho": 0.7,
    "rounds": 1,
    "rows": 100,
    "baseline": "FedGMM-plain",
}
#: ``--stream --quick``: a smoke stream.
STREAM_QUICK = {"datasets": ["cifar10-svhn"], "windows": 4, "clients": [3], "rows": 40}

#: ``--quick``: a smoke grid of one federated EM, FedGenGMM and one PyOD method.
QUICK = {
    "datasets": ["4_breastw", "29_Pima"],
    "methods": ["FedGenGMM", "DEM-kmeans", "IForest"],
    "seeds": [0],
}
SWEEP_AXES = ("alpha", "n_clients", "n_components", "client_components")


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


def save_figure(outputs: BenchOutputs, name: str, figure) -> Path:
    """Write the matplotlib ``figure`` as the PNG ``name`` of the bench folder, then close it."""
    import matplotlib.pyplot as plt

    try:
        return outputs.write(name, lambda path: figure.savefig(path, dpi=120, format="png"))
    finally:
        plt.close(figure)


def bench_figures(df: pd.DataFrame, outputs: BenchOutputs, metric: str) -> list[Path]:
    """One bar chart of ``metric`` per protocol; AUC-PR vs every swept axis per dataset."""
    from fednovelty.evaluation.plots import plot_method_bars, plot_metric_vs

    paths = []
    for protocol, rows in df.groupby("protocol", sort=False):
        ax = plot_method_bars(rows, metric, title=f"{protocol} protocol")
        paths.append(save_figure(outputs, f"{metric}_by_dataset_{protocol}.png", ax.figure))
        for x in SWEEP_AXES:
            if rows[x].nunique() < 2:
                continue
            for dataset, part in rows.groupby("dataset", sort=False):
                ax = plot_metric_vs(part, x, "aupr_out", title=f"{dataset}, {protocol}")
                safe = dataset.replace(":", "-").replace("/", "-")
                name = f"aupr_out_vs_{x}_{safe}_{protocol}.png"
                paths.append(save_figure(outputs, name, ax.figure))
    return paths


def check_bench_folder(out: str) -> BenchOutputs:
    """``bench --out``: an existing folder (resumed) or a new one in an existing folder, whose
    files named like the bench's outputs are the bench's own
    (:meth:`~fednovelty._cli.bench_outputs.BenchOutputs.check`)."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {out} is a file; bench writes into a folder: name a folder.")
    parent = folder.absolute().parent
    if not folder.exists() and not parent.is_dir():
        raise UsageError(
            f"--out {out}: the folder {parent} does not exist; create it first "
            f"(mkdir -p {parent}) or choose another --out."
        )
    from fednovelty._cli.bench_outputs import BenchOutputs

    return BenchOutputs.check(folder)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _single(args: argparse.Namespace, name: str, default: int) -> int:
    """A list option of the grid that a stream takes once (``--clients 10``)."""
    values = getattr(args, name)
    if values is None:
        return default
    if len(values) != 1:
        raise UsageError(
            f"{_option(name)} takes one value with --stream (got {len(values)}); run the "
            "stream once per value."
        )
    return values[0]


def stream_figures(df: pd.DataFrame, outputs: BenchOutputs) -> list[Path]:
    """One figure per dataset: AUROC per window, one line per method, with A's share."""
    from fednovelty.evaluation.plots import plot_stream_metric

    paths = []
    for dataset, rows in df.groupby("dataset", sort=False):
        ax = plot_stream_metric(rows, "auroc", title=f"{dataset}: AUROC per window")
        safe = dataset.replace(":", "-").replace("/", "-").replace("+", "-")
        paths.append(save_figure(outputs, f"auroc_by_window_{safe}.png", ax.figure))
    return paths


def run_stream(args: argparse.Namespace) -> int:
    """``bench --stream``: novelty under drift (module doc); print the summary. Exit 0."""
    from fednovelty.evaluation.stream_summary import format_stream_summary
    from fednovelty.evaluation.streams import (
        check_stream_datasets,
        check_stream_methods,
        run_stream_benchmark,
        stream_methods,
    )

    given = [name for name in GRID_DEFAULTS if getattr(args, name) not in (None, False)]
    given += ["retry_errors"] if args.retry_errors else []
    if given:
        raise UsageError(
            f"{', '.join(_option(n) for n in given)}: grid option(s) that do not apply to "
            "--stream runs; drop them (streams take --windows, --cycles, --share, --rho, "
            "--rounds, --rows, --baseline, --clients, --components, --seeds)."
        )
    if args.share is not None and args.stream != "constant":
        raise UsageError("--share is the constant schedule's share; use it with --stream constant.")
    if args.quick:
        for name, value in STREAM_QUICK.items():
            if getattr(args, name) is None:
                setattr(args, name, value)
    for name, value in STREAM_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.datasets is None:
        raise UsageError(
            "name the streams (--datasets cifar10-svhn femnist, or A+B of two ADBench names "
            "of one width), or --quick."
        )
    if not 0.0 <= args.share <= 1.0:
        raise UsageError(f"--share must be in [0, 1]; got {args.share}.")
    if not 0.0 <= args.rho <= 1.0:
        raise UsageError(f"--rho must be in [0, 1]; got {args.rho}.")
    clients = _single(args, "clients", 10)
    components = _single(args, "components", 4)
    methods = args.methods or stream_methods()
    outputs = check_bench_folder(args.out)
    out = outputs.folder
    if (out / "results.csv").exists():
        raise UsageError(
            f"{out / 'results.csv'} exists: a stream run does not resume; choose a new --out "
            "or move the old results away."
        )
    try:
        datasets = check_stream_datasets(args.datasets, args.data_dir)
        check_stream_methods(methods, args.baseline)
    except ValueError as error:
        raise UsageError(str(error)) from None
    started = time.perf_counter()
    frames = [
        run_stream_benchmark(
            dataset,
            methods,
            seeds=args.seeds or [0],
            n_windows=args.windows,
            schedule=args.stream,
            cycles=args.cycles,
            constant=args.share,
            n_clients=clients,
            rows_per_window=args.rows,
            n_components=components,
            covariance_type=args.covariance_type,
            rho=args.rho,
            rounds=args.rounds,
            baseline=args.baseline,
            data_dir=args.data_dir,
            progress=progress_of(args),
            threads=args.threads or None,
        )
        for dataset in datasets
    ]
    import pandas as pd

    df = pd.concat(frames, ignore_index=True)
    out.mkdir(exist_ok=True)
    outputs.write("results.csv", lambda path: df.to_csv(path, index=False))
    summary = format_stream_summary(df)
    outputs.write("summary.md", lambda path: Path(path).write_text(summary, encoding="utf-8"))
    figures = stream_figures(df, outputs)
    return _report(summary, df, "rows", started, out, figures)


def run(args: argparse.Namespace) -> int:
    """Run the grid of ``args`` (see :func:`add_parser`), or the stream of ``--stream``;
    print the summary. Exit status 0."""
    stream_given = [n for n in STREAM_DEFAULTS if getattr(args, n) is not None]
    if args.stream is not None:
        return run_stream(args)
    if stream_given:
        raise UsageError(
            f"{', '.join(_option(n) for n in stream_given)}: stream option(s); add --stream "
            "linear|cosine|constant to run a stream, or drop them."
        )
    for name, value in GRID_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.clients is None:
        args.clients = [10]
    if args.components is None:
        args.components = [10]
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
    streams = [d for d in args.datasets if d.split(":")[0] == "cifar10-svhn" or "+" in d]
    if streams:
        raise UsageError(
            f"{', '.join(streams)}: stream dataset(s); add --stream linear|cosine|constant."
        )
    args.methods = args.methods or method_names()
    outputs = check_bench_folder(args.out)
    out = outputs.folder  # created by run_benchmark
    # the grid's names, as check_grid checks them and run_benchmark runs them
    grid = {
        "ablations": args.ablations,
        "protocols": args.protocols,
        "alphas": args.alphas,
        "partition": args.partition,
        "data_dir": args.data_dir,
    }
    try:  # what run_benchmark checks before it runs anything, as usage errors
        check_grid(args.datasets, args.methods, **grid)
        check_results_file(out / "results.csv")
    except ValueError as error:
        raise UsageError(str(error)) from None
    started = time.perf_counter()
    df = run_benchmark(
        args.datasets,
        args.methods,
        **grid,
        n_clients=args.clients,
        seeds=args.seeds or [0],
        n_components=args.components,
        client_components=args.client_components,
        covariance_type=args.covariance_type,
        max_train=args.max_train,
        max_test=args.max_test,
        min_size=args.min_size,
        out_csv=out / "results.csv",
        retry_errors=args.retry_errors,
        progress=progress_of(args),
        threads=args.threads or None,
    )
    if (out / "results.csv").is_file():
        outputs.record("results.csv")
    summary = summarize(df, args.metric)
    outputs.write(
        "summary.md", lambda path: Path(path).write_text(summary + "\n", encoding="utf-8")
    )
    figures = bench_figures(df, outputs, args.metric)
    return _report(summary, df, "cells", started, out, figures)


def _report(
    summary: str, df: pd.DataFrame, unit: str, started: float, out: Path, figures: list[Path]
) -> int:
    """Print the summary, then one line: ``len(df)`` ``unit`` (rows with an ``error``
    failed), the seconds since ``started`` (``time.perf_counter``) and the files written
    in ``out``. Returns the exit status 0."""
    seconds = time.perf_counter() - started
    print(summary)
    n_failed = int(df["error"].notna().sum())
    print(
        f"{len(df)} {unit} ({n_failed} failed) in {seconds:.1f} s: {out / 'results.csv'}, "
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
        "dropped and its cell run again); summary.md and the figures are rewritten. Only "
        "files bench wrote itself (listed in DIR/.fednovelty-bench.json) are replaced: a "
        "foreign summary.md, figure or results.csv, or a link, FIFO or device in their "
        "place, stops the command before it runs.",
    )
    bench.add_argument(
        "--datasets",
        nargs="+",
        help="ADBench names, 'all', 'mnist', 'femnist' (writers as clients), 'digits' "
        "(scikit-learn's bundled digits); a suffix "
        "':noise' picks the Gaussian-noise OOD set",
    )
    bench.add_argument(
        "--methods",
        nargs="+",
        help=f"names of fednovelty.methods (default: {', '.join(method_names())}); "
        f"METHOD-ABLATION (e.g. FedGenGMM-plain) runs one ablation alone",
    )
    bench.add_argument(
        "--ablations",
        nargs="+",
        default=None,
        metavar="ABLATION",
        help="also run each method that takes them with the robust defaults switched off, "
        f"named METHOD-ABLATION in the results: {', '.join(ABLATION_NAMES)} (plain: no "
        "standardisation, no covariance prior; std: standardisation only; prior: the prior "
        "only), comma- or space-separated",
    )
    bench.add_argument(
        "--protocols",
        nargs="+",
        default=None,
        choices=["novelty", "outlier"],
        help="default: novelty",
    )
    bench.add_argument(
        "--alphas", nargs="+", type=positive_float, default=None, help="default: 0.5"
    )
    bench.add_argument(
        "--clients",
        nargs="+",
        type=positive_int,
        default=None,
        help="default: 10 (with --stream one value: clients per window, FEMNIST's writers)",
    )
    bench.add_argument("--seeds", nargs="+", type=non_negative_int, default=None, help="default: 0")
    bench.add_argument(
        "--components",
        nargs="+",
        type=positive_int,
        default=None,
        help="K of the mixture methods (default 10; with --stream one value, default 4)",
    )
    bench.add_argument(
        "--client-components",
        nargs="+",
        type=client_components,
        default=None,
        help="K_c of the methods whose clients fit their own mixture (FedGenGMM, Local), or "
        "'bic' (default)",
    )
    bench.add_argument(
        "--partition",
        choices=PARTITIONS,
        default=None,
        help="default: dirichlet",
    )
    bench.add_argument("--covariance-type", default="full", choices=COVARIANCE_TYPES)
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
        default=None,
        choices=METRICS,
        help="metric of summary.md and the bar chart (default auroc)",
    )
    bench.add_argument(
        "--out",
        required=True,
        help="output folder (created; its parent must exist); results.csv in it is resumed; "
        "files in it that bench did not write are never replaced",
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
    add_progress_option(bench)
    online = method_names(task="stream", variants=True)
    streams = bench.add_argument_group(
        "streams",
        "novelty under drift (--stream): datasets cifar10-svhn, femnist[:ood] or A+B of two "
        f"ADBench names of one width; methods {', '.join([*online, *STREAM_ROLES])} and "
        "federated registry methods refitted every window (default: "
        f"{' '.join([*online, *STREAM_ROLES, DEFAULT_REFITTED])})",
    )
    streams.add_argument(
        "--stream",
        choices=SCHEDULES,
        default=None,
        help="run a stream whose share of domain A follows this schedule",
    )
    streams.add_argument(
        "--windows", type=positive_int, default=None, help="windows after the warm-up (40)"
    )
    streams.add_argument("--cycles", type=positive_int, default=None, help="schedule cycles (1)")
    streams.add_argument(
        "--share", type=float, default=None, help="A's share of --stream constant (0.5)"
    )
    streams.add_argument(
        "--rho", type=float, default=None, help="the streaming detector's forgetting (0.7)"
    )
    streams.add_argument(
        "--rounds", type=non_negative_int, default=None, help="federated rounds per window (1)"
    )
    streams.add_argument(
        "--rows", type=positive_int, default=None, help="rows per client and window (100)"
    )
    streams.add_argument(
        "--baseline",
        default=None,
        help="registry method, or ablation of one, of static and refit (FedGMM-plain)",
    )
    bench.add_argument(
        "--data-dir", default=None, help="default: $FEDNOVELTY_DATA or ../shared/data"
    )
    bench.set_defaults(func=run)
