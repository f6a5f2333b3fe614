"""Starts without a round: the initial mixture or centres from the settings alone.

- :class:`GivenParams`: ``weights_init``, ``means_init`` and ``precisions_init`` all given:
  they are the initial mixture (in the working units).
- :class:`GivenMeans`: ``means_init`` given: the centres of one federated Lloyd round
  (:class:`~fednovelty.federated.init.assign.AssignStep`).
- :class:`PublicCentres`: under differential privacy, ``n_components`` centres far apart in
  ``[-1, 1]`` per feature of the working units (public knowledge only), then private
  Lloyd rounds.
"""

from __future__ import annotations

from typing import Any

import torch

from fednovelty.federated.core.steps import NoRoundStep
from fednovelty.federated.init.separated import separated_centers
from fednovelty.federated.init.units import to_working_units
from fednovelty.mixture import MixtureParams, affine_params, precisions_cholesky_from_precisions


class GivenParams(NoRoundStep):
    """Initial weights, means and precisions all given: the initial mixture, no round."""

    def begin(self, state: Any) -> None:
        config = self.config
        params = MixtureParams(
            config.weights_init,
            config.means_init,
            precisions_cholesky_from_precisions(config.precisions_init, config.covariance_type),
            config.covariance_type,
        )
        if state.scale is not None:
            params = affine_params(params, -state.offset / state.scale, 1 / state.scale)
        state.params = params
        return None


class GivenMeans(GivenParams):
    """``means_init`` given: the Lloyd assignment starts from those centres, no round."""

    def begin(self, state: Any) -> None:
        state.centers = to_working_units(state, self.config.means_init)
        return None


class PublicCentres(GivenParams):
    """Initial centres from public knowledge only, no round: ``n_components`` points far
    apart in ``[-1, 1]`` per feature of the working units (z-scores, or the public box's
    units), as :func:`~fednovelty.federated.init.separated.separated_centers` spreads them;
    what a differentially private fit starts from instead of the clients' centroids or
    ranges, which have no private form. Private Lloyd rounds
    (:class:`~fednovelty.federated.init.assign.AssignStep`) follow."""

    def begin(self, state: Any) -> None:
        config = self.config
        width = self._width(state)
        low = -torch.ones(width, dtype=config.dtype, device=config.device)
        state.centers = separated_centers(low, -low, config.n_components, config.random_state)
        return None

    @staticmethod
    def _width(state: Any) -> int:
        if state.offset is None:
            raise ValueError(
                "a differentially private start needs the working units' width: give the "
                "public feature bounds (bounds / dp_bounds) or standardize."
            )
        return int(state.offset.shape[0])
