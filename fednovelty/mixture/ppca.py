"""Probabilistic PCA pieces for a mixture fitted on principal axes (Tipping & Bishop, 1999).

A density of rows ``x`` in ``d`` dimensions made from a density of their projection
``z = (x - m) U^T`` on ``q`` orthonormal axes ``U`` (q, d) and an isotropic Gaussian on the
``d - q`` discarded directions::

    log p(x) = log p_q(z) + log N(r; 0, sigma^2 I_{d-q}),      r = (x - m) - z U

with ``sigma^2`` the mean discarded eigenvalue of the rows' covariance. It is a proper
density of ``x`` (the two parts live on orthogonal subspaces, the change of variables has
unit Jacobian), and with ``p_q`` the Gaussian ``N(0, diag(lambda_1..q))`` it is exactly the
maximum-likelihood PPCA model (scikit-learn's ``PCA.score_samples``).

:func:`choose_n_components` is the rule that picks ``q`` from the eigenvalues and the pooled
row count. Pure torch: dtype and device come from the inputs.
"""

from __future__ import annotations

import math

from torch import Tensor

#: share of the total variance the automatic rule keeps at most.
VARIANCE_SHARE = 0.9
#: pooled rows per kept axis the automatic rule asks for.
ROWS_PER_AXIS = 10.0
#: the automatic rule's ceiling on the kept axes (a full covariance in ``q`` dimensions has
#: ``q (q + 3) / 2`` parameters per component; 64 axes keep an EM round near ``N K q^2``).
MAX_AXES = 64


def residual_log_density(X: Tensor, mean: Tensor, components: Tensor, noise_variance) -> Tensor:
    """``log N(r; 0, sigma^2 I_{d-q})`` of each row's residual off the principal subspace.

    Args:
        X: rows (n_samples, d).
        mean: (d,) the rows' mean ``m``.
        components: (q, d) orthonormal principal axes ``U`` as rows, ``q <= d``.
        noise_variance: ``sigma^2 > 0``, the variance of every discarded direction (a float or
            a 0-d tensor); ignored when ``q == d``.

    Returns:
        (n_samples,) the log-density of ``r = (x - m) - ((x - m) U^T) U`` under an isotropic
        Gaussian of dimension ``d - q``; zeros when ``q == d`` (nothing is discarded).
    """
    q, d = components.shape
    centred = X - mean.to(X)
    if q == d:
        return centred.new_zeros(centred.shape[0])
    sigma2 = float(noise_variance)
    if not sigma2 > 0 or not math.isfinite(sigma2):
        raise ValueError(f"noise_variance must be a positive finite number, got {sigma2}.")
    axes = components.to(X)
    residual = centred - (centred @ axes.T) @ axes
    rest = d - q
    return -0.5 * (rest * math.log(2 * math.pi * sigma2) + residual.square().sum(1) / sigma2)


def ppca_log_likelihood(
    X: Tensor, mean: Tensor, components: Tensor, explained_variance: Tensor, noise_variance
) -> Tensor:
    """The maximum-likelihood PPCA log-density of each row (one Gaussian on ``q`` axes plus
    :func:`residual_log_density`), as ``sklearn.decomposition.PCA.score_samples``.

    Args:
        X: rows (n_samples, d).
        mean: (d,); components: (q, d) orthonormal rows; explained_variance: (q,) the
            variances ``lambda_j > 0`` along the axes; noise_variance: ``sigma^2``.

    Returns:
        (n_samples,) ``log N(x; m, U^T diag(lambda) U + sigma^2 (I - U^T U))``.
    """
    z = (X - mean.to(X)) @ components.to(X).T
    lam = explained_variance.to(X)
    gaussian = -0.5 * (
        z.shape[1] * math.log(2 * math.pi) + lam.log().sum() + (z.square() / lam).sum(1)
    )
    return gaussian + residual_log_density(X, mean, components, noise_variance)


def variance_axes(eigenvalues: Tensor, share: float = VARIANCE_SHARE) -> int:
    """The fewest leading axes whose eigenvalues hold at least ``share`` of their sum.

    Args:
        eigenvalues: (d,) covariance eigenvalues in decreasing order (negatives from
            round-off count as 0).
        share: in (0, 1].

    Returns:
        q in ``1..d``.
    """
    if not 0 < share <= 1:
        raise ValueError(f"share must be in (0, 1], got {share}.")
    values = eigenvalues.clamp_min(0.0)
    total = float(values.sum())
    if total <= 0:
        return 1
    cumulative = values.cumsum(0) / total
    reached = int((cumulative < share - 1e-12).sum()) + 1
    return min(reached, int(values.shape[0]))


def choose_n_components(
    eigenvalues: Tensor,
    n_samples: int,
    *,
    share: float = VARIANCE_SHARE,
    rows_per_axis: float = ROWS_PER_AXIS,
    max_axes: int = MAX_AXES,
) -> int:
    """The automatic number of principal axes ``q``::

        q = max(1, min(variance_axes(eigenvalues, share), floor(n_samples / rows_per_axis),
                       max_axes, d - 1))

    The variance term keeps the axes that carry the rows' structure (the rest is modelled
    by the isotropic residual). The rows term asks for ``rows_per_axis`` pooled rows per
    kept axis, so the projected covariance and the components' covariances on it are
    estimated from several rows per parameter direction (a local fit on a small client
    leans on the covariance prior, as without the front end). The ceiling bounds the cost
    of a round, ``O(N K q^2)``. ``d - 1`` leaves one discarded direction so the residual
    term exists.

    Args:
        eigenvalues: (d,) covariance eigenvalues of the pooled rows, decreasing.
        n_samples: the pooled rows the eigenvalues come from.
        share: variance share, in (0, 1]; rows_per_axis: > 0; max_axes: >= 1.

    Returns:
        q in ``1..max(1, d - 1)``.
    """
    if rows_per_axis <= 0 or max_axes < 1 or n_samples < 1:
        raise ValueError(
            "rows_per_axis must be > 0, max_axes >= 1 and n_samples >= 1, got "
            f"{rows_per_axis}, {max_axes} and {n_samples}."
        )
    d = int(eigenvalues.shape[0])
    by_rows = int(n_samples // rows_per_axis)
    q = min(variance_axes(eigenvalues, share), by_rows, int(max_axes), d - 1)
    return max(1, q)


__all__ = [
    "MAX_AXES",
    "ROWS_PER_AXIS",
    "VARIANCE_SHARE",
    "choose_n_components",
    "ppca_log_likelihood",
    "residual_log_density",
    "variance_axes",
]
