"""The DP utility benchmarks that draw their noise themselves (``dp_split``, ``private_fit``)
run their quick mode to the end: both had stopped with a TypeError when privacy noise came
to be drawn only from a ``NoiseSource``, and no test ran them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_module(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_private_fit_quick_prints_every_epsilon_beside_scikit_learn():
    out = run_module("benchmarks.private_fit", "--quick")
    assert "sklearn" in out and "eps=0.5" in out and "eps=inf" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("100 ", "1000"))]
    assert rows and all(len(row) >= 8 for row in rows)


def test_dp_split_quick_writes_its_report(tmp_path):
    out = run_module("benchmarks.dp_split", "--quick", "--out", str(tmp_path / "out"))
    assert "Derived split per task" in out and "One noisy M-step" in out
