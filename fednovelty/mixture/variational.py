"""Variational Bayes for Gaussian mixtures from summable statistics.

The variational posterior is scikit-learn's ``BayesianGaussianMixture`` term for term, so a
fit here and a fit there from the same start follow the same path to round-off:

* weights: a Dirichlet distribution (``dirichlet_distribution``, concentrations
  ``alpha_k``) or a truncated Dirichlet process in stick-breaking form
  (``dirichlet_process``, one Beta ``(a_k, b_k)`` per stick);
* means and precisions: Normal-Wishart, ``mu_k | Lambda_k ~ N(m_k, (beta_k Lambda_k)^-1)``,
  ``Lambda_k ~ W(W_k, nu_k)``. As in scikit-learn, ``covariances`` holds the *normalised*
  ``W_k^-1 / nu_k`` (the inverse of the expected precision) and ``precisions_cholesky``
  its Cholesky-of-precision factor. ``diag`` and ``spherical`` use a Wishart whose scale
  matrix is diagonal (scalar times identity), with scikit-learn's expectations of
  ``log det Lambda_k`` for a ``d``-dimensional Wishart; ``tied`` has one Wishart shared by
  every component, with ``nu = nu_0 + N / K``.

The M-step (:func:`vb_m_step`) needs only counts, first and second moments, the
:class:`~fednovelty.mixture.stats.SufficientStats` that federated EM already sums: it turns
them into scikit-learn's ``nk, xk, Sk`` with the project's :func:`~fednovelty.mixture.stats.m_step`
(whose ``10 * eps`` on the counts and ``reg_covar`` on ``Sk`` are scikit-learn's) and then
applies the conjugate update. Statistics of disjoint rows add, so the posterior from summed
client statistics is the posterior from the pooled rows: federated VB under one shared prior
is exact.

The E-step is a Gaussian-mixture E-step in disguise: scikit-learn's ``_estimate_log_prob``
differs from ``log N(x | m_k, covariances_k)`` only by a per-component constant, so
``E[log pi_k] + E[log N(x | mu_k, Lambda_k)]`` = ``log N(x | m_k, covariances_k) + c_k``
with ``c_k`` from :func:`vb_log_offset`, and the project's chunked ``e_step_stats`` kernel
runs it unchanged (:func:`vb_e_step_stats`).

The ELBO (:func:`vb_lower_bound`) is scikit-learn's ``_compute_lower_bound``: the entropy of
the responsibilities minus the normalisers of the posterior (constants dropped; it is only
meaningful right after an M-step). The entropy ``-sum_ik r_ik log r_ik`` is recovered from
the statistics (:func:`resp_entropy_from_stats`): ``log r_ik = w_ik - log p(x_i)``, where
``sum_i log p(x_i)`` is the statistics' ``log_likelihood`` and ``sum_ik r_ik w_ik`` is linear
in the counts, first and second moments. So clients send nothing beyond the statistics.

Grouped rows: :func:`fit_vb_groups` runs the same iterations on groups of rows known only by
their statistics (a client's local components), every row of a group taking the group's
responsibilities (:func:`vb_group_log_prob`: the E-step's log-weights averaged over the group,
a function of its count, first and second moments); its bound is a lower bound on the rows'
ELBO under those responsibilities, and with one row per group it is :func:`fit_vb`.

Scoring: :func:`vb_predictive_log_prob` is the posterior predictive, a mixture of
multivariate Student-t densities (Bishop, PRML 10.81) weighted by the expected weights
(``weights_`` of scikit-learn, which for the truncated Dirichlet process is renormalised);
:func:`vb_plugin_params` gives the plug-in Gaussian mixture (``weights_``, ``means_``,
``covariances_``). scikit-learn's ``score_samples`` is neither: it returns the E-step
normaliser ``log sum_k exp(E[log pi_k] + E[log N(x | k)])`` (``vb_log_resp(X, posterior)[0]``),
which is not a normalised density.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from fednovelty.mixture.covariance import (
    check_covariance_type,
    covariance_shape,
    log_det_cholesky,
    precisions_cholesky_from_covariances,
)
from fednovelty.mixture.density import (
    default_chunk_size,
    log_gaussian_prob,
    log_responsibilities,
    logsumexp_rows,
)
from fednovelty.mixture.em import prior_target
from fednovelty.mixture.model import MixtureParams
from fednovelty.mixture.stats import SufficientStats, e_step_stats, m_step, stats_from_resp

WEIGHT_PRIOR_TYPES: tuple[str, ...] = ("dirichlet_process", "dirichlet_distribution")


class InvalidPriorError(ValueError):
    """A variational prior is not a proper distribution (non-positive concentration, mean
    precision or covariance; degrees of freedom <= n_features - 1; wrong shapes)."""


# --------------------------------------------------------------------------- prior


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


# --------------------------------------------------------------------------- posterior


@dataclass(frozen=True)
class VBPosterior:
    """Variational posterior of a Bayesian Gaussian mixture (scikit-learn's fitted
    ``weight_concentration_``, ``mean_precision_``, ``means_``, ``degrees_of_freedom_``,
    ``covariances_``, ``precisions_cholesky_``).

    Attributes:
        weight_concentration: Dirichlet ``alpha``, shape (n_components,); or, for the
            Dirichlet process, the Beta parameters of the sticks stacked, shape
            (2, n_components) (scikit-learn's tuple).
        mean_precision: ``beta``, shape (n_components,).
        means: ``m``, shape (n_components, n_features).
        degrees_of_freedom: ``nu``, shape (n_components,), or () for ``tied``.
        covariances: ``W^-1 / nu``, shape per ``covariance_type``.
        precisions_cholesky: Cholesky-of-precision factors of ``covariances``.
        covariance_type: ``full``, ``tied``, ``diag`` or ``spherical``.
        weight_concentration_prior_type: ``dirichlet_process`` or ``dirichlet_distribution``.
    """

    weight_concentration: Tensor
    mean_precision: Tensor
    means: Tensor
    degrees_of_freedom: Tensor
    covariances: Tensor
    precisions_cholesky: Tensor
    covariance_type: str
    weight_concentration_prior_type: str

    @property
    def n_components(self) -> int:
        return self.means.shape[0]

    @property
    def n_features(self) -> int:
        return self.means.shape[1]

    @property
    def weights(self) -> Tensor:
        """Expected mixture weights, (n_components,) (scikit-learn's ``weights_``; for the
        truncated Dirichlet process the expected stick lengths, renormalised)."""
        wc = self.weight_concentration
        if self.weight_concentration_prior_type == "dirichlet_process":
            a, b = wc[0], wc[1]
            total = a + b
            sticks = torch.cat([wc.new_ones(1), torch.cumprod(b / total, 0)[:-1]])
            weights = a / total * sticks
            return weights / weights.sum()
        return wc / wc.sum()

    def tensors(self) -> dict[str, Tensor]:
        """The posterior's tensors by name (what a server broadcasts)."""
        return {
            "weight_concentration": self.weight_concentration,
            "mean_precision": self.mean_precision,
            "means": self.means,
            "degrees_of_freedom": self.degrees_of_freedom,
            "covariances": self.covariances,
            "precisions_cholesky": self.precisions_cholesky,
        }


def _wishart_scale(
    prior: VBPrior, nk: Tensor, xk: Tensor, sk: Tensor, mean_precision: Tensor
) -> tuple[Tensor, Tensor]:
    """scikit-learn's ``_estimate_wishart_*``: ``(degrees_of_freedom, covariances)``."""
    ct = prior.covariance_type
    beta0 = float(prior.mean_precision)
    nu0 = float(prior.degrees_of_freedom)
    cov0 = prior.covariance.to(xk.dtype)
    diff = xk - prior.mean.to(xk.dtype)
    k = nk.shape[0]
    if ct == "full":
        dof = nu0 + nk
        shrink = (nk * beta0 / mean_precision).view(-1, 1, 1)
        cov = cov0 + nk.view(-1, 1, 1) * sk + shrink * (diff.unsqueeze(2) * diff.unsqueeze(1))
        return dof, cov / dof.view(-1, 1, 1)
    if ct == "tied":
        dof = nu0 + nk.sum() / k
        cov = cov0 + sk * nk.sum() / k + beta0 / k * (((nk / mean_precision) * diff.T) @ diff)
        return dof, cov / dof
    dof = nu0 + nk
    if ct == "diag":
        cov = cov0 + nk.unsqueeze(1) * (sk + (beta0 / mean_precision).unsqueeze(1) * diff.square())
        return dof, cov / dof.unsqueeze(1)
    cov = cov0 + nk * (sk + beta0 / mean_precision * diff.square().mean(1))
    return dof, cov / dof


def vb_m_step(stats: SufficientStats, prior: VBPrior, reg_covar: float = 1e-6) -> VBPosterior:
    """Variational M-step: the posterior from (summed) statistics.

    scikit-learn's ``BayesianGaussianMixture._m_step``: ``nk`` are the counts plus
    ``10 * eps``, ``xk`` the weighted means and ``Sk`` the weighted covariances plus
    ``reg_covar`` (all from :func:`~fednovelty.mixture.stats.m_step`); then the
    Dirichlet (process) and Normal-Wishart updates.

    Args:
        stats: E-step statistics (summed over clients), any shift.
        prior: the shared prior; its ``covariance_type`` must be the statistics'.
        reg_covar: added to the diagonal of ``Sk``.

    Returns:
        The posterior.

    Raises:
        ValueError: covariance types or widths differ.
        SingularCovarianceError: a covariance is not positive definite.
    """
    ct = stats.covariance_type
    if prior.covariance_type != ct:
        raise ValueError(
            f"Prior for covariance_type={prior.covariance_type!r} given statistics of "
            f"covariance_type={ct!r}."
        )
    if prior.n_features != stats.n_features:
        raise ValueError(
            f"Prior has {prior.n_features} features, statistics have {stats.n_features}."
        )
    eps = torch.finfo(stats.counts.dtype).eps
    nk = stats.counts + 10 * eps
    _, xk, sk = m_step(stats, reg_covar)
    gamma0 = float(prior.weight_concentration)
    if prior.weight_concentration_prior_type == "dirichlet_process":
        tail = torch.cat([torch.flip(torch.cumsum(torch.flip(nk, [0]), 0), [0])[1:], nk[:1] * 0])
        weight_concentration = torch.stack([1.0 + nk, gamma0 + tail])
    else:
        weight_concentration = gamma0 + nk
    beta0 = float(prior.mean_precision)
    mean_precision = beta0 + nk
    means = (beta0 * prior.mean.to(xk.dtype) + nk.unsqueeze(1) * xk) / mean_precision.unsqueeze(1)
    dof, covariances = _wishart_scale(prior, nk, xk, sk, mean_precision)
    return VBPosterior(
        weight_concentration=weight_concentration,
        mean_precision=mean_precision,
        means=means,
        degrees_of_freedom=dof,
        covariances=covariances,
        precisions_cholesky=precisions_cholesky_from_covariances(covariances, ct),
        covariance_type=ct,
        weight_concentration_prior_type=prior.weight_concentration_prior_type,
    )


# --------------------------------------------------------------------------- E-step


def expected_log_weights(posterior: VBPosterior) -> Tensor:
    """``E[log pi_k]`` under the posterior, (n_components,) (scikit-learn's
    ``_estimate_log_weights``)."""
    wc = posterior.weight_concentration
    if posterior.weight_concentration_prior_type == "dirichlet_process":
        digamma_sum = torch.digamma(wc[0] + wc[1])
        digamma_a, digamma_b = torch.digamma(wc[0]), torch.digamma(wc[1])
        before = torch.cat([wc.new_zeros(1), torch.cumsum(digamma_b - digamma_sum, 0)[:-1]])
        return digamma_a - digamma_sum + before
    return torch.digamma(wc) - torch.digamma(wc.sum())


def _log_prob_offset(posterior: VBPosterior) -> Tensor:
    """``E[log N(x | mu_k, Lambda_k)] - log N(x | means_k, covariances_k)``: a constant per
    component ((n_components,), or () for tied), scikit-learn's
    ``-0.5 d log nu + 0.5 (E[log det Lambda] - d log det(W) ... - d / beta)``."""
    d = posterior.n_features
    dof = posterior.degrees_of_freedom
    j = torch.arange(d, dtype=dof.dtype, device=dof.device)
    log_lambda = d * math.log(2.0) + torch.digamma(0.5 * (dof.unsqueeze(-1) - j)).sum(-1)
    return -0.5 * d * dof.log() + 0.5 * (log_lambda - d / posterior.mean_precision)


def vb_log_offset(posterior: VBPosterior) -> Tensor:
    """Per-component constant ``c_k`` with ``E[log pi_k] + E[log N(x | k)] = log N(x |
    means_k, covariances_k) + c_k``, shape (n_components,): the ``log_weights`` to give a
    Gaussian E-step kernel to run the variational E-step."""
    return expected_log_weights(posterior) + _log_prob_offset(posterior)


def vb_log_prob(X: Tensor, posterior: VBPosterior) -> Tensor:
    """``E[log N(x_i | mu_k, Lambda_k)]`` (up to scikit-learn's dropped constant), shape
    (n_samples, n_components) (scikit-learn's ``_estimate_log_prob``)."""
    return log_gaussian_prob(
        X, posterior.means, posterior.precisions_cholesky, posterior.covariance_type
    ) + _log_prob_offset(posterior)


def vb_log_resp(X: Tensor, posterior: VBPosterior) -> tuple[Tensor, Tensor]:
    """The variational E-step on rows ``X`` (n_samples, n_features).

    Returns:
        ``(log_prob_norm, log_resp)``, shapes (n_samples,) and (n_samples, n_components)
        (scikit-learn's ``_estimate_log_prob_resp``).
    """
    return log_responsibilities(vb_log_prob(X, posterior) + expected_log_weights(posterior))


def vb_e_step_stats(
    X: Tensor, posterior: VBPosterior, shift: Tensor, chunk_size: int | None = None
) -> SufficientStats:
    """Variational E-step folded into summable statistics (the chunked Gaussian kernel
    with :func:`vb_log_offset` as log weights). ``log_likelihood`` is
    ``sum_i log_prob_norm_i``."""
    return e_step_stats(
        X,
        vb_log_offset(posterior),
        posterior.means,
        posterior.precisions_cholesky,
        posterior.covariance_type,
        shift,
        chunk_size,
    )


# --------------------------------------------------------------------------- ELBO


def _weighted_quadratic(stats: SufficientStats, posterior: VBPosterior) -> Tensor:
    """``sum_i r_ik (x_i - m_k)^T P_k (x_i - m_k)`` per component, (n_components,), from
    the statistics (``P_k`` the precision of ``covariances_k``)."""
    ct = stats.covariance_type
    U = posterior.precisions_cholesky
    m = posterior.means - stats.shift  # (K, d), about the shift
    n, s, S = stats.counts, stats.sums, stats.second
    if ct == "full":
        P = U @ U.transpose(-1, -2)
        ms = torch.einsum("kd,kd->k", m, torch.einsum("kde,ke->kd", P, s))
        mm = torch.einsum("kd,kd->k", m, torch.einsum("kde,ke->kd", P, m))
        return torch.einsum("kde,ked->k", P, S) - 2 * ms + n * mm
    if ct == "tied":
        P = U @ U.T
        ms = ((m @ P) * s).sum(1)
        mm = ((m @ P) * m).sum(1)
        # The second moment is only known summed over components: return the sum in slot 0.
        total = (P * S).sum() - 2 * ms.sum() + (n * mm).sum()
        return torch.cat([total.reshape(1), total.new_zeros(stats.n_components - 1)])
    if ct == "diag":
        P = U.square()
        return (P * (S - 2 * m * s + n.unsqueeze(1) * m.square())).sum(1)
    P = U.square()
    return P * (S - 2 * (m * s).sum(1) + n * m.square().sum(1))


def resp_entropy_from_stats(stats: SufficientStats, posterior: VBPosterior) -> Tensor:
    """``-sum_ik r_ik log r_ik`` of the E-step that produced ``stats`` under ``posterior``
    (``stats`` from :func:`vb_e_step_stats`), shape ().

    ``log r_ik = w_ik - log p(x_i)`` with ``w_ik = c_k + log det U_k - d/2 log 2 pi -
    q_ik / 2``, so the entropy is ``sum_i log p(x_i) - sum_k [n_k (c_k + log det U_k -
    d/2 log 2 pi) - Q_k / 2]``, ``Q_k`` the weighted quadratic form from the moments.
    Exact up to round-off of order ``eps`` times ``sum_k Q_k``.
    """
    d = stats.n_features
    log_det = log_det_cholesky(posterior.precisions_cholesky, posterior.covariance_type, d)
    const = vb_log_offset(posterior) + log_det - 0.5 * d * math.log(2 * math.pi)
    expected = (stats.counts * const).sum() - 0.5 * _weighted_quadratic(stats, posterior).sum()
    return stats.log_likelihood - expected


def resp_entropy(log_resp: Tensor) -> Tensor:
    """``-sum_ik r_ik log r_ik`` from log-responsibilities (n_samples, n_components)."""
    return -(log_resp.exp() * log_resp).sum()


def _log_wishart_norm(dof: Tensor, log_det_precisions_chol: Tensor, n_features: int) -> Tensor:
    """scikit-learn's ``_log_wishart_norm`` (without its ``log pi`` term)."""
    j = torch.arange(n_features, dtype=dof.dtype, device=dof.device)
    return -(
        dof * log_det_precisions_chol
        + dof * n_features * 0.5 * math.log(2.0)
        + torch.lgamma(0.5 * (dof.unsqueeze(-1) - j)).sum(-1)
    )


def vb_lower_bound(posterior: VBPosterior, entropy: Tensor) -> Tensor:
    """scikit-learn's ``_compute_lower_bound`` (its ELBO up to constants), shape ().

    Args:
        posterior: the posterior right after the M-step.
        entropy: ``-sum_ik r_ik log r_ik`` of the E-step that fed that M-step
            (:func:`resp_entropy_from_stats` or :func:`resp_entropy`).
    """
    d = posterior.n_features
    dof = posterior.degrees_of_freedom
    log_det = (
        log_det_cholesky(posterior.precisions_cholesky, posterior.covariance_type, d)
        - 0.5 * d * dof.log()
    )
    if posterior.covariance_type == "tied":
        log_wishart = posterior.n_components * _log_wishart_norm(dof, log_det, d)
    else:
        log_wishart = _log_wishart_norm(dof, log_det, d).sum()
    wc = posterior.weight_concentration
    if posterior.weight_concentration_prior_type == "dirichlet_process":
        a, b = wc[0], wc[1]
        log_norm_weight = -(torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)).sum()
    else:
        log_norm_weight = torch.lgamma(wc.sum()) - torch.lgamma(wc).sum()
    return entropy - log_wishart - log_norm_weight - 0.5 * d * posterior.mean_precision.log().sum()


