"""Smoke test of ``benchmarks/fedgmm_pfl.py``: the quick run completes and writes its report."""


def test_quick_run_writes_both_tables(benchmark_script, tmp_path):
    out = tmp_path / "report.md"
    report = benchmark_script("fedgmm_pfl").main(["--quick", "--seeds", "3", "--out", str(out)])
    assert out.read_text() == report
    assert "## 1. PFL classification (8 clients, 5 rounds, ours data, seeds [3])" in report
    assert "## 2. Unseen clients (6 of 8 clients train" in report
    for name in ("| Local |", "| FedAvg |", "| FedProx |", "| FedEM |", "| FedGMM |"):
        assert name in report
    assert "| FedGMM adapted (x, y) |" in report
    assert report.count("PASS") + report.count("FAIL") == 3


def test_reference_data_reports_client_groups_and_resumes_each_fit(benchmark_script, tmp_path):
    script = benchmark_script("fedgmm_pfl")
    argv = ["--quick", "--data", "reference", "--algorithm", "both", "--experiment", "pfl"]
    argv += ["--methods", "FedAvg", "FedGMM", "--checkpoints", str(tmp_path)]
    report = script.main(argv)
    assert "| Gaussian clients % | Beta clients % |" in report
    for name in ("| FedAvg |", "| FedGMM |", "| FedGMM-paper |"):
        assert name in report
    assert sorted(p.name for p in tmp_path.glob("pfl-seed0-*.pkl")) == [
        "pfl-seed0-FedAvg.pkl",
        "pfl-seed0-FedGMM-paper.pkl",
        "pfl-seed0-FedGMM.pkl",
    ]
    (tmp_path / "pfl-seed0.pkl").unlink()  # the seed's record gone: its fits are read back
    again = script.main(argv)
    assert "3 units read back, 1 computed" in again
    assert again.split("## 1.")[1] == report.split("## 1.")[1]
