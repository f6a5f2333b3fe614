"""Smoke test of ``benchmarks/fedgmm_pfl.py``: the quick run completes and writes its report."""


def test_quick_run_writes_both_tables(benchmark_script, tmp_path):
    out = tmp_path / "report.md"
    report = benchmark_script("fedgmm_pfl").main(["--quick", "--seeds", "3", "--out", str(out)])
    assert out.read_text() == report
    assert "## 1. PFL classification (8 clients, 5 rounds, seeds [3])" in report
    assert "## 2. Unseen clients (6 of 8 clients train" in report
    for name in ("| Local |", "| FedAvg |", "| FedProx |", "| FedEM |", "| FedGMM |"):
        assert name in report
    assert "| FedGMM adapted (x, y) |" in report
    assert report.count("PASS") + report.count("FAIL") == 3
