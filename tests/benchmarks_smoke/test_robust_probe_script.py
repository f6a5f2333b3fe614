"""``benchmarks/robust_probe.py``: its copula features and one real run (the marginal map itself,
from ``fednovelty.mixture.copula``, is tested in ``tests/mixture/test_copula.py``)."""

import numpy as np
import pandas as pd
import pytest
import torch

from fednovelty.datasets.protocols import make_task
from fednovelty.detectors import FedGMMDetector
from fednovelty.evaluation.metrics import auroc
from fednovelty.mixture import MixtureParams


@pytest.fixture
def probe(benchmark_script):
    return benchmark_script("robust_probe")


def _one_d(weights, means, sds) -> MixtureParams:
    sds = torch.tensor(sds, dtype=torch.float64)
    return MixtureParams(
        torch.tensor(weights, dtype=torch.float64),
        torch.tensor(means, dtype=torch.float64).view(-1, 1),
        (1 / sds).view(-1, 1, 1),
        "full",
    )


def test_gaussian_marginal_is_the_identity_copula(probe):
    """One component: u is the z-score and the Jacobian term is -log sd per feature."""
    models = [_one_d([1.0], [3.0], [2.0]), None, _one_d([1.0], [-1.0], [0.5])]
    X = torch.tensor([[3.0, 7.0, -1.0], [5.0, 7.0, 0.0], [-9.0, 7.0, -3.5]], dtype=torch.float64)
    U, log_f, jacobian = probe.copula_features(models, X)
    np.testing.assert_allclose(U.numpy(), [[0.0, 0.0], [1.0, 2.0], [-6.0, -5.0]], atol=1e-9)
    np.testing.assert_allclose(jacobian.numpy(), -np.log(2.0) - np.log(0.5), atol=1e-9)
    assert log_f.shape == (3,)


def test_feature_bags_sizes_and_determinism(probe):
    bags = probe.feature_bags(9, seed=3)
    assert len(bags) == probe.N_BAGS
    for cols in bags:
        assert 4 <= len(cols) <= 8 and len(set(cols)) == len(cols)
        assert np.all(np.diff(cols) > 0) and cols.max() < 9
    assert all(
        np.array_equal(a, b) for a, b in zip(bags, probe.feature_bags(9, seed=3), strict=True)
    )
    assert [list(c) for c in probe.feature_bags(1, seed=0)] == [[0]] * probe.N_BAGS


def test_one_shot_copula_is_a_density(probe):
    """On 1-D rows the one-shot copula's log-density integrates to about 1."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.cat(
        [torch.randn(400, 1, generator=gen), 4 + 0.5 * torch.randn(200, 1, generator=gen)]
    )
    grid = torch.linspace(-8, 10, 4001, dtype=torch.float64).view(-1, 1)
    log_p = probe.one_shot_copula(rows.double(), grid, seed=0, prior_scale=4.0)
    mass = np.trapezoid(np.exp(log_p), grid.numpy().ravel())
    assert abs(mass - 1) < 0.02


def test_one_real_run(probe, tmp_path, capsys):
    df = probe.main(["--datasets", "45_wine", "--seeds", "0", "--out", str(tmp_path)])
    written = pd.read_csv(tmp_path / "robust_probe_outlier.csv")
    assert set(written["candidate"]) == {
        "dem",
        "fedgen",
        "dem-K-ens",
        "fedgen-K-ens",
        "dem-scale-ens",
        "marginals",
        "copula",
        "dem+marginals",
        "dem+copula",
        "fedgen+copula",
        "fedgen-union",
        "fedgen-copula",
        "fedgen+fedgen-copula",
        "dem-bag",
        "fedgen-bag",
    }
    assert written["auroc"].between(0, 1).all()
    # the 'dem' row is the scoreboard's DEM-kmeans without the privacy floor (the probe's
    # measurements predate it), computed here independently
    task = make_task(
        "45_wine", "outlier", n_clients=10, alpha=0.5, seed=0, max_train=10_000, max_test=10_000
    )
    detector = FedGMMDetector(10, mixture_weights="global", random_state=0, privacy_min_rows=1)
    expected = auroc(
        task.y_test,
        detector.fit(task.X_train, groups=task.groups_train).decision_function(task.X_test),
    )
    got = df.loc[df["candidate"] == "dem", "auroc"].item()
    assert got == pytest.approx(expected, abs=1e-12)
    assert "mean AUROC over 1 datasets" in capsys.readouterr().out
