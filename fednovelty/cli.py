"""The ``fednovelty`` command.

``fednovelty demo``   train every method on a real dataset split into clients and print a table.
``fednovelty fit``    fit a detector on a CSV/Parquet file (one client per value of a column).
``fednovelty score``  score a CSV/Parquet file with a saved detector and write the scores.
``fednovelty bench``  run a benchmark grid; save results.csv, summary.md and PNG figures.
``fednovelty app``    start the Streamlit dashboard (needs ``pip install 'fednovelty[app]'``).

Files: ``fit`` and ``score`` never write over one of their inputs (the data, the model), refuse
to replace an existing ``--out`` unless ``--overwrite`` is given, and need ``--out``'s folder to
exist; they write a temporary file beside ``--out`` and rename it, so an interrupted run leaves
the old file or the new one, never half of one. ``bench --out DIR`` creates ``DIR`` (its parent
must exist) and resumes from ``DIR/results.csv``; ``summary.md`` and the figures are rewritten
from it on every run.

Exit status: 0 done; 1 the data or the model cannot be used (an unreadable table, NaN,
a damaged model file, a fit that fails) or a file cannot be written; 2 a usage error (argparse's
own, a bad option value, a missing input file, an output that would be overwritten or whose
folder is missing); 130 interrupted. An error is one line on stderr, ``fednovelty: error:
...``, without a traceback; an unexpected internal error still shows its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pandas as pd
from sklearn.utils._param_validation import InvalidParameterError

DETECTORS = ("FedGMM", "FedGenGMM", "Local")
TABLE_SUFFIXES = (".csv", ".txt", ".parquet")


class UsageError(Exception):
    """A mistake in the command line (exit status 2): a bad option value, a missing input file,
    an output that would overwrite a file or whose folder does not exist."""


def _number_type(convert: type, low: float, strict: bool, expected: str):
    """An argparse type: ``convert(text)``, finite, ``> low`` (``strict``) or ``>= low``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (value > low if strict else value >= low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    return parse


_positive_int = _number_type(int, 1, False, "an integer >= 1")
_non_negative_int = _number_type(int, 0, False, "an integer >= 0")
_positive_float = _number_type(float, 0.0, True, "a finite number > 0")


def _check_input(path: str, option: str) -> Path:
    """``path`` as a ``Path`` if it names an existing file, else a ``UsageError``."""
    source = Path(path)
    if not source.exists():
        raise UsageError(f"{option} {path}: no such file.")
    if not source.is_file():
        raise UsageError(f"{option} {path}: not a file (a folder?); name a file.")
    return source


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (links and relative paths included)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _check_output(out: str, inputs: Sequence[Path], overwrite: bool) -> Path:
    """``--out`` as a ``Path`` once it is safe to write: not one of ``inputs``, not an existing
    file unless ``overwrite``, not a folder, in a folder that exists. Else a ``UsageError``."""
    path = Path(out)
    for source in inputs:
        if _same_file(path, source):
            raise UsageError(
                f"--out {out} is the input file {source}; refusing to write over an input. "
                "Choose another --out."
            )
    if path.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name in it.")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise UsageError(
            f"--out {out}: the folder {folder} does not exist; create it first "
            f"(mkdir -p {folder}) or choose another --out."
        )
    if path.exists() and not overwrite:
        raise UsageError(
            f"--out {out} exists; pass --overwrite to replace it, or choose another --out."
        )
    return path


