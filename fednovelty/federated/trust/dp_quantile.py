"""A differentially private quantile: the exponential mechanism over a public grid.

A private detector's alarm threshold is a quantile of its training scores; the exact one is
a function of every row and leaks the extreme ones. :func:`private_quantile` releases it with
pure ``epsilon``-DP instead (McSherry and Talwar 2007; the quantile form of Smith 2011): over
a grid of candidate thresholds fixed before the scores are read (:func:`score_grid`, from the
released model and public numbers only), it picks ``t`` with probability proportional to
``exp(epsilon * u(t) / (2 * sensitivity))``, ``u(t) = -| #{s_i <= t} - q n |``. Adding or
removing one row moves ``#{s_i <= t}`` by at most 1 and ``q n`` by ``q``, so the
sensitivity is ``1 + q``. The draw is the Gumbel-max trick on uniforms from the client's
:class:`~fednovelty.federated.trust.noise.NoiseSource` (fresh OS entropy). The rank error is of
order ``2 (1 + q) log(len(grid)) / epsilon`` rows: a few hundred rows at ``epsilon = 0.05``,
so the threshold is meaningful for federations of thousands of rows, not tens.
"""

from __future__ import annotations

import math

import numpy as np

from fednovelty.federated.trust.noise import NoiseSource, check_source

#: the candidate thresholds above the lowest possible score: log-spaced offsets (nats).
GRID_OFFSETS = np.concatenate([[0.0], np.geomspace(1e-3, 1e6, 255)])


def score_grid(lowest: float) -> np.ndarray:
    """The public candidate thresholds of a detector whose scores (``-log p(x)``) are at
    least ``lowest`` (minus the model's highest log-density: public once the model is):
    ``lowest`` plus :data:`GRID_OFFSETS`, shape (256,).

    Raises:
        ValueError: ``lowest`` not finite.
    """
    if not math.isfinite(lowest):
        raise ValueError(f"the lowest score must be finite; got {lowest!r}.")
    return float(lowest) + GRID_OFFSETS


def private_quantile(
    scores: np.ndarray, q: float, epsilon: float, grid: np.ndarray, source: NoiseSource
) -> float:
    """The exponential mechanism's ``q``-quantile of ``scores`` over ``grid`` (module
    docstring): ``epsilon``-DP under adding or removing one score.

    Args:
        scores: (n,) the rows' scores (any reals; outside the grid they count at its ends).
        q: the quantile in [0, 1] (a detector's ``1 - contamination``).
        epsilon: > 0, the mechanism's budget.
        grid: (m,) increasing public candidates, chosen without reading ``scores``.
        source: the draws (:mod:`fednovelty.federated.trust.noise`).

    Returns:
        One of ``grid``'s values.

    Raises:
        ValueError: ``q`` outside [0, 1], ``epsilon`` not positive, or an empty or
            unsorted grid.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1]; got {q!r}.")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a positive finite number; got {epsilon!r}.")
    grid = np.asarray(grid, dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0 or bool((np.diff(grid) <= 0).any()):
        raise ValueError("grid must be a non-empty increasing 1-d array of candidates.")
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    below = np.searchsorted(ordered, grid, side="right")  # #{s_i <= t}
    utility = -np.abs(below - q * ordered.size)
    logits = epsilon * utility / (2.0 * (1.0 + q))
    uniforms = check_source(source).uniform((grid.size,)).numpy()
    gumbel = -np.log(-np.log(np.clip(uniforms, 1e-300, 1 - 1e-16)))
    return float(grid[int(np.argmax(logits + gumbel))])


__all__ = ["GRID_OFFSETS", "private_quantile", "score_grid"]
