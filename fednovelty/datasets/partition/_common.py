"""Shared argument checks and randomness for the partitioners (private)."""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike

_MAX_TRIES = 1000


def _rng(random_state: int | np.random.Generator | None) -> np.random.Generator:
    """A ``numpy.random.Generator`` from None, a non-negative int, or a Generator (as is)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or (
        isinstance(random_state, numbers.Integral)
        and not isinstance(random_state, bool)
        and random_state >= 0
    ):
        return np.random.default_rng(random_state)
    raise ValueError(
        f"random_state must be None, a non-negative int or a numpy.random.Generator; "
        f"got {random_state!r}."
    )


def _check_int(value, name: str, minimum: int) -> int:
    """``value`` as an int if it is an integer (not a bool) >= ``minimum``; else a ValueError."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}.")
    return int(value)


def _check_positive(value, name: str, hint: str = "") -> float:
    """``value`` as a float if it is a finite real (not a bool) > 0; else a ValueError naming
    ``name``, with ``hint`` (e.g. ``" (a typical value)"``) after the rule."""
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not np.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a finite number > 0{hint}; got {value!r}.")
    return float(value)


#: the examples in the message of a bad Dirichlet concentration
_ALPHA_EXAMPLES = "e.g. 0.4; large = close to IID, or use iid_partition"


def _check_alpha(alpha, name: str = "alpha", examples: str = _ALPHA_EXAMPLES) -> float:
    """A Dirichlet concentration named ``name``: a finite real > 0 (small = more skew, large =
    close to IID); ``examples`` ends the error message."""
    return _check_positive(alpha, name, f" (small = more skewed, {examples})")


def _check_groups(groups: ArrayLike) -> np.ndarray:
    """``groups`` as a non-empty 1-D array of shape (n_samples,); else a ValueError."""
    labels = np.asarray(groups)
    if labels.ndim != 1 or labels.shape[0] == 0:
        raise ValueError(f"groups must be a non-empty 1-D array (n_samples,); got {labels.shape}.")
    return labels


def _group_members(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct values of ``labels`` (sorted, as ``np.unique``) and each one's row indices.

    Returns:
        ``(values, members)``: ``values`` of shape (n_groups,); ``members[g]`` the int64 row
        indices (ascending) whose label is ``values[g]``.
    """
    values, codes = np.unique(labels, return_inverse=True)
    codes = codes.ravel()
    members = np.split(np.argsort(codes, kind="stable"), np.cumsum(np.bincount(codes))[:-1])
    return values, [m.astype(np.int64) for m in members]


def _check_parts(parts, n_samples: int) -> list[np.ndarray]:
    """Each of ``parts`` as a 1-D integer array with values in ``[0, n_samples)``.

    Empty arrays (of any dtype, e.g. ``[]``) are allowed. Repeats and rows in no part are not
    checked here.
    """
    arrays = [np.asarray(idx) for idx in parts]
    for client, idx in enumerate(arrays):
        if idx.size and (
            idx.ndim != 1 or idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= n_samples
        ):
            raise ValueError(
                f"parts[{client}] must be a 1-D array of integer row indices in "
                f"[0, {n_samples}); got shape {idx.shape}, dtype {idx.dtype}, values "
                f"[{idx.min()}, {idx.max()}]."
            )
    return arrays