def _write_atomically(path: Path, write: Callable[[str], None], overwrite: bool) -> None:
    """Call ``write(temporary_path)`` for a file beside ``path``, then rename it to ``path``
    (atomic on one file system): readers see the old file or the new one, never a part."""
    temporary = str(path.absolute().with_name(f".{path.name}.{os.getpid()}.tmp"))
    try:
        write(temporary)
        if path.exists() and not overwrite:  # appeared while this command ran
            raise UsageError(
                f"--out {path} was created while this command ran; pass --overwrite to "
                "replace it, or choose another --out."
            )
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _read_table(path: Path) -> pd.DataFrame:
    """The table in ``path`` (.csv, .txt or .parquet); a ``ValueError`` naming the file if it
    cannot be parsed."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except (ValueError, ImportError) as error:
        kind = "Parquet" if suffix == ".parquet" else "CSV"
        raise ValueError(f"{path}: cannot read it as a {kind} table ({error}).") from None


def _check_table_path(path: str) -> Path:
    source = _check_input(path, "data")
    if source.suffix.lower() not in TABLE_SUFFIXES:
        raise UsageError(f"data {path}: expected a .csv or .parquet file.")
    return source


def _demo(args: argparse.Namespace) -> int:
    from fednovelty.demo import format_table, run_demo

    print(
        f"fednovelty demo: {args.dataset}, {args.clients} clients, Dirichlet({args.alpha}) "
        "over k-means clusters, novelty protocol (train on inliers; test on held-out inliers "
        "+ ADBench anomalies), in-process engine",
        flush=True,
    )
    table = run_demo(
        args.dataset,
        n_clients=args.clients,
        alpha=args.alpha,
        n_components=args.components,
        random_state=args.seed,
        data_dir=args.data_dir,
    )
    print(format_table(table))
    return 0


def _fit(args: argparse.Namespace) -> int:
    from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector

    data = _check_table_path(args.data)
    out = _check_output(args.out, [data], args.overwrite)
    frame = _read_table(data)
    groups = None
    if args.client_column:
        if args.client_column not in frame:
            raise UsageError(
                f"--client-column {args.client_column!r}: no such column in {args.data} "
                f"(columns: {', '.join(map(str, frame.columns[:20]))})."
            )
        groups = frame.pop(args.client_column).to_numpy()
    if args.components is not None and args.components > len(frame):
        raise UsageError(
            f"--components {args.components}: {args.data} has only {len(frame)} rows; use at "
            "most that many components."
        )
    cls = {"FedGMM": FedGMMDetector, "FedGenGMM": FedGenGMMDetector, "Local": LocalGMMDetector}
    kwargs = {"random_state": args.seed, "progress": True}
    if args.components is not None and args.method != "Local":
        kwargs["n_components"] = args.components
    detector = cls[args.method](**kwargs).fit(frame, groups=groups)
    _write_atomically(out, detector.save, args.overwrite)
    print(f"saved {args.method} detector ({detector.n_rounds_} rounds) to {out}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from fednovelty import load

    model = _check_input(args.model, "model")
    data = _check_table_path(args.data)
    out = _check_output(args.out, [model, data], args.overwrite)
    detector = load(model)
    frame = _read_table(data)
    if args.client_column and args.client_column in frame:
        frame = frame.drop(columns=[args.client_column])
    scores = pd.DataFrame(
        {
            "log_px": detector.score_samples(frame),
            "anomaly_score": detector.decision_function(frame),
            "is_anomaly": detector.predict(frame),
        }
    )
    _write_atomically(out, lambda path: scores.to_csv(path, index=False), args.overwrite)
    print(f"wrote {len(scores)} scores to {out} ({int(scores.is_anomaly.sum())} flagged)")
    return 0


QUICK = {
    "datasets": ["4_breastw", "29_Pima"],
    "methods": ["FedGenGMM", "DEM-kmeans", "IForest"],
    "seeds": [0],
}
SWEEP_AXES = ("alpha", "n_clients", "n_components", "client_components")


def _client_components(text: str) -> int | None:
    if text.lower() in ("bic", "none"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'bic', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'bic', got {value}")
    return value


def _bench_figures(df: pd.DataFrame, out: Path, metric: str) -> list[Path]:
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


def _check_bench_folder(out: str) -> Path:
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


def _bench(args: argparse.Namespace) -> int:
    from fednovelty.evaluation.benchmark import (
        DEFAULT_METHODS,
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
    args.methods = args.methods or list(DEFAULT_METHODS)
    out = _check_bench_folder(args.out)  # created by run_benchmark
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
    _write_atomically(
        out / "summary.md",
        lambda path: Path(path).write_text(summary + "\n", encoding="utf-8"),
        overwrite=True,
    )
    figures = _bench_figures(df, out, args.metric)
    seconds = time.perf_counter() - started
    print(summary)
    n_failed = int(df["error"].notna().sum())
    print(
        f"{len(df)} cells ({n_failed} failed) in {seconds:.1f} s: {out / 'results.csv'}, "
        f"{out / 'summary.md'}, {len(figures)} figure(s)"
    )
    return 0


APP_SCRIPT = Path(__file__).resolve().parent.parent / "app" / "Home.py"


def app_command(args: argparse.Namespace, script: Path = APP_SCRIPT) -> list[str]:
    """The ``streamlit run`` command line that serves the dashboard's ``script``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script),
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true" if args.headless else "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
    ]