# --------------------------------------------------------------------------- scoring


def vb_plugin_params(posterior: VBPosterior) -> MixtureParams:
    """The plug-in Gaussian mixture (expected weights, ``means``, ``covariances``:
    scikit-learn's ``weights_``, ``means_``, ``covariances_``).

    Note that scikit-learn's ``BayesianGaussianMixture.score_samples`` is *not* this
    density: it returns the E-step normaliser ``log sum_k exp(E[log pi_k] + E[log N(x |
    k)])`` (``vb_log_resp(X, posterior)[0]`` here), a lower bound that does not integrate
    to one."""
    return MixtureParams(
        posterior.weights,
        posterior.means,
        posterior.precisions_cholesky,
        posterior.covariance_type,
    )


def _mahalanobis(X: Tensor, means: Tensor, precisions_cholesky: Tensor, ct: str) -> Tensor:
    """``(x_i - m_k)^T P_k (x_i - m_k)``, (n_rows, n_components)."""
    diff = X.unsqueeze(1) - means.unsqueeze(0)  # (n, K, d)
    if ct == "full":
        return torch.einsum("nkd,kde->nke", diff, precisions_cholesky).square().sum(-1)
    if ct == "tied":
        return (diff @ precisions_cholesky).square().sum(-1)
    if ct == "diag":
        return (diff * precisions_cholesky).square().sum(-1)
    return diff.square().sum(-1) * precisions_cholesky.square()


