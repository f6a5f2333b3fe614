"""k-means++ seeding and weighted Lloyd iterations."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment
from sklearn.metrics import adjusted_rand_score

from fednovelty.mixture.kmeans import assign, kmeans, kmeans_plusplus, one_hot, squared_distances


def t(a, dtype=torch.float64) -> torch.Tensor:
    return torch.as_tensor(np.array(a, copy=True), dtype=dtype)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def row_indices(X: torch.Tensor, centers: torch.Tensor) -> list[int]:
    """Index of the row of ``X`` equal to each centre (fails if a centre is not a row)."""
    out = []
    for c in centers:
        hits = torch.nonzero((X == c).all(1)).flatten()
        assert hits.numel() >= 1, f"centre {c.tolist()} is not a row of X"
        out.append(int(hits[0]))
    return out


def test_squared_distances_match_cdist():
    rng = np.random.default_rng(0)
    X, C = t(rng.normal(size=(30, 4))), t(rng.normal(size=(5, 4)))
    np.testing.assert_allclose(
        squared_distances(X, C).numpy(), torch.cdist(X, C).square().numpy(), atol=1e-12
    )
    assert (squared_distances(X, X).diagonal() >= 0).all()


@pytest.mark.parametrize("seed", range(10))
def test_kmeans_plusplus_returns_distinct_rows_of_x(seed):
    X = t(np.random.default_rng(seed).normal(size=(100, 3)))
    centers = kmeans_plusplus(X, 5, generator=gen(seed))
    assert centers.shape == (5, 3) and centers.dtype == torch.float64
    assert len(set(row_indices(X, centers))) == 5


def test_kmeans_plusplus_float32():
    X = t(np.random.default_rng(0).normal(size=(50, 2)), torch.float32)
    centers = kmeans_plusplus(X, 3, generator=gen(0))
    assert centers.dtype == torch.float32
    row_indices(X, centers)


@pytest.mark.parametrize("seed", range(20))
def test_kmeans_plusplus_never_picks_zero_weight_points(seed):
    rng = np.random.default_rng(seed)
    inliers = rng.normal(size=(60, 2))
    # Far outliers are the most attractive D^2 candidates; with weight 0 they must never win.
    outliers = rng.normal(size=(40, 2)) * 5 + 1000.0
    X = t(np.concatenate([inliers, outliers]))
    weight = t(np.concatenate([rng.uniform(0.5, 2.0, size=60), np.zeros(40)]))
    perm = torch.as_tensor(rng.permutation(100))
    X, weight = X[perm], weight[perm]
    for n_clusters in (1, 4, 10):
        idx = row_indices(
            X, kmeans_plusplus(X, n_clusters, generator=gen(seed), sample_weight=weight)
        )
        assert all(weight[i] > 0 for i in idx), idx


def test_kmeans_plusplus_zero_weight_when_weighted_points_coincide():
    X = t([[0.0, 0.0], [5.0, 5.0], [0.0, 0.0]])
    weight = t([1.0, 0.0, 1.0])
    for seed in range(10):
        centers = kmeans_plusplus(X, 2, generator=gen(seed), sample_weight=weight)
        assert (centers == 0).all(), (seed, centers.tolist())


def test_kmeans_plusplus_weight_concentrates_the_first_centre():
    X = t(np.arange(20.0).reshape(10, 2))
    weight = torch.zeros(10, dtype=torch.float64)
    weight[7] = 1.0
    for seed in range(5):
        assert row_indices(X, kmeans_plusplus(X, 1, generator=gen(seed), sample_weight=weight)) == [
            7
        ]


def test_kmeans_plusplus_deterministic_per_seed():
    X = t(np.random.default_rng(0).normal(size=(200, 3)))
    a = kmeans_plusplus(X, 6, generator=gen(42))
    b = kmeans_plusplus(X, 6, generator=gen(42))
    assert torch.equal(a, b)
    others = [kmeans_plusplus(X, 6, generator=gen(s)) for s in range(5)]
    assert any(not torch.equal(a, o) for o in others)


def test_kmeans_plusplus_spreads_over_separated_clusters(blobs):
    """k-means++ picks one seed per well separated blob (D^2 sampling)."""
    X, labels = blobs
    for seed in range(5):
        idx = row_indices(t(X), kmeans_plusplus(t(X), 3, generator=gen(seed)))
        assert sorted(labels[idx]) == [0, 1, 2]


def test_kmeans_plusplus_identical_points():
    X = torch.ones(5, 2, dtype=torch.float64)
    centers = kmeans_plusplus(X, 3, generator=gen(0))
    assert torch.equal(centers, torch.ones(3, 2, dtype=torch.float64))


def test_kmeans_plusplus_needs_enough_samples():
    with pytest.raises(ValueError, match="n_samples >= n_clusters, got 2 < 3"):
        kmeans_plusplus(torch.zeros(2, 2), 3, generator=gen(0))


# --- Lloyd ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_kmeans_recovers_separated_centres(blobs, blob_centers, seed):
    X, labels = blobs
    centers, found = kmeans(t(X), 3, generator=gen(seed))
    cost = ((centers.numpy()[:, None, :] - blob_centers[None]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    assert np.sqrt(cost[rows, cols]).max() < 0.2
    assert adjusted_rand_score(labels, found.numpy()) == 1.0
    # At convergence each centre is the mean of its cluster.
    for k in range(3):
        np.testing.assert_allclose(centers[k].numpy(), X[found.numpy() == k].mean(0), atol=1e-12)


def test_weighted_kmeans_centres_are_weighted_means(aniso):
    rng = np.random.default_rng(0)
    X, weight = t(aniso), t(rng.uniform(0.0, 3.0, size=aniso.shape[0]))
    centers, labels = kmeans(X, 4, generator=gen(1), sample_weight=weight, tol=0.0, max_iter=300)
    assert torch.equal(labels, assign(X, centers)[0])
    for k in range(4):
        mask = labels == k
        w = weight[mask]
        expected = (w[:, None] * X[mask]).sum(0) / w.sum()
        torch.testing.assert_close(centers[k], expected, rtol=0, atol=1e-12)


def test_integer_weights_act_as_repeated_rows():
    """Weighted and repeated data have the same Lloyd fixed points from the same centres."""
    rng = np.random.default_rng(2)
    X = t(rng.normal(size=(40, 2)))
    counts = torch.as_tensor(rng.integers(1, 4, size=40))
    centers_w, labels_w = kmeans(
        X, 3, generator=gen(0), sample_weight=counts.double(), tol=0.0, max_iter=300
    )
    repeated = X.repeat_interleave(counts, dim=0)
    rep_labels = assign(repeated, centers_w)[0]
    for k in range(3):
        torch.testing.assert_close(
            repeated[rep_labels == k].mean(0), centers_w[k], rtol=0, atol=1e-12
        )
    assert torch.equal(rep_labels, labels_w.repeat_interleave(counts))


def test_kmeans_deterministic_per_seed(aniso):
    a = kmeans(t(aniso), 4, generator=gen(3))
    b = kmeans(t(aniso), 4, generator=gen(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_kmeans_does_not_modify_inputs(aniso):
    X, weight = t(aniso), torch.ones(aniso.shape[0], dtype=torch.float64)
    X0, w0 = X.clone(), weight.clone()
    kmeans(X, 3, generator=gen(0), sample_weight=weight)
    assert torch.equal(X, X0) and torch.equal(weight, w0)


def test_one_hot():
    labels = torch.tensor([2, 0, 1, 2])
    resp = one_hot(labels, 3, torch.zeros(1, dtype=torch.float32))
    assert resp.dtype == torch.float32
    assert torch.equal(resp.argmax(1), labels)
    assert torch.equal(resp.sum(1), torch.ones(4))