@contextlib.contextmanager
def serving_app(
    log_path: Path, timeout: float = 60.0, script: Path = APP_SCRIPT
) -> Iterator[tuple[str, float]]:
    """Serve ``script`` headless on 127.0.0.1 and a free port while the block runs.

    Yields the URL and the seconds from launch until Streamlit's health check answered; the
    server's output goes to ``log_path``. Raises ``RuntimeError`` if the server exits and
    ``TimeoutError`` if it is not healthy within ``timeout`` seconds (both with the log's end).
    The server is stopped on exit (SIGTERM, SIGKILL after 10 s).
    """
    from fednovelty.runtime.flower.deploy import free_port, wait_for_http

    port = free_port()
    options = argparse.Namespace(address="127.0.0.1", port=port, headless=True)
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            app_command(options, script), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for_http(f"{url}/_stcore/health", timeout, process, log_path)
        yield url, time.perf_counter() - started
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _app(args: argparse.Namespace) -> int:
    """Run the dashboard: this process becomes ``streamlit run`` (``os.execv``), so SIGTERM
    or Ctrl-C stops the server itself and no server outlives the command. Returns 2 when
    Streamlit or the app folder is missing (checked first, without importing Streamlit)."""
    if importlib.util.find_spec("streamlit") is None:
        print(
            "error: the dashboard needs Streamlit and Plotly: pip install 'fednovelty[app]'",
            file=sys.stderr,
        )
        return 2
    if not APP_SCRIPT.is_file():
        print(
            f"error: no dashboard at {APP_SCRIPT}; it ships in the source checkout's app/ "
            "folder: install fednovelty from a clone (pip install -e '.[app]').",
            file=sys.stderr,
        )
        return 2
    if args.address not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: serving on {args.address}: the dashboard has no login of its own, so "
            "anyone who reaches this port can use it; beyond localhost put it behind a "
            "reverse proxy with TLS and authentication (docs/app.md).",
            file=sys.stderr,
        )
    print(f"fednovelty dashboard: http://{args.address}:{args.port}", flush=True)
    command = app_command(args)
    if os.name != "posix":  # no exec there: Streamlit runs as a child of this process
        return subprocess.call(command)
    sys.stderr.flush()
    os.execv(command[0], command)  # never returns: Streamlit becomes this process


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fednovelty", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train every method on a real dataset and compare")
    demo.add_argument("--dataset", default="10_cover", help="ADBench name (default 10_cover)")
    demo.add_argument("--clients", type=int, default=20)
    demo.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    demo.add_argument("--components", type=int, default=15, help="K of the iterative methods")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--data-dir", default=None, help="default: $FEDNOVELTY_DATA or ../shared/data"
    )
    demo.set_defaults(func=_demo)
    fit = sub.add_parser("fit", help="fit a detector on a table and save it")
    fit.add_argument("data", help=".csv or .parquet with numeric feature columns")
    fit.add_argument("--client-column", default=None, help="column holding the client id")
    fit.add_argument("--method", choices=DETECTORS, default="FedGMM")
    fit.add_argument("--components", type=_positive_int, default=None)
    fit.add_argument("--seed", type=_non_negative_int, default=0)
    fit.add_argument(
        "--out", required=True, help="model file (.safetensors); its folder must exist"
    )
    fit.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    fit.set_defaults(func=_fit)
    score = sub.add_parser("score", help="score a table with a saved detector")
    score.add_argument("model")
    score.add_argument("data")
    score.add_argument("--client-column", default=None, help="column to drop before scoring")
    score.add_argument("--out", required=True, help="output CSV; its folder must exist")
    score.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    score.set_defaults(func=_score)
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
        help="ADBench names, 'all', 'mnist'; a suffix ':noise' picks the Gaussian-noise OOD set",
    )
    bench.add_argument(
        "--methods",
        nargs="+",
        help="default: every method but the ablation variants (NAME-plain, -std, -prior)",
    )
    bench.add_argument(
        "--protocols", nargs="+", default=["novelty"], choices=["novelty", "outlier"]
    )
    bench.add_argument("--alphas", nargs="+", type=_positive_float, default=[0.5])
    bench.add_argument("--clients", nargs="+", type=_positive_int, default=[10])
    bench.add_argument(
        "--seeds", nargs="+", type=_non_negative_int, default=None, help="default: 0"
    )
    bench.add_argument(
        "--components",
        nargs="+",
        type=_positive_int,
        default=[10],
        help="K of the mixture methods (default 10)",
    )
    bench.add_argument(
        "--client-components",
        nargs="+",
        type=_client_components,
        default=[None],
        help="K_c of FedGenGMM/Local clients, or 'bic'",
    )
    bench.add_argument("--partition", choices=["dirichlet", "quantity", "iid"], default="dirichlet")
    bench.add_argument(
        "--covariance-type", default="full", choices=["full", "tied", "diag", "spherical"]
    )
    bench.add_argument("--max-train", type=_positive_int, default=None, help="cap on training rows")
    bench.add_argument("--max-test", type=_positive_int, default=None, help="cap on test rows")
    bench.add_argument(
        "--min-size",
        type=_positive_int,
        default=None,
        help="rows every Dirichlet client must hold (default: 10, less for small data)",
    )
    bench.add_argument(
        "--metric",
        default="auroc",
        choices=["auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1"],
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
        help="smoke run: 4_breastw and 29_Pima, FedGenGMM, DEM-kmeans, IForest, "
        "seed 0 (names given explicitly still win)",
    )
    bench.add_argument("--retry-errors", action="store_true", help="rerun failed cells")
    bench.add_argument(
        "--threads",
        type=_non_negative_int,
        default=1,
        help="torch threads (default 1: fastest for these small mixtures; 0 = torch's default)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument(
        "--data-dir", default=None, help="default: $FEDNOVELTY_DATA or ../shared/data"
    )
    bench.set_defaults(func=_bench)
    app = sub.add_parser("app", help="start the Streamlit dashboard (fednovelty[app])")
    app.add_argument("--port", type=int, default=8501)
    app.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to serve on (default: this machine only; 0.0.0.0: all interfaces, "
        "with no login: see docs/app.md)",
    )
    app.add_argument("--headless", action="store_true", help="do not open a browser")
    app.set_defaults(func=_app)
    return parser


def _error(message: object, status: int) -> int:
    """Print ``fednovelty: error: message`` (one line) to stderr and return ``status``."""
    text = " ".join(str(message).split()) or "failed"
    print(f"fednovelty: error: {text}", file=sys.stderr)
    return status


def main(argv: list[str] | None = None) -> int:
    """Run the command; the exit status is 0, 1 (data, model or I/O) or 2 (usage), see above."""
    args = build_parser().parse_args(argv)  # argparse exits with 2 on its own errors
    try:
        return args.func(args)
    except (UsageError, InvalidParameterError) as error:  # the command line is wrong
        return _error(error, 2)
    except (ValueError, OSError) as error:  # the data, the model file or the disk
        return _error(error, 1)
    except KeyboardInterrupt:
        print("fednovelty: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
