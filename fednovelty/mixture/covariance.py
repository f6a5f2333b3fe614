"""Covariance parameterisations and their Cholesky-of-precision storage.

Conventions follow scikit-learn's ``GaussianMixture`` so that fitted attributes are
interchangeable: ``precisions_cholesky`` is the upper-triangular ``U`` with
``precision = U @ U.T`` (``U = L^{-T}`` for ``covariance = L @ L.T``). Shapes by type:

============  =================================  ==========================
type          covariances / precisions_cholesky  one parameter set per
============  =================================  ==========================
``full``      (n_components, n_features, n_features)  component
``tied``      (n_features, n_features)            mixture
``diag``      (n_components, n_features)          component
``spherical`` (n_components,)                     component
============  =================================  ==========================

All functions are pure and take dtype and device from their inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fednovelty.exceptions import SingularCovarianceError

COVARIANCE_TYPES: tuple[str, ...] = ("full", "tied", "diag", "spherical")


def check_covariance_type(covariance_type: str) -> str:
    """Return ``covariance_type`` or raise a ``ValueError`` naming the valid choices."""
    if covariance_type not in COVARIANCE_TYPES:
        raise ValueError(
            f"covariance_type must be one of {COVARIANCE_TYPES}, got {covariance_type!r}."
        )
    return covariance_type


def covariance_shape(covariance_type: str, n_components: int, n_features: int) -> tuple[int, ...]:
    """Shape of the covariance (and precision-Cholesky) tensor for a covariance type."""
    return {
        "full": (n_components, n_features, n_features),
        "tied": (n_features, n_features),
        "diag": (n_components, n_features),
        "spherical": (n_components,),
    }[check_covariance_type(covariance_type)]


def _singular_error(covariance_type: str, components: list[int], dtype: torch.dtype) -> Exception:
    where = "the tied covariance" if covariance_type == "tied" else f"component(s) {components}"
    message = (
        f"The covariance of {where} is not positive definite (for instance a component that "
        "collapsed onto a single point or a constant feature). Increase reg_covar, decrease "
        "n_components, or scale the input features."
    )
    if dtype == torch.float32:
        message += " Using float64 (the default) also improves numerical accuracy."
    return SingularCovarianceError(message)


def precisions_cholesky_from_covariances(covariances: Tensor, covariance_type: str) -> Tensor:
    """Cholesky factors of the precisions from covariances.

    Args:
        covariances: covariance tensor of the shape given by ``covariance_shape``.
        covariance_type: one of ``COVARIANCE_TYPES``.

    Returns:
        ``precisions_cholesky`` of the same shape (upper-triangular for full/tied).

    Raises:
        SingularCovarianceError: a covariance is not positive definite.
    """
    check_covariance_type(covariance_type)
    if covariance_type in ("full", "tied"):
        batched = covariances if covariance_type == "full" else covariances.unsqueeze(0)
        chol, info = torch.linalg.cholesky_ex(batched)
        bad = torch.nonzero(info > 0).flatten()
        if bad.numel() or not bool(torch.isfinite(chol).all()):
            raise _singular_error(covariance_type, bad.tolist(), covariances.dtype)
        eye = torch.eye(batched.shape[-1], dtype=batched.dtype, device=batched.device)
        prec_chol = torch.linalg.solve_triangular(chol, eye.expand_as(chol), upper=False)
        prec_chol = prec_chol.transpose(-1, -2)
        return prec_chol if covariance_type == "full" else prec_chol[0]
    bad_mask = ~(covariances > 0)
    if covariance_type == "diag":
        bad_mask = bad_mask.any(dim=1)
    if bool(bad_mask.any()):
        raise _singular_error(
            covariance_type, torch.nonzero(bad_mask).flatten().tolist(), covariances.dtype
        )
    return torch.rsqrt(covariances)


def precisions_cholesky_from_precisions(precisions: Tensor, covariance_type: str) -> Tensor:
    """Upper Cholesky factors ``U`` with ``precision = U @ U.T`` from precision matrices.

    Uses the flip trick (as scikit-learn): ``J P J = L L^T`` gives ``U = J L J``.
    """
    check_covariance_type(covariance_type)
    if covariance_type in ("full", "tied"):
        flipped = precisions.flip(-1, -2)
        chol, info = torch.linalg.cholesky_ex(flipped)
        if bool((info > 0).any()):
            raise ValueError(
                "precisions_init must be symmetric positive definite; its Cholesky "
                "factorisation failed."
            )
        return chol.flip(-1, -2)
    if bool((precisions <= 0).any()):
        raise ValueError("precisions_init must be strictly positive.")
    return torch.sqrt(precisions)


def covariances_from_precisions_cholesky(
    precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """Covariances ``(U U^T)^{-1} = U^{-T} U^{-1}`` from precision Cholesky factors."""
    check_covariance_type(covariance_type)
    if covariance_type in ("full", "tied"):
        eye = torch.eye(
            precisions_cholesky.shape[-1],
            dtype=precisions_cholesky.dtype,
            device=precisions_cholesky.device,
        )
        inv = torch.linalg.solve_triangular(
            precisions_cholesky, eye.expand_as(precisions_cholesky), upper=True
        )
        return inv.transpose(-1, -2) @ inv
    return precisions_cholesky.pow(-2)


def precisions_from_precisions_cholesky(
    precisions_cholesky: Tensor, covariance_type: str
) -> Tensor:
    """Precisions ``U @ U.T`` (full, tied) or ``U ** 2`` (diag, spherical)."""
    check_covariance_type(covariance_type)
    if covariance_type in ("full", "tied"):
        return precisions_cholesky @ precisions_cholesky.transpose(-1, -2)
    return precisions_cholesky.square()


def log_det_cholesky(precisions_cholesky: Tensor, covariance_type: str, n_features: int) -> Tensor:
    """``log det U`` = ``-0.5 * log det covariance``; shape (n_components,) or () for tied."""
    check_covariance_type(covariance_type)
    if covariance_type in ("full", "tied"):
        return torch.diagonal(precisions_cholesky, dim1=-2, dim2=-1).log().sum(-1)
    if covariance_type == "diag":
        return precisions_cholesky.log().sum(-1)
    return n_features * precisions_cholesky.log()


def n_covariance_parameters(covariance_type: str, n_components: int, n_features: int) -> int:
    """Free parameters in the covariances (scikit-learn's ``_n_parameters`` convention)."""
    per_matrix = n_features * (n_features + 1) // 2
    return {
        "full": n_components * per_matrix,
        "tied": per_matrix,
        "diag": n_components * n_features,
        "spherical": n_components,
    }[check_covariance_type(covariance_type)]
