"""Partitioners: coverage, determinism, skew that follows alpha, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fednovelty.datasets.partition import (
    dirichlet_partition,
    groups_from_partition,
    iid_partition,
    kmeans_groups,
)

GROUPS = np.repeat(np.arange(10), 100)  # 10 balanced classes, 1000 rows


def _assert_exact_cover(parts, n):
    allrows = np.concatenate(parts)
    assert allrows.dtype == np.int64
    np.testing.assert_array_equal(np.sort(allrows), np.arange(n))
    for p in parts:
        assert np.all(np.diff(p) > 0)  # sorted, no repeats


def _mean_max_share(parts, groups):
    shares = [np.bincount(groups[p]).max() / p.size for p in parts if p.size]
    return float(np.mean(shares))


@pytest.mark.parametrize("alpha", [0.05, 0.5, 5.0, 1000.0])
@pytest.mark.parametrize("n_clients", [1, 3, 20])
def test_dirichlet_uses_every_row_once(alpha, n_clients):
    parts = dirichlet_partition(GROUPS, n_clients, alpha, random_state=1)
    assert len(parts) == n_clients
    _assert_exact_cover(parts, GROUPS.size)


def test_dirichlet_any_labels():
    labels = np.array(["b", "a", "b", "c", "a", "c", "c"])
    parts = dirichlet_partition(labels, 2, 1.0, random_state=0)
    _assert_exact_cover(parts, labels.size)


def test_dirichlet_deterministic_per_seed():
    a = dirichlet_partition(GROUPS, 5, 0.3, random_state=42)
    b = dirichlet_partition(GROUPS, 5, 0.3, random_state=42)
    c = dirichlet_partition(GROUPS, 5, 0.3, random_state=43)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    g1 = dirichlet_partition(GROUPS, 5, 0.3, random_state=np.random.default_rng(7))
    g2 = dirichlet_partition(GROUPS, 5, 0.3, random_state=np.random.default_rng(7))
    assert all(np.array_equal(x, y) for x, y in zip(g1, g2, strict=True))


def test_smaller_alpha_is_more_heterogeneous():
    def skew(alpha):
        return np.mean(
            [
                _mean_max_share(dirichlet_partition(GROUPS, 10, alpha, random_state=s), GROUPS)
                for s in range(10)
            ]
        )

    skews = [skew(a) for a in (0.05, 0.5, 5.0, 500.0)]
    assert skews == sorted(skews, reverse=True)
    assert skews[0] > 0.6  # a client holds few classes, one dominant
    assert skews[-1] < 0.2  # close to the IID value 0.1


def test_dirichlet_min_size():
    for seed in range(5):
        parts = dirichlet_partition(GROUPS, 10, 0.1, random_state=seed, min_size=20)
        assert min(p.size for p in parts) >= 20
        _assert_exact_cover(parts, GROUPS.size)


def test_dirichlet_min_size_unreachable():
    with pytest.raises(ValueError, match=r"min_size=400 for each of n_clients=3 needs 1200 rows"):
        dirichlet_partition(GROUPS, 3, 1.0, min_size=400)
    with pytest.raises(ValueError, match=r"could not give every client min_size=5 rows.*lower"):
        dirichlet_partition(np.zeros(10), 2, 1e-4, random_state=0, min_size=5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0.0}, r"alpha must be a finite number > 0 .* got 0.0"),
        ({"alpha": -1.0}, r"alpha must be a finite number > 0"),
        ({"alpha": np.inf}, r"alpha must be a finite number > 0 .*iid_partition"),
        ({"alpha": "1"}, r"alpha must be a finite number"),
        ({"n_clients": 0}, r"n_clients must be an int >= 1; got 0"),
        ({"n_clients": 2.5}, r"n_clients must be an int >= 1; got 2.5"),
        ({"min_size": -1}, r"min_size must be an int >= 0; got -1"),
        ({"random_state": -3}, r"random_state must be None, a non-negative int or a numpy"),
        ({"random_state": np.random.RandomState(0)}, r"random_state must be None"),
        ({"groups": np.zeros((4, 2))}, r"groups must be a non-empty 1-D array"),
        ({"groups": []}, r"groups must be a non-empty 1-D array"),
    ],
)
def test_dirichlet_errors(kwargs, message):
    args = {"groups": GROUPS, "n_clients": 4, "alpha": 1.0} | kwargs
    with pytest.raises(ValueError, match=message):
        dirichlet_partition(**args)


def test_iid_partition():
    parts = iid_partition(103, 10, random_state=0)
    _assert_exact_cover(parts, 103)
    assert sorted(p.size for p in parts) == [10] * 7 + [11] * 3
    again = iid_partition(103, 10, random_state=0)
    assert all(np.array_equal(x, y) for x, y in zip(parts, again, strict=True))
    assert _mean_max_share(iid_partition(1000, 10, random_state=0), GROUPS) < 0.25


def test_iid_errors():
    with pytest.raises(ValueError, match=r"n_clients=5 exceeds n_samples=3"):
        iid_partition(3, 5)
    with pytest.raises(ValueError, match=r"n_samples must be an int >= 1; got 0"):
        iid_partition(0, 1)
    with pytest.raises(ValueError, match=r"n_clients must be an int >= 1; got True"):
        iid_partition(10, True)


def test_kmeans_groups_recovers_blobs_and_is_deterministic():
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [20.0, 0.0], [0.0, 20.0]])
    truth = np.repeat(np.arange(3), 50)
    X = centers[truth] + rng.normal(size=(150, 2))
    labels = kmeans_groups(X, 3, random_state=0)
    assert labels.dtype == np.int64 and labels.shape == (150,)
    assert adjusted_rand_score(truth, labels) == 1.0
    np.testing.assert_array_equal(labels, kmeans_groups(X, 3, random_state=0))
    from_gen = kmeans_groups(X, 3, random_state=np.random.default_rng(1))
    assert adjusted_rand_score(truth, from_gen) == 1.0
    # feeds straight into dirichlet_partition
    _assert_exact_cover(dirichlet_partition(labels, 4, 0.5, random_state=0), 150)


def test_kmeans_groups_errors():
    with pytest.raises(ValueError, match=r"X must be a non-empty 2-D array"):
        kmeans_groups(np.ones(5), 2)
    with pytest.raises(ValueError, match=r"X contains NaN"):
        kmeans_groups([[0.0], [np.nan]], 1)
    with pytest.raises(ValueError, match=r"n_groups=4 exceeds the number of rows in X \(3\)"):
        kmeans_groups(np.ones((3, 2)), 4)
    with pytest.raises(ValueError, match=r"n_groups must be an int >= 1"):
        kmeans_groups(np.ones((3, 2)), 0)


def test_groups_from_partition_roundtrip():
    parts = dirichlet_partition(GROUPS, 7, 0.2, random_state=3)
    client_id = groups_from_partition(parts, GROUPS.size)
    assert client_id.dtype == np.int64 and client_id.shape == GROUPS.shape
    for c, p in enumerate(parts):
        np.testing.assert_array_equal(np.flatnonzero(client_id == c), p)
    # empty clients (and plain lists) are fine
    np.testing.assert_array_equal(groups_from_partition([[], [1, 0], [2]], 3), [1, 1, 2])


def test_groups_from_partition_errors():
    with pytest.raises(ValueError, match=r"row 1 is in more than one client \(clients \[0, 1\]\)"):
        groups_from_partition([np.array([0, 1]), np.array([1, 2])], 3)
    with pytest.raises(ValueError, match=r"row 0 is in more than one client \(clients \[0, 0\]\)"):
        groups_from_partition([np.array([0, 0, 1])], 2)
    with pytest.raises(ValueError, match=r"2 rows are in no client \(first: \[1, 3\]\)"):
        groups_from_partition([np.array([0, 2])], 4)
    with pytest.raises(ValueError, match=r"parts\[1\] must be a 1-D array of integer row indices"):
        groups_from_partition([np.array([0]), np.array([5])], 2)
    with pytest.raises(ValueError, match=r"parts\[0\] must be .* dtype float64"):
        groups_from_partition([np.array([0.0, 1.0])], 2)
