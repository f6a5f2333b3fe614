"""Smoke test of ``benchmarks/few_rounds.py`` (federated EM from the one-shot start with
SQUAREM against DEM-kmeans): the quick run prints its table, and the differences against
DEM-kmeans are computed per dataset and seed (checked on a frame built by hand)."""

import pandas as pd
import pytest


def test_quick_run_prints_every_variant(benchmark_script):
    report = benchmark_script("few_rounds").main(["--quick"])
    assert "## Covertype" in report and "DEM seed spread" in report
    rows = {
        line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")
    }
    assert {"DEM-kmeans", "oneshot+1", "FedGenGMM"} <= set(rows)
    cells = rows["DEM-kmeans"].strip("|").split("|")
    assert cells[5].strip() == "+0.0000 (0.0000)"  # the reference against itself
    assert int(float(cells[1])) >= 1 and float(cells[1]) < int(float(cells[2]))  # EM < all rounds


def test_differences_are_against_dem_of_the_same_dataset_and_seed(benchmark_script):
    module = benchmark_script("few_rounds")
    table = pd.DataFrame(
        {
            "dataset": ["a", "a", "a", "a", "b", "b"],
            "seed": [0, 0, 1, 1, 0, 0],
            "variant": ["DEM-kmeans", "x", "DEM-kmeans", "x", "x", "DEM-kmeans"],
            "auroc": [0.9, 0.91, 0.8, 0.7, 0.5, 0.6],
            "aupr": [0.3, 0.2, 0.4, 0.45, 0.1, 0.1],
        }
    )
    out = module.with_differences(table)
    assert out.d_auroc.tolist() == pytest.approx([0.0, 0.01, 0.0, -0.1, -0.1, 0.0])
    assert out.d_aupr.tolist() == pytest.approx([0.0, -0.1, 0.0, 0.05, 0.0, 0.0])
