"""The prior of a variational Bayesian Gaussian mixture and scikit-learn's defaults for it.

:class:`VBPrior` holds scikit-learn's ``*_prior_`` attributes of ``BayesianGaussianMixture``:
the weights' Dirichlet distribution or truncated Dirichlet process (concentration ``alpha_0``
or ``gamma_0``) and the components' Normal-Wishart (``beta_0``, ``m_0``, ``nu_0``,
``W_0^-1``), checked on construction (:class:`InvalidPriorError` names the field and a valid
choice). :func:`prior_from_moments` fills in scikit-learn's defaults from pooled
one-component moments, so summed client statistics give the prior of the pooled rows;
:func:`default_prior` does the same from one machine's rows. :func:`wishart_pseudo_rows` is
the alternative Wishart of ``strength`` pseudo-rows at a multiple of each feature's variance.
The posterior the prior feeds is :class:`~fednovelty.mixture.variational.VBPosterior`.

All functions are pure and take dtype and device from their inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.mixture.covariance import check_covariance_type, covariance_shape
from fednovelty.mixture.em import prior_target
from fednovelty.mixture.stats import SufficientStats, stats_from_resp

WEIGHT_PRIOR_TYPES: tuple[str, ...] = ("dirichlet_process", "dirichlet_distribution")


class InvalidPriorError(ValueError):
    """A variational prior is not a proper distribution (non-positive concentration, mean
    precision or covariance; degrees of freedom <= n_features - 1; wrong shapes)."""


@dataclass(frozen=True, eq=False)
class VBPrior:
    """Prior of a Bayesian Gaussian mixture (scikit-learn's ``*_prior_`` attributes).

    Attributes:
        weight_concentration_prior_type: ``dirichlet_process`` (stick-breaking) or
            ``dirichlet_distribution``.
        weight_concentration: ``gamma_0`` (process) or ``alpha_0`` (distribution), > 0.
        mean_precision: ``beta_0`` > 0.
        mean: ``m_0``, shape (n_features,).
        degrees_of_freedom: ``nu_0`` > n_features - 1.
        covariance: ``W_0^-1`` (not normalised), shape (n_features, n_features) for
            full/tied (symmetric positive definite), (n_features,) for diag, () for
            spherical (positive).
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.

    Raises:
        InvalidPriorError: on construction, if any of the above does not hold.
    """

    weight_concentration_prior_type: str
    weight_concentration: float
    mean_precision: float
    mean: Tensor
    degrees_of_freedom: float
    covariance: Tensor
    covariance_type: str

    def __post_init__(self) -> None:
        check_covariance_type(self.covariance_type)
        if self.weight_concentration_prior_type not in WEIGHT_PRIOR_TYPES:
            raise InvalidPriorError(
                f"weight_concentration_prior_type must be one of {WEIGHT_PRIOR_TYPES}, "
                f"got {self.weight_concentration_prior_type!r}."
            )
        for name in ("weight_concentration", "mean_precision"):
            value = float(getattr(self, name))
            if not (value > 0 and math.isfinite(value)):
                raise InvalidPriorError(
                    f"{name} prior must be a finite number > 0, got {value}; use e.g. "
                    f"1 / n_components for the weights and 1.0 for the mean precision."
                )
        if self.mean.ndim != 1 or not bool(torch.isfinite(self.mean).all()):
            raise InvalidPriorError(
                f"mean prior must be a finite (n_features,) tensor, got shape "
                f"{tuple(self.mean.shape)}."
            )
        d = self.mean.shape[0]
        dof = float(self.degrees_of_freedom)
        if not (dof > d - 1.0 and math.isfinite(dof)):
            raise InvalidPriorError(
                f"degrees_of_freedom prior must be > n_features - 1 = {d - 1}, got {dof}; "
                f"use n_features ({d}) or more."
            )
        expected = covariance_shape(self.covariance_type, 1, d)[1:]
        if self.covariance_type == "tied":
            expected = (d, d)
        if tuple(self.covariance.shape) != expected:
            raise InvalidPriorError(
                f"covariance prior for covariance_type={self.covariance_type!r} must have "
                f"shape {expected}, got {tuple(self.covariance.shape)}."
            )
        if self.covariance_type in ("full", "tied"):
            cov = self.covariance
            symmetric = torch.allclose(cov, cov.T, rtol=0, atol=1e-12 * float(cov.abs().max()))
            if not symmetric or int(torch.linalg.cholesky_ex(cov).info) != 0:
                raise InvalidPriorError(
                    "covariance prior must be symmetric positive definite; e.g. a multiple "
                    "of the data covariance or of the identity."
                )
        elif not bool((self.covariance > 0).all()) or not bool(
            torch.isfinite(self.covariance).all()
        ):
            raise InvalidPriorError("covariance prior must be finite and > 0.")

    @property
    def n_features(self) -> int:
        return self.mean.shape[0]

    def tensors(self) -> dict[str, Tensor]:
        """The prior as tensors (what a server broadcasts once)."""
        like = {"dtype": self.mean.dtype, "device": self.mean.device}
        return {
            "weight_concentration": torch.tensor(float(self.weight_concentration), **like),
            "mean_precision": torch.tensor(float(self.mean_precision), **like),
            "mean": self.mean,
            "degrees_of_freedom": torch.tensor(float(self.degrees_of_freedom), **like),
            "covariance": self.covariance,
        }


#: smallest eigenvalue of the default covariance prior, relative to its mean variance: a
#: singular or near-singular one (a constant or collinear feature) is lifted to it.
PRIOR_RIDGE = 1e-6


def _positive_definite(cov: Tensor) -> Tensor:
    """``cov`` (d, d) as it is when its smallest eigenvalue is at least ``PRIOR_RIDGE``
    times its mean variance (scikit-learn's default prior); otherwise (a constant or
    collinear feature, where scikit-learn's prior fails or its posterior's Cholesky
    factorisation does) with the diagonal raised until it is."""
    scale = float(torch.diagonal(cov).clamp_min(0).mean())
    floor = PRIOR_RIDGE * (scale if scale > 0 else 1.0)
    smallest = float(torch.linalg.eigvalsh(cov).min())
    if smallest >= floor:
        return cov
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    return cov + (floor - min(smallest, 0.0)) * eye


def wishart_pseudo_rows(
    variance: Tensor, strength: float, prior_scale: float, covariance_type: str
) -> tuple[float, Tensor]:
    """The Wishart prior of ``strength`` pseudo-rows whose covariance is ``prior_scale``
    times each feature's variance: ``(nu_0, W_0^-1)`` with ``nu_0 = strength`` and
    ``W_0^-1 = strength * prior_scale * diag(variance)``.

    It is :class:`~fednovelty.mixture.stats.CovariancePrior` on the Wishart's own terms: a
    component's posterior covariance ``W_k^-1 / nu_k`` is ``(n_k S_k + strength * psi +
    mean term) / (n_k + strength)`` with ``psi = prior_scale * diag(variance)``, so a
    component backed by few rows is pulled towards ``psi`` and one backed by thousands
    keeps its own shape. A feature without spread (variance 0) gets the mean target of the
    others (:func:`~fednovelty.mixture.em.prior_target`).

    Args:
        variance: (n_features,) each feature's pooled variance (>= 0).
        strength: pseudo-rows, > n_features - 1 (the Wishart's degrees of freedom).
        prior_scale: > 0.
        covariance_type: the shape of ``W_0^-1``: (d, d) for full and tied, (d,) for diag,
            () for spherical (the mean of the targets).
    """
    target = prior_target(variance, torch.ones_like(variance), prior_scale)
    scaled = float(strength) * target
    covariance = {
        "full": lambda: torch.diag(scaled),
        "tied": lambda: torch.diag(scaled),
        "diag": lambda: scaled,
        "spherical": lambda: scaled.mean(),
    }[covariance_type]()
    return float(strength), covariance


def prior_from_moments(
    moments: SufficientStats,
    n_components: int,
    covariance_type: str,
    *,
    weight_concentration_prior_type: str = "dirichlet_process",
    weight_concentration_prior: float | None = None,
    mean_precision_prior: float | None = None,
    mean_prior: Tensor | None = None,
    degrees_of_freedom_prior: float | None = None,
    covariance_prior: Tensor | float | None = None,
    prior_strength: float | None = None,
    prior_scale: float = 1.0,
) -> VBPrior:
    """scikit-learn's defaults for every prior not given, from pooled moments.

    Args:
        moments: one-component ``full`` statistics of all rows (``stats_from_resp(X,
            ones, "full", shift)``, summed over clients): the defaults need only the row
            count, mean and covariance.
        n_components: K; the default concentration is ``1 / K``.
        covariance_type: of the mixture.
        weight_concentration_prior_type, ...: scikit-learn's arguments; ``None`` means
            its default (``1/K``, ``1``, the data mean, ``n_features``, and the data
            covariance with ``ddof=1``: its diagonal for diag, the mean of the diagonal
            for spherical; a singular one, e.g. with a constant feature, gets a small ridge:
            :func:`_positive_definite`).
        prior_strength, prior_scale: with ``prior_strength`` set, the defaults of
            ``degrees_of_freedom_prior`` and ``covariance_prior`` are
            :func:`wishart_pseudo_rows` of the data variances (``ddof=1``) instead of
            scikit-learn's; a given ``degrees_of_freedom_prior`` or ``covariance_prior``
            still wins. ``None`` keeps scikit-learn's defaults.

    Raises:
        InvalidPriorError: a given prior is invalid.
        ValueError: ``moments`` is not one-component full statistics of >= 2 rows.
    """
    check_covariance_type(covariance_type)
    if moments.covariance_type != "full" or moments.n_components != 1:
        raise ValueError(
            "prior_from_moments needs one-component 'full' statistics of all rows, e.g. "
            "stats_from_resp(X, ones((n, 1)), 'full', shift)."
        )
    n = moments.counts[0]
    if float(n) < 2:
        raise ValueError(f"The default prior needs >= 2 rows, got {float(n):g}.")
    like = {"dtype": moments.sums.dtype, "device": moments.sums.device}
    offset = moments.sums[0] / n
    d = moments.n_features
    if prior_strength is not None:
        centered = moments.second[0] - n * torch.outer(offset, offset)
        variance = (torch.diagonal(centered) / (n - 1)).clamp_min(0)
        dof, pseudo = wishart_pseudo_rows(variance, prior_strength, prior_scale, covariance_type)
        degrees_of_freedom_prior = (
            dof if degrees_of_freedom_prior is None else degrees_of_freedom_prior
        )
        covariance_prior = pseudo if covariance_prior is None else covariance_prior
    if covariance_prior is None:
        cov = (moments.second[0] - n * torch.outer(offset, offset)) / (n - 1)
        cov = _positive_definite(0.5 * (cov + cov.T))
        covariance_prior = {
            "full": cov,
            "tied": cov,
            "diag": torch.diagonal(cov).clone(),
            "spherical": torch.diagonal(cov).mean(),
        }[covariance_type]
    covariance_prior = torch.as_tensor(covariance_prior, **like)
    return VBPrior(
        weight_concentration_prior_type=weight_concentration_prior_type,
        weight_concentration=(
            1.0 / n_components
            if weight_concentration_prior is None
            else float(weight_concentration_prior)
        ),
        mean_precision=1.0 if mean_precision_prior is None else float(mean_precision_prior),
        mean=moments.shift + offset if mean_prior is None else torch.as_tensor(mean_prior, **like),
        degrees_of_freedom=(
            float(d) if degrees_of_freedom_prior is None else float(degrees_of_freedom_prior)
        ),
        covariance=covariance_prior,
        covariance_type=covariance_type,
    )


def default_prior(X: Tensor, n_components: int, covariance_type: str, **kwargs) -> VBPrior:
    """:func:`prior_from_moments` on the rows ``X`` (n_samples, n_features) of one machine."""
    ones = torch.ones(X.shape[0], 1, dtype=X.dtype, device=X.device)
    return prior_from_moments(
        stats_from_resp(X, ones, "full", X.mean(0)), n_components, covariance_type, **kwargs
    )
