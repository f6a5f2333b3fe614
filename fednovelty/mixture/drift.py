"""Drift statistics of a stream: how far mixture weights moved, how surprising a window is,
and a CUSUM alarm with a chosen false-alarm rate.

- :func:`total_variation`: ``0.5 * sum_k |p_k - q_k|`` between two weight vectors, in [0, 1].
- :func:`standardized_surprise`: a window's mean log-likelihood under the previous model
  against the reference mean and spread of per-row log-likelihoods, as a z-score
  (positive = less likely than usual): ``(mu_ref - mean_ll) / (sd_ref / sqrt(n))``.
- One-sided CUSUM on z-scores (Page 1954): ``S_t = max(0, S_{t-1} + z_t - k)``, an alarm when
  ``S_t > h`` (then ``S`` restarts at 0). For independent standard-normal ``z`` (a
  stationary stream), Siegmund's approximation gives the average run length between false
  alarms, ``ARL0 = (exp(2 k b) - 2 k b - 1) / (2 k^2)`` with ``b = h + 1.166``;
  :func:`cusum_threshold` inverts it, so ``h`` follows from the false-alarm rate per window
  ``1 / ARL0`` a user accepts. ``k = 0.5`` (the default) is tuned to shifts of one standard
  error.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "cusum_arl0",
    "cusum_step",
    "cusum_threshold",
    "standardized_surprise",
    "total_variation",
]

_SIEGMUND = 1.166


def total_variation(p, q) -> np.ndarray:
    """Total variation ``0.5 * sum |p - q|`` over the last axis: (..., K), (..., K) -> (...).

    Example:
        >>> float(total_variation([0.5, 0.5], [1.0, 0.0]))
        0.5
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape; got {p.shape} and {q.shape}.")
    return 0.5 * np.abs(p - q).sum(axis=-1)


def standardized_surprise(mean_ll: float, n_rows: int, ref_mean: float, ref_sd: float) -> float:
    """z-score of a window's mean log-likelihood (``n_rows`` rows) against a reference
    per-row mean and standard deviation; positive when the window is less likely than the
    reference. ``n_rows = 0`` gives 0 (no evidence)."""
    if n_rows <= 0:
        return 0.0
    if not ref_sd > 0:
        raise ValueError(f"ref_sd must be > 0; got {ref_sd!r}.")
    return float((ref_mean - mean_ll) / (ref_sd / math.sqrt(n_rows)))


def cusum_step(statistic: float, z: float, k: float, h: float) -> tuple[float, bool]:
    """One CUSUM update: ``(new statistic, alarm)``; after an alarm the statistic is 0."""
    value = max(0.0, statistic + z - k)
    if value > h:
        return 0.0, True
    return value, False


def cusum_arl0(h: float, k: float = 0.5) -> float:
    """Siegmund's approximation of the average windows between false alarms on a stationary
    stream of standard-normal z-scores (see the module doc)."""
    _check_positive(k, "k")
    b = 2.0 * k * (h + _SIEGMUND)
    return (math.exp(b) - b - 1.0) / (2.0 * k * k)


def cusum_threshold(false_alarm_rate: float, k: float = 0.5) -> float:
    """The threshold ``h`` whose false-alarm rate per window (``1 / ARL0``) on a stationary
    stream is ``false_alarm_rate``, by bisection on :func:`cusum_arl0`.

    Example:
        >>> round(cusum_threshold(0.01), 2)
        2.84
    """
    if not 0.0 < false_alarm_rate < 1.0:
        raise ValueError(f"false_alarm_rate must be in (0, 1); got {false_alarm_rate!r}.")
    target = 1.0 / false_alarm_rate
    low, high = 0.0, 1.0
    while cusum_arl0(high, k) < target:
        high *= 2.0
    if cusum_arl0(low, k) >= target:
        return 0.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if cusum_arl0(mid, k) < target else (low, mid)
    return 0.5 * (low + high)


def _check_positive(value: float, name: str) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0; got {value!r}.")
