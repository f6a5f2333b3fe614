"""The federated algorithms by name: one table that every engine and run config reads.

An engine never imports an algorithm class: Flower's ServerApp and ClientApp build the
algorithm a run config names with :func:`build_algorithm` (the same settings dataclass on
both sides, from the JSON of :func:`algorithm_settings`), and a result file records
:func:`algorithm_name` and :func:`algorithm_settings`. The table is read from the package:
an algorithm registers itself when its class is defined with a ``config_class``
(``to_json`` / ``from_json``): nothing else names it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from typing import Any

import fednovelty.federated as _package
from fednovelty.federated.core.base import REGISTERED, FederatedAlgorithm


def _package_classes() -> list[type]:
    """Every class defined in a module of :mod:`fednovelty.federated` (each imported once, so
    that every algorithm of the package has registered itself)."""
    found = []
    for info in pkgutil.walk_packages(_package.__path__, f"{_package.__name__}."):
        module = importlib.import_module(info.name)
        found += [
            value
            for value in vars(module).values()
            if inspect.isclass(value) and value.__module__ == module.__name__
        ]
    return found


_CLASSES = _package_classes()
#: algorithm name (its class name) -> class: every ``FederatedAlgorithm`` with a
#: ``config_class``, registered when its class is defined (the package's, and any defined
#: later, e.g. an extension's); the same dict as ``fednovelty.federated.core.base.REGISTERED``.
ALGORITHMS: dict[str, type[FederatedAlgorithm]] = REGISTERED
#: the server-state dataclasses a result file may hold, by class name: the dataclasses of the
#: package named ``...State`` (what the algorithms' ``start`` returns).
STATES: dict[str, type] = {
    cls.__name__: cls
    for cls in _CLASSES
    if dataclasses.is_dataclass(cls) and cls.__name__.endswith("State")
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
