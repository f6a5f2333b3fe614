"""The evidence behind the README's default: every scoreboard method's mean AUROC over both
protocols, paired with the default on the same cells.

Reads scoreboard results (``fednovelty bench`` CSVs: ``dataset, protocol, seed, method,
auroc``; several files are concatenated, a method's rows taken from the first file that has
it) and writes, per method: the novelty and outlier means over its cells, their mean (each
(dataset, seed) cell's two protocols averaged, then averaged over cells), and the paired
difference of that mean with the reference method (default ``DEM-kmeans``) over the cells
both have, with its standard error over the seeds (each seed's mean difference over the
datasets; the s.e. of those seed means). Then, per protocol, which method leads and by how
much over the reference, paired the same way: where another detector wins.

    python -m benchmarks.default_evidence \\
        --results benchmarks/results/adbench_default/results.csv \\
                  benchmarks/results/fedgengmm_holds/results.csv \\
        --out benchmarks/results/adbench_default/default_evidence.md
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import RESULTS

PROTOCOLS = ("novelty", "outlier")
DEFAULT_RESULTS = (
    RESULTS / "adbench_default" / "results.csv",
    RESULTS / "fedgengmm_holds" / "results.csv",
)


def load(paths: Sequence[Path]) -> pd.DataFrame:
    """The concatenated results, each method from the first file that holds it; rows with an
    error or no AUROC dropped. Columns ``dataset, protocol, seed, method, auroc``."""
    frames, seen = [], set()
    for path in paths:
        frame = pd.read_csv(path)
        frame = frame[~frame["method"].isin(seen)]
        seen |= set(frame["method"])
        frames.append(frame)
    out = pd.concat(frames, ignore_index=True)
    if "error" in out:
        out = out[out["error"].isna()]
    return out.dropna(subset=["auroc"])[["dataset", "protocol", "seed", "method", "auroc"]]


def cells(results: pd.DataFrame) -> pd.DataFrame:
    """AUROC per (dataset, seed) row and (method, protocol) column."""
    return results.pivot_table(
        index=["dataset", "seed"], columns=["method", "protocol"], values="auroc"
    )


def paired(a: pd.Series, b: pd.Series) -> tuple[float, float, int]:
    """``(mean, s.e., cells)`` of ``a - b`` over the (dataset, seed) cells both have; the mean
    over seeds of each seed's mean difference, the s.e. over those seed means (0 for one seed)."""
    diff = (a - b).dropna()
    per_seed = diff.groupby(level="seed").mean()
    se = float(per_seed.std(ddof=1) / np.sqrt(len(per_seed))) if len(per_seed) > 1 else 0.0
    return float(per_seed.mean()), se, int(diff.size)


def both(table: pd.DataFrame, method: str) -> pd.Series:
    """Each cell's mean of the two protocols' AUROC (NaN where either is missing)."""
    return (table[(method, "novelty")] + table[(method, "outlier")]) / 2


def report(results: pd.DataFrame, reference: str = "DEM-kmeans") -> str:
    """The markdown tables (see the module docstring)."""
    table = cells(results)
    methods = sorted(
        m for m in results["method"].unique() if all((m, p) in table for p in PROTOCOLS)
    )
    if reference not in methods:
        raise ValueError(
            f"--reference {reference!r} has no rows in both protocols; choose one of {methods}"
        )
    rows = []
    for m in methods:
        nov, out = (float(table[(m, p)].mean()) for p in PROTOCOLS)
        diff, se, n = paired(both(table, m), both(table, reference))
        rows.append((m, nov, out, both(table, m).mean(), diff, se, n))
    rows.sort(key=lambda r: -r[3])
    lines = [
        f"Mean AUROC per protocol over each method's cells; 'both': each (dataset, seed) cell's "
        f"two protocols averaged; paired with {reference} on the cells both have (s.e. over "
        "seeds).",
        "",
        f"| method | novelty | outlier | both | both minus {reference} (s.e.) | paired cells |",
        "|---|---|---|---|---|---|",
    ]
    for m, nov, out, mean, diff, se, n in rows:
        shown = "" if m == reference else f"{diff:+.4f} ({se:.4f})"
        lines.append(f"| {m} | {nov:.3f} | {out:.3f} | {mean:.4f} | {shown} | {n} |")
    lines += [
        "",
        "| protocol | leader | its mean | minus " + reference + " (s.e.) |",
        "|---|---|---|---|",
    ]
    for p in PROTOCOLS:
        leader = max(methods, key=lambda m: table[(m, p)].mean())
        diff, se, _ = paired(table[(leader, p)], table[(reference, p)])
        shown = "" if leader == reference else f"{diff:+.4f} ({se:.4f})"
        lines.append(f"| {p} | {leader} | {table[(leader, p)].mean():.3f} | {shown} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", nargs="+", type=Path, default=list(DEFAULT_RESULTS))
    parser.add_argument("--reference", default="DEM-kmeans")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.results if not p.exists()]
    if missing:
        parser.error(f"--results: no such file {missing}; run `fednovelty bench` first")
    text = report(load(args.results), args.reference)
    print(text)
    if args.out is not None:
        args.out.write_text("# The README's default: the scoreboard's evidence\n\n" + text)
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
