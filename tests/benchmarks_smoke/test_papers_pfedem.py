"""``benchmarks.papers_pfedem``: pFedEM's Table I built from kept fits (synthetic ones here)."""

from __future__ import annotations

import pickle

import numpy as np


def keep(folder, name, acc, acc_half, commit="abc1234"):
    record = {
        "value": {"acc": np.asarray(acc), "acc_half": np.asarray(acc_half), "pi": np.zeros(0)},
        "signature": "{}",
        "commit": commit,
        "date": "2026-12-04",
        "seconds": 1.0,
    }
    with (folder / f"{name}.pkl").open("wb") as handle:
        pickle.dump(record, handle)


def test_the_table_reads_each_variant_beside_the_shared_baselines(benchmark_script, tmp_path):
    papers = benchmark_script("papers_pfedem")
    half = {"FedGMM": [0.5, 0.7], "FedEM": [0.5, 0.6], "FedAvg": [0.5, 0.9]}
    for seed in (0, 1):
        for method, values in half.items():
            keep(tmp_path, f"linear-x3-seed{seed}-{method}-mlp", [0.1, 0.3], values)
        keep(tmp_path, f"linear-x3-seed{seed}-pFedEM-mlp-backbone-paper", [0.2, 0.2], [0.5, 0.52])
        keep(tmp_path, f"linear-x3-seed{seed}-pFedEM-mlp-backbone-ours-reg0.01", [0, 0], [0.4, 1.0])
    # a variant with one seed only where a baseline is missing: not shown
    keep(tmp_path, "cosine-x3-seed0-pFedEM-linear-input-ours", [0.1, 0.2], [0.1, 0.2])
    # a 1-cycle fit: not Table I's
    keep(tmp_path, "linear-x1-seed0-pFedEM-mlp-backbone-paper", [0.0, 1.0], [0.0, 1.0])

    (built,) = papers.tables(tmp_path)
    assert built.header[2:] == [
        "ours: backbone Gaussians, the paper's algorithm, std half (matched)",
        "ours: backbone Gaussians, reg_covar 0.01, our algorithm, std half (matched)",
    ]
    rows = {row[0]: row for row in built.rows}
    # the std of [0.5, 0.52] is 0.01, of [0.2, 0.2] zero; FedEM's half std 0.05, matched 0.1
    assert rows["linear, pFedEM"][1:] == ["0.0296", "0.0100 (0.0000)", "0.3000 (0.0000)"]
    assert rows["linear, FedEM"][1:] == ["0.0316", "0.0500 (0.1000)", "0.0500 (0.1000)"]
    assert rows["cosine, pFedEM"][2] == "not run yet"
    assert list(built.seeds) == [0, 1]
    assert "in 1 of 2 variant and schedule cells" in built.verdict
    assert "reg_covar 0.01, our algorithm, linear: pFedEM 0.3000, rank 4 of 4" in built.verdict
    assert "backbone Gaussians, the paper's algorithm, linear: pFedEM 0.0100, the most stable" in (
        built.verdict
    )
    assert built.markdown().startswith("scale: reduced (60 windows of one round")


def test_no_finished_three_cycle_schedule_gives_no_table(benchmark_script, tmp_path):
    papers = benchmark_script("papers_pfedem")
    assert papers.tables(tmp_path / "absent") == []
    keep(tmp_path, "linear-x1-seed0-pFedEM-mlp-backbone-paper", [0.0, 1.0], [0.0, 1.0])
    assert papers.tables(tmp_path) == []