def vb_predictive_components(posterior: VBPosterior) -> tuple[Tensor, Tensor, Tensor]:
    """The Student-t components of the posterior predictive.

    Component ``k`` is ``St(x | m_k, Sigma_k, v_k)`` with ``v_k = nu_k + 1 - d`` and
    ``Sigma_k = covariances_k * nu_k (1 + beta_k) / (v_k beta_k)`` (Bishop 10.81 with
    ``W_k^-1 = nu_k covariances_k``; for diag/spherical the Wishart has a diagonal scale).

    Returns:
        ``(dof, scale_factor, log_det_scale)``: ``v_k``, the factor ``f_k`` with
        ``Sigma_k = f_k covariances_k`` and ``log det Sigma_k``, each (n_components,).
    """
    d = posterior.n_features
    k = posterior.n_components
    nu = posterior.degrees_of_freedom.expand(k)
    beta = posterior.mean_precision
    t_dof = nu + 1 - d
    factor = nu * (1 + beta) / (t_dof * beta)
    log_det_cov = -2 * log_det_cholesky(
        posterior.precisions_cholesky, posterior.covariance_type, d
    ).expand(k)
    return t_dof, factor, log_det_cov + d * factor.log()


def vb_predictive_log_prob(
    X: Tensor, posterior: VBPosterior, chunk_size: int | None = None
) -> Tensor:
    """Log posterior predictive density ``log p(x_i | data)`` of each row, (n_samples,):
    ``log sum_k E[pi_k] St(x_i | m_k, Sigma_k, v_k)`` (see
    :func:`vb_predictive_components`), exact for the factorised posterior since the weights
    are independent of the component parameters."""
    d = posterior.n_features
    t_dof, factor, log_det = vb_predictive_components(posterior)
    log_norm = (
        torch.lgamma(0.5 * (t_dof + d))
        - torch.lgamma(0.5 * t_dof)
        - 0.5 * d * (t_dof.log() + math.log(math.pi))
        - 0.5 * log_det
        + posterior.weights.log()
    )
    ct = posterior.covariance_type
    step = chunk_size or default_chunk_size(posterior.n_components, d)
    out = []
    for start in range(0, X.shape[0], step):
        q = _mahalanobis(
            X[start : start + step], posterior.means, posterior.precisions_cholesky, ct
        )
        out.append(logsumexp_rows(log_norm - 0.5 * (t_dof + d) * torch.log1p(q / (factor * t_dof))))
    return torch.cat(out) if out else X.new_zeros(0)


