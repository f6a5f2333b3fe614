"""The federated algorithms by name: one table that every engine and run config reads.

An engine never imports an algorithm class: Flower's ServerApp and ClientApp build the
algorithm a run config names with :func:`build_algorithm` (the same settings dataclass on
both sides, from the JSON of :func:`algorithm_settings`), and a result file records
:func:`algorithm_name` and :func:`algorithm_settings`. :data:`ALGORITHMS` lists the
package's algorithms (name -> the module defining the class of that name), :data:`STATES`
the server states a result file may hold; a module is imported when its name is first
looked up. An algorithm defined elsewhere is added with :func:`register_algorithm`; it
cannot take a name of the package's.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from fednovelty.federated.core.base import FederatedAlgorithm

#: The package's algorithms: class name -> the module that defines it.
BUILTIN_ALGORITHMS: dict[str, str] = {
    "FederatedEM": "fednovelty.federated.mixtures.em",
    "FederatedFactorEM": "fednovelty.federated.mixtures.factor_em",
    "FedGenGMM": "fednovelty.federated.mixtures.fedgengmm",
    "LocalGMMs": "fednovelty.federated.mixtures.fedgengmm",
    "FederatedPCA": "fednovelty.federated.mixtures.pca",
    "ClusteredEM": "fednovelty.federated.clustered.clustered_em",
    "FedAvgPlus": "fednovelty.federated.clustered.fedavg_plus",
    "IFCA": "fednovelty.federated.clustered.ifca",
    "FeSEM": "fednovelty.federated.clustered.fesem",
    "IFCACAM": "fednovelty.federated.clustered.ifca_cam",
    "FeSEMCAM": "fednovelty.federated.clustered.fesem_cam",
    "FederatedVB": "fednovelty.federated.bayesian.variational",
    "FederatedVBOneShot": "fednovelty.federated.bayesian.vb_oneshot",
    "FederatedKNNMarkers": "fednovelty.federated.bayesian.knn_markers",
    "VGM2": "fednovelty.federated.bayesian.vgm2",
    "VGM2Local": "fednovelty.federated.bayesian.vgm2_local",
    "VGM2FedAvg": "fednovelty.federated.bayesian.vgm2_fedavg",
    "VGM2Prototype": "fednovelty.federated.bayesian.vgm2_prototype",
    "JointFedGMM": "fednovelty.federated.joint_models.joint",
    "PFedEM": "fednovelty.federated.joint_models.pfedem",
    "StreamingEM": "fednovelty.federated.streams.streaming",
    "FederatedCalibration": "fednovelty.federated.calibration.quantile",
}
#: The server-state dataclasses a result file may hold: class name -> its module.
BUILTIN_STATES: dict[str, str] = {
    "EMState": "fednovelty.federated.mixtures.em",
    "FactorEMState": "fednovelty.federated.mixtures.factor_em",
    "FedGenState": "fednovelty.federated.mixtures.fedgengmm",
    "PCAState": "fednovelty.federated.mixtures.pca",
    "ProjectedState": "fednovelty.federated.mixtures.projected",
    "ClusteredEMState": "fednovelty.federated.clustered.clustered_em",
    "ClusteredState": "fednovelty.federated.clustered.cam_settings",
    "VBState": "fednovelty.federated.bayesian.variational",
    "VBOneShotState": "fednovelty.federated.bayesian.vb_oneshot",
    "VGM2State": "fednovelty.federated.bayesian.vgm2_settings",
    "JointState": "fednovelty.federated.joint_models.joint",
    "StreamState": "fednovelty.federated.streams.streaming",
    "BoundsState": "fednovelty.federated.trust.private_bounds",
    "ClientState": "fednovelty.federated.trust.secure",
    "CalibrationState": "fednovelty.federated.calibration.quantile",
}


class ClassTable(Mapping[str, type]):
    """Class name -> class, for a table of class name -> module: a module is imported when
    one of its names is first looked up; :meth:`add` takes a class defined elsewhere."""

    def __init__(self, modules: Mapping[str, str]):
        self._modules = dict(modules)
        self._added: dict[str, type] = {}

    def __getitem__(self, name: str) -> type:
        if name in self._added:
            return self._added[name]
        return getattr(importlib.import_module(self._modules[name]), name)

    def __iter__(self) -> Iterator[str]:
        return iter([*self._modules, *self._added])

    def __len__(self) -> int:
        return len(self._modules) + len(self._added)

    def __contains__(self, name: object) -> bool:
        return name in self._modules or name in self._added

    def name_of(self, cls: type) -> str | None:
        """The name ``cls`` is listed under, or ``None``."""
        name = cls.__name__
        if self._added.get(name) is cls or self._modules.get(name) == cls.__module__:
            return name
        return None

    def add(self, cls: type) -> None:
        """List ``cls`` under its class name (a name of the package's stays the package's)."""
        if cls.__name__ in self._modules:
            raise ValueError(
                f"{cls.__name__!r} names one of the package's own classes; give "
                f"{cls.__module__}.{cls.__name__} another name."
            )
        self._added[cls.__name__] = cls

    def remove(self, name: str) -> None:
        """Forget a class :meth:`add` listed (the package's own cannot be removed)."""
        self._added.pop(name, None)


#: algorithm name (its class name) -> class: the package's (:data:`BUILTIN_ALGORITHMS`)
#: and those added by :func:`register_algorithm`.
ALGORITHMS = ClassTable(BUILTIN_ALGORITHMS)
#: the server-state dataclasses a result file may hold, by class name.
STATES = ClassTable(BUILTIN_STATES)


def register_algorithm(cls: type[FederatedAlgorithm], state: type | None = None) -> type:
    """Let engines build ``cls`` by its class name (and result files hold ``state``, its
    server-state dataclass); returns ``cls``, so it also serves as a class decorator.

    Raises:
        ValueError: ``cls`` has no ``config_class`` (engines build an algorithm from its
            settings), or its name is one of the package's algorithms.
    """
    if getattr(cls, "config_class", None) is None:
        raise ValueError(
            f"{cls.__name__} has no config_class: engines build an algorithm from its settings "
            "dataclass; set config_class on the class."
        )
    ALGORITHMS.add(cls)
    if state is not None:
        STATES.add(state)
    return cls


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
    return ALGORITHMS.name_of(type(algorithm)) or type(algorithm).__name__


def algorithm_settings(algorithm: FederatedAlgorithm) -> dict[str, Any]:
    """``algorithm``'s settings as a JSON object (``{}`` for an algorithm without a
    ``config``); ``build_algorithm(algorithm_name(a), algorithm_settings(a))`` rebuilds it.

    Raises:
        ValueError: a setting JSON cannot carry (a custom learner factory).
    """
    config = getattr(algorithm, "config", None)
    return {} if config is None else config.to_json()
