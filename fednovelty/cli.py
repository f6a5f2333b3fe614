"""The ``fednovelty`` command.

``fednovelty demo``   train every method on a real dataset split into clients and print a table.
``fednovelty fit``    fit a detector on a CSV/Parquet file (one client per value of a column).
``fednovelty score``  score a CSV/Parquet/.npy file with a saved detector, chunk by chunk.
``fednovelty bench``  run a benchmark grid; save results.csv, summary.md and PNG figures.
``fednovelty app``    start the Streamlit dashboard (needs ``pip install 'fednovelty[app]'``).
``fednovelty flower new DIR``  write a Flower app for ``flwr run`` (:mod:`fednovelty._cli.flower`).

Methods (``fit --method``, ``bench --methods``) are names of the registry,
:mod:`fednovelty.methods`, read when the parser is built (without importing a detector:
``--help`` and ``--version`` import no torch, PyOD or scikit-learn); a mistyped choice is
answered with the closest names. The subcommands' parts are in :mod:`fednovelty._cli`.

``score --client-column`` scores each row under its client's own model where the detector
has one and writes the id (``--id-column``, default the row number) and client columns beside
the scores (:mod:`fednovelty._cli.scoring`).

Progress bars (``demo``, ``fit``, ``bench``) are drawn only when stderr is a terminal, never
with ``--no-progress``.

Files: ``fit`` and ``score`` never write over one of their inputs (the data, the model), refuse
to replace an existing ``--out`` unless ``--overwrite`` is given, and need ``--out``'s folder to
exist; they write a temporary file beside ``--out`` and rename it, so an interrupted run leaves
the old file or the new one, never half of one; only a regular file is ever replaced (a link,
a FIFO, a device or a folder at ``--out`` is refused, ``--overwrite`` or not). ``bench --out
DIR`` creates ``DIR`` (its parent must exist) and resumes from ``DIR/results.csv``;
``summary.md`` and the figures are rewritten from it on every run, and only files ``bench``
wrote itself are ever replaced (:mod:`fednovelty._cli.bench_outputs`).

Exit status: 0 done; 1 the data or the model cannot be used (an unreadable table, NaN,
a damaged model file, a fit that fails) or a file cannot be written; 2 a usage error (argparse's
own, a bad option value, a missing input file, an output that would be overwritten or whose
folder is missing, a package of the ``app`` extra missing); 130 interrupted. An error is one
line on stderr, ``fednovelty: error: ...``, without a traceback; an unexpected internal error
still shows its traceback.
"""

from __future__ import annotations

import argparse
import sys

from fednovelty import __version__
from fednovelty._cli import bench, dashboard, flower
from fednovelty._cli.choices import Parser
from fednovelty._cli.dashboard import app_command, dashboard_script, serving_app
from fednovelty._cli.files import (
    SCORE_SUFFIXES,
    UsageError,
    check_input,
    check_output,
    check_table_path,
    non_negative_int,
    positive_int,
    read_table,
    write_atomically,
)
from fednovelty._cli.progress import add_progress_option, progress_of
from fednovelty._cli.score_stream import CHUNK_ROWS
from fednovelty._cli.tables import check_header, check_numeric, pop_column
from fednovelty.methods import get_method, method_names

__all__ = [
    "UsageError",
    "app_command",
    "build_parser",
    "dashboard_script",
    "fit_methods",
    "main",
    "serving_app",
]


def fit_methods() -> list[str]:
    """The methods ``fit`` can train and save: the registry's novelty methods, variants
    included, but PyOD's (a PyOD detector has no ``save``)."""
    return [name for name in method_names(variants=True) if get_method(name).kind != "pyod"]


