"""Comparing floats that were computed twice.

Two computations of the same quantity (two code paths, another library, sums in another
order, a model scored again after save and load) agree only to round-off, and where the
last bits fall depends on the CPU, the BLAS build, the thread count and memory layout. Such
comparisons therefore allow an error relative to the values' scale: per element
``|actual - expected| <= rtol * |expected| + rtol * max|expected|``, the second term covering
elements near zero that come out of sums of larger terms. Values that are copied (tensors
saved and read back, ids, labels, counts) are compared exactly instead.

Test folders have no ``__init__.py``; pytest puts ``tests/`` (the folder of the top-level
``conftest.py``) on ``sys.path``, so test modules import this one as ``_tolerance``.
"""

from __future__ import annotations

import numpy as np


def _as_numpy(values) -> np.ndarray:
    """A NumPy array of ``values`` (NumPy array, torch tensor, list or scalar)."""
    if hasattr(values, "detach"):  # a torch tensor, on any device
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def assert_close_scaled(actual, expected, rtol: float = 1e-12, err_msg: str = "") -> None:
    """Assert ``actual`` equals ``expected`` up to ``rtol`` relative to ``expected``'s scale.

    Args:
        actual: array-like (NumPy, torch or nested lists), any shape.
        expected: array-like of the same shape; its largest finite magnitude is the scale.
        rtol: relative tolerance, per element and (as an absolute tolerance) times the
            scale. ``rtol=0`` asks for exact equality.
        err_msg: text added to the failure message (e.g. the tensor's name).

    Infinities and NaNs must sit at the same places with the same signs
    (``np.testing.assert_allclose``'s rule).
    """
    actual, expected = _as_numpy(actual), _as_numpy(expected)
    finite = np.abs(expected[np.isfinite(expected)])
    scale = float(finite.max()) if finite.size else 0.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale, err_msg=err_msg)
