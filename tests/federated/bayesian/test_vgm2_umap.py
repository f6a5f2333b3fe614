"""VGM2's fuzzy kNN graph and UMAP curve against umap-learn's own functions."""

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors

from fednovelty.federated.bayesian.vgm2_umap import fuzzy_graph, umap_ab

umap_ = pytest.importorskip(
    "umap.umap_",
    reason="umap-learn, the reference graph, is a dev dependency (make test installs it)",
)


def _reference(X: np.ndarray, n_neighbors: int):
    rows = X.astype(np.float32)
    k = max(2, min(n_neighbors, rows.shape[0]))
    distances, indices = NearestNeighbors(n_neighbors=k).fit(rows).kneighbors(rows)
    graph, _, _ = umap_.fuzzy_simplicial_set(
        rows, k, np.random.RandomState(0), "euclidean",
        knn_indices=indices, knn_dists=distances.astype(np.float32),
    )  # fmt: skip
    coo = graph.tocoo()
    keep = coo.row != coo.col
    return coo.row[keep], coo.col[keep], coo.data[keep]


def _cases():
    rng = np.random.default_rng(0)
    for trial in range(24):
        n, f = int(rng.integers(3, 200)), int(rng.integers(1, 8))
        X = rng.normal(size=(n, f)) * rng.uniform(0.01, 100)
        if trial % 4 == 0:
            X[: n // 3] = X[0]  # repeated rows: zero distances, rho from the next one
        if trial % 5 == 0:
            X = np.round(X, 1)  # ties
        yield X, int(rng.integers(2, 20))


def test_the_graph_is_umap_learns():
    for X, k in _cases():
        heads, tails, weights = fuzzy_graph(torch.as_tensor(X), k, 0)
        ref_heads, ref_tails, ref_weights = _reference(X, k)
        assert np.array_equal(heads.numpy(), ref_heads)
        assert np.array_equal(tails.numpy(), ref_tails)
        assert weights.dtype == torch.float64
        scale = max(1.0, float(np.abs(ref_weights).max()))  # float32 strengths
        np.testing.assert_allclose(weights.numpy(), ref_weights, rtol=0, atol=5e-5 * scale)


@pytest.mark.parametrize("min_dist", [0.0, 0.1, 0.5])
def test_the_curve_is_umap_learns(min_dist):
    a, b = umap_ab(min_dist)
    ref_a, ref_b = umap_.find_ab_params(1.0, min_dist)
    assert abs(a - ref_a) <= 1e-9 * abs(ref_a) and abs(b - ref_b) <= 1e-9 * abs(ref_b)