def _demo(args: argparse.Namespace) -> int:
    from fednovelty.demo import demo_dataset, demo_settings, format_table, run_demo

    dataset, why = demo_dataset(args.dataset, args.data_dir)
    if why:
        print(f"fednovelty demo: {why}", flush=True)
    settings = demo_settings(dataset)
    clients = settings["n_clients"] if args.clients is None else args.clients
    components = settings["n_components"] if args.components is None else args.components
    print(
        f"fednovelty demo: {dataset}, {clients} clients by "
        f"{settings['split'].format(alpha=args.alpha)}, novelty protocol (train on inliers; "
        f"test on held-out inliers + {settings['novel']}), in-process engine",
        flush=True,
    )
    table = run_demo(
        dataset,
        n_clients=clients,
        alpha=args.alpha,
        n_components=components,
        random_state=args.seed,
        data_dir=args.data_dir,
        progress=progress_of(args),
    )
    print(format_table(table))
    return 0


def _read_features(args: argparse.Namespace, data) -> tuple:
    """The table ``data`` split into its feature columns (one name each; whether they are
    numbers is :func:`check_numeric`'s, called once the options are checked), the
    ``--client-column`` (a Series, or None) and the ``--id-column`` (``score`` only; None
    otherwise)."""
    frame = read_table(data)
    check_header(data, [str(name) for name in frame.columns])
    clients = ids = None
    if args.client_column:
        clients = pop_column(frame, args.client_column, "--client-column", args.data)
    if getattr(args, "id_column", None):
        ids = pop_column(frame, args.id_column, "--id-column", args.data)
    return frame, clients, ids


def _fit(args: argparse.Namespace) -> int:
    method = get_method(args.method)
    data = check_table_path(args.data)
    out = check_output(args.out, [data], args.overwrite)
    frame, clients, _ = _read_features(args, data)
    groups = None if clients is None else clients.to_numpy()
    if args.components is not None and args.components > len(frame):
        raise UsageError(
            f"--components {args.components}: {args.data} has only {len(frame)} rows; use at "
            "most that many components."
        )
    check_numeric(frame, args.data, args.client_column)
    settings = {"random_state": args.seed}
    if args.components is not None:  # a method whose clients choose their own K ignores it
        settings["n_components"] = args.components
    shown = {"progress": progress_of(args)} if "progress" in method.parameters() else {}
    if args.alpha is not None:
        if "alpha" not in method.parameters():
            raise UsageError(f"--alpha: {args.method} has no conformal calibration.")
        shown.update(calibration="conformal", alpha=args.alpha)
    detector = method.build(**method.shared_params(**settings), **shown)
    if method.fits_clients:
        detector.fit(frame, groups=groups)
    else:  # fitted on the pooled rows
        detector.fit(frame)
    write_atomically(out, detector.save, args.overwrite)
    print(f"saved {args.method} detector ({detector.n_rounds_} rounds) to {out}")
    return 0


def _warn(message: str) -> None:
    """Print ``fednovelty: warning: message`` (one line) to stderr."""
    print(f"fednovelty: warning: {' '.join(message.split())}", file=sys.stderr)


def _score(args: argparse.Namespace) -> int:
    from fednovelty import load
    from fednovelty._cli.score_stream import score_file

    model = check_input(args.model, "model")
    data = check_table_path(args.data, SCORE_SUFFIXES)
    out = check_output(args.out, [model, data], args.overwrite)
    detector = load(model)
    counts = []  # the input is read, scored and written chunk by chunk (_cli.score_stream)
    write_atomically(
        out,
        lambda path: counts.extend(score_file(detector, args, data, path, _warn)),
        args.overwrite,
    )
    print(f"wrote {counts[0]} scores to {out} ({counts[1]} flagged)")
    return 0


