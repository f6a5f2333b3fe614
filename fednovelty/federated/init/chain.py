"""Which initialisation protocol a fit runs: :func:`init_steps`, by the settings.

scikit-learn's rule first: weights, means and precisions all given -> no round
(:class:`~fednovelty.federated.init.given.GivenParams`); ``means_init`` -> one Lloyd round
from them; else ``init_params`` (:data:`~fednovelty.federated.init.settings.INIT_PARAMS`):

- ``"kmeans"``: k-FED seeds, then Lloyd rounds (:mod:`~fednovelty.federated.init.centroids`,
  :mod:`~fednovelty.federated.init.assign`);
- ``"separated"``: centres far apart in the merged ranges, one Lloyd round
  (:mod:`~fednovelty.federated.init.separated`);
- ``"subset"``: raw rows fitted on the server (:mod:`~fednovelty.federated.init.subset`);
- ``"oneshot"``: one round of local fits reduced on the server
  (:class:`~fednovelty.federated.local_fit.OneShotStart`, FedGenGMM's round).

Under differential privacy only ``"kmeans"`` and ``"separated"`` have a form: both start
from public centres (:class:`~fednovelty.federated.init.given.PublicCentres`) and run
private Lloyd rounds.
"""

from __future__ import annotations

from typing import Any

from fednovelty.federated.core.steps import Step
from fednovelty.federated.init.assign import AssignStep
from fednovelty.federated.init.centroids import CentroidsStep
from fednovelty.federated.init.given import GivenMeans, GivenParams, PublicCentres
from fednovelty.federated.init.separated import RangeStep
from fednovelty.federated.init.subset import SubsetStep
from fednovelty.federated.local_fit import OneShotStart


def init_steps(config: Any) -> list[Step]:
    """The steps that produce the initial mixture, by the settings (scikit-learn's rule:
    weights, means and precisions all given -> no rounds; ``means_init`` -> one Lloyd
    round from them; else ``init_params``)."""
    if config.given_params:
        return [GivenParams(config)]
    if config.means_init is not None:
        return [GivenMeans(config), AssignStep(config, budget=1)]
    if getattr(config, "dp_mode", None) is not None:
        if config.init_params in ("subset", "oneshot"):
            raise ValueError(
                f"init_params={config.init_params!r} has no private form here (raw rows, or "
                'local fits); use "kmeans" or "separated" with differential privacy.'
            )
        return [PublicCentres(config), AssignStep(config, config.kmeans_rounds, relocate=True)]
    if config.init_params == "kmeans":
        return [CentroidsStep(config), AssignStep(config, budget=config.kmeans_rounds)]
    if config.init_params == "separated":
        return [RangeStep(config), AssignStep(config, budget=1)]
    if config.init_params == "oneshot":
        return [OneShotStart(config)]
    return [SubsetStep(config)]
