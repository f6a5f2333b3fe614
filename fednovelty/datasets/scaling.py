"""Federated min-max scaling: only per-client feature minima and maxima leave a client.

Each client sends ``client_minmax(X_client)``, two vectors of shape (n_features,); the server
merges them with :func:`merge_minmax` (element-wise min of minima, max of maxima), which equals
the pooled data's min and max exactly, in any order and for any partition. The resulting
:class:`MinMaxScaling` is broadcast back and applied locally.

Choices, and why:

- ``transform`` maps the fitted range to [0, 1] but does not clip: for novelty detection a test
  value outside the training range is signal, not noise.
- A constant feature (``max == min``) gets scale 1, as in scikit-learn's ``MinMaxScaler``: its
  training values map to exactly 0 and nothing is divided by zero; a new value keeps its offset
  from the constant, in original units, so a detector can still see it.
- Only min/max are shared, no row-level data; note that extremes are themselves individual
  values, so they are not private in the differential-privacy sense.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["MinMaxScaling", "client_minmax", "merge_minmax"]


def _check_X(X: ArrayLike, name: str = "X") -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(
            f"{name} must be a non-empty 2-D array (n_samples, n_features); got shape {X.shape}."
        )
    if not np.isfinite(X).all():
        raise ValueError(f"{name} contains NaN or infinite values; drop or impute them first.")
    return X


def client_minmax(X: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """One client's message: per-feature minimum and maximum of its rows.

    Args:
        X: shape (n_samples, n_features), finite, at least one row.

    Returns:
        ``(data_min, data_max)``, float64, each of shape (n_features,).

    Example:
        >>> lo, hi = client_minmax([[1.0, 5.0], [3.0, 2.0]])
        >>> lo.tolist(), hi.tolist()
        ([1.0, 2.0], [3.0, 5.0])
    """
    X = _check_X(X)
    return X.min(axis=0), X.max(axis=0)


def merge_minmax(
    stats: Iterable[tuple[ArrayLike, ArrayLike]],
) -> tuple[np.ndarray, np.ndarray]:
    """Server step: combine the clients' ``(min, max)`` pairs into the pooled ones.

    Args:
        stats: one ``(data_min, data_max)`` pair per client, each of shape (n_features,).

    Returns:
        ``(data_min, data_max)``, float64, each of shape (n_features,).

    Example:
        >>> lo, hi = merge_minmax([([1.0, 2.0], [3.0, 5.0]), ([0.0, 4.0], [2.0, 9.0])])
        >>> lo.tolist(), hi.tolist()
        ([0.0, 2.0], [3.0, 9.0])
    """
    pairs = [(np.asarray(lo, np.float64), np.asarray(hi, np.float64)) for lo, hi in stats]
    if not pairs:
        raise ValueError("stats is empty; need (min, max) from at least one client.")
    shape = pairs[0][0].shape
    for client, (lo, hi) in enumerate(pairs):
        if lo.ndim != 1 or lo.shape != shape or hi.shape != shape:
            raise ValueError(
                f"stats[{client}] has min shape {lo.shape} and max shape {hi.shape}; every "
                f"client must send two vectors of shape {shape} (n_features,)."
            )
    lows, highs = zip(*pairs, strict=True)
    return np.min(lows, axis=0), np.max(highs, axis=0)


@dataclass(frozen=True, eq=False)
class MinMaxScaling:
    """A fitted min-max scaling ``(X - data_min) / (data_max - data_min)``.

    Attributes:
        data_min: shape (n_features,), float64, read-only.
        data_max: shape (n_features,), float64, read-only, ``>= data_min``.

    Example:
        >>> scaling = MinMaxScaling.from_clients([[[0.0, 1.0]], [[4.0, 1.0], [2.0, 1.0]]])
        >>> scaling.transform([[1.0, 1.0], [4.0, 3.0]]).tolist()
        [[0.25, 0.0], [1.0, 2.0]]
    """

    data_min: np.ndarray
    data_max: np.ndarray

    def __post_init__(self) -> None:
        lo = np.array(self.data_min, dtype=np.float64)  # copies: the caller's arrays stay as-is
        hi = np.array(self.data_max, dtype=np.float64)
        if lo.ndim != 1 or lo.shape != hi.shape:
            raise ValueError(
                f"data_min and data_max must be 1-D of the same shape (n_features,); got "
                f"{lo.shape} and {hi.shape}."
            )
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            raise ValueError("data_min and data_max must be finite.")
        if (lo > hi).any():
            raise ValueError(
                f"data_min exceeds data_max for features {np.flatnonzero(lo > hi)[:5].tolist()}."
            )
        lo.setflags(write=False)
        hi.setflags(write=False)
        object.__setattr__(self, "data_min", lo)
        object.__setattr__(self, "data_max", hi)

    @classmethod
    def from_clients(cls, client_data: Iterable[ArrayLike]) -> MinMaxScaling:
        """Simulate the federated round: ``client_minmax`` per client, then ``merge_minmax``.

        A client with no rows (shape (0, n_features)) sends nothing, as a dropped-out client
        would; at least one client must have data.

        Args:
            client_data: one array of shape (n_samples_c, n_features) per client.
        """
        arrays = [np.asarray(X) for X in client_data]
        return cls(*merge_minmax(client_minmax(X) for X in arrays if X.size or X.ndim != 2))

    def transform(self, X: ArrayLike) -> np.ndarray:
        """Scale rows; the fitted range maps to [0, 1] (no clipping outside it).

        Args:
            X: shape (n_samples, n_features), finite. Not modified.

        Returns:
            New float64 array of shape (n_samples, n_features).
        """
        X = _check_X(X)
        if X.shape[1] != self.data_min.shape[0]:
            raise ValueError(
                f"X has {X.shape[1]} features but this scaling was fitted on "
                f"{self.data_min.shape[0]}."
            )
        scale = self.data_max - self.data_min
        scale[scale == 0.0] = 1.0  # constant feature: training values map to 0
        return (X - self.data_min) / scale