def effective_n_components(posterior: VBPosterior, threshold: float = 1e-2) -> int:
    """Number of components whose expected weight exceeds ``threshold`` (the rest are
    pruned by the prior)."""
    return int((posterior.weights > threshold).sum())


def active_components(posterior: VBPosterior, threshold: float = 1e-2) -> Tensor:
    """Boolean mask (n_components,) of the components counted by
    :func:`effective_n_components`."""
    return posterior.weights > threshold


# --------------------------------------------------------------------------- local loop


@dataclass(frozen=True)
class VBResult:
    """Outcome of a variational EM run.

    Attributes:
        posterior: final posterior (after the last M-step).
        n_iter: iterations run.
        converged: whether the ELBO changed by less than ``tol``.
        lower_bounds: the ELBO after each M-step (scikit-learn's ``lower_bounds_``).
    """

    posterior: VBPosterior
    n_iter: int
    converged: bool
    lower_bounds: list[float]


def vb_step(
    X: Tensor,
    posterior: VBPosterior,
    prior: VBPrior,
    reg_covar: float = 1e-6,
    chunk_size: int | None = None,
) -> tuple[VBPosterior, Tensor]:
    """One variational EM iteration on ``X``: E-step statistics under ``posterior``, the
    M-step, and the ELBO (scikit-learn's order). Returns ``(new posterior, ELBO)``."""
    shift = posterior.weights @ posterior.means
    stats = vb_e_step_stats(X, posterior, shift, chunk_size)
    entropy = resp_entropy_from_stats(stats, posterior)
    new = vb_m_step(stats, prior, reg_covar)
    return new, vb_lower_bound(new, entropy)


