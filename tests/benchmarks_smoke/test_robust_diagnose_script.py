"""``benchmarks/robust_diagnose.py``: the per-component table and one real run."""

import numpy as np
import pandas as pd
import pytest

from fednovelty.datasets.protocols import make_task
from fednovelty.detectors import FedGMMDetector


@pytest.fixture
def diag(benchmark_script):
    return benchmark_script("robust_diagnose")


def _two_clusters(seed=0):
    rng = np.random.default_rng(seed)
    inliers = rng.normal(0.0, 1.0, size=(300, 2))
    anomalies = rng.normal(8.0, 0.1, size=(20, 2))  # a tight group of their own
    X = np.vstack([inliers, anomalies])
    y = np.r_[np.zeros(300), np.ones(20)]
    return X, y, rng.integers(0, 3, size=len(X))


@pytest.mark.parametrize("covariance_type", ["full", "tied"])
def test_component_table_accounts_for_every_row(diag, covariance_type):
    X, y, groups = _two_clusters()
    detector = FedGMMDetector(
        2, mixture_weights="global", covariance_type=covariance_type, random_state=0
    ).fit(X, groups=groups)
    table = diag.component_table(detector, X, y)
    assert list(table.columns) == [
        "component", "weight", "rows", "anomalies", "anomaly_share",
        "share_of_anomalies", "log_det_cov",
    ]  # fmt: skip
    assert table["rows"].sum() == len(X) and table["anomalies"].sum() == 20
    assert table["share_of_anomalies"].sum() == pytest.approx(1.0)
    assert table["weight"].is_monotonic_decreasing
    # the tight far group is a component of its own, holding every anomaly
    own = table[table["anomalies"] > 0]
    assert len(own) == 1 and own["anomaly_share"].item() == 1.0
    assert own["weight"].item() == pytest.approx(20 / 320, abs=0.01)


def test_empty_component_has_nan_share(diag):
    X, y, groups = _two_clusters()
    detector = FedGMMDetector(2, mixture_weights="global", random_state=0).fit(X, groups=groups)
    table = diag.component_table(detector, X[:300], y[:300])  # only the inliers
    assert table["anomalies"].sum() == 0
    assert table.loc[table["rows"] == 0, "anomaly_share"].isna().all()


def test_one_real_run(diag, tmp_path, capsys):
    diag.main(["--datasets", "45_wine", "--seed", "0", "--out", str(tmp_path), "--plain"])
    written = pd.read_csv(tmp_path / "robust_diagnose_DEM-kmeans-plain_outlier_0.csv")
    task = make_task("45_wine", "outlier", n_clients=10, alpha=0.5, seed=0, max_train=10_000)
    assert len(written) == 10 and written["rows"].sum() == len(task.X_train)
    assert written["share_of_anomalies"].sum() == pytest.approx(1.0)
    assert 0 < written["train_anomaly_share"].iloc[0] < 0.2
    assert "45_wine" in capsys.readouterr().out
