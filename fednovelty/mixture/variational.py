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

The prior (:class:`~fednovelty.mixture.vb_prior.VBPrior`, with scikit-learn's defaults) is in
:mod:`fednovelty.mixture.vb_prior`; variational EM on groups of rows known only by their
statistics in :mod:`fednovelty.mixture.vb_groups`; scoring (the posterior predictive and the
plug-in mixture) in :mod:`fednovelty.mixture.vb_predictive`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.mixture.containers import ComponentTensors
from fednovelty.mixture.covariance import log_det_cholesky, precisions_cholesky_from_covariances
from fednovelty.mixture.density import log_gaussian_prob, log_responsibilities
from fednovelty.mixture.em import iterate_bound
from fednovelty.mixture.stats import SufficientStats, e_step_stats, m_step
from fednovelty.mixture.vb_prior import VBPrior

# --------------------------------------------------------------------------- posterior


@dataclass(frozen=True)
class VBPosterior(ComponentTensors):
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

    @classmethod
    def from_covariances(
        cls,
        weight_concentration: Tensor,
        mean_precision: Tensor,
        means: Tensor,
        degrees_of_freedom: Tensor,
        covariances: Tensor,
        covariance_type: str,
        weight_concentration_prior_type: str,
    ) -> VBPosterior:
        """The posterior with these fields and ``precisions_cholesky`` computed from
        ``covariances`` (raises ``SingularCovarianceError`` if not positive definite)."""
        return cls(
            weight_concentration,
            mean_precision,
            means,
            degrees_of_freedom,
            covariances,
            precisions_cholesky_from_covariances(covariances, covariance_type),
            covariance_type,
            weight_concentration_prior_type,
        )

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
    kind = prior.weight_concentration_prior_type
    return VBPosterior.from_covariances(
        weight_concentration, mean_precision, means, dof, covariances, ct, kind
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

    def step(posterior: VBPosterior) -> tuple[VBPosterior, float]:
        posterior, elbo = vb_step(X, posterior, prior, reg_covar, chunk_size)
        return posterior, float(elbo)

    return VBResult(*iterate_bound(step, init, max_iter, tol))
