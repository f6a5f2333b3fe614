"""Smoke test of ``benchmarks/femnist_novelty.py``: the quick run writes all four sections."""


def test_quick_run_writes_every_section_and_the_figure(benchmark_script, tmp_path):
    out, fig = tmp_path / "report.md", tmp_path / "writers.png"
    report = benchmark_script("femnist_novelty").main(
        ["--quick", "--seeds", "1", "--out", str(out), "--figure", str(fig)]
    )
    assert out.read_text() == report and fig.stat().st_size > 0
    assert "## 1. Covariate novelty, pooled (8 writers, seeds [1], K = 10)" in report
    for section in ("## 2. Per writer", "## 3. Label novelty", "## 4. Unseen writers"):
        assert section in report
    for row in ("| FedGMM | federated |", "| CentralGMM | centralized |", "| IForest | pyod |"):
        assert row in report
    assert "| adapt 20 |" in report and "FedGMM -log p(y \\| x)" in report
    assert report.count("PASS") + report.count("FAIL") == 4
