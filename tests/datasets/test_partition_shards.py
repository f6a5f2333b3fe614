"""Label shards (fednovelty.datasets.partition.shard_partition): McMahan's split."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty.datasets.partition import groups_from_partition, shard_partition


def test_every_row_once_equal_shards_few_labels() -> None:
    labels = np.repeat(np.arange(10), 600)  # sorted labels, 6000 rows
    parts = shard_partition(np.random.default_rng(0).permutation(labels), 30, 2, random_state=1)
    assert len(parts) == 30
    allrows = np.concatenate(parts)
    assert np.array_equal(np.sort(allrows), np.arange(6000))
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)
    assert {p.size for p in parts} == {200}
    shuffled = np.random.default_rng(0).permutation(labels)
    # shards of 100 rows within labels of 600: at most two labels per client
    assert max(np.unique(shuffled[p]).size for p in parts) <= 2
    assert groups_from_partition(parts, 6000).shape == (6000,)


def test_same_seed_same_partition_and_uneven_rows() -> None:
    labels = np.random.default_rng(2).integers(0, 5, 1003)
    a = shard_partition(labels, 7, 3, random_state=4)
    b = shard_partition(labels, 7, 3, random_state=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert sum(p.size for p in a) == 1003
    assert max(p.size for p in a) - min(p.size for p in a) <= 3  # shards differ by <= 1 row
    c = shard_partition(labels, 7, 3, random_state=5)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="n_clients"):
        shard_partition(np.zeros(10), 0)
    with pytest.raises(ValueError, match="shards_per_client"):
        shard_partition(np.zeros(10), 2, 0)
    with pytest.raises(ValueError, match="cannot fill 12 shards"):
        shard_partition(np.zeros(10), 6, 2)
