"""benchmarks/bench_app.py: the report's ratios and budget flags (the browser run itself is
exercised by tests/app/test_app_browser.py)."""

import pytest


@pytest.fixture(scope="module")
def bench(benchmark_script):
    return benchmark_script("bench_app")


def test_report_prints_median_max_and_ratio_to_budget(bench):
    text = bench.report({"first page": [1.0, 3.0, 2.0], "server up": [0.5]})
    first = next(line for line in text.splitlines() if line.startswith("first page"))
    assert first.split()[2:] == ["2.00", "3.00", "5", "0.40"]
    server = next(line for line in text.splitlines() if line.startswith("server up"))
    assert server.split()[-2:] == ["-", "-"]


def test_budgets_are_5s_first_page_and_30s_default_training(bench):
    assert bench.BUDGETS == {"first page": 5.0, "default training shown": 30.0}


def test_repeats_below_one_is_rejected_by_name(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--repeats", "0"])
    assert "--repeats must be >= 1" in capsys.readouterr().err
