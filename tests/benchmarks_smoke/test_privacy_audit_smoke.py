"""Smoke test of ``benchmarks/privacy_audit.py``: two trials of the non-private mode into a
temporary folder print the table and write the report, and a rerun resumes every fit from the
checkpoint instead of fitting again; the attack's scores and the held-out bound on made-up
statistics."""

import json
import math

import numpy as np
import pytest


def test_two_trials_of_one_mode_write_the_table_and_resume(benchmark_script, tmp_path):
    audit = benchmark_script("privacy_audit")
    out, report_path = tmp_path / "audit", tmp_path / "audit.txt"
    argv = ["--trials", "2", "--shadows", "2", "--modes", "none"]
    argv += ["--out", str(out), "--report", str(report_path)]
    report = audit.main(argv)
    assert report_path.read_text() == report
    row = next(line for line in report.splitlines() if line.startswith("| none |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == "inf" and cells[3] == "1.000 / 1.000" and cells[7] == "2"
    # without noise the released model is a function of the rows: the attack always wins
    assert cells[2] == "1.000 [1.000, 1.000]" and cells[6] == "1 / 1"
    (checkpoint,) = out.glob("scores-*.jsonl")
    records = [json.loads(line) for line in checkpoint.read_text().splitlines()]
    assert len(records) == 8  # 2 trials and 2 shadows, with and without the canary
    assert {(r["role"], r["member"]) for r in records} == {
        (role, member) for role in ("trial", "shadow") for member in (True, False)
    }
    again = audit.main(argv)
    assert "(8 finished fits found there)" in again
    assert len(checkpoint.read_text().splitlines()) == 8


def test_lira_scores_follow_the_shadows_direction_and_floor_a_zero_spread(benchmark_script):
    audit = benchmark_script("privacy_audit")
    # the canary lowers the statistic: members (low s) must still score higher
    scores = audit.lira_scores(np.array([-1.0, 1.0]), np.array([-1.1, -0.9]), np.array([0.9, 1.1]))
    assert scores[0] > 0 > scores[1]
    assert scores[0] == pytest.approx(2 * 1.0 / 0.02, rel=1e-12)  # (m1 - m0)(s - mid) / sd^2
    # every shadow alike (the fit a function of the seed): any difference names a member
    scores = audit.lira_scores(
        np.array([5.0, 5.0 + 1e-6]), np.array([5.0 + 1e-6] * 3), np.array([5.0] * 3)
    )
    assert scores[1] > 0 > scores[0]


def test_held_out_bound_chooses_on_even_trials_and_counts_odd_ones(benchmark_script):
    audit = benchmark_script("privacy_audit")
    members, nonmembers = np.arange(40) + 100.0, np.arange(40.0)
    found = audit.held_out_bound(members, nonmembers)
    assert (found.n_members, found.n_nonmembers) == (20, 20)
    u = 1 - 0.025 ** (1 / 20)
    assert found.epsilon == pytest.approx(math.log((1 - audit.DELTA - u) / u), rel=1e-10)
    assert audit.held_out_bound(members[:1], nonmembers[:1]) is None
