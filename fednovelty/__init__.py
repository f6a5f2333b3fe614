"""fednovelty: federated novelty and anomaly detection with Gaussian mixtures.

Scores follow scikit-learn and PyOD: ``score_samples(X)`` is ``log p(x)`` (higher = more
normal) and ``decision_function(X)`` is ``-log p(x)`` (higher = more anomalous).
"""

from fednovelty.detectors import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector, load

__version__ = "0.1.0"

__all__ = ["FedGMMDetector", "FedGenGMMDetector", "LocalGMMDetector", "__version__", "load"]
