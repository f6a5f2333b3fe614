"""Cluster-wise partitioners (Fed-CAM Sec. 5): cover, cluster structure, seeds, named errors."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fednovelty.datasets as ds
from fednovelty.datasets.partition import (
    ClusteredPartition,
    cluster_dirichlet_partition,
    cluster_nclass_partition,
    groups_from_partition,
)
from fednovelty.datasets.partition import clustered as clustered_module

# 10 classes of uneven size (about 600 rows each), like a small MNIST
LABELS = np.random.default_rng(0).integers(0, 10, 6000)


def _assert_exact_cover(parts, n):
    allrows = np.concatenate(parts)
    assert allrows.dtype == np.int64
    np.testing.assert_array_equal(np.sort(allrows), np.arange(n))
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)  # sorted, no repeats


def _label_dists(parts, labels, n_classes):
    return np.array([np.bincount(labels[p], minlength=n_classes) / p.size for p in parts])


def _mean_tv(parts, clusters, labels, n_classes=10):
    """Mean total variation between clients' label distributions: (within, between) clusters."""
    dists = _label_dists(parts, labels, n_classes)
    tv = 0.5 * np.abs(dists[:, None, :] - dists[None, :, :]).sum(axis=-1)
    same = clusters[:, None] == clusters[None, :]
    off_diag = ~np.eye(len(clusters), dtype=bool)
    return float(tv[same & off_diag].mean()), float(tv[~same].mean())


def _cluster_groups(parts, clusters, labels, k):
    rows = np.concatenate([p for p, c in zip(parts, clusters, strict=True) if c == k])
    return set(np.unique(labels[rows]).tolist())


def _same(a: ClusteredPartition, b: ClusteredPartition) -> bool:
    return np.array_equal(a.client_clusters, b.client_clusters) and all(
        np.array_equal(x, y) for x, y in zip(a.parts, b.parts, strict=True)
    )


# --- cluster-wise Dirichlet(alpha, client_alpha) -------------------------------------------------


@pytest.mark.parametrize(("n_clients", "n_clusters"), [(1, 1), (7, 3), (40, 5), (40, 40)])
def test_dirichlet_uses_every_row_once_with_true_clusters(n_clients, n_clusters):
    out = cluster_dirichlet_partition(LABELS, n_clients, n_clusters, 0.1, random_state=1)
    assert isinstance(out, ClusteredPartition)
    parts, clusters = out
    assert len(parts) == n_clients
    _assert_exact_cover(parts, LABELS.size)
    assert clusters.dtype == np.int64 and clusters.shape == (n_clients,)
    sizes = np.bincount(clusters, minlength=n_clusters)
    assert sizes.size == n_clusters and sizes.max() - sizes.min() <= 1  # m/K clients each
    groups_from_partition(parts, LABELS.size)  # a valid groups= for fit


def test_dirichlet_paper_setting_within_cluster_far_below_between():
    # the paper's Dirichlet(0.1, 10) with K = 10 clusters over m = 200 clients
    parts, clusters = cluster_dirichlet_partition(
        LABELS, 200, 10, 0.1, 10.0, random_state=0, min_size=5
    )
    assert min(p.size for p in parts) >= 5
    within, between = _mean_tv(parts, clusters, LABELS)
    assert within < 0.3 * between, (within, between)
    assert between > 0.6


def test_dirichlet_client_alpha_controls_within_cluster_spread():
    def within(client_alpha):
        parts, clusters = cluster_dirichlet_partition(
            LABELS, 40, 4, 0.1, client_alpha, random_state=3, min_size=1
        )
        return _mean_tv(parts, clusters, LABELS)[0]

    assert within(100.0) < within(10.0) < within(0.1)


def test_dirichlet_client_order_is_shuffled():
    # clients are not listed cluster by cluster, so their ids say nothing of the clusters
    _, clusters = cluster_dirichlet_partition(LABELS, 40, 4, 0.5, random_state=0)
    assert not np.all(np.diff(clusters) >= 0)


def test_dirichlet_deterministic_per_seed():
    a = cluster_dirichlet_partition(LABELS, 20, 4, 0.1, random_state=42)
    b = cluster_dirichlet_partition(LABELS, 20, 4, 0.1, random_state=42)
    c = cluster_dirichlet_partition(LABELS, 20, 4, 0.1, random_state=43)
    assert _same(a, b) and not _same(a, c)
    g1 = cluster_dirichlet_partition(LABELS, 20, 4, 0.1, random_state=np.random.default_rng(7))
    g2 = cluster_dirichlet_partition(LABELS, 20, 4, 0.1, random_state=np.random.default_rng(7))
    assert _same(g1, g2)


