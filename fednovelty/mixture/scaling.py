"""Per-feature moments that merge exactly, standardisation, and the affine map of a mixture.

A federation standardises its features from summable statistics: each client sends its row
count, feature means and sums of squared deviations (:func:`feature_moments`, ``2 d + 1``
numbers); adding them with Chan et al.'s pairwise update (:meth:`FeatureMoments.__add__`)
gives the pooled mean and variance exactly, in any order, without the cancellation of raw
``sum x^2`` moments. A mixture fitted on standardised rows ``z = (x - offset) / scale`` is
mapped back to the original units by :func:`affine_params` (a Gaussian stays a Gaussian
under an affine map), so a model and its log-densities are always in the user's units.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.mixture.model import MixtureParams
from fednovelty.mixture.rows import RowSource, chunks


@dataclass(frozen=True, eq=False)
class FeatureMoments:
    """Row count, per-feature mean and sum of squared deviations about that mean.

    Attributes:
        n_samples: scalar tensor, the number of rows.
        mean: (n_features,) mean of the rows (zeros when there are none).
        m2: (n_features,) ``sum_i (x_ij - mean_j)^2``.
    """

    n_samples: Tensor
    mean: Tensor
    m2: Tensor

    def __add__(self, other: FeatureMoments) -> FeatureMoments:
        """The moments of both sets of rows together (exact; Chan et al., 1979)."""
        n = self.n_samples + other.n_samples
        if float(n) == 0:
            return self
        delta = other.mean - self.mean
        share = other.n_samples / n
        mean = self.mean + delta * share
        m2 = self.m2 + other.m2 + delta.square() * self.n_samples * share
        return FeatureMoments(n, mean, m2)

    @property
    def variance(self) -> Tensor:
        """(n_features,) population variance ``m2 / n_samples`` (zeros without rows)."""
        return self.m2 / self.n_samples.clamp_min(1)

    def tensors(self) -> dict[str, Tensor]:
        return {"n_samples": self.n_samples, "mean": self.mean, "m2": self.m2}


def feature_moments(X: Tensor | RowSource) -> FeatureMoments:
    """Moments of rows ``X`` (n_samples, n_features); a client with no rows sends zeros. A
    :class:`~fednovelty.mixture.rows.RowSource`'s are its chunks' moments, merged."""
    if isinstance(X, RowSource):
        return merge_moments(feature_moments(rows) for rows in chunks(X))
    n = torch.tensor(float(X.shape[0]), dtype=X.dtype, device=X.device)
    if X.shape[0] == 0:
        zeros = X.new_zeros(X.shape[1])
        return FeatureMoments(n, zeros, zeros.clone())
    mean = X.mean(0)
    return FeatureMoments(n, mean, (X - mean).square().sum(0))


def merge_moments(moments: Iterable[FeatureMoments]) -> FeatureMoments:
    """Sum of several clients' moments (raises ``ValueError`` on an empty iterable)."""
    total = None
    for m in moments:
        total = m if total is None else total + m
    if total is None:
        raise ValueError("merge_moments needs at least one set of moments.")
    return total


def mixture_moments(params: MixtureParams, n_samples: float) -> FeatureMoments:
    """Per-feature mean and variance of the mixture distribution, as moments of
    ``n_samples`` rows: ``mean = sum_k w_k mu_k``, ``var = sum_k w_k (Sigma_k,jj + mu_kj^2)
    - mean^2``."""
    w = params.weights
    mean = w @ params.means
    cov = params.covariances
    ct = params.covariance_type
    if ct == "full":
        diag = torch.diagonal(cov, dim1=1, dim2=2)
    elif ct == "tied":
        diag = torch.diagonal(cov).expand_as(params.means)
    elif ct == "diag":
        diag = cov
    else:
        diag = cov.unsqueeze(1).expand_as(params.means)
    variance = (w @ (diag + params.means.square()) - mean.square()).clamp_min(0)
    n = torch.tensor(float(n_samples), dtype=mean.dtype, device=mean.device)
    return FeatureMoments(n, mean, variance * n)


def standardization(
    moments: FeatureMoments, covariance_type: str = "full", floor: float = 1e-12
) -> tuple[Tensor, Tensor]:
    """``(offset, scale)``, each (n_features,), that map rows to ``z = (x - offset) / scale``.

    ``offset`` is the mean and ``scale`` the standard deviation. A feature whose variance is
    below ``floor`` times ``max(1, mean^2)`` (constant up to round-off) keeps scale 1, as in
    scikit-learn's ``StandardScaler``. With ``covariance_type="spherical"`` every feature
    gets one common scale (the root mean variance of the non-constant features): per-feature
    scales would not keep spherical covariances spherical in the original units.
    """
    variance = moments.variance
    constant = variance <= floor * moments.mean.square().clamp_min(1)
    if covariance_type == "spherical":
        live = variance[~constant]
        common = live.mean().sqrt() if live.numel() else variance.new_tensor(1.0)
        return moments.mean, common.expand_as(variance).clone()
    scale = torch.where(constant, torch.ones_like(variance), variance.sqrt())
    return moments.mean, scale


def affine_params(params: MixtureParams, offset: Tensor, scale: Tensor) -> MixtureParams:
    """The mixture of ``x = offset + scale * z`` when ``z`` follows ``params``.

    Means become ``offset + scale * mu`` and covariances ``D Sigma D`` with
    ``D = diag(scale)``; precision Cholesky factors are divided row-wise by ``scale``.
    ``scale`` (n_features,) must be positive, and constant for ``spherical`` mixtures.
    """
    ct = params.covariance_type
    p = params.precisions_cholesky
    if ct in ("full", "tied"):
        p = p / scale.unsqueeze(-1)
    elif ct == "diag":
        p = p / scale
    else:
        if not bool(torch.all(scale == scale[0])):
            raise ValueError("a spherical mixture can only be rescaled by one common scale.")
        p = p / scale[0]
    return MixtureParams(params.weights, offset + params.means * scale, p, ct)