OVERWRITE_HELP = "replace --out if it is an existing regular file (never a link, FIFO or device)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fednovelty", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fednovelty {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train every method on a real dataset and compare")
    demo.add_argument(
        "--dataset",
        default=None,
        help="ADBench name, or 'digits' (scikit-learn's bundled digits); default 10_cover, or "
        "digits when the data folder is missing",
    )
    demo.add_argument("--clients", type=int, default=None, help="default 20 (digits: 10)")
    demo.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    demo.add_argument(
        "--components", type=int, default=None, help="K of the iterative methods (15; digits: 5)"
    )
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--data-dir", default=None, help="default: $FEDNOVELTY_DATA or ../shared/data"
    )
    add_progress_option(demo)
    demo.set_defaults(func=_demo)
    fit = sub.add_parser("fit", help="fit a detector on a table and save it")
    methods = fit_methods()
    bases = [name for name in methods if not get_method(name).variant_of]
    variants = [name for name in methods if get_method(name).variant_of]
    fit.add_argument("data", help=".csv or .parquet with numeric feature columns")
    fit.add_argument("--client-column", default=None, help="column holding the client id")
    fit.add_argument(
        "--method",
        choices=methods,
        default="FedGMM",
        metavar="NAME",
        help=f"a method of fednovelty.methods (default FedGMM): {', '.join(bases)}, or a "
        f"variant ({', '.join(variants)})",
    )
    fit.add_argument(
        "--components",
        type=positive_int,
        default=None,
        help="K of the mixture (methods whose clients choose their own K ignore it)",
    )
    fit.add_argument(
        "--alpha",
        type=float,
        default=None,
        help="calibrate conformal alarms at this false-alarm rate per client (e.g. 0.01): "
        "each client holds out 20 %% of its rows for it; default: PyOD's contamination "
        "threshold",
    )
    fit.add_argument("--seed", type=non_negative_int, default=0)
    fit.add_argument(
        "--out", required=True, help="model file (.safetensors); its folder must exist"
    )
    fit.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_progress_option(fit)
    fit.set_defaults(func=_fit)
    score = sub.add_parser("score", help="score a table with a saved detector")
    score.add_argument("model")
    score.add_argument("data", help=".csv, .parquet or .npy rows to score, read chunk by chunk")
    score.add_argument(
        "--client-column",
        default=None,
        help="column of client ids: each row is scored with its client's own model where the "
        "detector has one (FedGMM, ClusteredGMM, Local), else the global model (a warning "
        "says so); the column is written beside the scores",
    )
    score.add_argument(
        "--id-column",
        default=None,
        help="column of row ids, written first in the output (default: the row number, "
        "column 'row')",
    )
    score.add_argument(
        "--fdr",
        type=float,
        default=None,
        help="a model fitted with --alpha only: add a 'discovery' column, Benjamini-Hochberg "
        "at this false discovery rate (e.g. 0.1) over the file's rows",
    )
    score.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=CHUNK_ROWS,
        help=f"rows read, scored and written at a time (default {CHUNK_ROWS}): the memory "
        "the command needs is one chunk's",
    )
    score.add_argument("--out", required=True, help="output CSV; its folder must exist")
    score.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    score.set_defaults(func=_score)
    bench.add_parser(sub)
    dashboard.add_parser(sub)
    flower.add_parser(sub)
    return parser


def _error(message: object, status: int) -> int:
    """Print ``fednovelty: error: message`` (one line) to stderr and return ``status``."""
    text = " ".join(str(message).split()) or "failed"
    print(f"fednovelty: error: {text}", file=sys.stderr)
    return status


def _usage_errors() -> tuple[type[Exception], ...]:
    """The exceptions that mean the command line is wrong: ``UsageError`` and, once
    scikit-learn is imported (only a command that fits or scores imports it), its
    ``InvalidParameterError`` (a bad parameter of a detector)."""
    validation = sys.modules.get("sklearn.utils._param_validation")
    return (UsageError,) if validation is None else (UsageError, validation.InvalidParameterError)


def main(argv: list[str] | None = None) -> int:
    """Run the command; the exit status is 0, 1 (data, model or I/O) or 2 (usage), see above."""
    args = build_parser().parse_args(argv)  # argparse exits with 2 on its own errors
    try:
        return args.func(args)
    except _usage_errors() as error:  # the command line is wrong
        return _error(error, 2)
    except (ValueError, OSError) as error:  # the data, the model file or the disk
        return _error(error, 1)
    except KeyboardInterrupt:
        print("fednovelty: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
