"""fednovelty: federated novelty and anomaly detection with Gaussian mixtures."""

__version__ = "0.1.0"
