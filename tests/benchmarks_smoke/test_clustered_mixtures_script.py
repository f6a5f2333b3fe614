"""Smoke test of ``benchmarks/clustered_mixtures.py``: the quick run writes both tables and
the six target checks."""


def test_quick_run_writes_both_tables_and_the_checks(benchmark_script, tmp_path):
    out = tmp_path / "report.md"
    report = benchmark_script("clustered_mixtures").main(["--quick", "--out", str(out)])
    assert out.read_text() == report
    assert "## 1. MVTec-AD categories as clusters (5 categories x 2 clients" in report
    assert "## 2. ADBench sets, cluster-wise Dirichlet(0.1, 10)" in report
    for name in ("| ClusteredGMM-IFCA |", "| ClusteredGMM-FeSEM |", "| FedGMM |", "| FedGenGMM |"):
        assert name in report
    assert report.count("PASS") + report.count("FAIL") == 6
