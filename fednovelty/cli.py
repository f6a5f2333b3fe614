"""The ``fednovelty`` command.

``fednovelty demo``   train every method on a real dataset split into clients and print a table.
``fednovelty fit``    fit a detector on a CSV/Parquet file (one client per value of a column).
``fednovelty score``  score a CSV/Parquet file with a saved detector and write the scores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

DETECTORS = ("FedGMM", "FedGenGMM", "Local")


def _read_table(path: str) -> pd.DataFrame:
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix in (".csv", ".txt"):
        return pd.read_csv(path)
    raise SystemExit(f"error: {path}: expected a .csv or .parquet file.")


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

    frame = _read_table(args.data)
    groups = None
    if args.client_column:
        if args.client_column not in frame:
            raise SystemExit(f"error: no column {args.client_column!r} in {args.data}.")
        groups = frame.pop(args.client_column).to_numpy()
    cls = {"FedGMM": FedGMMDetector, "FedGenGMM": FedGenGMMDetector, "Local": LocalGMMDetector}
    kwargs = {"random_state": args.seed, "progress": True}
    if args.components is not None and args.method != "Local":
        kwargs["n_components"] = args.components
    detector = cls[args.method](**kwargs).fit(frame, groups=groups)
    detector.save(args.out)
    print(f"saved {args.method} detector ({detector.n_rounds_} rounds) to {args.out}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from fednovelty import load

    detector = load(args.model)
    frame = _read_table(args.data)
    if args.client_column and args.client_column in frame:
        frame = frame.drop(columns=[args.client_column])
    out = pd.DataFrame(
        {
            "log_px": detector.score_samples(frame),
            "anomaly_score": detector.decision_function(frame),
            "is_anomaly": detector.predict(frame),
        }
    )
    out.to_csv(args.out, index=False)
    print(f"wrote {len(out)} scores to {args.out} ({int(out.is_anomaly.sum())} flagged)")
    return 0


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
    fit.add_argument("--components", type=int, default=None)
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--out", required=True, help="model file (.safetensors)")
    fit.set_defaults(func=_fit)
    score = sub.add_parser("score", help="score a table with a saved detector")
    score.add_argument("model")
    score.add_argument("data")
    score.add_argument("--client-column", default=None, help="column to drop before scoring")
    score.add_argument("--out", required=True, help="output CSV")
    score.set_defaults(func=_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
