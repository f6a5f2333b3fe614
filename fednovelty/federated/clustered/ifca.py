"""IFCA (Ghosh et al. 2020), a baseline of the Fed-CAM paper: K cluster models, each client
joining the one of least loss on its rows.

Each round a client evaluates every cluster model's mean cross-entropy on its rows, joins
the argmin, trains that model and sends it back; the server averages each cluster's copies
(:class:`~fednovelty.federated.clustered.cam_cluster_step.MinLossClusterStep`). No warm-up.
"""

from __future__ import annotations

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_cluster_step import MinLossClusterStep
from fednovelty.federated.clustered.cam_settings import ClusteredConfig
from fednovelty.federated.core.config import settings_dataclass

__all__ = ["IFCA", "IFCAConfig"]


@settings_dataclass
class IFCAConfig(ClusteredConfig):
    """Settings of :class:`IFCA` (:class:`ClusteredConfig`'s); no warm-up."""


class IFCA(ClusteredAlgorithm):
    """IFCA: each client joins the cluster model of least loss on its rows, trains it and
    sends it back; the server averages each cluster's copies."""

    method = "IFCA"
    config_class = IFCAConfig
    clustering = MinLossClusterStep
