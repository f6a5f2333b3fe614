"""``benchmarks/robust_report.py``: targets, ablation and per-dataset tables from results."""

import pandas as pd


def _results():
    values = {  # method -> AUROC per (dataset a, dataset b), same in both seeds
        "FedGenGMM": (0.9, 0.8),  # mean 0.85: above IForest's 0.80
        "DEM-kmeans": (0.8, 0.7),  # mean 0.75: below it
        "FedGenGMM-copula": (0.9, 0.72),  # mean 0.81: above it
        "DEM-kmeans-plain": (0.6, 0.5),
        "DEM-kmeans-std": (0.7, 0.5),
        "IForest": (0.8, 0.8),
        "ECOD": (0.7, 0.7),
    }
    rows = [
        {"dataset": d, "protocol": p, "seed": s, "method": m, "auroc": v[i], "error": None}
        for m, v in values.items()
        for i, d in enumerate(["a", "b"])
        for p in ("outlier", "novelty")
        for s in (0, 1)
    ]
    return pd.DataFrame(rows)


def test_targets_ablation_and_tables(benchmark_script, tmp_path, capsys):
    module = benchmark_script("robust_report")
    path = tmp_path / "results.csv"
    _results().to_csv(path, index=False)
    assert module.main(["--results", str(path)]) == 0
    text = (tmp_path / "robust.md").read_text()
    assert (
        "| FedGenGMM | 0.8500 | 0.8500 | **0.8500** | 0.0000 | +0.0500 | 0.0000 | > IForest: met |"
        in text
    )
    assert (
        "| DEM-kmeans | 0.7500 | 0.7500 | **0.7500** | 0.0000 | -0.0500 | 0.0000 "
        "| > IForest: missed |" in text
    )
    assert (
        "| FedGenGMM-copula | 0.8100 | 0.8100 | **0.8100** | 0.0000 | +0.0100 | 0.0000 "
        "| > IForest: met |" in text
    )
    assert "| dataset | FedGenGMM after | FedGenGMM copula | DEM-kmeans before |" in text
    assert "| b | 0.800 | 0.720 | 0.500 |" in text
    assert "| DEM-kmeans | novelty | 0.5500 | 0.6000 |  | 0.7500 |" in text  # ablation row
    assert ">= 0.80" not in text  # the retired target
    assert "| a | | " not in text
    assert "| **mean** |" in text
    assert "written:" in capsys.readouterr().out


def test_standard_errors_over_seeds(benchmark_script):
    module = benchmark_script("robust_report")
    df = _results()
    shift = {0: 0.0, 1: 0.04}  # FedGenGMM gains 0.04 in seed 1; IForest stays put
    is_fedgen = df["method"] == "FedGenGMM"
    df.loc[is_fedgen, "auroc"] += df.loc[is_fedgen, "seed"].map(shift)
    text = module.targets(df)
    # seeds 0.85 and 0.89: mean 0.87, sd 0.04 / sqrt(2), s.e. 0.02; same for the difference
    assert "| FedGenGMM | 0.8500 | 0.8900 | **0.8700** | 0.0200 | +0.0700 | 0.0200 |" in text
    assert module._standard_error(pd.Series([0.8])) == ""
