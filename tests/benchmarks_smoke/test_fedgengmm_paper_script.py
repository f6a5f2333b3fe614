"""Smoke test of ``benchmarks/fedgengmm_paper.py`` on a small dataset, and its report logic."""

import numpy as np
import pandas as pd


def _rows(method, values, rounds, **extra):
    return [
        {
            "dataset": "d",
            "alpha": 0.5,
            "method": method,
            "aupr_out": v,
            "rounds": rounds,
            "bytes_up": 1e6,
            "error": None,
            "client_components": 10.0,
            "seed": i,
            **extra,
        }
        for i, v in enumerate(values)
    ]


def test_alpha_report_checks_both_targets(benchmark_script):
    script = benchmark_script("fedgengmm_paper")
    rows = (
        _rows("FedGenGMM", [0.90, 0.92], 1)
        + _rows("CentralGMM", [0.95, 0.95], np.nan)  # 0.04 above FedGenGMM: check fails
        + _rows("DEM-kmeans", [0.89, 0.89], 40)  # below FedGenGMM: check passes
        + _rows("DEM-separated", [0.5, 0.5], 20)
        + _rows("DEM-subset", [0.6, 0.6], 10)
    )
    report = script.alpha_report(pd.DataFrame(rows))
    assert "within 0.02 of CentralGMM (or above): 0 of 1" in report
    assert "at least DEM init 3 (DEM-kmeans): 1 of 1" in report
    assert (
        "| d | 1 (1.00 MB up) | 20.0 (1.0 MB up) | 10.0 (1.0 MB up) | 40.0 (1.0 MB up) | - |"
        in (report)
    )
    assert "| d | 0.5 | 0.910 ± 0.010 |  | 0.950 ± 0.000 | 0.890 ± 0.000 |" in report


def test_kc_frame_puts_each_method_on_its_client_model_size(benchmark_script):
    script = benchmark_script("fedgengmm_paper")
    df = pd.DataFrame(
        {
            "method": ["FedGenGMM", "DEM-kmeans", "CentralGMM"],
            "client_components": [5.0, np.nan, np.nan],
            "n_components": [20, 7, 20],
        }
    )
    assert script.kc_frame(df)["client_model_size"].tolist()[:2] == [5.0, 7.0]
    assert np.isnan(script.kc_frame(df)["client_model_size"].iloc[2])


def test_quick_run_end_to_end(benchmark_script, tmp_path):
    script = benchmark_script("fedgengmm_paper")
    assert (
        script.main(
            [
                "--quick",
                "--datasets",
                "4_breastw",
                "--out",
                str(tmp_path),
                "--no-progress",
                "--experiment",
                "alpha",
            ]
        )
        == 0
    )
    report = (tmp_path / "report.md").read_text()
    assert "## Table 4: rounds to convergence" in report
    assert "| 4_breastw | 5 |" in report
    assert (tmp_path / "fig3_alpha_4_breastw.png").stat().st_size > 1000
    assert len(pd.read_csv(tmp_path / "alpha.csv")) == 12  # 2 alphas x (5 methods + FedGenGMM-BIC)
