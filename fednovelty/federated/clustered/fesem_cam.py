"""FeSEM-CAM (the Fed-CAM paper, Alg. 1): FeSEM on the clustered additive model.

A global model is added to the cluster models' logits, ``F_i(x) = h(x; Theta_g) +
f(x; Theta_c(i))`` (Eq. 1). After ``warmup_rounds`` rounds of local training only, each
clustered by the server's k-means, each round a client joins the centre nearest to the
model it sent last and trains each half on the residual of the other, the cluster half
pulled towards its centre by ``kmeans_reg``.
"""

from __future__ import annotations

from typing import ClassVar

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_cluster_step import KMeansClusterStep
from fednovelty.federated.clustered.cam_local_warmup import LocalWarmupStep
from fednovelty.federated.clustered.cam_settings import WARMUP_SHARE, ClusteredConfig, WarmupRule
from fednovelty.federated.clustered.fesem import KMEANS_WARMUP
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["FeSEMCAM", "FeSEMCAMConfig"]


@settings_dataclass
class FeSEMCAMConfig(ClusteredConfig):
    """Settings of :class:`FeSEMCAM` (:class:`ClusteredConfig`'s); ``warmup_rounds`` rounds
    of local training only (>= 1; ``None``: ``round(0.3 * rounds)``, at least 1)."""

    WARMUP: ClassVar[WarmupRule | None] = WarmupRule(
        share=WARMUP_SHARE, least=KMEANS_WARMUP.least, reason=KMEANS_WARMUP.reason
    )


class FeSEMCAM(ClusteredAlgorithm):
    """FeSEM-CAM: a global model added to FeSEM's cluster models; after a warm-up of local
    training clustered by k-means, each client joins its nearest centre and trains each half
    on the residual of the other."""

    method = "FeSEM-CAM"
    config_class = FeSEMCAMConfig
    warmup = LocalWarmupStep
    clustering = KMeansClusterStep
    additive = True
