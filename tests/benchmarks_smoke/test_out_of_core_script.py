"""Smoke test of ``benchmarks/out_of_core.py`` (DEM-kmeans from a memory map beside the
in-memory fit): the quick run fits and scores both ways in fresh processes and reports
per-row times as ratios to the in-memory cell and the peak memory; the rows it writes are the
seeded Gaussians, written in chunks."""

import numpy as np


def test_quick_run_reports_both_paths(benchmark_script):
    report = benchmark_script("out_of_core").main(["--quick"])
    rows = [line for line in report.splitlines() if line.startswith("| 6,000 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["memory", "stream"]
    assert "(1.00x)" in rows[0]  # the reference against itself
    assert "Peak memory of the 6,000-row stream cell" in report and "load average" in report


def test_rows_are_written_in_chunks_and_seeded(benchmark_script, tmp_path, monkeypatch):
    module = benchmark_script("out_of_core")
    monkeypatch.setattr(module, "WRITE_ROWS", 7)  # 50 rows in 8 chunks
    module.write_rows(tmp_path / "a.npy", 50)
    module.write_rows(tmp_path / "b.npy", 50)
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.shape == (50, module.N_FEATURES) and np.isfinite(a).all()
    assert np.array_equal(a, b) and not (tmp_path / "a.partial.npy").exists()
    assert len(np.unique(a[:, 0])) == 50  # every chunk drawn afresh
