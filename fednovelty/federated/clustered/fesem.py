"""FeSEM (Xie et al. 2021), a baseline of the Fed-CAM paper: the server clusters the
clients' models by k-means on their parameters.

After a warm-up of local training (one round by default: k-means needs trained models),
each client trains from its cluster's model, pulled towards it by ``kmeans_reg`` (Eq. 13),
and the server re-clusters the released models (Eq. 10-11:
:class:`~fednovelty.federated.clustered.cam_local_warmup.KMeansServer`).
"""

from __future__ import annotations

from typing import ClassVar

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_cluster_step import KMeansClusterStep
from fednovelty.federated.clustered.cam_local_warmup import LocalWarmupStep
from fednovelty.federated.clustered.cam_settings import ClusteredConfig, WarmupRule
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["KMEANS_WARMUP", "FeSEM", "FeSEMConfig"]

#: the warm-up of the k-means methods: at least one round of local training.
KMEANS_WARMUP = WarmupRule(
    least=1, reason="clusters client models by k-means, which needs models trained first"
)


@settings_dataclass
class FeSEMConfig(ClusteredConfig):
    """Settings of :class:`FeSEM` (:class:`ClusteredConfig`'s); ``warmup_rounds`` rounds of
    local training only (>= 1; ``None``: 1)."""

    WARMUP: ClassVar[WarmupRule | None] = KMEANS_WARMUP


class FeSEM(ClusteredAlgorithm):
    """FeSEM: the server clusters the clients' models by k-means on their parameters; each
    client trains from its cluster's model, pulled towards it by ``kmeans_reg``."""

    method = "FeSEM"
    config_class = FeSEMConfig
    warmup = LocalWarmupStep
    clustering = KMeansClusterStep
