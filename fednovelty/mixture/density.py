"""Component log-densities and responsibilities (the E-step kernels).

The formulas are scikit-learn's ``_estimate_log_gaussian_prob`` written as batched torch
operations: for full covariances one matrix product ``X @ [U_1 ... U_K]`` of shape
(n_samples, n_components * n_features) replaces a Python loop over components.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.covariance import check_covariance_type, log_det_cholesky


def log_gaussian_prob(
    X: Tensor, means: Tensor, precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """Log-density of every sample under every component, ``log N(x_i; mu_k, Sigma_k)``.

    Args:
        X: samples, shape (n_samples, n_features).
        means: shape (n_components, n_features).
        precisions_cholesky: shape given by ``covariance_shape(covariance_type, ...)``.
        covariance_type: one of ``full``, ``tied``, ``diag``, ``spherical``.

    Returns:
        Log-densities, shape (n_samples, n_components).
    """
    check_covariance_type(covariance_type)
    n_samples, n_features = X.shape
    n_components = means.shape[0]
    log_det = log_det_cholesky(precisions_cholesky, covariance_type, n_features)
    if covariance_type == "full":
        # (n_features, n_components * n_features): all components in one GEMM.
        stacked = precisions_cholesky.permute(1, 0, 2).reshape(n_features, -1)
        offsets = torch.einsum("kd,kde->ke", means, precisions_cholesky)
        y = (X @ stacked).view(n_samples, n_components, n_features)
        y.sub_(offsets)
        maha = y.square_().sum(-1)
    elif covariance_type == "tied":
        y = (X @ precisions_cholesky).unsqueeze(1) - (means @ precisions_cholesky).unsqueeze(0)
        maha = y.square_().sum(-1)
    elif covariance_type == "diag":
        precisions = precisions_cholesky.square()
        maha = (
            (means.square() * precisions).sum(1)
            - 2.0 * (X @ (means * precisions).T)
            + X.square() @ precisions.T
        )
    else:
        precisions = precisions_cholesky.square()
        maha = (
            means.square().sum(1) * precisions
            - 2.0 * (X @ means.T) * precisions
            + torch.outer(X.square().sum(1), precisions)
        )
    return -0.5 * (n_features * math.log(2 * math.pi) + maha) + log_det


def log_responsibilities(weighted_log_prob: Tensor) -> tuple[Tensor, Tensor]:
    """Normalise ``log pi_k + log N(x_i | k)`` in log space.

    Args:
        weighted_log_prob: shape (n_samples, n_components).

    Returns:
        ``(log_prob_norm, log_resp)``: the per-sample log-likelihood ``log p(x_i)``, shape
        (n_samples,), and log-responsibilities, shape (n_samples, n_components).
    """
    log_prob_norm = torch.logsumexp(weighted_log_prob, dim=1)
    return log_prob_norm, weighted_log_prob - log_prob_norm.unsqueeze(1)


def default_chunk_size(n_components: int, n_features: int, budget_bytes: int = 1 << 25) -> int:
    """Rows per chunk so that an (rows, n_components, n_features) float64 buffer fits
    ``budget_bytes`` (32 MiB by default): bounds peak memory and stays cache friendly."""
    return max(256, budget_bytes // (8 * max(1, n_components * n_features)))
