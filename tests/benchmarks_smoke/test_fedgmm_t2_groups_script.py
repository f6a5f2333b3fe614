"""Smoke test of ``benchmarks/fedgmm_t2_groups.py``: the quick run (8 clients, 2 of them Beta
clients, 5 rounds) writes every section, and its numbers agree with the data."""

import re

import numpy as np

from fednovelty.datasets.synthetic_reference import make_fedgmm_reference_synthetic


def table_row(report: str, first_cells: str) -> list[str]:
    """The cells of the report's table row that starts with ``| first_cells |``."""
    line = next(x for x in report.splitlines() if x.startswith(f"| {first_cells} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_quick_run_reports_each_group_and_beta_client(benchmark_script, tmp_path):
    script = benchmark_script("fedgmm_t2_groups")
    out = tmp_path / "groups.md"
    report = script.main(["--quick", "--seed", "0", "--out", str(out)])
    assert out.read_text() == report
    assert "## Client groups: 8 clients (2 Beta clients), 5 rounds, seed 0" in report
    for n in range(1, 6):
        assert f"\n### {n}. " in report
    # the generator's own rows, counted by hand: clients 6 and 7 are the Beta clients
    data = make_fedgmm_reference_synthetic(8, 2, random_state=0)
    beta_rows = int((data.groups_train >= 6).sum())
    gaussian = table_row(report, "Gaussian clients")
    beta = table_row(report, "Beta clients")
    assert beta[1].startswith(f"{beta_rows} (")
    assert gaussian[1].startswith(f"{len(data.groups_train) - beta_rows} (")
    for row in (gaussian, beta):  # responsibilities: each group's mass sums to 100 %
        assert abs(sum(float(v) for v in row[2:5]) - 100.0) < 0.2
    y6 = data.y_test[data.groups_test == 6]
    majority = 100.0 * np.bincount(y6).max() / len(y6)
    client = table_row(report, "6")
    assert client[1] == str(int((data.groups_train == 6).sum()))
    assert abs(float(client[3]) - majority) < 0.051
    accuracies = [float(v) for v in client[4:8]]  # FedGMM, FedEM, Local, best learner
    assert all(0.0 <= v <= 100.0 for v in accuracies)
    assert table_row(report, "7")[0] == "7"
    assert re.search(r"\| all Beta training rows, one rule \| \d+\.\d \|", report)


def test_mostly_on_counts_the_fewest_gaussians_holding_the_share(benchmark_script):
    mostly_on = benchmark_script("fedgmm_t2_groups").mostly_on
    assert mostly_on(np.array([0.05, 0.9, 0.05])) == 1
    assert mostly_on(np.array([0.5, 0.05, 0.45])) == 2
    assert mostly_on(np.array([0.4, 0.3, 0.3])) == 3