def fit_vb(
    X: Tensor,
    init: VBPosterior,
    prior: VBPrior,
    *,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    chunk_size: int | None = None,
) -> VBResult:
    """Variational EM from an initial posterior (scikit-learn's loop and stopping rule:
    stop when ``|ELBO_t - ELBO_{t-1}| < tol``).

    ``init`` is typically ``vb_m_step(stats_from_resp(X, one_hot(labels), ...), prior)``,
    scikit-learn's ``_initialize``.
    """
    posterior = init
    lower_bounds: list[float] = []
    previous = -float("inf")
    converged = False
    for _ in range(max_iter):
        posterior, elbo = vb_step(X, posterior, prior, reg_covar, chunk_size)
        lower_bounds.append(float(elbo))
        if abs(lower_bounds[-1] - previous) < tol:
            converged = True
            break
        previous = lower_bounds[-1]
    return VBResult(posterior, len(lower_bounds), converged, lower_bounds)


# --------------------------------------------------------------------------- grouped rows


def _pairwise_quadratic(groups: SufficientStats, posterior: VBPosterior) -> Tensor:
    """``sum_i r_ig (x_i - m_k)^T P_k (x_i - m_k)`` for every group ``g`` of ``groups``
    and every component ``k`` of ``posterior``, (n_groups, n_components), from the groups'
    counts, first and second moments (``P_k`` the precision of ``covariances_k``; full,
    diag or spherical)."""
    ct = groups.covariance_type
    U = posterior.precisions_cholesky
    m = posterior.means - groups.shift  # (K, d), about the shift
    if ct == "full":
        P = U @ U.transpose(-1, -2)
        Pm = torch.einsum("kde,ke->kd", P, m)
        trace = torch.einsum("kde,ged->gk", P, groups.second)
    elif ct == "diag":
        P = U.square()
        Pm = P * m
        trace = groups.second @ P.T
    else:
        P = U.square()
        Pm = P.unsqueeze(1) * m
        trace = groups.second.unsqueeze(1) * P
    n = groups.counts.unsqueeze(1)
    return trace - 2 * groups.sums @ Pm.T + n * (m * Pm).sum(1)


