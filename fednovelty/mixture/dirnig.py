"""Dirichlet-Normal-Inverse-Gamma (Dir-NIG) relation markers: the mixture math of VGM2
(Puppala et al., "Variational Gaussian Mixture Manifold Models for Client-Specific Federated
Personalization", Sec. 3.3-3.4). Torch, differentiable, no federated notions.

A *relation marker* is a K-component mixture over a scalar (a latent distance ``s``) with a
mean-field posterior ``Dir(w | a) prod_c NIG(mu_c, sigma2_c | m_c, kappa_c, alpha_c, beta_c)``
(Eq. 2): ``sigma2_c ~ InvGamma(alpha_c, beta_c)``, ``mu_c | sigma2_c ~ N(m_c, sigma2_c /
kappa_c)``. VGM2 keeps one marker per relation ``r`` (0: different class, 1: same class).

Storage: the two markers of a client are one tensor ``markers`` of shape (2, 5, K): relation
``r``, field (:data:`MARKER_FIELDS`: concentration ``a``, mean ``m``, ``kappa``, ``alpha``,
``beta``), component ``c``; 2 * 5 * K = 10K scalars, the paper's count (Sec. 4).

A 1-D NIG is the 1-D Normal-Wishart of :class:`~fednovelty.mixture.variational.VBPosterior`
with mean ``m``, mean precision ``kappa``, degrees of freedom ``nu = 2 alpha`` and precision
scale ``W = 1 / (2 beta)`` (so scikit-learn's ``covariances = W^-1 / nu = beta / alpha``):
:func:`marker_to_posterior` and :func:`posterior_to_marker` convert (covariance type
``"full"``, weights ``"dirichlet_distribution"``), which lets the server reuse the package's
posterior aggregation.

Functions (shapes in each docstring): :func:`student_t_log_prob` (the NIG's predictive,
Student-t with ``2 alpha`` degrees of freedom, location ``m``, squared scale
``beta (kappa + 1) / (alpha kappa)``), :func:`marker_log_density` (the Student-t mixture with
the expected Dirichlet weights), :func:`same_class_logit` / :func:`same_class_probability`
(``pi_1(s)`` of Eq. 3), :func:`kl_dirichlet`, :func:`kl_nig`, :func:`kl_markers` (Eq. 6),
:func:`soft_calibration_error` (Eq. 5, B = 15 soft bins by default), and the unconstrained
parameterisation used by gradient training (:func:`markers_from_free`, :func:`free_from_markers`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.variational import VBPosterior

__all__ = [
    "MARKER_FIELDS",
    "check_markers",
    "default_markers",
    "free_from_markers",
    "kl_dirichlet",
    "kl_markers",
    "kl_nig",
    "marker_log_density",
    "marker_to_posterior",
    "markers_from_free",
    "posterior_to_marker",
    "same_class_logit",
    "same_class_probability",
    "soft_calibration_error",
    "student_t_log_prob",
]

#: the fields of a marker, in storage order (axis 1 of a (2, 5, K) markers tensor).
MARKER_FIELDS: tuple[str, ...] = ("concentration", "mean", "kappa", "alpha", "beta")


def check_markers(markers: Tensor, name: str = "markers") -> Tensor:
    """``markers`` unchanged if it is a (2, 5, K) tensor of finite values with positive
    concentration, kappa, alpha and beta; otherwise a ``ValueError`` naming ``name``."""
    if markers.ndim != 3 or markers.shape[0] != 2 or markers.shape[1] != 5:
        raise ValueError(f"{name} must have shape (2, 5, K); got {tuple(markers.shape)}.")
    if not bool(torch.isfinite(markers).all()):
        raise ValueError(f"{name} has NaN or inf values.")
    positive = markers[:, [0, 2, 3, 4], :]
    if not bool((positive > 0).all()):
        raise ValueError(f"{name}: concentration, kappa, alpha and beta must be > 0.")
    return markers


def default_markers(
    n_markers: int,
    *,
    same_mean: float = 0.5,
    diff_mean: float = 2.0,
    spread: float = 0.25,
    concentration: float = 1.0,
    kappa: float = 1.0,
    alpha: float = 2.0,
    scale: float = 0.5,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """A (2, 5, K) markers tensor: the server's initial prior ``p_0(M)``.

    Component means are spread evenly by ``spread`` around ``diff_mean`` (relation 0) and
    ``same_mean`` (relation 1); every component has concentration ``concentration``, mean
    precision ``kappa``, shape ``alpha`` and rate ``beta = alpha * scale**2`` (prior expected
    variance ``beta / (alpha - 1)`` near ``scale**2``).
    """
    offsets = (
        torch.linspace(-1.0, 1.0, n_markers, dtype=dtype) * spread
        if n_markers > 1
        else (torch.zeros(1, dtype=dtype))
    )
    out = torch.empty(2, 5, n_markers, dtype=dtype)
    for r, centre in ((0, diff_mean), (1, same_mean)):
        out[r, 0] = concentration
        out[r, 1] = centre + offsets
        out[r, 2] = kappa
        out[r, 3] = alpha
        out[r, 4] = alpha * scale**2
    return out


# ----------------------------------------------------------------------------- conversion
def marker_to_posterior(marker: Tensor) -> VBPosterior:
    """One relation's marker, (5, K), as a 1-D :class:`VBPosterior` with K components
    (``covariance_type="full"``, ``"dirichlet_distribution"`` weights): ``nu = 2 alpha``,
    covariances ``beta / alpha`` (K, 1, 1)."""
    a, m, kappa, alpha, beta = marker
    covariances = (beta / alpha).reshape(-1, 1, 1)
    return VBPosterior(
        weight_concentration=a.clone(),
        mean_precision=kappa.clone(),
        means=m.reshape(-1, 1).clone(),
        degrees_of_freedom=2.0 * alpha,
        covariances=covariances,
        precisions_cholesky=covariances.rsqrt(),
        covariance_type="full",
        weight_concentration_prior_type="dirichlet_distribution",
    )


def posterior_to_marker(posterior: VBPosterior) -> Tensor:
    """The (5, K) marker of a 1-D Dirichlet-weighted :class:`VBPosterior` (any covariance
    type): ``alpha = nu / 2``, ``beta = alpha * covariance``.

    Raises:
        ValueError: a posterior of more than one feature or with Dirichlet-process weights.
    """
    if posterior.n_features != 1:
        raise ValueError(f"a marker is 1-D; the posterior has {posterior.n_features} features.")
    if posterior.weight_concentration_prior_type != "dirichlet_distribution":
        raise ValueError("a marker's weights are Dirichlet; got a Dirichlet-process posterior.")
    k = posterior.n_components
    alpha = posterior.degrees_of_freedom.reshape(-1).expand(k) / 2.0
    variance = posterior.covariances.reshape(-1)
    variance = variance.expand(k) if variance.numel() == 1 else variance.reshape(k)
    return torch.stack(
        [
            posterior.weight_concentration.reshape(k),
            posterior.means.reshape(k),
            posterior.mean_precision.reshape(-1).expand(k),
            alpha,
            alpha * variance,
        ]
    )


def markers_from_free(free: Tensor) -> Tensor:
    """Markers (2, 5, K) from unconstrained values of the same shape: ``exp`` of the
    concentration, kappa, alpha and beta rows, the mean row as is (differentiable)."""
    positive = free[:, [0, 2, 3, 4], :].exp()
    return torch.stack(
        [positive[:, 0], free[:, 1], positive[:, 1], positive[:, 2], positive[:, 3]], dim=1
    )


def free_from_markers(markers: Tensor) -> Tensor:
    """The inverse of :func:`markers_from_free`, (2, 5, K)."""
    free = markers.log()
    free[:, 1] = markers[:, 1]
    return free


# ----------------------------------------------------------------------------- densities
def student_t_log_prob(
    s: Tensor, mean: Tensor, kappa: Tensor, alpha: Tensor, beta: Tensor
) -> Tensor:
    """Log-density of the NIG posterior predictive at ``s`` (n,), one column per component
    of the parameters (K,): a Student-t with ``2 alpha`` degrees of freedom, location
    ``mean`` and squared scale ``beta (kappa + 1) / (alpha kappa)``. Returns (n, K)."""
    nu = 2.0 * alpha
    scale2 = beta * (kappa + 1.0) / (alpha * kappa)
    z2 = (s.unsqueeze(-1) - mean).square() / scale2
    return (
        torch.lgamma((nu + 1.0) / 2.0)
        - torch.lgamma(nu / 2.0)
        - 0.5 * torch.log(nu * math.pi * scale2)
        - (nu + 1.0) / 2.0 * torch.log1p(z2 / nu)
    )


def marker_log_density(s: Tensor, marker: Tensor) -> Tensor:
    """``log sum_c E_q[w_c] t(s; m_c, alpha_c, beta_c, kappa_c)`` at ``s`` (n,) for one
    relation's marker (5, K); returns (n,)."""
    a, m, kappa, alpha, beta = marker
    log_w = a.log() - a.sum().log()
    return torch.logsumexp(log_w + student_t_log_prob(s, m, kappa, alpha, beta), dim=-1)


