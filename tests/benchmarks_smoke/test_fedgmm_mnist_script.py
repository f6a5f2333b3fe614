"""Smoke test of ``benchmarks/fedgmm_mnist.py``: the quick run writes both sections (Table 4
and Figure 2) and both figures."""


def test_quick_run_writes_both_sections_and_figures(benchmark_script, tmp_path):
    assert benchmark_script("fedgmm_mnist").main(["--quick", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "fedgmm_mnist.md").read_text()
    assert report.startswith("# FedGMM novelty detection on federated MNIST")
    assert "## Novelty detection (paper Table 4)" in report
    assert "## Leave digit 1 out (paper Figure 2)" in report
    for row in ("| FedGMM log p(x) |", "| FedEM MSP |", "| FedAvg MSP |"):
        assert report.count(row) == 1
    assert "| normal vs digit 1 (unseen) |" in report
    assert "(quick smoke run on a small split: not the benchmark)" in report
    for figure in ("fedgmm_mnist_histograms.png", "fedgmm_figure2.png"):
        assert (tmp_path / figure).stat().st_size > 0