def _check_grouped(groups: SufficientStats) -> None:
    if groups.covariance_type not in ("full", "diag", "spherical"):
        raise ValueError(
            "grouped rows need second moments per group: covariance_type 'full', 'diag' or "
            f"'spherical', got {groups.covariance_type!r}."
        )


def vb_group_log_prob(groups: SufficientStats, posterior: VBPosterior) -> Tensor:
    """``E[log pi_k] + E[log N(x | mu_k, Lambda_k)]`` averaged over each group's rows,
    (n_groups, n_components): the variational E-step's log-weights when every row of a
    group must take the group's responsibilities.

    Args:
        groups: one "component" per group of rows (its count, first and second moments:
            e.g. a client's local components), full, diag or spherical, every count > 0.
        posterior: of the same covariance type and width.
    """
    _check_grouped(groups)
    d = groups.n_features
    log_det = log_det_cholesky(posterior.precisions_cholesky, posterior.covariance_type, d)
    const = vb_log_offset(posterior) + log_det - 0.5 * d * math.log(2 * math.pi)
    quadratic = _pairwise_quadratic(groups, posterior)
    return const - 0.5 * quadratic / groups.counts.unsqueeze(1)


def grouped_stats(groups: SufficientStats, resp: Tensor) -> SufficientStats:
    """Statistics of the rows when group ``g``'s rows take responsibilities ``resp[g]``
    ((n_groups, n_components), rows summing to one): ``sum_g resp_gk`` times the group's
    count, first and second moments."""
    ct = groups.covariance_type
    if ct == "full":
        second = torch.einsum("gk,gde->kde", resp, groups.second)
    else:
        second = resp.T @ groups.second
    counts = resp.T @ groups.counts
    return SufficientStats(
        counts=counts,
        sums=resp.T @ groups.sums,
        second=second,
        shift=groups.shift,
        log_likelihood=counts.new_zeros(()),
        n_samples=groups.counts.sum(),
        covariance_type=ct,
    )