def test_dirichlet_any_labels_and_empty_clients_allowed_without_min_size():
    labels = np.array(["b", "a", "b", "c", "a", "c", "c"])
    parts, _ = cluster_dirichlet_partition(labels, 6, 3, 0.05, random_state=0)
    _assert_exact_cover(parts, labels.size)
    assert any(p.size == 0 for p in parts)  # 7 rows over 6 skewed clients


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n_clients=3, n_clusters=4), r"n_clusters=4 exceeds n_clients=3; every cluster"),
        (dict(n_clusters=0), r"n_clusters must be an int >= 1; got 0"),
        (dict(n_clients=0), r"n_clients must be an int >= 1; got 0"),
        (dict(alpha=0.0), r"alpha must be a finite number > 0"),
        (dict(alpha=float("nan")), r"alpha must be a finite number > 0"),
        (dict(client_alpha=-1.0), r"client_alpha must be a finite number > 0.*got -1.0"),
        (dict(client_alpha=True), r"client_alpha must be a finite number > 0"),
        (dict(random_state=-1), r"random_state must be None, a non-negative int"),
        (dict(min_size=-1), r"min_size must be an int >= 0"),
        (dict(min_size=400), r"min_size=400 for each of n_clients=20 needs 8000 rows"),
        (dict(groups=np.zeros((3, 2))), r"groups must be a non-empty 1-D array"),
    ],
)
def test_dirichlet_errors(kwargs, message):
    args = dict(groups=LABELS, n_clients=20, n_clusters=4, alpha=0.1) | kwargs
    with pytest.raises(ValueError, match=message):
        cluster_dirichlet_partition(**args)


def test_dirichlet_min_size_unreachable():
    # 40 rows, 10 clients of min 3 rows: possible in principle, hopeless with alpha = 0.01
    labels = np.repeat(np.arange(4), 10)
    with pytest.raises(ValueError, match=r"could not give every client min_size=3 rows.*alpha"):
        cluster_dirichlet_partition(labels, 10, 5, 0.01, 0.01, random_state=0, min_size=3)


# --- cluster-wise n-class(groups_per_cluster, groups_per_client) ---------------------------------


@pytest.mark.parametrize(
    ("n_clients", "n_clusters", "per_cluster", "per_client"),
    [(200, 10, 3, 2), (200, 5, 3, 2), (20, 4, 3, 2), (9, 2, 5, 3), (10, 10, 1, 1), (12, 1, 10, 4)],
)
def test_nclass_structure(n_clients, n_clusters, per_cluster, per_client):
    parts, clusters = cluster_nclass_partition(
        LABELS, n_clients, n_clusters, per_cluster, per_client, random_state=2
    )
    assert len(parts) == n_clients
    _assert_exact_cover(parts, LABELS.size)
    sizes = np.bincount(clusters, minlength=n_clusters)
    assert sizes.size == n_clusters and sizes.max() - sizes.min() <= 1
    held_by = np.zeros(10, dtype=np.int64)
    for k in range(n_clusters):
        cluster_groups = _cluster_groups(parts, clusters, LABELS, k)
        assert len(cluster_groups) == per_cluster  # exactly the requested number of classes
        held_by[list(cluster_groups)] += 1
        for p, c in zip(parts, clusters, strict=True):
            if c == k:
                client_groups = set(np.unique(LABELS[p]).tolist())
                assert len(client_groups) == per_client and client_groups <= cluster_groups
    # every class is held, and by numbers of clusters within one ("balanced instances per class")
    assert held_by.min() >= 1 and held_by.max() - held_by.min() <= 1


def test_nclass_paper_setting_within_cluster_below_between():
    # n-class(3, 2): clients of a cluster share its 3 classes (2 each), so they differ by at
    # most half their mass; clients of different clusters mostly hold other classes
    parts, clusters = cluster_nclass_partition(LABELS, 200, 10, 3, 2, random_state=0)
    within, between = _mean_tv(parts, clusters, LABELS)
    assert within < 0.5 * between, (within, between)
    # rows of a class split evenly among the clusters holding it, and its clients
    assert max(p.size for p in parts) < 1.5 * min(p.size for p in parts)


def test_nclass_deterministic_per_seed_and_min_size():
    a = cluster_nclass_partition(LABELS, 30, 5, 3, 2, random_state=5, min_size=50)
    b = cluster_nclass_partition(LABELS, 30, 5, 3, 2, random_state=5, min_size=50)
    c = cluster_nclass_partition(LABELS, 30, 5, 3, 2, random_state=6, min_size=50)
    assert _same(a, b) and not _same(a, c)
    assert min(p.size for p in a.parts) >= 50


