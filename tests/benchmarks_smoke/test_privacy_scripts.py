"""Smoke tests of the privacy benchmarks (``dp_utility.py``, ``membership.py``,
``secure_sums.py``, ``dp_learners.py``): each quick run completes and prints its table."""


def test_dp_utility_quick_run_prints_private_and_reference_rows(benchmark_script, capsys, tmp_path):
    rows = tmp_path / "rows.csv"
    benchmark_script("dp_utility").main(["--quick", "--csv", str(rows)])
    out = capsys.readouterr().out
    table = out[out.index("d_auroc_worst") :]
    for label in ("inf ", "inf*", "central", "1.0", "private"):
        assert label in table
    assert "'spent': 0.99" in out  # the private fit spent (almost exactly) its budget
    assert len(rows.read_text().splitlines()) == 4  # header and three fits
    benchmark_script("dp_utility").main(["--quick", "--csv", str(rows)])  # resumes: no fit
    assert "'auroc'" not in capsys.readouterr().out
    assert len(rows.read_text().splitlines()) == 4


def test_membership_quick_run_prints_attacks_beside_bounds(benchmark_script, capsys):
    report = benchmark_script("membership").main(["--quick"])
    assert "GDP AUC bound" in report and "loss attack AUC" in report


def test_secure_sums_quick_run_prints_errors_within_their_bound(benchmark_script, tmp_path):
    report = benchmark_script("secure_sums").main(["--quick", "--out", str(tmp_path / "r.txt")])
    assert "bound" in report


def test_dp_learners_quick_run_prints_the_private_and_plain_joint_model(benchmark_script, tmp_path):
    benchmark_script("dp_learners").main(["--quick", "--out", str(tmp_path / "r.txt")])
    report = (tmp_path / "r.txt").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| 4.0 |")]
    assert len(rows) == 1 and "| inf |" in report
    spent = float(rows[0].split("|")[6])
    assert 3.9 < spent <= 4.0  # the private fit spent (almost exactly) its budget
