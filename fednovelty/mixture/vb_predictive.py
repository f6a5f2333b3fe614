"""Scoring with a variational posterior: the posterior predictive and the plug-in mixture.

:func:`vb_predictive_log_prob` is the posterior predictive of a
:class:`~fednovelty.mixture.variational.VBPosterior`, a mixture of multivariate Student-t
densities (Bishop, PRML 10.81) weighted by the expected weights (``weights_`` of
scikit-learn, which for the truncated Dirichlet process is renormalised);
:func:`vb_plugin_params` gives the plug-in Gaussian mixture (``weights_``, ``means_``,
``covariances_``). scikit-learn's ``score_samples`` is neither: it returns the E-step
normaliser ``log sum_k exp(E[log pi_k] + E[log N(x | k)])`` (``vb_log_resp(X, posterior)[0]``
of :mod:`fednovelty.mixture.variational`), which is not a normalised density.
:func:`effective_n_components` and :func:`active_components` count the components whose
expected weight the prior has not pruned.

All functions are pure and take dtype and device from their inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.mixture.covariance import log_det_cholesky
from fednovelty.mixture.density import default_chunk_size, logsumexp_rows
from fednovelty.mixture.model import MixtureParams
from fednovelty.mixture.variational import VBPosterior


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
