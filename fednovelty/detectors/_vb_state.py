"""A variational posterior's saved tensors (``posterior.<name>``), read back checked: what
``FedVBDetector`` and ``FedKNNMarkerDetector`` save and restore of their posteriors."""

from __future__ import annotations

import torch

from fednovelty.detectors.persistence import get_tensor
from fednovelty.exceptions import ModelFormatError
from fednovelty.mixture.covariance import covariance_shape

__all__ = ["POSTERIOR_TENSORS", "posterior_from"]

#: The posterior's tensors ``save`` writes (``posterior.<name>``).
POSTERIOR_TENSORS = (
    "weight_concentration",
    "mean_precision",
    "means",
    "degrees_of_freedom",
    "covariances",
)


def posterior_from(
    tensors: dict[str, torch.Tensor],
    n_components: int,
    n_features: int,
    covariance_type: str,
    weight_type: str,
) -> dict[str, torch.Tensor]:
    """The saved posterior tensors (``posterior.*``), checked: the shapes ``n_components``,
    ``n_features`` and the types imply, finite, concentrations and mean precisions > 0,
    degrees of freedom > n_features - 1, diagonal / spherical covariances > 0 (full and tied
    ones are checked positive definite by their Cholesky factorisation). Raises
    ``ModelFormatError``."""
    k, d = n_components, n_features
    wc_shape = (2, k) if weight_type == "dirichlet_process" else (k,)
    dof_shape = () if covariance_type == "tied" else (k,)
    cov_shape = covariance_shape(covariance_type, k, d)
    shapes = {
        "weight_concentration": wc_shape,
        "mean_precision": (k,),
        "means": (k, d),
        "degrees_of_freedom": dof_shape,
        "covariances": cov_shape,
    }
    out = {name: get_tensor(tensors, f"posterior.{name}", shape) for name, shape in shapes.items()}
    for name in ("weight_concentration", "mean_precision"):
        if not bool((out[name] > 0).all()):
            raise ModelFormatError(
                f"the tensor 'posterior.{name}' holds a value <= 0; the posterior's "
                "concentrations and precisions are positive."
            )
    if not bool((out["degrees_of_freedom"] > d - 1).all()):
        raise ModelFormatError(
            f"the tensor 'posterior.degrees_of_freedom' holds a value <= n_features - 1 = "
            f"{d - 1}; a Wishart needs more degrees of freedom."
        )
    cov = out["covariances"]
    if covariance_type in ("diag", "spherical") and not bool((cov > 0).all()):
        raise ModelFormatError(
            "the tensor 'posterior.covariances' holds a value <= 0; variances are positive."
        )
    if covariance_type in ("full", "tied"):
        scale = float(cov.abs().max())
        if not torch.allclose(cov, cov.transpose(-1, -2), rtol=0, atol=1e-12 * scale):
            raise ModelFormatError("the tensor 'posterior.covariances' is not symmetric.")
    return out
