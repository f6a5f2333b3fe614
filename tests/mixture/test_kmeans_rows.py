"""k-means of a row source pass by pass (mixture.kmeans_rows) against the in-memory k-means
on the same rows and seed, and the row-source forms of the statistics kernels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.mixture import e_step_stats, feature_moments, score_samples, stats_from_resp
from fednovelty.mixture.kmeans import kmeans, kmeans_plusplus, one_hot
from fednovelty.mixture.kmeans_rows import first_index, kmeans_plusplus_rows, kmeans_rows
from fednovelty.mixture.model import MixtureParams
from fednovelty.runtime.rows import ArrayRows


def blobs(n: int = 1203, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 6, (4, 3))
    return centres[rng.integers(0, 4, n)] + rng.normal(0, 1, (n, 3))


@pytest.mark.parametrize(
    ("n", "block"),
    [(1, 1), (7, 1), (7, 3), (1000, 1), (1000, 3), (1000, 65_536), (100_003, 3), (100_003, 65_536)],
)
def test_first_index_is_torch_multinomial_of_equal_weights(n, block):
    expected = torch.multinomial(
        torch.ones(n, dtype=torch.float64), 1, generator=torch.Generator().manual_seed(n)
    )
    assert first_index(n, torch.Generator().manual_seed(n), block) == int(expected)


@pytest.mark.parametrize("chunk_rows", [1, 97, 5000])
def test_kmeans_plusplus_of_a_source_picks_the_in_memory_rows(chunk_rows):
    X = blobs(120 if chunk_rows == 1 else 1203)
    expected = kmeans_plusplus(torch.as_tensor(X), 6, generator=torch.Generator().manual_seed(4))
    source = ArrayRows(X, chunk_rows=chunk_rows)
    got = kmeans_plusplus_rows(source, 6, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same rows, copied


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("chunk_rows", [97, 1204])
def test_kmeans_of_a_source_matches_in_memory(k, chunk_rows):
    X = blobs()
    centres, labels = kmeans(torch.as_tensor(X), k, generator=torch.Generator().manual_seed(1))
    source = ArrayRows(X, chunk_rows=chunk_rows)
    got, none = kmeans(source, k, generator=torch.Generator().manual_seed(1))
    assert none is None  # no label per row is kept
    assert_close_scaled(got, centres, rtol=1e-10)
    _, counts = kmeans_rows(source, k, generator=torch.Generator().manual_seed(1))
    assert counts.tolist() == torch.bincount(labels, minlength=k).double().tolist()


def test_kmeans_of_a_source_refuses_weights():
    with pytest.raises(ValueError, match="equal weights"):
        kmeans(ArrayRows(blobs(20)), 2, generator=torch.Generator(), sample_weight=torch.ones(20))


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_statistics_of_a_source_match_the_tensor(covariance_type):
    X = torch.as_tensor(blobs())
    source = ArrayRows(X.numpy(), chunk_rows=101)
    rng = np.random.default_rng(2)
    means = torch.as_tensor(rng.normal(0, 4, (3, 3)))
    params = MixtureParams.from_covariances(
        torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64),
        means,
        {
            "full": torch.eye(3).repeat(3, 1, 1) * 2.0,
            "tied": torch.eye(3) * 2.0,
            "diag": torch.ones(3, 3) * 2.0,
            "spherical": torch.ones(3) * 2.0,
        }[covariance_type].double(),
        covariance_type,
    )
    shift = X.mean(0)
    args = (params.weights.log(), params.means, params.precisions_cholesky, covariance_type, shift)
    rows_a, rows_b = torch.empty(len(X), dtype=X.dtype), torch.empty(len(X), dtype=X.dtype)
    sq_a, sq_b = torch.zeros(3, dtype=X.dtype), torch.zeros(3, dtype=X.dtype)
    a = e_step_stats(X, *args, chunk_size=64, squared_counts=sq_a, row_log_likelihood=rows_a)
    b = e_step_stats(source, *args, chunk_size=64, squared_counts=sq_b, row_log_likelihood=rows_b)
    for name in ("counts", "sums", "second", "log_likelihood", "n_samples"):
        assert_close_scaled(getattr(b, name), getattr(a, name), rtol=1e-10, err_msg=name)
    assert_close_scaled(rows_b, rows_a, rtol=1e-12)
    assert_close_scaled(sq_b, sq_a, rtol=1e-10)
    resp = one_hot(torch.arange(len(X)) % 3, 3, X)
    hard_a = stats_from_resp(X, resp, covariance_type, shift)
    hard_b = stats_from_resp(source, resp, covariance_type, shift, chunk_size=50)
    assert_close_scaled(hard_b.second, hard_a.second, rtol=1e-10)
    assert_close_scaled(score_samples(params, source), score_samples(params, X), rtol=1e-12)
    m_a, m_b = feature_moments(X), feature_moments(source)
    assert_close_scaled(m_b.mean, m_a.mean, rtol=1e-12)
    assert_close_scaled(m_b.m2, m_a.m2, rtol=1e-10)