def test_nclass_any_labels():
    labels = np.repeat(np.array(["cat", "dog", "eel", "fox"]), [5, 6, 7, 8])
    parts, clusters = cluster_nclass_partition(labels, 6, 3, 2, 1, random_state=0)
    _assert_exact_cover(parts, labels.size)
    for k in range(3):
        assert len(_cluster_groups(parts, clusters, labels, k)) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(n_clients=3, n_clusters=4), r"n_clusters=4 exceeds n_clients=3; every cluster"),
        (dict(groups_per_cluster=11), r"groups_per_cluster=11 exceeds the number of distinct"),
        (dict(groups_per_cluster=0), r"groups_per_cluster must be an int >= 1; got 0"),
        (dict(groups_per_client=4), r"groups_per_client=4 exceeds groups_per_cluster=3"),
        (dict(groups_per_client=1.0), r"groups_per_client must be an int >= 1; got 1.0"),
        (
            dict(n_clusters=3),
            r"n_clusters=3 x groups_per_cluster=3 = 9 cluster slots cannot hold all 10 groups",
        ),
        (
            dict(n_clients=7, n_clusters=5, groups_per_client=1),
            r"a cluster of 1 client\(s\) x groups_per_client=1 = 1 client slots cannot hold its "
            r"3 groups .*n_clients >= 15",
        ),
        (dict(min_size=601), r"min_size=601 for each of n_clients=10 needs 6010 rows"),
        (dict(random_state=1.5), r"random_state must be None"),
    ],
)
def test_nclass_errors(kwargs, message):
    args = (
        dict(groups=LABELS, n_clients=10, n_clusters=4, groups_per_cluster=3, groups_per_client=2)
        | kwargs
    )
    with pytest.raises(ValueError, match=message):
        cluster_nclass_partition(**args)


def test_nclass_class_with_too_few_rows():
    # 8 clusters x 3 classes over 4 classes: each class shared by 6 clusters; class 3 has 2 rows
    labels = np.concatenate([np.repeat([0, 1, 2], 50), [3, 3]])
    with pytest.raises(ValueError, match=r"group 3 has 2 row\(s\), fewer than the 6 clusters"):
        cluster_nclass_partition(labels, 16, 8, 3, 2, random_state=0)


def test_nclass_min_size_unreachable():
    labels = np.repeat(np.arange(4), [40, 40, 40, 4])  # a tiny class starves its clients
    with pytest.raises(ValueError, match=r"could not give every client min_size=4 rows"):
        cluster_nclass_partition(labels, 8, 4, 1, 1, random_state=0, min_size=4)


# --- properties, exports, doctests --------------------------------------------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_groups=st.integers(1, 6),
    rows_per_group=st.integers(1, 30),
    n_clusters=st.integers(1, 5),
    extra_clients=st.integers(0, 8),
    alpha=st.sampled_from([0.05, 1.0, 50.0]),
    seed=st.integers(0, 2**16),
)
def test_property_dirichlet_cover(n_groups, rows_per_group, n_clusters, extra_clients, alpha, seed):
    labels = np.random.default_rng(seed).integers(0, n_groups, n_groups * rows_per_group)
    n_clients = n_clusters + extra_clients
    parts, clusters = cluster_dirichlet_partition(
        labels, n_clients, n_clusters, alpha, alpha, random_state=seed
    )
    _assert_exact_cover(parts, labels.size)
    sizes = np.bincount(clusters, minlength=n_clusters)
    assert sizes.size == n_clusters and sizes.max() - sizes.min() <= 1 and sizes.min() >= 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_groups=st.integers(1, 8),
    rows_per_group=st.integers(8, 30),
    n_clusters=st.integers(1, 6),
    per_cluster=st.integers(1, 8),
    per_client=st.integers(1, 8),
    clients_per_cluster=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_property_nclass(
    n_groups, rows_per_group, n_clusters, per_cluster, per_client, clients_per_cluster, seed
):
    per_cluster = min(per_cluster, n_groups)
    per_client = min(per_client, per_cluster)
    n_clients = n_clusters * clients_per_cluster
    labels = np.repeat(np.arange(n_groups), rows_per_group)
    feasible = n_clusters * per_cluster >= n_groups and clients_per_cluster * per_client >= (
        per_cluster
    )
    if not feasible:
        with pytest.raises(ValueError, match=r"cannot hold"):
            cluster_nclass_partition(
                labels, n_clients, n_clusters, per_cluster, per_client, random_state=seed
            )
        return
    parts, clusters = cluster_nclass_partition(
        labels, n_clients, n_clusters, per_cluster, per_client, random_state=seed
    )
    _assert_exact_cover(parts, labels.size)
    for k in range(n_clusters):
        cluster_groups = _cluster_groups(parts, clusters, labels, k)
        assert len(cluster_groups) == per_cluster
        for p, c in zip(parts, clusters, strict=True):
            if c == k and p.size:
                assert set(np.unique(labels[p]).tolist()) <= cluster_groups


def test_exports():
    from fednovelty.datasets.partition.clustered import cluster_dirichlet_partition as d
    from fednovelty.datasets.partition.clustered import cluster_nclass_partition as n

    assert (d, n) == (cluster_dirichlet_partition, cluster_nclass_partition)
    assert ds.cluster_dirichlet_partition is d and ds.cluster_nclass_partition is n
    assert ds.ClusteredPartition is ClusteredPartition


def test_doctests():
    result = doctest.testmod(clustered_module, raise_on_error=False)
    assert result.attempted >= 4 and result.failed == 0


def test_docs_example_runs(capsys):
    docs = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
    blocks = re.findall(r"```python\n(.*?)```", docs.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "cluster_dirichlet_partition" in b]
    exec(compile(block, "docs/benchmarks.md cluster-wise", "exec"), {})
    sizes, ari = capsys.readouterr().out.strip().splitlines()
    assert sizes == "[20 20 20 20 20 20 20 20 20 20]" and ari == "1.0"
