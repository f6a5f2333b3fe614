"""Two-domain pools of novelty streams: stream names, ADBench pairs and FEMNIST writers."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty.datasets.domain_pools import (
    adbench_pools,
    femnist_pools,
    parse_stream_dataset,
    stream_pools,
)
from fednovelty.datasets.streams import domain_stream


def test_stream_names_parse():
    assert parse_stream_dataset("cifar10-svhn") == ("adbench", ("CIFAR10_0", "SVHN_0"))
    assert parse_stream_dataset("femnist") == ("femnist", ("transforms",))
    assert parse_stream_dataset("femnist:rotate") == ("femnist", ("rotate",))
    assert parse_stream_dataset("MVTec-AD_wood+MVTec-AD_tile") == (
        "adbench",
        ("MVTec-AD_wood", "MVTec-AD_tile"),
    )
    for bad, match in (("4_breastw", "not a stream dataset"), ("cifar10-svhn:x", "OOD suffix")):
        with pytest.raises(ValueError, match=match):
            parse_stream_dataset(bad)


def test_adbench_pools_split_inliers_and_keep_both_sets_anomalies():
    pools = stream_pools("cifar10-svhn", random_state=0)
    assert pools.name == "cifar10-svhn" and pools.features == "pca" and pools.n_writers is None
    for train, test in ((pools.train_a, pools.test_a), (pools.train_b, pools.test_b)):
        assert train.shape[1] == 512 and train.shape[0] / (train.shape[0] + test.shape[0]) == (
            pytest.approx(0.7, abs=0.01)
        )
    assert pools.novel.shape[0] > 100  # both sets' 5 % anomalies
    same = adbench_pools("CIFAR10_0", "SVHN_0", random_state=0)
    np.testing.assert_array_equal(same.test_b, pools.test_b)
    with pytest.raises(ValueError, match="one width"):
        adbench_pools("CIFAR10_0", "4_breastw")


def test_femnist_pools_hold_each_writers_digits_and_letters():
    pools = femnist_pools(5, ood="rotate", random_state=0)
    assert pools.name == "femnist:rotate" and pools.features == "polar"
    assert pools.n_writers == 5 and pools.n_features == 784
    assert set(np.unique(pools.clients_a)) <= set(range(5))
    # held-out images halved into inliers and novel ones
    n_inliers = pools.test_a.shape[0] + pools.test_b.shape[0]
    assert abs(pools.novel.shape[0] - n_inliers) <= 1
    stream = domain_stream(pools, 2, rows_per_window=20, test_inliers=30, test_novel=10)
    assert stream.n_features == 25  # 24 polar axes + log norm (make_task's femnist features)
    with pytest.raises(ValueError, match="ood must be one of"):
        femnist_pools(2, ood="blur")
