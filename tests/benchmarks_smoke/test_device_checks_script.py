"""Smoke tests of ``benchmarks/device_checks.py`` (``--quick`` on the CPU) and the plan's
arithmetic in ``benchmarks/device_plan.py``: the FedGMM rounds continue from a checkpoint
folder across commands, a budget stops them, the paper-table scripts run one call per unit
and are kept, every figure carries its device, date and commit."""

import json
import re
import warnings

import numpy as np
import pytest
import torch


def quick(script, tmp_path, *extra):
    argv = ["--quick", "--device", "cpu", "--checkpoint", str(tmp_path), "--commit", "abc1234"]
    return script.main([*argv, *extra])


def femnist_rows(report: str) -> list[list[str]]:
    """The FedGMM table's rows (one per command), as cells."""
    rows = [line for line in report.splitlines() if re.match(r"\| \d+ \| ", line)]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_quick_rounds_continue_from_the_checkpoint(benchmark_script, tmp_path):
    script = benchmark_script("device_checks")
    first = quick(script, tmp_path, "--part", "lane", "femnist", "--max-rounds", "2")
    assert "skipped (--quick)" in first
    assert "stopped: --max-rounds 2 rounds run in this command" in first
    progress = json.loads((tmp_path / "progress.json").read_text())["femnist"]
    assert progress["done"] == 2 and progress["model"] == "femnist_fedgmm.r002.safetensors"
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["femnist_fedgmm.r002.safetensors"]

    second = quick(script, tmp_path, "--part", "femnist")
    assert "stopped: target reached: 4 of 4 rounds" in second
    rows = femnist_rows(second)
    assert [row[2] for row in rows] == ["1-2", "3-4"]  # the second command began at round 3
    for row in rows:
        assert row[1].startswith("cpu, ") and row[1].endswith("commit abc1234")
        assert float(row[3]) > 0 and 0 <= float(row[6]) <= 100
    assert [p.name for p in tmp_path.glob("*.safetensors")] == ["femnist_fedgmm.r004.safetensors"]

    # the plan to 200 rounds is the arithmetic of the second command's figures
    plan = next(line for line in second.splitlines() if line.startswith("- 200 rounds' GPU"))
    numbers = re.match(
        r"- 200 rounds' GPU time: (\S+) \+ 199 x (\S+) \+ (\d+) x (\S+) = (\d+) s", plan
    ).groups()
    first_fixed, per, later, fixed, total = map(float, numbers)
    # each figure is printed rounded: seconds to 0.5, the round's to 0.005 (x 199)
    printed = 0.5 + 199 * 0.005 + later * 0.5 + 0.5
    assert abs(first_fixed + 199 * per + later * fixed - total) <= printed + 1e-9 * total


def test_a_tiny_budget_stops_after_the_first_round(benchmark_script, tmp_path):
    script = benchmark_script("device_checks")
    report = quick(script, tmp_path, "--part", "femnist", "--budget-s", "1")
    assert "rounds 1-1 (1 round(s))" in report
    assert "stopped: budget: the next round" in report
    assert "the next command continues from round 1" in report
    assert json.loads((tmp_path / "progress.json").read_text())["femnist"]["done"] == 1


@pytest.mark.parametrize(
    ("part", "unit", "kept"),
    [("fedcam", "mnist cluster-dir K=2 seed 0", "records"), ("pfedem", "1 cycles seed 0", "text")],
)
def test_quick_paper_script_runs_each_call_once(benchmark_script, tmp_path, part, unit, kept):
    script = benchmark_script("device_checks")
    report = quick(script, tmp_path, "--part", part)
    assert "- stopped: all 1 calls done" in report
    assert f"| {unit} | 3 | " in report and "| cpu, " in report
    progress = json.loads((tmp_path / "progress.json").read_text())[part]
    record = progress["units"][unit]
    assert record["commit"] == "abc1234" and record["device"] == "cpu" and record["rounds"] == 3
    assert sorted(r for r, _ in progress["points"]["cpu"]) == [1, 2, 3]  # two timings, the call
    if kept == "records":  # fedcam_table1.json's records of the call's methods
        assert {r["method"] for r in record["kept"]} == {"FedAvg", "IFCA-CAM"}
    else:  # pfedem_femnist's report
        assert "Table I" in record["kept"]
    again = quick(script, tmp_path, "--part", part)  # kept: nothing runs again
    assert "- stopped: all 1 calls done" in again
    assert len(json.loads((tmp_path / "progress.json").read_text())[part]["points"]["cpu"]) == 3


