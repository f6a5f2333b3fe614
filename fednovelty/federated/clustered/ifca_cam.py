"""IFCA-CAM (the Fed-CAM paper, Alg. 1): IFCA on the clustered additive model.

A global model is added to the cluster models' logits, ``F_i(x) = h(x; Theta_g) +
f(x; Theta_c(i))`` (Eq. 1). After ``warmup_rounds`` rounds of FedAvg on the global model
alone, each round a client joins the cluster whose ``h + f_k`` has the least loss (Eq. 2)
and trains each half on the residual of the other.
"""

from __future__ import annotations

from typing import ClassVar

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_cluster_step import MinLossClusterStep
from fednovelty.federated.clustered.cam_global_warmup import GlobalWarmupStep
from fednovelty.federated.clustered.cam_settings import WARMUP_SHARE, ClusteredConfig, WarmupRule
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["IFCACAM", "IFCACAMConfig"]


@settings_dataclass
class IFCACAMConfig(ClusteredConfig):
    """Settings of :class:`IFCACAM` (:class:`ClusteredConfig`'s); ``warmup_rounds=None``
    warms up ``round(0.3 * rounds)`` rounds."""

    WARMUP: ClassVar[WarmupRule | None] = WarmupRule(share=WARMUP_SHARE)


class IFCACAM(ClusteredAlgorithm):
    """IFCA-CAM: a global model added to IFCA's cluster models; after a warm-up of FedAvg on
    the global model, each client joins the cluster whose additive model has the least loss
    and trains each half on the residual of the other."""

    method = "IFCA-CAM"
    config_class = IFCACAMConfig
    warmup = GlobalWarmupStep
    clustering = MinLossClusterStep
    additive = True
