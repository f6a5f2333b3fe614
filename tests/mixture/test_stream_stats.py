"""Streaming statistics: re-shifting is exact, forgetting is ``rho S + S_window``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fednovelty.mixture import stats_from_resp
from fednovelty.mixture.streaming import decay_stats, forget_and_add, memory_rows, reshift_stats

TYPES = ("full", "tied", "diag", "spherical")


def _data(seed: int = 0, n: int = 60, d: int = 3, k: int = 2):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64) * 3.0 + 10.0
    resp = torch.softmax(torch.randn(n, k, generator=g, dtype=torch.float64), dim=1)
    return X, resp


def _close(a, b) -> None:
    scale = max(1.0, float(b.abs().max()))
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10 * scale)


@pytest.mark.parametrize("covariance_type", TYPES)
def test_reshift_equals_statistics_taken_about_the_new_shift(covariance_type):
    X, resp = _data()
    old, new = torch.zeros(3, dtype=torch.float64), torch.tensor([9.0, 11.0, 10.5]).double()
    moved = reshift_stats(stats_from_resp(X, resp, covariance_type, old), new)
    direct = stats_from_resp(X, resp, covariance_type, new)
    for name in ("counts", "sums", "second", "shift"):
        _close(getattr(moved, name), getattr(direct, name))


@pytest.mark.parametrize("covariance_type", TYPES)
def test_forgetting_with_rho_one_sums_the_windows_exactly(covariance_type):
    X, resp = _data(n=90)
    shifts = [torch.full((3,), float(c), dtype=torch.float64) for c in (0.0, 8.0, 12.0)]
    carry = None
    for w, shift in enumerate(shifts):
        rows = slice(30 * w, 30 * (w + 1))
        carry = forget_and_add(
            carry, stats_from_resp(X[rows], resp[rows], covariance_type, shift), 1.0
        )
    pooled = stats_from_resp(X, resp, covariance_type, shifts[-1])
    for name in ("counts", "sums", "second", "n_samples"):
        _close(getattr(carry, name), getattr(pooled, name))


def test_forgetting_discounts_older_windows_by_rho_per_window():
    X, resp = _data(n=40)
    shift = torch.zeros(3, dtype=torch.float64)
    first = stats_from_resp(X[:20], resp[:20], "diag", shift)
    second = stats_from_resp(X[20:], resp[20:], "diag", shift)
    both = forget_and_add(forget_and_add(None, first, 0.3), second, 0.3)
    _close(both.counts, 0.3 * first.counts + second.counts)
    _close(both.second, 0.3 * first.second + second.second)
    assert float(both.n_samples) == pytest.approx(0.3 * 20 + 20)
    assert float(decay_stats(first, 0.0).counts.abs().sum()) == 0.0


def test_memory_rows_and_errors_are_named():
    assert memory_rows(100, 0.9) == pytest.approx(1000.0)
    assert memory_rows(100, 1.0) == float("inf")
    X, resp = _data()
    stats = stats_from_resp(X, resp, "full", torch.zeros(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="rho"):
        forget_and_add(None, stats, 1.5)
    with pytest.raises(ValueError, match="rho"):
        decay_stats(stats, True)
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        reshift_stats(stats, torch.zeros(2))
    assert np.isfinite(float(stats.second.sum()))
