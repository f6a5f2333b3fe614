"""The Fed-CAM paper's classification methods by name (Table 1): :data:`CLUSTERED_METHODS`.

Each name maps to its algorithm class (registered under the class name, e.g.
``build_algorithm("IFCACAM", ...)``); the estimator
:class:`~fednovelty.detectors.cam.ClusteredFLClassifier` picks its class here.
"""

from __future__ import annotations

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus
from fednovelty.federated.clustered.fesem import FeSEM
from fednovelty.federated.clustered.fesem_cam import FeSEMCAM
from fednovelty.federated.clustered.ifca import IFCA
from fednovelty.federated.clustered.ifca_cam import IFCACAM

__all__ = ["CLUSTERED_METHODS"]

#: the paper's name of each method -> its algorithm class.
CLUSTERED_METHODS: dict[str, type[ClusteredAlgorithm]] = {
    cls.method: cls for cls in (FedAvgPlus, IFCA, FeSEM, IFCACAM, FeSEMCAM)
}
