"""The federated algorithms by name: one table that every engine and run config reads.

An engine never imports an algorithm class: Flower's ServerApp and ClientApp build the
algorithm a run config names with :func:`build_algorithm` (the same settings dataclass on
both sides, from the JSON of :func:`algorithm_settings`), and a result file records
:func:`algorithm_name` and :func:`algorithm_settings`. A new algorithm is one entry in
``ALGORITHMS`` (its class has a ``config_class`` with ``to_json`` / ``from_json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fednovelty.federated.base import FederatedAlgorithm
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers
from fednovelty.federated.bayesian.variational import FederatedVB, VBState
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot, VBOneShotState
from fednovelty.federated.bayesian.vgm2 import VGM2, VGM2State
from fednovelty.federated.clustered.cam import ClusteredFL, ClusteredState
from fednovelty.federated.clustered.clustered_em import ClusteredEM, ClusteredEMState
from fednovelty.federated.joint_models.joint import JointFedGMM, JointState
from fednovelty.federated.joint_models.pfedem import PFedEM
from fednovelty.federated.mixtures.em import EMState, FederatedEM
from fednovelty.federated.mixtures.fedgengmm import FedGenGMM, FedGenState, LocalGMMs
from fednovelty.federated.mixtures.pca import FederatedPCA, PCAState
from fednovelty.federated.streams.streaming import StreamingEM, StreamState

#: algorithm name -> class (its ``config_class`` reads the JSON settings).
ALGORITHMS: dict[str, type[FederatedAlgorithm]] = {
    "FederatedEM": FederatedEM,
    "JointFedGMM": JointFedGMM,
    "FedGenGMM": FedGenGMM,
    "LocalGMMs": LocalGMMs,
    "FederatedPCA": FederatedPCA,
    "StreamingEM": StreamingEM,
    "PFedEM": PFedEM,
    "ClusteredFL": ClusteredFL,
    "ClusteredEM": ClusteredEM,
    "FederatedVB": FederatedVB,
    "VGM2": VGM2,
    "FederatedVBOneShot": FederatedVBOneShot,
    "FederatedKNNMarkers": FederatedKNNMarkers,
}

#: the server-state classes of the algorithms in ``ALGORITHMS``, by class name.
STATES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        EMState,
        JointState,
        FedGenState,
        PCAState,
        StreamState,
        ClusteredState,
        ClusteredEMState,
        VBState,
        VGM2State,
        VBOneShotState,
    )
}


def build_algorithm(name: str, params: Mapping[str, Any]) -> FederatedAlgorithm:
    """Algorithm ``name`` with the settings of a JSON object (``algorithm_settings``'s form:
    dtypes as ``"float64"``, lists for tuples and tensors, ``"learner": "mlp"``); missing
    settings keep their defaults.

    Raises:
        ValueError: an unknown name (naming the known ones), or settings the algorithm
            does not take or accept (naming the setting).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; must be one of {sorted(ALGORITHMS)}.")
    cls = ALGORITHMS[name]
    try:
        config = cls.config_class.from_json(dict(params))
    except (TypeError, ValueError) as error:
        raise ValueError(f"settings do not fit {name}: {error}") from None
    return cls.from_config(config)


def algorithm_name(algorithm: FederatedAlgorithm) -> str:
    """The registry name of ``algorithm``'s class (its class name if it is not registered,
    e.g. a test's wrapper)."""
    for name, cls in ALGORITHMS.items():
        if type(algorithm) is cls:
            return name
    return type(algorithm).__name__


def algorithm_settings(algorithm: FederatedAlgorithm) -> dict[str, Any]:
    """``algorithm``'s settings as a JSON object (``{}`` for an algorithm without a
    ``config``); ``build_algorithm(algorithm_name(a), algorithm_settings(a))`` rebuilds it.

    Raises:
        ValueError: a setting JSON cannot carry (a custom learner factory).
    """
    config = getattr(algorithm, "config", None)
    return {} if config is None else config.to_json()
