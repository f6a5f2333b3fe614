"""The Gaussian-mixture parameter set and what can be computed from it alone.

``MixtureParams`` is a frozen container of tensors (weights, means, Cholesky factors of
the precisions) with the covariance type; scoring, BIC and sampling are pure functions of
it. It knows nothing of clients or estimators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.mixture.containers import ComponentTensors
from fednovelty.mixture.covariance import (
    check_covariance_type,
    covariance_shape,
    covariances_from_precisions_cholesky,
    n_covariance_parameters,
    precisions_cholesky_from_covariances,
)
from fednovelty.mixture.density import (
    default_chunk_size,
    log_gaussian_prob,
    log_responsibilities,
    logsumexp_rows,
)
from fednovelty.mixture.rows import chunks


@dataclass(frozen=True)
class MixtureParams(ComponentTensors):
    """Parameters of a Gaussian mixture.

    Attributes:
        weights: mixture weights, shape (n_components,), summing to 1.
        means: shape (n_components, n_features).
        precisions_cholesky: upper Cholesky factors of the precisions, shape per
            ``covariance_type`` (see ``fednovelty.mixture.covariance``).
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
    """

    weights: Tensor
    means: Tensor
    precisions_cholesky: Tensor
    covariance_type: str

    def __post_init__(self) -> None:
        check_covariance_type(self.covariance_type)
        if self.means.ndim != 2:
            raise ValueError(
                f"means must have shape (n_components, n_features), got {tuple(self.means.shape)}."
            )
        k, d = self.means.shape
        if self.weights.shape != (k,):
            raise ValueError(f"weights must have shape ({k},), got {tuple(self.weights.shape)}.")
        expected = covariance_shape(self.covariance_type, k, d)
        if tuple(self.precisions_cholesky.shape) != expected:
            raise ValueError(
                f"precisions_cholesky for covariance_type={self.covariance_type!r} must have "
                f"shape {expected}, got {tuple(self.precisions_cholesky.shape)}."
            )

    @classmethod
    def from_covariances(
        cls, weights: Tensor, means: Tensor, covariances: Tensor, covariance_type: str
    ) -> MixtureParams:
        """Build from covariances (raises ``SingularCovarianceError`` if not positive definite)."""
        return cls(
            weights,
            means,
            precisions_cholesky_from_covariances(covariances, covariance_type),
            covariance_type,
        )

    @property
    def covariances(self) -> Tensor:
        """Covariances recomputed from the precision factors (shape per covariance type)."""
        return covariances_from_precisions_cholesky(self.precisions_cholesky, self.covariance_type)

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> MixtureParams:
        """A copy on another device and/or dtype."""
        return MixtureParams(
            self.weights.to(device=device, dtype=dtype),
            self.means.to(device=device, dtype=dtype),
            self.precisions_cholesky.to(device=device, dtype=dtype),
            self.covariance_type,
        )


def n_parameters(covariance_type: str, n_components: int, n_features: int) -> int:
    """Free parameters of a mixture (scikit-learn's count: covariances + means + K - 1)."""
    return (
        n_covariance_parameters(covariance_type, n_components, n_features)
        + n_components * n_features
        + n_components
        - 1
    )


def weighted_log_prob(
    params: MixtureParams, X: Tensor, log_weights: Tensor | None = None
) -> Tensor:
    """``log pi_k + log N(x_i | k)``, shape (n_samples, n_components).

    ``log_weights`` (n_components,) overrides ``log(params.weights)`` (e.g. a client's
    personal mixture weights).
    """
    lw = params.weights.log() if log_weights is None else log_weights
    return (
        log_gaussian_prob(X, params.means, params.precisions_cholesky, params.covariance_type) + lw
    )


def _by_chunks(fn, params: MixtureParams, X: Tensor, chunk_size: int | None, empty: Tensor):
    """``fn(rows)`` over row chunks of ``X`` (a tensor or a
    :class:`~fednovelty.mixture.rows.RowSource`), concatenated (``empty`` for zero rows)."""
    chunk_size = chunk_size or default_chunk_size(params.n_components, params.n_features)
    out = [fn(rows) for rows in chunks(X, chunk_size) if rows.shape[0]]
    return torch.cat(out) if out else empty


def score_samples(
    params: MixtureParams,
    X: Tensor,
    log_weights: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Log-density ``log p(x_i)`` of each row, shape (n_samples,), computed in chunks."""
    return _by_chunks(
        lambda rows: logsumexp_rows(weighted_log_prob(params, rows, log_weights)),
        params,
        X,
        chunk_size,
        X.new_zeros(0),
    )


def predict_proba(
    params: MixtureParams,
    X: Tensor,
    log_weights: Tensor | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Posterior component probabilities, shape (n_samples, n_components)."""
    return _by_chunks(
        lambda rows: log_responsibilities(weighted_log_prob(params, rows, log_weights))[1].exp(),
        params,
        X,
        chunk_size,
        X.new_zeros(0, params.n_components),
    )


def bic(params: MixtureParams, X: Tensor) -> float:
    """Bayesian information criterion on ``X`` (n_samples, n_features); lower is better."""
    n = X.shape[0]
    return float(-2.0 * score_samples(params, X).sum()) + n_parameters(
        params.covariance_type, params.n_components, params.n_features
    ) * math.log(n)


def sample(
    params: MixtureParams, n_samples: int, *, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Draw ``n_samples`` rows: ``(X, labels)`` with shapes (n_samples, n_features), (n_samples,).

    Component counts are multinomial in the weights; each row is ``mu_k + U_k^{-T} z`` with
    ``z ~ N(0, I)``, so its covariance is ``(U_k U_k^T)^{-1}``. Random numbers are drawn on the
    CPU generator and moved to the parameters' device.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}.")
    like = params.means
    k, d = params.n_components, params.n_features
    labels = torch.multinomial(
        params.weights.detach().double().cpu(), n_samples, replacement=True, generator=generator
    )
    labels = labels.sort().values.to(like.device)
    z = torch.randn(n_samples, d, generator=generator, dtype=torch.float64).to(
        like.device, like.dtype
    )
    ct = params.covariance_type
    if ct in ("full", "tied"):
        # v = U_k^{-T} z per component: labels are sorted, so each component is a slice.
        counts = torch.bincount(labels, minlength=k).tolist()
        parts, start = [], 0
        for j, count in enumerate(counts):
            factor = params.precisions_cholesky[j] if ct == "full" else params.precisions_cholesky
            block = z[start : start + count].T
            parts.append(torch.linalg.solve_triangular(factor.T, block, upper=False).T)
            start += count
        v = torch.cat(parts)
    elif ct == "diag":
        v = z / params.precisions_cholesky[labels]
    else:
        v = z / params.precisions_cholesky[labels].unsqueeze(1)
    return params.means[labels] + v, labels
