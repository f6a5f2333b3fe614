"""FedGMM synthetic data: shapes, determinism, the generative spec, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn.linear_model import LogisticRegression

from fednovelty.datasets.synthetic import FederatedSplit, make_fedgmm_synthetic

D = 32
VAR = D**-0.5  # per-coordinate variance 1 / sqrt(d)


@pytest.fixture(scope="module")
def gaussian():
    return make_fedgmm_synthetic(30, random_state=0)


@pytest.fixture(scope="module")
def large():
    return make_fedgmm_synthetic(300, random_state=1)


def _fields(data: FederatedSplit):
    return [getattr(data, name) for name in FederatedSplit.__dataclass_fields__]


def _residuals(data: FederatedSplit) -> np.ndarray:
    return data.X_train - data.means[data.components_train]


def test_shapes_and_dtypes(gaussian):
    d = gaussian
    n_train, n_test = d.X_train.shape[0], d.X_test.shape[0]
    assert d.X_train.shape == (n_train, D) and d.X_test.shape == (n_test, D)
    assert d.X_train.dtype == d.X_test.dtype == np.float64
    for arr, n in [
        (d.y_train, n_train),
        (d.groups_train, n_train),
        (d.components_train, n_train),
        (d.y_test, n_test),
        (d.groups_test, n_test),
        (d.components_test, n_test),
    ]:
        assert arr.shape == (n,) and arr.dtype == np.int64
    assert d.client_weights.shape == (30, 3)
    np.testing.assert_allclose(d.client_weights.sum(axis=1), 1.0)
    assert d.means.shape == d.directions.shape == (3, D)
    assert np.all(np.abs(d.means) <= 1.0)
    for groups in (d.groups_train, d.groups_test):
        assert np.all(np.diff(groups) >= 0)
        np.testing.assert_array_equal(np.unique(groups), np.arange(30))
    assert set(np.unique(d.components_train)) <= {0, 1, 2}
    assert np.isfinite(d.X_train).all() and np.isfinite(d.X_test).all()


def test_other_sizes_follow_arguments():
    d = make_fedgmm_synthetic(4, n_components=5, n_features=7, random_state=3)
    assert d.X_train.shape[1] == d.X_test.shape[1] == 7
    assert d.client_weights.shape == (4, 5) and d.means.shape == (5, 7)


def test_client_sizes_and_test_fraction(gaussian):
    sizes = np.bincount(gaussian.groups_train)
    assert sizes.min() >= 100 and sizes.max() <= 1000
    np.testing.assert_array_equal(
        np.bincount(gaussian.groups_test), np.floor(0.25 * sizes + 0.5).astype(int)
    )
    small = make_fedgmm_synthetic(30, test_fraction=0.1, random_state=0)
    np.testing.assert_array_equal(np.bincount(small.groups_train), sizes)
    np.testing.assert_array_equal(
        np.bincount(small.groups_test), np.floor(0.1 * sizes + 0.5).astype(int)
    )


def test_deterministic_per_seed_and_different_across_seeds(gaussian):
    again = make_fedgmm_synthetic(30, random_state=0)
    for a, b in zip(_fields(gaussian), _fields(again), strict=True):
        np.testing.assert_array_equal(a, b)
    other = make_fedgmm_synthetic(30, random_state=2)
    assert not np.array_equal(gaussian.means, other.means)
    assert gaussian.X_train.shape != other.X_train.shape or not np.array_equal(
        gaussian.X_train, other.X_train
    )
    g1 = make_fedgmm_synthetic(5, random_state=np.random.default_rng(7))
    g2 = make_fedgmm_synthetic(5, random_state=np.random.default_rng(7))
    np.testing.assert_array_equal(g1.X_test, g2.X_test)


def test_global_numpy_state_untouched():
    # reads (never sets) the legacy global state, which must not move
    before = np.random.get_state()[1].copy()  # noqa: NPY002
    make_fedgmm_synthetic(3, random_state=None)
    make_fedgmm_synthetic(3, random_state=5)
    np.testing.assert_array_equal(np.random.get_state()[1], before)  # noqa: NPY002


def test_labels_binary_and_balanced(gaussian):
    for y in (gaussian.y_train, gaussian.y_test):
        assert set(np.unique(y)) == {0, 1}
        assert 0.3 < y.mean() < 0.7


def test_labelling_rule_holds_exactly(gaussian):
    d = gaussian
    for X, y, z in [
        (d.X_train, d.y_train, d.components_train),
        (d.X_test, d.y_test, d.components_test),
    ]:
        margin = np.einsum("ij,ij->i", X - d.means[z], d.directions[z])
        np.testing.assert_array_equal(y, (margin > 0).astype(np.int64))


def test_directions_point_at_another_component(gaussian):
    d = gaussian
    for m in range(3):
        others = [d.means[j] - d.means[m] for j in range(3) if j != m]
        assert any(np.allclose(d.directions[m], s * v) for v in others for s in (-1.0, 1.0))


def test_gaussian_moments_match_spec(large):
    r = _residuals(large)
    for m in range(3):
        rows = r[large.components_train == m]
        assert rows.shape[0] > 5000
        np.testing.assert_allclose(rows.mean(axis=0), 0.0, atol=0.02)
        np.testing.assert_allclose(rows.var(axis=0), VAR, rtol=0.1)
        cov = np.cov(rows, rowvar=False)
        np.testing.assert_allclose(cov - np.diag(np.diag(cov)), 0.0, atol=0.02)
    assert abs(stats.kurtosis(r.ravel())) < 0.1


def test_client_proportions_track_weights(gaussian):
    d = gaussian
    counts = np.zeros_like(d.client_weights)
    np.add.at(counts, (d.groups_train, d.components_train), 1)
    props = counts / counts.sum(axis=1, keepdims=True)
    diff = np.abs(props - d.client_weights)
    assert diff.mean() < 0.04 and diff.max() < 0.25
    # alpha = 0.4 is skewed: many clients are dominated by one component
    assert np.median(d.client_weights.max(axis=1)) > 0.6


def test_smaller_alpha_more_skewed():
    def dominance(alpha):
        w = make_fedgmm_synthetic(200, alpha=alpha, random_state=0).client_weights
        return w.max(axis=1).mean()

    assert dominance(0.1) > dominance(0.4) > dominance(10.0)


def _train_accuracy(X, y):
    return LogisticRegression(max_iter=1000).fit(X, y).score(X, y)


def test_linear_within_component_not_globally(gaussian):
    d = gaussian
    for m in range(3):
        rows = d.components_train == m
        assert _train_accuracy(d.X_train[rows], d.y_train[rows]) > 0.95
    assert _train_accuracy(d.X_train, d.y_train) < 0.85


@pytest.mark.parametrize("distribution", ["laplace", "beta"])
def test_setting1_variants(distribution, gaussian):
    d = make_fedgmm_synthetic(30, distribution=distribution, random_state=0)
    # same seed: same clients, components and labelling geometry; only the noise differs
    for name in ("groups_train", "groups_test", "components_train", "means", "directions"):
        np.testing.assert_array_equal(getattr(d, name), getattr(gaussian, name))
    assert not np.array_equal(d.X_train, gaussian.X_train)
    assert d.X_train.dtype == np.float64 and d.y_train.dtype == np.int64
    r = _residuals(d)
    np.testing.assert_allclose(r.mean(), 0.0, atol=0.01)
    np.testing.assert_allclose(r.var(), VAR, rtol=0.05)
    assert 0.3 < d.y_train.mean() < 0.7
    margin = np.einsum("ij,ij->i", r, d.directions[d.components_train])
    np.testing.assert_array_equal(d.y_train, (margin > 0).astype(np.int64))
    for m in range(3):
        rows = d.components_train == m
        assert _train_accuracy(d.X_train[rows], d.y_train[rows]) > 0.95


def test_laplace_is_heavy_tailed():
    r = _residuals(make_fedgmm_synthetic(30, distribution="laplace", random_state=0))
    assert 2.5 < stats.kurtosis(r.ravel()) < 3.5  # Laplace excess kurtosis is 3


def test_beta_is_bounded_and_skewed(gaussian):
    d = make_fedgmm_synthetic(30, distribution="beta", random_state=0)
    r, rg = _residuals(d), _residuals(gaussian)

    def mean_abs_skew(res, comps):
        return np.mean([np.abs(stats.skew(res[comps == m], axis=0)).mean() for m in range(3)])

    assert mean_abs_skew(r, d.components_train) > 3 * mean_abs_skew(rg, gaussian.components_train)
    # Beta(a, b) with a, b in [1, 5] is light-tailed (excess kurtosis < 0) and bounded: the
    # standardised draw lies within sqrt(max(a, b) (a + b + 1) / min(a, b)) <= sqrt(35) std.
    assert stats.kurtosis(r.ravel()) < -0.2
    assert np.abs(r).max() <= np.sqrt(35.0) * np.sqrt(VAR)


@pytest.mark.parametrize("other", ["laplace", "beta"])
def test_setting2_last_clients_differ(other, gaussian):
    d = make_fedgmm_synthetic(30, n_other_clients=10, other_distribution=other, random_state=0)
    for name in ("groups_train", "components_train", "means", "directions", "client_weights"):
        np.testing.assert_array_equal(getattr(d, name), getattr(gaussian, name))
    first = d.groups_train < 20
    np.testing.assert_array_equal(d.X_train[first], gaussian.X_train[first])
    assert not np.array_equal(d.X_train[~first], gaussian.X_train[~first])
    r = _residuals(d)
    if other == "laplace":
        assert stats.kurtosis(r[~first].ravel()) > 2.0
        assert abs(stats.kurtosis(r[first].ravel())) < 0.3
    else:
        z = d.components_train
        skew_other = np.abs(stats.skew(r[~first & (z == 0)], axis=0)).mean()
        skew_gauss = np.abs(stats.skew(r[first & (z == 0)], axis=0)).mean()
        assert skew_other > 2 * skew_gauss


def test_all_clients_other():
    a = make_fedgmm_synthetic(5, n_other_clients=5, other_distribution="laplace", random_state=4)
    b = make_fedgmm_synthetic(5, distribution="laplace", random_state=4)
    np.testing.assert_array_equal(a.X_train, b.X_train)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_clients": 0}, "n_clients"),
        ({"n_clients": 2.5}, "n_clients"),
        ({"n_components": 1}, "n_components"),
        ({"n_features": 0}, "n_features"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": -1.0}, "alpha"),
        ({"alpha": float("inf")}, "alpha"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"test_fraction": "0.2"}, "test_fraction"),
        ({"distribution": "poisson"}, "distribution"),
        ({"n_other_clients": -1}, "n_other_clients"),
        ({"n_other_clients": 31, "other_distribution": "beta"}, "n_other_clients"),
        ({"n_other_clients": 3}, "other_distribution"),
        ({"n_other_clients": 3, "other_distribution": "cauchy"}, "other_distribution"),
        ({"other_distribution": "cauchy"}, "other_distribution"),
        ({"random_state": -1}, "random_state"),
        ({"random_state": "seed"}, "random_state"),
    ],
)
def test_argument_errors(kwargs, name):
    args = {"n_clients": 30, **kwargs}
    with pytest.raises(ValueError, match=name):
        make_fedgmm_synthetic(args.pop("n_clients"), **args)
