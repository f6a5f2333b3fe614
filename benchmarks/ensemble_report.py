"""The ensemble's scoreboard cells paired with the default run's: mean AUROC per protocol,
paired differences with DEM-kmeans, KNN and IForest (standard error over the seeds), and
the per-dataset means against KNN.

Reads ``results/adbench_ensemble/results.csv`` (``fednovelty bench --methods
FedGenGMM-ensemble``, the scoreboard's settings) and ``results/adbench_default/results.csv``;
pairs cells by dataset, protocol and seed (cells with an error on either side are left out
and counted); writes ``results/adbench_ensemble/summary.md``.

    python benchmarks/ensemble_report.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).parent / "results"
METHOD = "FedGenGMM-ensemble"
REFERENCES = ("DEM-kmeans", "KNN", "IForest")
KEY = ["dataset", "protocol", "seed"]


def paired(ours: pd.DataFrame, theirs: pd.DataFrame) -> pd.DataFrame:
    """Cells both ran without error: ``KEY``, ``ours`` and ``theirs`` AUROC."""
    a = ours[ours.error.isna()][[*KEY, "auroc"]].rename(columns={"auroc": "ours"})
    b = theirs[theirs.error.isna()][[*KEY, "auroc"]].rename(columns={"auroc": "theirs"})
    return a.merge(b, on=KEY)


def seed_error(cells: pd.DataFrame) -> tuple[float, float]:
    """Mean paired difference over the cells and its standard error over the seeds (each
    seed's mean difference over the datasets; std with ddof=1 / sqrt(seeds))."""
    diff = cells.ours - cells.theirs
    per_seed = diff.groupby(cells.seed).mean()
    se = per_seed.std(ddof=1) / np.sqrt(len(per_seed)) if len(per_seed) > 1 else float("nan")
    return float(diff.mean()), float(se)


def report(ensemble: pd.DataFrame, default: pd.DataFrame) -> str:
    lines = [f"# {METHOD} on the ADBench scoreboard\n"]
    done = ensemble[ensemble.error.isna()]
    lines.append(
        f"{len(done)} of 250 cells finished ({len(ensemble) - len(done)} with an error); "
        "differences paired by dataset, protocol and seed, standard error over the seeds.\n"
    )
    lines += ["| protocol | cells | ensemble | reference | reference AUROC | ensemble minus |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for protocol in ("novelty", "outlier"):
        mine = ensemble[ensemble.protocol == protocol]
        for name in REFERENCES:
            cells = paired(mine, default[(default.method == name) & (default.protocol == protocol)])
            if cells.empty:
                continue
            mean, se = seed_error(cells)
            lines.append(
                f"| {protocol} | {len(cells)} | {cells.ours.mean():.3f} | {name} | "
                f"{cells.theirs.mean():.3f} | {mean:+.3f} ({se:.3f}) |"
            )
    lines += ["\n## Per dataset (mean over seeds) against KNN and DEM-kmeans\n",
              "| dataset | protocol | seeds | ensemble | KNN | DEM-kmeans |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for (dataset, protocol), group in done.groupby(["dataset", "protocol"], sort=False):
        row = [dataset, protocol, str(len(group)), f"{group.auroc.mean():.3f}"]
        for name in ("KNN", "DEM-kmeans"):
            ref = default[
                (default.method == name)
                & (default.dataset == dataset)
                & (default.protocol == protocol)
                & default.seed.isin(group.seed)
            ]
            row.append(f"{ref.auroc.mean():.3f}" if len(ref) else "")
        lines.append("| " + " | ".join(row) + " |")
    fit = done.fit_seconds.mean()
    lines.append(
        f"\nPer cell: {done.rounds.mean():.1f} rounds, {done.bytes_up.mean() / 1e6:.3f} MB up, "
        f"{done.bytes_down.mean() / 1e6:.3f} MB down, fit {fit:.1f} s (one thread)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    ensemble = pd.read_csv(HERE / "adbench_ensemble" / "results.csv")
    default = pd.read_csv(HERE / "adbench_default" / "results.csv")
    text = report(ensemble, default)
    (HERE / "adbench_ensemble" / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
