"""``benchmarks/default_evidence.py``: both protocols' mean, paired with the default."""

import pandas as pd
import pytest


def _results():
    """Two datasets x two seeds. Per (dataset, protocol) AUROC; ``B`` gains 0.02 in seed 1."""
    values = {  # method -> {protocol: (dataset a, dataset b)}
        "DEM-kmeans": {"novelty": (0.8, 0.7), "outlier": (0.8, 0.6)},
        "KNN": {"novelty": (0.9, 0.8), "outlier": (0.6, 0.5)},
        "B": {"novelty": (0.8, 0.8), "outlier": (0.8, 0.6)},
    }
    rows = [
        {
            "dataset": d,
            "protocol": p,
            "seed": s,
            "method": m,
            "error": None,
            "auroc": v[p][i] + (0.02 if (m, s) == ("B", 1) else 0.0),
        }
        for m, v in values.items()
        for p in ("novelty", "outlier")
        for i, d in enumerate("ab")
        for s in (0, 1)
    ]
    return pd.DataFrame(rows)


def test_both_protocols_paired_with_the_default(benchmark_script, tmp_path):
    module = benchmark_script("default_evidence")
    path = tmp_path / "results.csv"
    _results().to_csv(path, index=False)
    out = tmp_path / "evidence.md"
    assert module.main(["--results", str(path), "--out", str(out)]) == 0
    text = out.read_text()
    # DEM-kmeans: novelty 0.75, outlier 0.70, both 0.725
    assert "| DEM-kmeans | 0.750 | 0.700 | 0.7250 |  | 4 |" in text
    # KNN: both (0.75 + 0.65) / 2 = 0.70: -0.025 in both seeds, s.e. 0
    assert "| KNN | 0.850 | 0.550 | 0.7000 | -0.0250 (0.0000) | 4 |" in text
    # B: novelty 0.81, both 0.76; seed 0 +0.025, seed 1 +0.045: mean +0.035, s.e. 0.01
    assert "| B | 0.810 | 0.710 | 0.7600 | +0.0350 (0.0100) | 4 |" in text
    assert text.index("| B |") < text.index("| DEM-kmeans |") < text.index("| KNN |")
    assert "| novelty | KNN | 0.850 | +0.1000 (0.0000) |" in text
    assert "| outlier | B | 0.710 | +0.0100 (0.0100) |" in text


def test_a_reference_with_no_rows_is_refused_by_name(benchmark_script):
    module = benchmark_script("default_evidence")
    with pytest.raises(ValueError, match="--reference 'FedVB'"):
        module.report(_results(), reference="FedVB")


def test_the_first_file_holding_a_method_wins(benchmark_script, tmp_path):
    module = benchmark_script("default_evidence")
    first, second = tmp_path / "1.csv", tmp_path / "2.csv"
    _results().to_csv(first, index=False)
    other = _results()
    other["auroc"] = 0.5
    other.to_csv(second, index=False)
    assert set(module.load([first, second])["auroc"]) == set(_results()["auroc"])
