"""Partitioners: coverage, determinism, skew that follows alpha / k, and argument errors."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fednovelty.datasets.partition import (
    dirichlet_partition,
    groups_from_partition,
    iid_partition,
    kmeans_groups,
    partition_counts,
    quantity_partition,
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


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


# --- package layout: one module per scheme, old import paths kept -------------------------------


def test_package_exports_and_private_helpers():
    import fednovelty.datasets as ds
    from fednovelty.datasets.partition import _MAX_TRIES, _check_int, _rng
    from fednovelty.datasets.partition.dirichlet import dirichlet_partition as d
    from fednovelty.datasets.partition.groups import groups_from_partition as g
    from fednovelty.datasets.partition.groups import kmeans_groups as k
    from fednovelty.datasets.partition.iid import iid_partition as i
    from fednovelty.datasets.partition.quantity import quantity_partition as q

    assert (d, g, k, i, q) == (
        dirichlet_partition,
        groups_from_partition,
        kmeans_groups,
        iid_partition,
        quantity_partition,
    )
    assert ds.quantity_partition is quantity_partition
    assert ds.partition_counts is partition_counts
    assert _MAX_TRIES == 1000
    assert _check_int(3, "x", 1) == 3
    assert isinstance(_rng(0), np.random.Generator)
    with pytest.raises(ValueError, match=r"x must be an int >= 1; got 0"):
        _check_int(0, "x", 1)


# --- Dirichlet: alpha extremes, tiny groups ------------------------------------------------------


def test_dirichlet_alpha_001_gives_clients_one_class_each():
    # Dir(0.01): each class lands (almost) whole on one client; with 100 clients and 10 classes
    # most non-empty clients hold a single class.
    shares = []
    for seed in range(5):
        parts = dirichlet_partition(GROUPS, 100, 0.01, random_state=seed)
        _assert_exact_cover(parts, GROUPS.size)
        per_client = [np.bincount(GROUPS[p]).max() / p.size for p in parts if p.size]
        assert np.median(per_client) == 1.0
        shares.append(np.mean(per_client))
    assert np.mean(shares) > 0.85
    # with 10 clients, a class's largest holder has most of it
    counts, _ = partition_counts(dirichlet_partition(GROUPS, 10, 0.01, random_state=0), GROUPS)
    assert np.mean(counts.max(axis=0) / counts.sum(axis=0)) > 0.8


def test_dirichlet_alpha_1000_is_near_uniform():
    for seed in range(3):
        parts = dirichlet_partition(GROUPS, 10, 1000.0, random_state=seed)
        counts, _ = partition_counts(parts, GROUPS)
        assert _mean_max_share(parts, GROUPS) < 0.13  # IID value 0.1
        sizes = counts.sum(axis=1)
        assert sizes.min() >= 85 and sizes.max() <= 115  # 100 each if exactly uniform
        assert counts.min() >= 3 and counts.max() <= 17  # 10 rows per cell if exactly uniform


def test_dirichlet_group_with_fewer_rows_than_clients():
    labels = np.concatenate([np.repeat([0, 1], 50), [2, 2]])  # group 2 has 2 rows, 10 clients
    for alpha in (0.1, 1.0, 100.0):
        for seed in range(5):
            parts = dirichlet_partition(labels, 10, alpha, random_state=seed)
            _assert_exact_cover(parts, labels.size)
            counts, values = partition_counts(parts, labels)
            assert values.tolist() == [0, 1, 2]
            assert counts[:, 2].sum() == 2 and np.count_nonzero(counts[:, 2]) <= 2
    # a single row shared by many clients, with min_size=0
    parts = dirichlet_partition(["x"], 5, 1.0, random_state=0)
    assert sorted(p.size for p in parts) == [0, 0, 0, 0, 1]


def test_dirichlet_seed_types():
    a = dirichlet_partition(GROUPS, 5, 0.5, random_state=np.int64(11))
    assert _same(a, dirichlet_partition(GROUPS, 5, 0.5, random_state=11))
    rng = np.random.default_rng(0)
    first = dirichlet_partition(GROUPS, 5, 0.5, random_state=rng)
    second = dirichlet_partition(GROUPS, 5, 0.5, random_state=rng)  # the Generator advances
    assert not _same(first, second)


# --- IID -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_samples", "n_clients"), [(1, 1), (7, 7), (10, 3), (1000, 20), (999, 10)]
)
def test_iid_balanced_sizes(n_samples, n_clients):
    parts = iid_partition(n_samples, n_clients, random_state=5)
    assert len(parts) == n_clients
    _assert_exact_cover(parts, n_samples)
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n_samples


def test_iid_deterministic_per_seed():
    assert _same(iid_partition(500, 7, random_state=3), iid_partition(500, 7, random_state=3))
    assert not _same(iid_partition(500, 7, random_state=3), iid_partition(500, 7, random_state=4))
    g1 = iid_partition(500, 7, random_state=np.random.default_rng(9))
    g2 = iid_partition(500, 7, random_state=np.random.default_rng(9))
    assert _same(g1, g2)


# --- Quantity(k) ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_clients", "k"), [(1, 10), (5, 2), (10, 1), (10, 2), (20, 3), (7, 10)])
def test_quantity_cover_and_at_most_k_groups(n_clients, k):
    parts = quantity_partition(GROUPS, n_clients, k, random_state=0)
    assert len(parts) == n_clients
    _assert_exact_cover(parts, GROUPS.size)
    counts, _ = partition_counts(parts, GROUPS)
    # every group has >= n_clients rows here, so every holder gets some: exactly k groups each
    assert (np.count_nonzero(counts, axis=1) == k).all()
    # holders per group are level (differ by at most one), so client sizes are too
    holders = np.count_nonzero(counts, axis=0)
    assert holders.min() >= 1 and holders.max() - holders.min() <= 1
    for g in range(10):  # each group split evenly among its holders
        held = counts[:, g][counts[:, g] > 0]
        assert held.max() - held.min() <= 1


def test_quantity_sizes_balanced_when_slots_divide_evenly():
    parts = quantity_partition(GROUPS, 10, 2, random_state=1)
    assert [p.size for p in parts] == [100] * 10
    assert _mean_max_share(parts, GROUPS) == 0.5  # two classes, 50 rows each


def test_quantity_any_labels_and_k_one():
    labels = np.array(["cat", "dog", "cat", "emu", "dog", "emu", "cat"])
    parts = quantity_partition(labels, 3, 1, random_state=0)
    _assert_exact_cover(parts, labels.size)
    assert sorted(np.unique(labels[p]).tolist()[0] for p in parts) == ["cat", "dog", "emu"]
    assert all(np.unique(labels[p]).size == 1 for p in parts)


def test_quantity_deterministic_per_seed():
    a = quantity_partition(GROUPS, 8, 3, random_state=42)
    assert _same(a, quantity_partition(GROUPS, 8, 3, random_state=42))
    assert not _same(a, quantity_partition(GROUPS, 8, 3, random_state=43))
    g1 = quantity_partition(GROUPS, 8, 3, random_state=np.random.default_rng(7))
    g2 = quantity_partition(GROUPS, 8, 3, random_state=np.random.default_rng(7))
    assert _same(g1, g2)


def test_quantity_group_with_fewer_rows_than_holders():
    # group 2 has 2 rows but (k = n_groups) all 6 clients hold it: 4 of them get none of it
    labels = np.concatenate([np.repeat([0, 1], 30), [2, 2]])
    for seed in range(5):
        parts = quantity_partition(labels, 6, 3, random_state=seed)
        _assert_exact_cover(parts, labels.size)
        counts, _ = partition_counts(parts, labels)
        assert counts[:, 2].tolist().count(1) == 2 and counts[:, 2].tolist().count(0) == 4
        assert (counts[:, :2] == 5).all()
    # and with k < n_groups: clients end up with <= k groups, every row still used once
    labels = np.concatenate([np.repeat(np.arange(4), 25), [4]])
    parts = quantity_partition(labels, 12, 2, random_state=0)
    _assert_exact_cover(parts, labels.size)
    counts, _ = partition_counts(parts, labels)
    assert (np.count_nonzero(counts, axis=1) <= 2).all() and counts[:, 4].sum() == 1


def test_quantity_feeds_groups_from_partition():
    parts = quantity_partition(GROUPS, 6, 2, random_state=0)
    client_id = groups_from_partition(parts, GROUPS.size)
    for c, p in enumerate(parts):
        np.testing.assert_array_equal(np.flatnonzero(client_id == c), p)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"groups_per_client": 0}, r"groups_per_client must be an int >= 1; got 0"),
        ({"groups_per_client": 1.5}, r"groups_per_client must be an int >= 1; got 1.5"),
        ({"groups_per_client": 11}, r"groups_per_client=11 exceeds the number of distinct groups"),
        ({"n_clients": 4, "groups_per_client": 2}, r"n_clients=4 x groups_per_client=2 = 8 client"),
        ({"n_clients": 0}, r"n_clients must be an int >= 1; got 0"),
        ({"random_state": -1}, r"random_state must be None, a non-negative int"),
        ({"groups": np.zeros((3, 3))}, r"groups must be a non-empty 1-D array"),
        ({"groups": []}, r"groups must be a non-empty 1-D array"),
    ],
)
def test_quantity_errors(kwargs, message):
    args = {"groups": GROUPS, "n_clients": 10, "groups_per_client": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        quantity_partition(**args)


# --- partition_counts ----------------------------------------------------------------------------


def test_partition_counts():
    parts = dirichlet_partition(GROUPS, 6, 0.3, random_state=0)
    counts, values = partition_counts(parts, GROUPS)
    assert counts.dtype == np.int64 and counts.shape == (6, 10)
    np.testing.assert_array_equal(values, np.arange(10))
    assert counts.sum() == GROUPS.size
    np.testing.assert_array_equal(counts.sum(axis=1), [p.size for p in parts])
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(GROUPS))
    # subsets, empty clients and unheld groups are fine
    counts, values = partition_counts([[], [0, 2]], ["b", "a", "c"])
    assert counts.tolist() == [[0, 0, 0], [0, 1, 1]] and values.tolist() == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"parts\[0\] must be a 1-D array of integer row indices"):
        partition_counts([[0, 3]], [0, 1, 2])
    with pytest.raises(ValueError, match=r"groups must be a non-empty 1-D array"):
        partition_counts([[0]], [])
