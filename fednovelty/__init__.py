"""fednovelty: federated novelty and anomaly detection with Gaussian mixtures.

Scores follow scikit-learn and PyOD: ``score_samples(X)`` is ``log p(x)`` (higher = more
normal) and ``decision_function(X)`` is ``-log p(x)`` (higher = more anomalous).

The detectors are imported on first use (PEP 562), so that processes which need only the
math and algorithm layers (e.g. every Flower ClientApp process) do not pay for PyOD and
scikit-learn.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

__all__ = [
    "ClusteredFLClassifier",
    "ClusteredFedGMMDetector",
    "FedGMMDetector",
    "FedGenGMMDetector",
    "FedKNNMarkerDetector",
    "FedVBDetector",
    "JointFedGMMDetector",
    "LocalGMMDetector",
    "PFedEMDetector",
    "StreamingFedGMMDetector",
    "VGM2Classifier",
    "__version__",
    "load",
]

_LAZY = {
    "ClusteredFLClassifier",
    "ClusteredFedGMMDetector",
    "FedGMMDetector",
    "FedKNNMarkerDetector",
    "FedVBDetector",
    "FedGenGMMDetector",
    "JointFedGMMDetector",
    "LocalGMMDetector",
    "PFedEMDetector",
    "StreamingFedGMMDetector",
    "VGM2Classifier",
    "load",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module("fednovelty.detectors"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fednovelty' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
