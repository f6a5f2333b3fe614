"""The posterior of federated variational Bayes back in the user's units.

With a public box (``bounds``) or ``standardize`` the rounds work in ``[-1, 1]`` per feature
or in pooled z-scores; :func:`affine_posterior` maps a posterior of ``z`` to that of ``x =
offset + scale * z`` exactly, and :class:`PosteriorUnitsStep` (no round, the last step of the
exact and the one-shot chains) applies it when the chain finishes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.steps import NoRoundStep
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.variational import VBPosterior

__all__ = ["PosteriorUnitsStep", "affine_posterior"]


def affine_posterior(posterior: VBPosterior, offset: Tensor, scale: Tensor) -> VBPosterior:
    """The posterior of the mixture of ``x = offset + scale * z`` when ``posterior`` is that
    of ``z`` (``offset``, ``scale`` (n_features,), ``scale`` > 0 and one common value for
    ``spherical``): means ``offset + scale * m``, covariances ``D C D`` (full, tied;
    ``D = diag(scale)``), ``scale**2 * c`` (diag, spherical), precision factors from those
    covariances (as a loaded posterior rebuilds them, so it scores bit for bit as the
    fitted one); the weights' concentrations,
    mean precisions and degrees of freedom do not change (a Wishart on ``Lambda_z`` is one
    on ``D^-1 Lambda_z D^-1`` with the same degrees of freedom)."""
    ct = posterior.covariance_type
    cov = posterior.covariances
    if ct in ("full", "tied"):
        cov = cov * torch.outer(scale, scale)
    elif ct == "diag":
        cov = cov * scale.square()
    else:
        cov = cov * scale[0].square()
    return replace(
        posterior,
        means=offset + posterior.means * scale,
        covariances=cov,
        precisions_cholesky=precisions_cholesky_from_covariances(cov, ct),
    )


class PosteriorUnitsStep(NoRoundStep):
    """No round: when the chain finishes, maps ``state.posterior`` from the units the rounds
    worked in (a public box's, pooled z-scores) back to the user's
    (:func:`affine_posterior`); the last step of the exact and the one-shot chains."""

    def finish(self, state: Any) -> None:
        if getattr(state, "scale", None) is not None and state.posterior is not None:
            state.posterior = affine_posterior(state.posterior, state.offset, state.scale)
