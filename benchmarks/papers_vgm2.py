"""VGM2's Table 1 (MNIST) at the paper's scale, built from the run's kept cells.

The run is ``python -m benchmarks.vgm2_table1 --paper-scale --encoder convnet --datasets mnist
--variants Local FedAvg "Prototype sharing" VGM2`` (resumable: one pickle per fitted cell under
``benchmarks/results/vgm2_paper_scale_convnet/cells/``, :mod:`benchmarks.checkpoints`).
:func:`tables` reads the finished cells and gives one
:class:`~benchmarks.paper_results.PaperTable`, the paper's macro-F1 beside ours per method,
mean ± population std over the seeds finished (a method with no finished seed says so).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS
from benchmarks.paper_results import PaperTable

CELLS = RESULTS / "vgm2_paper_scale_convnet" / "cells"
COMMAND = (
    "python -m benchmarks.vgm2_table1 --paper-scale --encoder convnet --datasets mnist "
    '--variants Local FedAvg "Prototype sharing" VGM2'
)
#: the paper's Table 1, MNIST column (test macro-F1, mean over 3 seeds).
PAPER = {"Local": 0.703, "FedAvg": 0.871, "Prototype sharing": 0.842, "VGM2": 0.909}
NAMES = {"VGM2": "VGM2 (moment matching, Prop. 1)"}
SEEDS = (0, 1, 2)


def read_cells(folder: Path = CELLS) -> dict[str, dict[int, dict]]:
    """The finished MNIST cells: method -> seed -> the cell's record (``macro_f1``, ...)."""
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(folder.glob("MNIST-*-seed*.pkl")):
        with path.open("rb") as handle:
            record = pickle.load(handle)
        value = record["value"]
        out.setdefault(value["variant"], {})[int(value["seed"])] = {
            **value,
            "commit": record.get("commit", ""),
            "date": record.get("date", ""),
        }
    return out


def _ours(seeds: dict[int, dict], key: str = "macro_f1") -> str:
    if not seeds:
        return "not run yet"
    values = np.array([seeds[s][key] for s in sorted(seeds)])
    text = f"{values.mean():.3f} ± {values.std():.3f}" if len(values) > 1 else f"{values[0]:.3f}"
    return f"{text} (seeds {', '.join(str(s) for s in sorted(seeds))})"


def verdict(cells: dict[str, dict[int, dict]]) -> str:
    """What reproduced: the ordering and each number against the paper's."""
    means = {m: np.mean([r["macro_f1"] for r in cells[m].values()]) for m in PAPER if cells.get(m)}
    if not means:
        return "no finished cell yet."
    parts = [f"{m} {means[m]:.3f} (paper {PAPER[m]:.3f})" for m in PAPER if m in means]
    text = "; ".join(parts) + "."
    missing = [m for m in PAPER if m not in means]
    if missing:
        text += f" Not finished yet: {', '.join(missing)}; no verdict on the ordering."
        if "Local" in means and means["Local"] > PAPER["Local"] + 0.1:
            text += " " + LOCAL_DIAGNOSIS
        return text
    order = sorted(means, key=means.get, reverse=True)
    paper_order = sorted(PAPER, key=PAPER.get, reverse=True)
    text += (
        f" Ordering ours: {' > '.join(order)}; the paper's: {' > '.join(paper_order)} "
        f"({'reproduced' if order == paper_order else 'not reproduced'})."
    )
    if means["Local"] > PAPER["Local"] + 0.1:
        text += " " + LOCAL_DIAGNOSIS
    return text


#: why Local is far above the paper's: the two-shard split itself (measured on every run).
LOCAL_DIAGNOSIS = (
    "Local is far above the paper's 0.703 because each client holds two label shards of "
    "sorted MNIST, so its own test rows span the few classes (mostly two) of its shards and a "
    "local model separates them (macro-F1 over the labels present in the client's test rows); "
    "the paper does not state how its Local reached 0.703 on such shards, so that protocol is "
    "not reproduced here."
)


def table(cells: dict[str, dict[int, dict]]) -> PaperTable:
    rows = [[NAMES.get(m, m), f"{PAPER[m]:.3f}", _ours(cells.get(m, {}))] for m in PAPER]
    finished = sorted({s for m in cells.values() for s in m})
    commits = sorted({r["commit"] for m in cells.values() for r in m.values() if r["commit"]})
    dates = sorted({r["date"] for m in cells.values() for r in m.values() if r["date"]})
    return PaperTable(
        name="vgm2-t1-mnist",
        title="VGM2 Table 1, MNIST: per-client macro-F1 at the paper's scale",
        scale="paper",
        paper="VGM2 (003), Table 1, MNIST column (test macro-F1, mean over 3 seeds)",
        command=COMMAND,
        algorithm=(
            "VGM2: moment-matched posterior merge (Prop. 1), the 'nearest' prediction rule; "
            "the baselines on the same code path (`VGM2Classifier(method=...)`)"
        ),
        differs=(
            "a small ConvNet encoder of ours (5x5 convolutions of 16 and 32 channels, each "
            "pooled 2x2, dense 128 -> 16; the paper's ConvNet is not specified further); 30 "
            "clients of two MNIST shards (2,000 rows, a fifth held out for test), 100 rounds, "
            "2 clients per round, 8 local epochs, as the paper's"
        ),
        seeds=finished,
        device="cpu (2 cores, one torch thread)",
        header=["method", "paper macro-F1", "ours, macro-F1 (mean ± std over seeds)"],
        rows=rows,
        verdict=verdict(cells),
        date=dates[-1] if dates else "",
        commit=", ".join(commits),
    )


def tables(folder: Path = CELLS) -> list[PaperTable]:
    """The table from the run's finished cells (none before the run has finished one)."""
    cells = read_cells(folder) if folder.exists() else {}
    return [table(cells)] if cells else []
