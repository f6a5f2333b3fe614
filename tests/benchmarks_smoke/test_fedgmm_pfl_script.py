"""Smoke test of ``benchmarks/fedgmm_pfl.py``: the quick run completes and writes its report."""

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fedgmm_pfl.py"


def load_script():
    spec = importlib.util.spec_from_file_location("fedgmm_pfl_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_both_tables(tmp_path):
    out = tmp_path / "report.md"
    report = load_script().main(["--quick", "--seeds", "3", "--out", str(out)])
    assert out.read_text() == report
    assert "## 1. PFL classification (8 clients, 5 rounds, seeds [3])" in report
    assert "## 2. Unseen clients (6 of 8 clients train" in report
    for name in ("| Local |", "| FedAvg |", "| FedProx |", "| FedEM |", "| FedGMM |"):
        assert name in report
    assert "| FedGMM adapted (x, y) |" in report
    assert report.count("PASS") + report.count("FAIL") == 3
