"""Smoke test of ``benchmarks/fedgmm_femnist.py``: the quick run writes both tables."""


def test_quick_run_writes_both_tables(benchmark_script, tmp_path):
    out = tmp_path / "report.md"
    report = benchmark_script("fedgmm_femnist").main(["--quick", "--seeds", "2", "--out", str(out)])
    assert out.read_text() == report
    assert "## 1. PFL classification, Table 2 (8 writers, 2 rounds, seeds [2])" in report
    assert "## 2. Unseen writers, Table 5 (6 writers train, 2 unseen, 2 rounds" in report
    for name in ("| Local |", "| FedAvg |", "| FedProx |", "| FedEM |", "| FedGMM |"):
        assert name in report
    assert "| FedGMM adapted (x only, 20 rows) |" in report and "| 78.51 |" in report
    assert report.count("PASS") + report.count("FAIL") == 4
