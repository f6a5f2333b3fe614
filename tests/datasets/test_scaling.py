"""Federated min-max scaling: merged client statistics equal the pooled ones."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fednovelty.datasets.partition import dirichlet_partition
from fednovelty.datasets.scaling import MinMaxScaling, client_minmax, merge_minmax


def _data(seed=0, n=200, d=4):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) * [1.0, 10.0, 0.1, 5.0] + [0.0, 3.0, -2.0, 100.0]


@pytest.mark.parametrize("seed", range(3))
def test_merge_equals_pooled(seed):
    X = _data(seed)
    parts = dirichlet_partition(np.arange(len(X)) % 5, 6, 0.3, random_state=seed, min_size=1)
    lo, hi = merge_minmax(client_minmax(X[p]) for p in parts)
    np.testing.assert_array_equal(lo, X.min(axis=0))
    np.testing.assert_array_equal(hi, X.max(axis=0))
    # order of clients does not matter
    lo2, hi2 = merge_minmax([client_minmax(X[p]) for p in parts][::-1])
    np.testing.assert_array_equal(lo, lo2)
    np.testing.assert_array_equal(hi, hi2)


def test_from_clients_matches_pooled_and_sklearn():
    from sklearn.preprocessing import MinMaxScaler

    X = _data(1)
    scaling = MinMaxScaling.from_clients([X[:50], X[50:120], X[120:]])
    np.testing.assert_array_equal(scaling.data_min, X.min(axis=0))
    np.testing.assert_array_equal(scaling.data_max, X.max(axis=0))
    Z = scaling.transform(X)
    assert Z.dtype == np.float64 and Z.shape == X.shape
    assert Z.min() >= 0.0 and Z.max() <= 1.0
    np.testing.assert_allclose(Z.min(axis=0), 0.0)
    np.testing.assert_allclose(Z.max(axis=0), 1.0)
    np.testing.assert_allclose(Z, MinMaxScaler().fit(X).transform(X), rtol=0, atol=1e-12)


def test_constant_column_and_integer_input():
    X = np.array([[1, 5, 2], [3, 5, 2], [2, 5, 4]], dtype=np.int16)
    scaling = MinMaxScaling.from_clients([X[:1], X[1:]])
    Z = scaling.transform(X)
    assert Z.dtype == np.float64
    np.testing.assert_array_equal(Z[:, 1], 0.0)  # constant feature -> 0, no division by zero
    np.testing.assert_array_equal(Z[:, 0], [0.0, 1.0, 0.5])
    # new data: not clipped; a constant feature keeps its offset in original units
    np.testing.assert_array_equal(scaling.transform([[5, 7, 0]]), [[2.0, 2.0, -1.0]])


def test_inputs_not_mutated():
    X = _data(2)
    X0 = X.copy()
    lo, hi = client_minmax(X)
    scaling = MinMaxScaling(lo, hi)
    scaling.transform(X)
    np.testing.assert_array_equal(X, X0)
    lo[:] = 0.0  # the caller's vectors are copied, not aliased
    assert scaling.data_min[0] == X.min(axis=0)[0]
    assert lo.flags.writeable


def test_frozen_and_read_only():
    scaling = MinMaxScaling([0.0, 1.0], [1.0, 3.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        scaling.data_min = np.zeros(2)
    with pytest.raises(ValueError, match="read-only"):
        scaling.data_min[0] = 5.0


def test_empty_client_sends_nothing():
    X = _data(3)
    scaling = MinMaxScaling.from_clients([X[:0], X])
    np.testing.assert_array_equal(scaling.data_max, X.max(axis=0))


def test_errors():
    with pytest.raises(ValueError, match=r"X must be a non-empty 2-D array .* shape \(3,\)"):
        client_minmax([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="X contains NaN or infinite"):
        client_minmax([[1.0], [np.nan]])
    with pytest.raises(ValueError, match="stats is empty"):
        merge_minmax([])
    with pytest.raises(ValueError, match=r"stats\[1\] has min shape \(3,\)"):
        merge_minmax([(np.zeros(2), np.ones(2)), (np.zeros(3), np.ones(3))])
    with pytest.raises(ValueError, match="data_min exceeds data_max for features \\[1\\]"):
        MinMaxScaling([0.0, 2.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="same shape"):
        MinMaxScaling([0.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="X has 3 features but this scaling was fitted on 2"):
        MinMaxScaling([0.0, 0.0], [1.0, 1.0]).transform(np.ones((4, 3)))
    with pytest.raises(ValueError, match="X must be a non-empty"):
        MinMaxScaling.from_clients([np.ones(3)])
