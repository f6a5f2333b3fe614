"""The units the preparation rounds work in, and the row counts their halves share.

A fit works in the user's units, in a public box's units (``bounds``: the box mapped to
``[-1, 1]`` per feature, :func:`box_units`) or in pooled z-scores (``standardize``); the
server's state holds the map ``z = (x - offset) / scale`` (``state.offset``,
``state.scale``; ``None``: the user's units) and :func:`to_working_units` takes user-unit
points into it. :func:`row_count` is the ``n_samples`` a client reply carries and
:func:`check_enough` the server's check that the rows can seed the components.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def check_bounds(bounds: Any) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Public feature bounds as ``(low, high)`` tuples of floats (``None`` stays).

    Raises:
        ValueError: not two rows of one finite value per feature with ``low < high``.
    """
    if bounds is None:
        return None
    try:
        low, high = (tuple(float(v) for v in torch.as_tensor(row).reshape(-1)) for row in bounds)
    except (TypeError, ValueError):
        raise ValueError(
            f"bounds must be (low, high), each one finite value per feature; got {bounds!r}."
        ) from None
    if len(low) != len(high) or not low:
        raise ValueError(
            f"bounds must give low and high for every feature; got {len(low)} and {len(high)}."
        )
    if not all(
        math.isfinite(a) and math.isfinite(b) and a < b for a, b in zip(low, high, strict=True)
    ):
        raise ValueError("bounds must be finite with low < high for every feature.")
    return low, high


def box_units(bounds: tuple, like: Tensor) -> tuple[Tensor, Tensor]:
    """``(offset, scale)`` (each (n_features,)) of the map ``u = (x - offset) / scale`` that
    takes the box ``bounds`` to ``[-1, 1]`` per feature, in ``like``'s dtype and device."""
    low, high = (torch.tensor(row, dtype=like.dtype, device=like.device) for row in bounds)
    return (low + high) / 2, (high - low) / 2


def server_like(config: Any) -> Tensor:
    """An empty tensor in the server's dtype and device (``config``'s)."""
    return torch.empty(0, dtype=config.dtype, device=config.device)


def to_working_units(state: Any, points: Tensor) -> Tensor:
    """User-unit points (m, n_features) in the units the rounds work in (z-scores after a
    standardising moments round)."""
    return points if state.scale is None else (points - state.offset) / state.scale


def row_count(X: Tensor) -> Tensor:
    """The number of rows of ``X`` as a 0-d tensor in its dtype (on the CPU)."""
    return torch.tensor(float(X.shape[0]), dtype=X.dtype)


def check_enough(n_samples: float, n_components: int) -> None:
    """Raise a ``ValueError`` when the clients' ``n_samples`` rows are fewer than
    ``n_components``."""
    if n_samples < n_components:
        raise ValueError(
            f"The clients hold {int(n_samples)} sample(s) but n_components={n_components}."
        )