def test_continued_rounds_start_from_the_fitted_gaussians(benchmark_script, monkeypatch):
    """The algorithm a continuation builds starts from the fitted precisions (the inverse of
    the fitted covariances), not from their Cholesky factors."""
    script = benchmark_script("device_checks")
    common = benchmark_script("common")
    from fednovelty.detectors.joint_fedgmm import JointFedGMMDetector

    data = common.standardised(common.shifted_writers(8, 0))
    settings = script.femnist_settings(script.parse_args(["--quick", "--device", "cpu"]))
    model = script.make_model("FedGMM", settings, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one round does not converge
        model.fit(data.X_train, data.y_train, data.groups_train)
    seen = {}
    real = JointFedGMMDetector._algorithm

    def spy(self, width, seed, pca_components, **overrides):
        seen.update(overrides)
        return real(self, width, seed, pca_components, **overrides)

    monkeypatch.setattr(JointFedGMMDetector, "_algorithm", spy)
    expected = np.linalg.inv(model.covariances_)
    script.continue_rounds(model, data, 1)
    start = torch.as_tensor(seen["precisions_init"]).double().numpy()
    assert np.abs(start - expected).max() <= 1e-3 * np.abs(expected).max()
    assert "_algorithm" not in model.__dict__


def test_plan_arithmetic(benchmark_script):
    plan = benchmark_script("device_plan")
    times = plan.RoundTimes(
        2.5, chunk_overhead=5.0, chunk_rounds=10, fixed=40.0, first_fixed=70.0, lane=180.0
    )
    # a round costs 2.5 + 5 / 10 = 3 s; 30 s of each command are kept for its end; first
    # command: 1 + (540 - 30 - 180 - 70) // 3 = 87 rounds; later ones (540 - 30 - 40) // 3 =
    # 156 rounds: the 113 left take one more command
    assert plan.commands_for(times, 200, 0, 540.0) == (87, 2)
    assert plan.commands_for(times, 200, 87, 540.0) == (113, 1)
    assert plan.commands_for(times, 200, 200, 540.0) == (0, 0)
    assert plan.commands_for(times, 200, 0, 540.0, reserve=0.0) == (97, 2)
    lines = "\n".join(plan.plan_lines(times, budget=540.0))
    assert "rounds 1-87" in lines and "156 rounds each; 113 rounds left: 1 more" in lines
    # 70 + 199 x 3 + 1 x 40 = 707 s: over the 600 s target
    assert "70 + 199 x 3.00 + 1 x 40 = 707 s = 11.8 min: over" in lines
    assert plan.commands_for(plan.RoundTimes(600.0), 200, 0, 540.0) == (0, -1)


def test_cost_line_and_budget(benchmark_script):
    plan = benchmark_script("device_plan")
    cost = plan.fit_cost([(1, 10.0), (3, 14.0), (3, 16.0)])  # means 10 and 15: slope 2.5
    assert cost == plan.Cost(7.5, 2.5)
    assert cost.seconds(100) == 257.5 and cost.rounds_within(20.0) == 5
    assert plan.fit_cost([(4, 12.0)]) == plan.Cost(0.0, 3.0)  # one count: an upper bound
    assert plan.fit_cost([]) is None
    budget = plan.Budget(100.0)
    half = budget.share(2)
    assert 49 < half.left() <= 50 and half.fits(40) and not half.fits(60)
    assert budget.fits(90) and not budget.fits(110)


def test_device_checks_lane_line_counts_the_lane(benchmark_script):
    line = benchmark_script("device_checks").cuda_lane(300)
    assert "skipped" in line or "passed" in line


def test_the_femnist_part_trains_at_the_rate_asked_for(benchmark_script):
    """The paper's scale keeps the paper's stated rate (0.001); the GPU command runs at
    ``--femnist-lr``, 10**-1.5 unless told, and the rate is part of the checkpoint's
    signature (a run at another rate starts afresh)."""
    script = benchmark_script("device_checks")
    femnist = benchmark_script("fedgmm_femnist")
    assert femnist.PAPER_SCALE["learning_rate"] == 0.001
    default = script.femnist_settings(script.parse_args(["--device", "cpu"]))
    assert default.learning_rate == pytest.approx(10**-1.5, rel=1e-12)
    assert default.n_writers == 539 and default.learner == "cnn"
    asked = script.femnist_settings(script.parse_args(["--device", "cpu", "--femnist-lr", "0.001"]))
    assert asked.learning_rate == 0.001
    signature = script.settings_signature
    assert signature(default) != signature(asked)