def fit_vb_groups(
    groups: SufficientStats,
    init: VBPosterior,
    prior: VBPrior,
    *,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
) -> VBResult:
    """Variational EM on groups of rows known only by their statistics, every row of a
    group sharing the group's responsibilities (a mean-field family restricted to be
    constant within groups), from the posterior ``init``.

    Each iteration is :func:`vb_group_log_prob` normalised per group, the M-step on
    :func:`grouped_stats` and the bound :func:`vb_lower_bound` with the groups' entropy
    ``-sum_g n_g sum_k r_gk log r_gk``, stopped as :func:`fit_vb` (``|change| < tol``).
    By the concavity of the entropy the bound is a lower bound on the ELBO of the rows
    themselves under the same responsibilities, so an unrestricted E-step on the rows
    from the result can only raise it. Groups with a count of 0 are left out.

    Args:
        groups: (n_groups,) counts, (n_groups, n_features) sums and their second moments
            (full, diag or spherical), about one shift.
        init: the starting posterior (n_components components).
        prior: the shared prior.
        reg_covar, tol, max_iter: as :func:`fit_vb` (``max_iter=0`` returns ``init``).
    """
    _check_grouped(groups)
    keep = groups.counts > 0
    groups = replace(
        groups,
        counts=groups.counts[keep],
        sums=groups.sums[keep],
        second=groups.second[keep],
        n_samples=groups.counts[keep].sum(),
    )
    posterior = init
    lower_bounds: list[float] = []
    previous = -float("inf")
    converged = False
    for _ in range(max_iter):
        log_resp = log_responsibilities(vb_group_log_prob(groups, posterior))[1]
        resp = log_resp.exp()
        entropy = -(groups.counts.unsqueeze(1) * resp * log_resp).sum()
        posterior = vb_m_step(grouped_stats(groups, resp), prior, reg_covar)
        lower_bounds.append(float(vb_lower_bound(posterior, entropy)))
        if abs(lower_bounds[-1] - previous) < tol:
            converged = True
            break
        previous = lower_bounds[-1]
    return VBResult(posterior, len(lower_bounds), converged, lower_bounds)
