"""Post-processing of noisy summed statistics, at no privacy cost.

Noise makes counts negative and covariances indefinite; whatever is computed from the noisy
release alone spends no more of the budget. :func:`positive_counts` keeps counts at a floor,
:func:`nearest_psd` raises every eigenvalue of symmetric matrices to a floor, and
:func:`plausible_stats` brings noisy statistics to ones some rows in the clipping ball could
have produced: counts at a floor, each component's mean inside the ball, its covariance's
eigenvalues between a floor that grows with the noise and the ball's ``bound**2``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def positive_counts(counts: Tensor, floor: float) -> Tensor:
    """Noisy counts (K,) kept at least ``floor`` (> 0): post-processing, no privacy cost."""
    return counts.clamp_min(floor)


def nearest_psd(matrices: Tensor, min_eigenvalue: float) -> Tensor:
    """Symmetric matrices (..., d, d) with every eigenvalue raised to at least
    ``min_eigenvalue`` (the nearest such matrix in Frobenius norm): a noisy covariance made
    positive definite by post-processing."""
    symmetric = (matrices + matrices.transpose(-1, -2)) / 2
    values, vectors = torch.linalg.eigh(symmetric)
    values = values.clamp_min(min_eigenvalue)
    return (vectors * values.unsqueeze(-2)) @ vectors.transpose(-1, -2)


def plausible_stats(
    stats: Any, bound: float, min_count: float, min_variance: float, second_noise: float = 0.0
) -> Any:
    """Noisy summed statistics post-processed (no privacy cost) into statistics some rows in
    the clipping ball could have produced: counts at least ``min_count``; each component's
    mean inside the ball of radius ``bound`` around the origin; its covariance's
    eigenvalues (variances for ``diag``, the mean variance for ``spherical``) between
    ``min_variance`` and ``bound**2``. The row count is the counts' sum.

    ``second_noise`` (the standard deviation of the noise on each entry of the summed second
    moments) raises each component's floor to the noise's typical spectral norm on its
    covariance, ``2 * second_noise * sqrt(d) / n_k``: a direction whose variance is below the
    noise is not trusted, so a noisy M-step cannot make a thin component that captures a
    slab of rows and starves the others.

    Args:
        stats: ``SufficientStats`` about ``stats.shift`` (d,).
        bound: the clipping radius ``B``; min_count > 0; min_variance > 0;
            second_noise >= 0.
    """
    from dataclasses import replace

    ct = stats.covariance_type
    counts = positive_counts(stats.counts, min_count)
    shift = stats.shift
    means = shift + stats.sums / counts.unsqueeze(1)
    norms = torch.linalg.vector_norm(means, dim=1, keepdim=True)
    means = torch.where(norms > bound, means * (bound / norms.clamp_min(1e-300)), means)
    offsets = means - shift  # the kept means about the shift
    top = float(bound) ** 2
    d = shift.shape[0]
    floors = (2 * second_noise * math.sqrt(d) / counts).clamp(min_variance, top)
    if ct == "full":
        cov = stats.second / counts[:, None, None] - (stats.sums / counts.unsqueeze(1)).unsqueeze(
            2
        ) * (stats.sums / counts.unsqueeze(1)).unsqueeze(1)
        cov = _bounded_eigen(cov, floors, top)
        second = counts[:, None, None] * (cov + offsets.unsqueeze(2) * offsets.unsqueeze(1))
    elif ct == "tied":
        n = counts.sum()
        scatter = stats.second - (stats.sums.T / counts) @ stats.sums
        low = (2 * second_noise * math.sqrt(d) / n).clamp(min_variance, top)
        cov = _bounded_eigen((scatter / n).unsqueeze(0), low.reshape(1), top)[0]
        second = n * cov + (offsets.T * counts) @ offsets
    elif ct == "diag":
        var = stats.second / counts.unsqueeze(1) - (stats.sums / counts.unsqueeze(1)).square()
        var = torch.minimum(torch.maximum(var, floors.unsqueeze(1)), var.new_tensor(top))
        second = counts.unsqueeze(1) * (var + offsets.square())
    else:
        var = stats.second / counts - (stats.sums / counts.unsqueeze(1)).square().sum(1)
        var = torch.minimum(torch.maximum(var, floors * d), var.new_tensor(top))
        second = counts * (var + offsets.square().sum(1))
    return replace(
        stats,
        counts=counts,
        sums=counts.unsqueeze(1) * offsets,
        second=second,
        n_samples=counts.sum().reshape(stats.n_samples.shape),
    )


def _bounded_eigen(matrices: Tensor, low: Tensor, high: float) -> Tensor:
    """Symmetric matrices (k, d, d) with eigenvalues clamped into ``[low_k, high]`` (``low``
    (k,))."""
    symmetric = (matrices + matrices.transpose(-1, -2)) / 2
    values, vectors = torch.linalg.eigh(symmetric)
    values = torch.minimum(torch.maximum(values, low.unsqueeze(-1)), values.new_tensor(high))
    return (vectors * values.unsqueeze(-2)) @ vectors.transpose(-1, -2)