def same_class_logit(s: Tensor, markers: Tensor, log_prior_odds: float | Tensor = 0.0) -> Tensor:
    """``logit pi_1(s)`` of Eq. 3 at distances ``s`` (n,) for markers (2, 5, K);
    ``log_prior_odds = log(pi_hat_1 / pi_hat_0)``. Returns (n,)."""
    return marker_log_density(s, markers[1]) - marker_log_density(s, markers[0]) + log_prior_odds


def same_class_probability(
    s: Tensor, markers: Tensor, log_prior_odds: float | Tensor = 0.0
) -> Tensor:
    """``pi_1(s)`` of Eq. 3, the posterior same-class probability, (n,) in [0, 1]."""
    return torch.sigmoid(same_class_logit(s, markers, log_prior_odds))


# ----------------------------------------------------------------------------- divergences
def kl_dirichlet(a: Tensor, b: Tensor) -> Tensor:
    """``KL(Dir(a) || Dir(b))`` over the last axis: ``a``, ``b`` (..., K) -> (...)."""
    a0, b0 = a.sum(-1), b.sum(-1)
    return (
        torch.lgamma(a0)
        - torch.lgamma(a).sum(-1)
        - torch.lgamma(b0)
        + torch.lgamma(b).sum(-1)
        + ((a - b) * (torch.digamma(a) - torch.digamma(a0).unsqueeze(-1))).sum(-1)
    )


