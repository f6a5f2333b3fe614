"""Smoke test of ``benchmarks/stream_drift.py``: the quick run writes every section."""


def test_quick_run_writes_every_section(benchmark_script, tmp_path):
    out = tmp_path / "report.md"
    report = benchmark_script("stream_drift").main(["--quick", "--seeds", "1", "--out", str(out)])
    assert out.read_text() == report
    title = "## 1-2. Novelty under drift and weight tracking (3 clients x 60 rows, 4 windows"
    assert title + ", linear cycle, rho 0.7, 1 round(s) per window" in report
    for name in ("| streaming |", "| static |", "| refit |", "| FedGenGMM |"):
        assert name in report
    assert "## 3. False alarms on a stationary stream" in report
    assert "## 4. Detection delay on a documented shift" in report
    for name in ("| cusum |", "| conformal |", "| conformal martingale |", "### mix:"):
        assert name in report
    assert "### novel: 20% of every client's rows are novel rows from window 6 on" in report
    assert report.count("PASS") + report.count("FAIL") == 6
