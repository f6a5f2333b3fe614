"""Smoke test of ``benchmarks/fedcam_table1.py``: the quick run writes both cluster-wise
tables, the claims' checks, the tidy files and the cluster-size figure."""

import json


def test_quick_run_writes_tables_checks_and_figure(benchmark_script, tmp_path):
    report = benchmark_script("fedcam_table1").main(["--quick", "--out-dir", str(tmp_path)])
    assert (tmp_path / "fedcam_table1.md").read_text() == report
    assert "## MNIST, cluster-wise Dirichlet(0.1, 10), K = 4" in report
    assert "## MNIST, cluster-wise n-class(3, 2), K = 4" in report
    for name in ("FedAvg", "FedAvg+", "IFCA", "FeSEM", "IFCA-CAM", "FeSEM-CAM"):
        assert report.count(f"| {name} |") == 2
    # per cluster-wise setting: two CAM-vs-base checks, collapse, two near-truth, FedAvg
    assert report.count("PASS") + report.count("FAIL") == 12
    assert (tmp_path / "fedcam_table1.png").stat().st_size > 0
    rows = (tmp_path / "fedcam_table1.csv").read_text().splitlines()
    assert rows[0].startswith("dataset,partition,k,seed,method,accuracy,macro_f1")
    assert len(rows) == 1 + 2 * 6
    records = json.loads((tmp_path / "fedcam_table1.json").read_text())
    ifca = [r for r in records if r["method"] == "IFCA"]
    assert len(ifca) == 2 and all(len(r["sizes"]) == 3 for r in ifca)
    assert all(sum(r["sizes"][-1]) == 20 for r in ifca)


def test_paper_reference_and_fedavg_settings(benchmark_script):
    module = benchmark_script("fedcam_table1")
    paper = module.PAPER_FMNIST[("cluster-dir", 10)]
    assert paper["IFCA"] == (82.10, 62.62) and paper["FeSEM-CAM"] == (96.19, 92.37)
    settings = module.build_settings(module.parse_args([]))
    fedavg = settings.model_params("FedAvg", 10, 0)
    assert (fedavg["method"], fedavg["n_clusters"]) == ("FedAvg+", 1)
    assert settings.model_params("IFCA-CAM", 10, 0)["warmup_rounds"] == 6
    assert settings.model_params("IFCA", 10, 0)["warmup_rounds"] is None
