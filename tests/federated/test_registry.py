"""The algorithm registry is one table: every algorithm of the package is listed under its
class name (and only those), engines build one by name, and an algorithm defined elsewhere is
added by name without taking one of the package's."""

import importlib
import inspect
import pkgutil

import numpy as np
import pytest
import torch

import fednovelty.federated as package
from fednovelty.federated import registry
from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.core.steps import ChainedAlgorithm
from fednovelty.federated.init.moments import MomentsStep
from fednovelty.federated.mixtures.em import EMConfig, EMState
from fednovelty.runtime import run_simulation


def _package_algorithms() -> dict[str, str]:
    """Every algorithm class of the package with settings (a ``config_class``), found by
    walking the modules: the independent reference the table is checked against."""
    found = {}
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and value.__module__ == module.__name__
                and issubclass(value, FederatedAlgorithm)
                and getattr(value, "config_class", None) is not None
            ):
                found[name] = module.__name__
    return found


def test_the_table_lists_every_algorithm_of_the_package_and_nothing_else():
    assert registry.BUILTIN_ALGORITHMS == _package_algorithms()


def test_every_algorithm_of_the_package_is_registered_under_its_class_name():
    assert {"FederatedEM", "FedGenGMM", "FederatedVB", "VGM2", "StreamingEM"} <= set(
        registry.ALGORITHMS
    )
    for name, cls in registry.ALGORITHMS.items():
        assert cls.__name__ == name and cls.config_class is not None
    assert {"EMState", "VBState", "FedGenState"} <= set(registry.STATES)


def test_an_algorithm_defined_elsewhere_is_built_by_name_and_cannot_shadow_the_packages():
    class OneRoundMoments(ChainedAlgorithm):
        """A new algorithm: one round of pooled moments (defined here, named nowhere)."""

        config_class = EMConfig

        def __init__(self, **settings):
            self._setup(EMConfig(n_components=1, standardize=True, **settings))

        def _setup(self, config):
            super()._setup(config)
            self._chain([MomentsStep(config)])

        def new_state(self):
            return EMState(phase="")

    class FederatedEM(OneRoundMoments):
        """A class outside the package with a package algorithm's name."""

    with pytest.raises(ValueError, match="one of the package's own"):
        registry.register_algorithm(FederatedEM)
    with pytest.raises(ValueError, match="no config_class"):
        registry.register_algorithm(type("Bare", (ChainedAlgorithm,), {}))
    assert "OneRoundMoments" not in registry.ALGORITHMS
    registry.register_algorithm(OneRoundMoments)
    try:
        assert registry.ALGORITHMS["OneRoundMoments"] is OneRoundMoments
        algorithm = registry.build_algorithm(
            "OneRoundMoments", registry.algorithm_settings(OneRoundMoments())
        )
        rng = np.random.default_rng(0)
        clients = [torch.as_tensor(rng.normal(3.0, 2.0, (50, 2))) for _ in range(3)]
        state = run_simulation(algorithm, clients, random_state=0).state
        pooled = torch.cat(clients)
        torch.testing.assert_close(state.offset, pooled.mean(0))
        assert registry.algorithm_name(algorithm) == "OneRoundMoments"
        assert registry.ALGORITHMS["FederatedEM"] is not FederatedEM
        assert registry.ALGORITHMS["FederatedEM"].__module__ == "fednovelty.federated.mixtures.em"
    finally:
        registry.ALGORITHMS.remove("OneRoundMoments")
