"""FedGenGMM's Fig. 3 and Table 4 in the papers' format, from the paper-scale run's cells.

The run is ``python -m benchmarks.fedgengmm_paper --setting paper --paper-scale --experiment
alpha`` (resumable: its finished cells are the rows of ``alpha.csv`` in
``benchmarks/results/fedgengmm_paper_paper_scale/``). :func:`tables` reads that file and gives
two :class:`~benchmarks.paper_results.PaperTable`: Table 4's rounds to convergence, the paper's
beside ours, and Fig. 3's AUC-PR per dataset and alpha (the paper gives AUC-PR as a figure
only, so its column states what the figure shows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.common import RESULTS, mean_std
from benchmarks.paper_results import PaperTable

RUN = RESULTS / "fedgengmm_paper_paper_scale" / "alpha.csv"
COMMAND = "python -m benchmarks.fedgengmm_paper --setting paper --paper-scale --experiment alpha"
DIFFERS = (
    "every row of our copies of the data: ADBench's Covertype (286,048 rows; the paper's "
    "580,000) and MNIST's 60,000 training and 10,000 test images (the paper's test set 12,000); "
    "Covertype's clients are k-means clusters (ADBench's copy has no terrain-type column); "
    "MNIST's pixels go through a two-round federated PCA to 24 features"
)
ALGORITHM = (
    "the paper's: plain maximum-likelihood mixtures (no standardisation, no covariance "
    "prior), diagonal covariances, K = 15 (Covertype) and 30 (MNIST), K_c = K, H = 100, EM "
    "tolerance 1e-3, no privacy floor; DEM = federated EM with the paper's three "
    "initialisations"
)
DATASETS = {"10_cover:noise": "Covertype", "mnist": "MNIST"}
#: The paper's Table 4 (rounds): FedGenGMM, DEM init 1, 2, 3.
PAPER_ROUNDS = {"10_cover:noise": (1, 21, 7, 40), "mnist": (1, 33, 41, 38)}
METHODS = {
    "FedGenGMM": 0,
    "DEM-separated": 1,
    "DEM-subset": 2,
    "DEM-kmeans": 3,
}
NAMES = {
    "FedGenGMM": "FedGenGMM",
    "DEM-separated": "DEM init 1",
    "DEM-subset": "DEM init 2 (sends 100 raw rows)",
    "DEM-kmeans": "DEM init 3",
    "CentralGMM": "CentralGMM",
}


def cells(path: Path = RUN) -> pd.DataFrame:
    """The finished cells, methods named without the ablation suffix (``-plain``)."""
    df = pd.read_csv(path)
    df = df[df["error"].isna()].copy()
    if "client_components" in df:
        bic = df["method"].str.startswith("FedGenGMM") & df["client_components"].isna()
        df = df[~bic]
    df["method"] = df["method"].str.removesuffix("-plain")
    return df


def _facts(df: pd.DataFrame) -> dict:
    return {
        "scale": "paper",
        "command": COMMAND,
        "algorithm": ALGORITHM,
        "differs": DIFFERS,
        "seeds": sorted(int(s) for s in df["seed"].unique()),
        "device": "cpu (2 cores, one torch thread)",
    }


def rounds_table(df: pd.DataFrame) -> PaperTable:
    """Table 4: mean rounds over the alphas and seeds finished, per dataset and method."""
    rows = []
    for dataset, name in DATASETS.items():
        cell = df[df["dataset"] == dataset]
        for method, column in METHODS.items():
            rounds = cell.loc[cell["method"] == method, "rounds"]
            ours = f"{rounds.mean():.1f} ({len(rounds)} fits)" if len(rounds) else "not run yet"
            rows.append([f"{name}: {NAMES[method]}", PAPER_ROUNDS[dataset][column], ours])
    return PaperTable(
        name="fedgengmm-t4-rounds",
        title="FedGenGMM Table 4: communication rounds to convergence (20 clients)",
        paper="FedGenGMM (001), Table 4 (rounds)",
        header=["dataset: method", "paper rounds", "ours: rounds (mean over alphas, seeds)"],
        rows=rows,
        verdict=rounds_verdict(df),
        **_facts(df),
    )


def rounds_verdict(df: pd.DataFrame) -> str:
    parts = []
    for dataset, name in DATASETS.items():
        cell = df[df["dataset"] == dataset]
        dem = cell.loc[cell["method"].str.startswith("DEM"), "rounds"]
        one = cell.loc[cell["method"] == "FedGenGMM", "rounds"]
        if len(one) and len(dem):
            parts.append(
                f"{name}: FedGenGMM {one.mean():.0f} round against DEM's {dem.min():.0f}-"
                f"{dem.max():.0f} (paper: 1 against {min(PAPER_ROUNDS[dataset][1:])}-"
                f"{max(PAPER_ROUNDS[dataset][1:])})"
            )
    claim = "one round against tens reproduced" if parts else "no finished cell yet"
    return "; ".join([claim, *parts]) + "."


def aucpr_table(df: pd.DataFrame) -> PaperTable:
    """Fig. 3: AUC-PR (novel = positive) per dataset and alpha, mean ± std over seeds."""
    header = ["dataset, alpha", "paper (Fig. 3, a figure)", *(NAMES[m] for m in NAMES)]
    header[2:] = ["FedGenGMM", "DEM init 1", "DEM init 2", "DEM init 3", "CentralGMM"]
    order = ["FedGenGMM", "DEM-separated", "DEM-subset", "DEM-kmeans", "CentralGMM"]
    rows, gaps = [], []
    for dataset, name in DATASETS.items():
        for alpha, cell in df[df["dataset"] == dataset].groupby("alpha"):
            values = {m: cell.loc[cell["method"] == m, "aupr_out"] for m in order}
            if len(values["FedGenGMM"]) and len(values["CentralGMM"]):
                gaps.append(
                    (
                        name,
                        values["FedGenGMM"].mean() - values["CentralGMM"].mean(),
                        values["FedGenGMM"].mean() - values["DEM-kmeans"].mean(),
                    )
                )
            rows.append(
                [
                    f"{name}, {alpha:g}",
                    "FedGenGMM near CentralGMM, at or above DEM",
                    *(mean_std(values[m], 3) for m in order),
                ]
            )
    return PaperTable(
        name="fedgengmm-fig3-aucpr",
        title="FedGenGMM Fig. 3: AUC-PR against the Dirichlet alpha (20 clients)",
        paper="FedGenGMM (001), Fig. 3 (AUC-PR, novel = positive; plotted, no table)",
        header=header,
        rows=rows,
        verdict=aucpr_verdict(gaps),
        **_facts(df),
    )


def aucpr_verdict(gaps: list[tuple[str, float, float]]) -> str:
    if not gaps:
        return "no finished cell yet."
    parts = []
    for name in DATASETS.values():
        mine = [g for g in gaps if g[0] == name]
        if not mine:
            continue
        central = np.array([g[1] for g in mine])
        dem = np.array([g[2] for g in mine])
        parts.append(
            f"{name}: FedGenGMM minus CentralGMM {central.min():+.3f} to {central.max():+.3f} "
            f"over {len(mine)} alphas ({int((central >= -0.02).sum())} within 0.02 or above), "
            f"minus DEM init 3 {dem.min():+.3f} to {dem.max():+.3f}"
        )
    text = "; ".join(parts) + "."
    covertype = [g for g in gaps if g[0] == "Covertype"]
    if covertype and max(g[1] for g in covertype) < -0.02:
        text += " " + COVERTYPE_DIAGNOSIS
    return text


#: why FedGenGMM trails CentralGMM on Covertype under the paper's setting: measured by the
#: probe of commit 90c05b7 (seed 0, alpha 0.1 and 1, the benchmark's cells reproduced).
COVERTYPE_DIAGNOSIS = (
    "Covertype, not reproduced; cause (probe of commit 90c05b7, seed 0, alphas 0.1 and 1): the "
    "server's refit, not the clients. The clients' union of 300 diagonal components scores "
    "0.743 / 0.643, above CentralGMM's 0.523; refitting 15 diagonal components to rows sampled "
    "from it gives 0.435 / 0.458 (0.458 / 0.471 with H = 1,000; 0.633 / 0.563 refitting full "
    "covariances). The novel rows are noise off the data's feature correlations (CentralGMM "
    "with full covariances: 0.982); the synthetic rows, drawn from axis-aligned components, "
    "fall off those correlations too, so the refit puts density where the novel rows lie "
    "(3.2-3.5 nats per novel row against CentralGMM's 2.3) and fits the real rows worse."
)


def tables(path: Path = RUN) -> list[PaperTable]:
    """Both tables from the run's finished cells (none when the run has not started)."""
    if not path.exists():
        return []
    df = cells(path)
    return [rounds_table(df), aucpr_table(df)] if len(df) else []
