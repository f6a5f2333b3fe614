"""VGM2 and its baselines by name: the table ``VGM2Classifier(method=...)`` reads.

Each method is its own registered algorithm (its class name in
:mod:`fednovelty.federated.registry`); this table names them as the VGM2 paper's Table 1
does: ``"vgm2"`` (:class:`~fednovelty.federated.bayesian.vgm2.VGM2`), ``"local"``,
``"fedavg"`` and ``"prototype"`` (the baselines on the same encoder).
"""

from __future__ import annotations

from fednovelty.federated.bayesian.vgm2 import VGM2
from fednovelty.federated.bayesian.vgm2_algorithm import EncoderAlgorithm
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.bayesian.vgm2_local import VGM2Local
from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype

__all__ = ["VGM2_ALGORITHMS", "VGM2_METHODS"]

#: method name -> algorithm class (each class's config states the name as ``METHOD``).
VGM2_ALGORITHMS: dict[str, type[EncoderAlgorithm]] = {
    cls.config_class.METHOD: cls for cls in (VGM2, VGM2Local, VGM2FedAvg, VGM2Prototype)
}
#: VGM2's methods: the paper's and its baselines on the same encoder.
VGM2_METHODS: tuple[str, ...] = tuple(VGM2_ALGORITHMS)
