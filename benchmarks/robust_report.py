"""A report on the robust mixture defaults against IForest, ECOD and the plain mixtures.

Run after the scoreboard (``fednovelty bench ... --seeds 0 1 2 --out benchmarks/results/adbench``
with the methods listed in ``docs/robust.md``)::

    python -m benchmarks.robust_report [--results benchmarks/results/adbench/results.csv]

It reads the tidy results and prints, and writes next to them as ``robust.md``:

1. the targets: mean AUROC over the 25 ADBench datasets of each federated mixture detector
   (defaults, FedGenGMM's ``copula`` option, and the federated VB, its one-shot
   variants and the kNN-distance markers where the results hold them) per seed and over
   seeds with its standard error over seeds, beside IForest's, with the difference and its
   paired standard error (the target in both protocols: above IForest, ``docs/robust.md``);
2. the ablation: plain (``-plain``), standardisation only (``-std``), prior only (``-prior``)
   and both (the defaults), mean AUROC per protocol;
3. per-dataset AUROC (mean over seeds): before (``-plain``) and after for FedGenGMM and
   DEM-kmeans, FedGenGMM with ``copula=True`` (``FedGenGMM-copula``), IForest, ECOD and
   the centralized GMM before and after.

Nothing is fitted here: every figure comes from one scoreboard run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from benchmarks.common import add_out, markdown_table

DEFAULT = Path(__file__).resolve().parent / "results" / "adbench" / "results.csv"
FEDERATED = ("FedGenGMM", "DEM-kmeans")
#: Federated detectors with a non-default option, the Bayesian ones and the kNN-distance
#: markers, reported beside the defaults.
OPTIONS = (
    "FedGenGMM-copula",
    "FedVB",
    "FedVB-oneshot-natural",
    "FedVB-oneshot-moment",
    "KNN-markers",
)
VARIANTS = {"-plain": "plain", "-std": "standardise only", "-prior": "prior only", "": "both"}


def _means(df: pd.DataFrame, protocol: str) -> pd.DataFrame:
    """Mean AUROC over datasets, per method x seed (only seeds where all datasets ran)."""
    part = df[(df["protocol"] == protocol) & df["error"].isna()]
    counts = part.groupby(["method", "seed"])["auroc"].count()
    full = counts[counts == part["dataset"].nunique()].index
    means = part.groupby(["method", "seed"])["auroc"].mean()
    return means.loc[means.index.isin(full)].unstack("seed")


def _standard_error(per_seed: pd.Series) -> str:
    """The standard error of a mean over seeds (sample sd / sqrt(seeds)); blank below 2 seeds.

    Applied to a per-seed difference with IForest, it is the paired standard error: both
    methods see the same splits and partitions in a seed.
    """
    values = per_seed.dropna()
    if len(values) < 2:
        return ""
    return f"{values.std(ddof=1) / len(values) ** 0.5:.4f}"


def targets(df: pd.DataFrame) -> str:
    out = ["## Targets (mean AUROC over the datasets)", ""]
    for protocol in ("outlier", "novelty"):
        m = _means(df, protocol)
        seeds = list(m.columns)
        header = ["method", *[f"seed {s}" for s in seeds], "mean", "s.e.", "vs IForest",
                  "s.e.", "target"]  # fmt: skip
        rows = []
        iforest = m.loc["IForest"] if "IForest" in m.index else pd.Series(float("nan"), seeds)
        reference = iforest.mean()
        for method in (*FEDERATED, *OPTIONS, "CentralGMM", "IForest", "ECOD"):
            if method not in m.index:
                continue
            mean = m.loc[method].mean()
            if method in (*FEDERATED, *OPTIONS):
                verdict = f"> IForest: {'met' if mean > reference else 'missed'}"
            else:
                verdict = ""
            rows.append(
                [
                    method,
                    *[
                        "" if pd.isna(m.loc[method, s]) else f"{m.loc[method, s]:.4f}"
                        for s in seeds
                    ],
                    f"**{mean:.4f}**",
                    _standard_error(m.loc[method]),
                    f"{mean - reference:+.4f}",
                    _standard_error(m.loc[method] - iforest),
                    verdict,
                ]
            )
        out += [f"### {protocol}", "", markdown_table(header, rows), ""]
    return "\n".join(out)


def ablation(df: pd.DataFrame) -> str:
    header = ["method", "protocol", *VARIANTS.values()]
    rows = []
    for method in (*FEDERATED, "CentralGMM"):
        for protocol in ("outlier", "novelty"):
            m = _means(df, protocol)
            cells = []
            for suffix in VARIANTS:
                name = method + suffix
                cells.append(f"{m.loc[name].mean():.4f}" if name in m.index else "")
            if any(cells):
                rows.append([method, protocol, *cells])
    return "\n".join(
        ["## Ablation (mean AUROC over datasets and seeds)", "", markdown_table(header, rows), ""]
    )


def _cell(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.3f}"


def per_dataset(df: pd.DataFrame) -> str:
    columns = [
        ("FedGenGMM before", "FedGenGMM-plain"),
        ("FedGenGMM after", "FedGenGMM"),
        ("FedGenGMM copula", "FedGenGMM-copula"),
        ("DEM-kmeans before", "DEM-kmeans-plain"),
        ("DEM-kmeans after", "DEM-kmeans"),
        ("IForest", "IForest"),
        ("ECOD", "ECOD"),
        ("central GMM before", "CentralGMM-plain"),
        ("central GMM after", "CentralGMM"),
    ]
    out = ["## Per dataset (AUROC, mean over seeds)", ""]
    for protocol in ("outlier", "novelty"):
        part = df[(df["protocol"] == protocol) & df["error"].isna()]
        table = part.groupby(["dataset", "method"])["auroc"].mean().unstack()
        present = [(label, name) for label, name in columns if name in table]
        rows = [
            [dataset, *[_cell(table.loc[dataset, name]) for _, name in present]]
            for dataset in table.index
        ]
        rows.append(["**mean**", *[f"**{table[name].mean():.3f}**" for _, name in present]])
        header = ["dataset", *[label for label, _ in present]]
        out += [f"### {protocol}", "", markdown_table(header, rows), ""]
    return "\n".join(out)


def report(df: pd.DataFrame) -> str:
    seeds = sorted(int(s) for s in df["seed"].unique())
    head = [
        "# Robust mixture defaults: report",
        "",
        f"{df['dataset'].nunique()} datasets, seeds {seeds}; 10 clients, Dirichlet(0.5), K = 10, "
        "at most 10,000 training and 10,000 test rows. `-plain`: no standardisation and no "
        "covariance prior (the mixtures without the robust defaults).",
        "",
    ]
    return "\n".join(head) + "\n".join([targets(df), ablation(df), per_dataset(df)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=DEFAULT)
    add_out(parser, "default: robust.md beside it")
    args = parser.parse_args(argv)
    text = report(pd.read_csv(args.results))
    print(text)
    out = args.out or args.results.with_name("robust.md")
    out.write_text(text + "\n")
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
