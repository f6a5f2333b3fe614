"""fednovelty: federated novelty and anomaly detection with Gaussian mixtures.

Scores follow scikit-learn and PyOD: ``score_samples(X)`` is ``log p(x)`` (higher = more
normal) and ``decision_function(X)`` is ``-log p(x)`` (higher = more anomalous).

The detectors are imported on first use (PEP 562), so that processes which need only the
math and algorithm layers (e.g. every Flower ClientApp process) do not import PyOD or the
estimator layer; ``fednovelty.federated`` imports an algorithm's modules when it is first
named, so a ClientApp running federated EM does not import scikit-learn either.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

#: The lazily imported names: every export of :mod:`fednovelty.detectors`.
_LAZY_FROM = "fednovelty.detectors"


def _detector_names() -> list[str]:
    return list(importlib.import_module(_LAZY_FROM).__all__)


def _could_export(name: str) -> bool:
    """Whether ``name`` may be a detector export, decided without importing the detectors:
    not private and not a subpackage (``from fednovelty import federated`` asks for it
    before importing it, and must not import PyOD)."""
    return not name.startswith("_") and importlib.util.find_spec(f"fednovelty.{name}") is None


def __getattr__(name: str):
    if name == "__all__":  # the detectors' exports and the version, read on first use
        value = sorted(["__version__", *_detector_names()])
    elif _could_export(name) and name in _detector_names():
        value = getattr(importlib.import_module(_LAZY_FROM), name)
    else:
        raise AttributeError(f"module 'fednovelty' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__getattr__("__all__")})
