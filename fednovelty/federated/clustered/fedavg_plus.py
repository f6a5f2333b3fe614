"""FedAvg+ (the Fed-CAM paper's Table 1): an ensemble of ``n_clusters`` FedAvg models.

The members start from different random draws; every client trains every member each
round, and prediction is their soft vote
(:func:`~fednovelty.federated.clustered.cam_models.ensemble_proba`). No clusters, no
warm-up; ``n_clusters=1`` is FedAvg.
"""

from __future__ import annotations

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_ensemble import EnsembleStep
from fednovelty.federated.clustered.cam_settings import ClusteredConfig
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["FedAvgPlus", "FedAvgPlusConfig"]


@settings_dataclass
class FedAvgPlusConfig(ClusteredConfig):
    """Settings of :class:`FedAvgPlus` (:class:`ClusteredConfig`'s; ``n_clusters``: the
    members); no warm-up."""


class FedAvgPlus(ClusteredAlgorithm):
    """FedAvg+: ``n_clusters`` FedAvg models from different random starts, every client
    training every member; prediction is their soft vote."""

    method = "FedAvg+"
    config_class = FedAvgPlusConfig
    clustering = EnsembleStep
