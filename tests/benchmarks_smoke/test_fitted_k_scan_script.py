"""benchmarks/fitted_k_scan.py: one cell's row on a small set (80 rows over 10 clients, as
ADBench's Hepatitis) and a failure recorded as a result."""

import csv

import numpy as np
import pytest


@pytest.fixture(scope="module")
def scan(benchmark_script):
    return benchmark_script("fitted_k_scan")


@pytest.fixture
def data_dir(tmp_path):
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (67, 6)), rng.normal(3, 1, (13, 6))])
    y = np.r_[np.zeros(67), np.ones(13)].astype(int)
    (tmp_path / "adbench").mkdir()
    np.savez(tmp_path / "adbench" / "80_rows.npz", X=X, y=y)
    return tmp_path


def test_a_small_set_fits_fewer_components_and_the_row_says_so(scan, data_dir):
    row = scan.scan_cell("80_rows", "novelty", 0, data_dir, 10)
    assert "error" not in row
    rows = [int(r) for r in row["client_rows"].split()]
    assert len(rows) == 10 and sum(rows) == row["n_train"]
    assert 1 <= row["n_components_"] < 10 and row["effective_n_components_"] >= 1
    assert "FewerComponentsWarning" in row["warnings"].split()
    assert row["finite_scores"] is True


def test_the_csv_has_the_fields_and_a_failure_is_a_row(scan, data_dir, tmp_path):
    out = tmp_path / "scan.csv"
    scan.main(["--out", str(out), "--data-dir", str(data_dir), "--datasets", "nowhere",
               "--seeds", "0"])  # fmt: skip
    with open(out) as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == scan.FIELDS
    assert [r["protocol"] for r in rows] == ["novelty", "outlier"]
    assert all(r["error"].startswith("ValueError: unknown ADBench dataset") for r in rows)