def kl_nig(q: Tensor, p: Tensor) -> Tensor:
    """``KL(NIG_q || NIG_p)`` per component: ``q``, ``p`` (4, ...) stacking ``m, kappa,
    alpha, beta``; returns (...).

    The inverse-gamma part plus the expected Gaussian part:
    ``KL_IG + E_q[KL(N(m_q, s2/k_q) || N(m_p, s2/k_p))]`` with ``E_q[1/s2] = alpha_q/beta_q``.
    """
    mq, kq, aq, bq = q
    mp, kp, ap, bp = p
    kl_ig = (
        (aq - ap) * torch.digamma(aq)
        - torch.lgamma(aq)
        + torch.lgamma(ap)
        + ap * (bq.log() - bp.log())
        + aq * (bp - bq) / bq
    )
    kl_normal = 0.5 * (kp / kq - 1.0 + (kq / kp).log() + kp * (mq - mp).square() * aq / bq)
    return kl_ig + kl_normal


def kl_markers(q: Tensor, p: Tensor) -> Tensor:
    """``KL(q(M) || p(M))`` of Eq. 6 for markers (2, 5, K): the two relations' Dirichlet
    KLs plus every component's NIG KL (mean field); a 0-d tensor."""
    dirichlet = kl_dirichlet(q[:, 0], p[:, 0]).sum()
    return dirichlet + kl_nig(q[:, 1:].transpose(0, 1), p[:, 1:].transpose(0, 1)).sum()


# ----------------------------------------------------------------------------- calibration
def soft_calibration_error(
    prob: Tensor, target: Tensor, n_bins: int = 15, temperature: float | None = None
) -> Tensor:
    """The smoothed expected calibration error of Eq. 5, a 0-d tensor.

    Each probability ``prob`` (n,) belongs to bin ``b`` (centre ``(b + 1/2) / n_bins``) with
    weight ``softmax_b(-(p - centre_b)^2 / temperature)`` (default temperature
    ``(1 / n_bins)^2 / 2``: a bin's neighbours get ``e^-2`` of its weight); per bin the soft
    accuracy (mean of ``target`` (n,), 0/1) and confidence (mean ``prob``) are compared, and
    ``sum_b w_b sqrt((acc_b - conf_b)^2 + 1e-8)`` is returned, ``w_b`` the bin's share of
    the soft mass (the hard-binned ECE as the temperature goes to 0)."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}.")
    tau = (0.5 / n_bins**2) if temperature is None else float(temperature)
    centres = (torch.arange(n_bins, dtype=prob.dtype, device=prob.device) + 0.5) / n_bins
    weights = torch.softmax(-(prob.unsqueeze(-1) - centres).square() / tau, dim=-1)  # (n, B)
    mass = weights.sum(0)
    safe = mass.clamp_min(torch.finfo(prob.dtype).tiny)
    conf = (weights * prob.unsqueeze(-1)).sum(0) / safe
    acc = (weights * target.to(prob.dtype).unsqueeze(-1)).sum(0) / safe
    gap = ((acc - conf).square() + 1e-8).sqrt()
    return (mass / mass.sum() * gap).sum()
