"""Smoke test of ``benchmarks/image_members.py`` (random-start ensembles of FedMFA against
pooled KNN on images): the two combination rules by hand, the quick FEMNIST run's table,
and the CV part's cells kept and resumed."""

import json

import numpy as np
import pytest


def test_prefix_scores_are_minus_the_mean_log_density_or_the_log_mean_density(
    benchmark_script,
):
    module = benchmark_script("image_members")
    log_p = np.log(np.array([[0.2, 0.5], [0.4, 0.1], [9.0, 9.0]]))
    np.testing.assert_allclose(
        module.prefix_scores(log_p, 2, "log-mean"), -np.log([np.sqrt(0.08), np.sqrt(0.05)])
    )
    np.testing.assert_allclose(module.prefix_scores(log_p, 2, "union"), -np.log([0.3, 0.3]))
    np.testing.assert_allclose(module.prefix_scores(log_p, 1, "union"), -log_p[0])


def test_quick_femnist_run_reports_every_member_count(benchmark_script):
    module = benchmark_script("image_members")
    report = module.main(["--quick"])
    for m in (1, 2, 3):
        assert f"| log-mean, {m} member" in report and f"| union, {m} member" in report
    assert "| KNN (PyOD, pooled) |" in report
    costs = report.split("Cost per member count")[1]
    rounds = [
        int(line.split("|")[2])
        for line in costs.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip().isdigit()
    ]
    assert len(rounds) == 3 and rounds[0] < rounds[1] < rounds[2]


def test_cv_part_keeps_each_cell_and_resumes(benchmark_script, tmp_path, monkeypatch):
    module = benchmark_script("image_members")
    cells = tmp_path / "cells.jsonl"
    argv = ["--part", "cv", "--quick", "--cells", str(cells)]
    first = module.main(argv)
    kept = [json.loads(line) for line in cells.read_text().splitlines()]
    assert len(kept) == 2 and all(c["seed"] == 0 for c in kept)
    for cell in kept:
        assert 0.5 < cell["KNN"] <= 1.0
        assert {"log-mean 1", "log-mean 2", "log-mean 3"} <= set(cell) or "refused" in cell

    def no_fit(*args, **kwargs):  # a resumed run fits nothing
        raise AssertionError("refitted a kept cell")

    monkeypatch.setattr(module, "cv_cell", no_fit)
    again = module.main(argv)
    assert again.split("Per set")[1] == first.split("Per set")[1]
    assert cells.read_text().count("\n") == 2


def test_members_below_one_is_a_usage_error(benchmark_script, capsys):
    module = benchmark_script("image_members")
    with pytest.raises(SystemExit):
        module.main(["--members", "0"])
    assert "--members and --components must be >= 1" in capsys.readouterr().err
