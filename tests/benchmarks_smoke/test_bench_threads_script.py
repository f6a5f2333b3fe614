"""Smoke tests of ``benchmarks/bench_threads.py``: the load it starts is there and gone after,
the thread modes restore the environment, the tables compute their ratios, and a tiny run
completes with the caller's torch threads intact."""

from __future__ import annotations

import os

import pytest
import torch

from fednovelty.runtime.threads import ENV_VAR


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("bench_threads")


def test_busy_processes_run_during_the_body_and_stop_after(bench) -> None:
    with bench.busy_processes(1, threads=1) as procs:
        assert len(procs) == 1 and procs[0].poll() is None
    assert procs[0].poll() is not None


def test_thread_modes_set_and_restore_the_override(bench, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "7")
    before = torch.get_num_threads()
    with bench.thread_mode("library", 4):
        assert ENV_VAR not in os.environ
    with bench.thread_mode("default", 4):
        assert os.environ[ENV_VAR] == "4"
    with bench.thread_mode("one", 4):
        assert os.environ[ENV_VAR] == "1" and torch.get_num_threads() == 1
    assert os.environ[ENV_VAR] == "7" and torch.get_num_threads() == before


def test_fit_section_and_table(bench) -> None:
    """Each (mode, condition) runs the suite once, in the mode's threads; the table's ratios
    are loaded / alone."""
    calls: list[tuple[str | None, int]] = []
    times = iter([1.0, 2.0, 4.0, 32.0, 1.5, 3.0])

    def suite() -> dict[str, float]:
        calls.append((os.environ.get(ENV_VAR), torch.get_num_threads()))
        return {"demo: X": next(times)}

    before = torch.get_num_threads()
    try:
        seconds = bench.fit_section([suite], 3, busy=1)
    finally:
        torch.set_num_threads(before)
    assert calls == [(None, 3), (None, 3), ("3", 3), ("3", 3), ("1", 1), ("1", 1)]
    table = bench.fit_table(seconds, 3)
    row = next(line for line in table.splitlines() if line.startswith("demo: X"))
    assert [cell.split() for cell in row.split("|")[1:]] == [
        ["1.0", "2.0", "2.0x"],
        ["4.0", "32.0", "8.0x"],
        ["1.5", "3.0", "2.0x"],
    ]
    assert "total, default (3t): alone 4.0 s, loaded 32.0 s, loaded/alone 8.0x" in table


def test_kernel_section_times_one_and_many_threads(bench) -> None:
    before = torch.get_num_threads()
    rows = bench.kernel_section(((50, 2, 3),), 2, busy=0, repeats=1, budget_s=0.0)
    assert torch.get_num_threads() == before
    assert [row[0] for row in rows] == ["E-step", "k-means", "score"] * 2
    assert {row[5] for row in rows} == {"alone", "loaded"}
    assert all(len(row[6][1]) == 1 and len(row[6][2]) == 1 for row in rows)
    assert "2t/1t" in bench.kernel_table(rows, 2)


@pytest.mark.slow
def test_quick_run_writes_the_report(bench, tmp_path) -> None:
    out = tmp_path / "threads.txt"
    before = torch.get_num_threads()
    report = bench.main(["--quick", "--busy", "1", "--modes", "library", "--out", str(out)])
    assert torch.get_num_threads() == before
    assert out.read_text() == report
    assert "## Kernels: one thread vs all" in report
    for name in ("demo: FedGenGMM", "demo: CentralGMM (pooled data)", "pfl: FedAvg", "pfl: FedGMM"):
        assert name in report
    assert "total, library: alone" in report
