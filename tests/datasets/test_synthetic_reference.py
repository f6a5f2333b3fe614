"""The reference code's Table 2 data: Gaussian clients, then Beta clients with raw [0, 1] rows."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from fednovelty.datasets.synthetic_reference import make_fedgmm_reference_synthetic

D = 32


@pytest.fixture(scope="module")
def data():
    return make_fedgmm_reference_synthetic(30, 10, random_state=0)


def test_beta_clients_are_the_last_ones_and_draw_rows_in_the_unit_box(data):
    beta = data.groups_train >= 20
    assert beta.any() and (~beta).any()
    assert data.X_train[beta].min() >= 0.0 and data.X_train[beta].max() <= 1.0
    # Gaussian clients' rows reach outside [0, 1] (means in [-1, 1], sd d^(-1/4) ~ 0.42).
    assert data.X_train[~beta].min() < -1.0 and data.X_train[~beta].max() > 1.5


def test_gaussian_clients_follow_the_paper_generator(data):
    gaussian = data.groups_train < 20
    z = data.components_train[gaussian]
    residual = data.X_train[gaussian] - data.means[z]
    # Each coordinate N(0, 1/sqrt(d)): a KS test against the exact normal.
    scaled = residual.ravel() / D**-0.25
    assert stats.kstest(scaled, "norm").pvalue > 1e-3
    labels = (np.einsum("ij,ij->i", residual, data.directions[z]) > 0).astype(int)
    np.testing.assert_array_equal(labels, data.y_train[gaussian])


def test_beta_rows_are_beta_distributed_per_coordinate():
    data = make_fedgmm_reference_synthetic(12, 12, n_features=4, random_state=3)
    X, z = data.X_train, data.components_train
    for m in range(3):
        rows = X[z == m]
        if len(rows) < 200:
            continue
        for j in range(4):
            a, b, _, _ = stats.beta.fit(rows[:, j], floc=0, fscale=1)
            # Gamma(3) and Gamma(5) draws: shape parameters well inside (0, 30).
            assert 0 < a < 30 and 0 < b < 30
            assert stats.kstest(rows[:, j], "beta", args=(a, b)).pvalue > 1e-4


def test_sizes_follow_the_reference_rule_and_seed_fixes_everything(data):
    sizes = np.bincount(data.groups_train)
    assert sizes.min() >= 100 and sizes.max() <= 1000
    again = make_fedgmm_reference_synthetic(30, 10, random_state=0)
    np.testing.assert_array_equal(again.X_train, data.X_train)
    np.testing.assert_array_equal(again.y_test, data.y_test)
    other = make_fedgmm_reference_synthetic(30, 10, random_state=1)
    assert not np.array_equal(other.y_train[:50], data.y_train[:50])


def test_no_beta_clients_gives_gaussian_clients_only():
    data = make_fedgmm_reference_synthetic(5, 0, random_state=0)
    assert data.X_train.min() < -1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_clients": 3, "n_beta_clients": 4}, "n_beta_clients=4 exceeds n_clients=3"),
        ({"n_clients": 0}, "n_clients"),
        ({"n_clients": 3, "n_beta_clients": 0, "test_fraction": 1.5}, "test_fraction"),
        ({"n_clients": 3, "n_beta_clients": 1, "alpha": 0.0}, "alpha"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_fedgmm_reference_synthetic(**kwargs)
