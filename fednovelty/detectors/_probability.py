"""PyOD's outlier probabilities from decision scores, robust to infinite scores.

A row far outside every Gaussian has ``log p(x) = -inf`` and a score of ``+inf``; PyOD's own
scaling turns such a training score into NaN probabilities for every row. These functions
scale by the finite training scores only and map ``+inf`` to 1 and ``-inf`` to 0.
"""

from __future__ import annotations

import numpy as np

__all__ = ["finite_moments", "outlier_labels", "outlier_probability"]


def outlier_probability(scores: np.ndarray, train: np.ndarray, method: str) -> np.ndarray:
    """Probability that each of ``scores`` (n_samples,) is an anomaly, in [0, 1], from the
    training scores ``train`` (n_train,): ``"linear"`` min-max or ``"unify"`` erf scaling of
    the finite training scores (see ``MixtureDetector.predict_proba``); +inf -> 1, -inf -> 0.
    """
    from scipy.special import erf

    finite = train[np.isfinite(train)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if method == "linear":
            low, high = (finite.min(), finite.max()) if finite.size else (0.0, 0.0)
            span = high - low
            if span > 0 and np.isfinite(span):
                anomaly = (scores - low) / span
            else:  # one training score (or none): above it is anomalous
                anomaly = (scores > high).astype(np.float64)
        else:
            mu, sigma = finite_moments(train)
            if sigma > 0 and np.isfinite(sigma):
                anomaly = erf((scores - mu) / (sigma * np.sqrt(2.0)))
            else:
                anomaly = (scores > mu).astype(np.float64)
    anomaly = np.where(np.isposinf(scores), 1.0, np.where(np.isneginf(scores), 0.0, anomaly))
    return np.clip(np.nan_to_num(anomaly, nan=1.0), 0.0, 1.0)


def outlier_labels(scores: np.ndarray, threshold: float) -> np.ndarray:
    """PyOD's binary labels (n_samples,) of decision ``scores``: 1 (anomaly) unless the score
    is at most ``threshold``, so a NaN score is an anomaly, never an inlier."""
    return (~(np.asarray(scores) <= threshold)).astype(int).ravel()


def finite_moments(scores: np.ndarray) -> tuple[float, float]:
    """Mean and standard deviation of the finite ``scores`` (PyOD's ``_mu``, ``_sigma``);
    ``(0, 1)`` if none is finite."""
    finite = scores[np.isfinite(scores)].astype(np.float64)
    if finite.size == 0:
        return 0.0, 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.mean(finite)), float(np.std(finite))
