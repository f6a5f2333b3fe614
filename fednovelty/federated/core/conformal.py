"""Split-conformal alarm thresholds and p-values from anomaly scores (higher = more anomalous).

An alarm is ``score > threshold``. With ``n`` calibration scores and
``k = ceil((1 - alpha)(n + 1))``, the threshold is the ``k``-th smallest of them. If the
calibration scores and a new inlier's are exchangeable (i.i.d. from one distribution, say),
``P(alarm | inlier) = (n + 1 - k) / (n + 1) <= alpha``, and ``>= alpha - 1 / (n + 1)`` when
no two scores tie (ties only lower it). The p-value ``(1 + #{cal >= s}) / (n + 1)`` is valid:
``P(p <= u) <= u``. The guarantee is marginal, over the draw of the calibration rows and the
new row. It breaks when the new rows come from elsewhere than the calibration rows (drift, a
client whose data differ from the calibration clients'), when the rows are not exchangeable
(time series, rows chosen after looking at their scores, rows also used to fit the model),
and when ``n < ceil(1 / alpha) - 1`` (the threshold is ``+inf``: no alarm is possible).

Binned forms, for scores a client releases as counts on a public grid fixed before any score
is read (:func:`calibration_edges`; bin ``j`` holds ``edges[j-1] < s <= edges[j]``): each
binned score is read at its bin's upper edge, never below its true value, so
:func:`histogram_threshold` is ``>=`` the exact threshold and :func:`histogram_p_values`
``>=`` the exact p-values (both equal when every calibration score sits on an edge). They keep
the guarantee above whatever the grid, at the price of up to one bin of slack; noisy counts
(differential privacy) are clipped at 0 and read the same way, without a finite-sample
guarantee. :func:`shrunk_threshold` mixes one client's own scores with the federation's
histogram (a shrinkage estimate). :func:`benjamini_hochberg` turns p-values into
discoveries at a false discovery rate. Pure numpy, float64.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

#: the interior bins of the calibration grid (:func:`calibration_edges`).
CALIBRATION_BINS = 4096
#: the grid's edges above the lowest possible score: 0, then log-spaced offsets from 1e-4 to
#: 1e6 (consecutive offsets differ by a factor 10**(10 / 4095), about 0.56 %), (4097,).
CALIBRATION_OFFSETS = np.concatenate([[0.0], np.geomspace(1e-4, 1e6, CALIBRATION_BINS)])


# ----------------------------------------------------------------------------- checks
def _check_level(value: Any, name: str) -> float:
    """``value`` as a float in (0, 1), else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise ValueError(f"{name} must be a number in (0, 1); got {value!r}.")
    if not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name} must be in (0, 1); got {value!r}.")
    return float(value)


def _exact(alpha: float) -> Fraction:
    """``alpha`` as the shortest decimal that reads back as it (0.1 is 1/10, not the binary
    value just above it), so that ranks computed from it are exact."""
    return Fraction(repr(float(alpha)))


def _scores(values: Any, name: str) -> np.ndarray:
    """``values`` as a float64 array (m,), else a ``ValueError`` naming ``name``."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(
            f"{name} must be a 1-d array of scores (n,); got shape {array.shape}. Pass one "
            "score per row (decision_function's output)."
        )
    if np.isnan(array).any():
        raise ValueError(f"{name} contains NaN; score rows the model can score, or drop them.")
    return array


def _edges(edges: Any) -> np.ndarray:
    """``edges`` as a float64 array (B + 1,), B >= 1, finite and strictly increasing."""
    array = np.asarray(edges, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(
            f"edges must be a 1-d array of at least 2 bin edges (B + 1,); got shape "
            f"{array.shape}. Build them with calibration_edges(lowest)."
        )
    if not np.isfinite(array).all() or not (np.diff(array) > 0).all():
        raise ValueError("edges must be finite and strictly increasing.")
    return array


def _counts(counts: Any, edges: np.ndarray) -> np.ndarray:
    """``counts`` as float64 (B + 2,) clipped at 0, else a ``ValueError`` naming it."""
    array = np.asarray(counts, dtype=np.float64)
    if array.shape != (edges.size + 1,):
        raise ValueError(
            f"counts must have shape (B + 2,) = ({edges.size + 1},) for {edges.size} edges "
            f"(underflow, B bins, overflow); got {array.shape}."
        )
    if not np.isfinite(array).all():
        raise ValueError("counts must be finite (no NaN or inf).")
    return np.clip(array, 0.0, None)


def _upper_edges(edges: np.ndarray) -> np.ndarray:
    """Each bin's upper edge (B + 2,): ``edges``, then ``+inf`` for the overflow bin."""
    return np.append(edges, np.inf)


# ----------------------------------------------------------------------------- exact forms
def conformal_rank(n: int, alpha: float) -> int:
    """The 1-based rank ``k = ceil((1 - alpha)(n + 1))`` of the calibration order statistic
    that is the split-conformal threshold of ``n`` scores at level ``alpha``; ``n + 1`` when
    ``k > n`` (too few rows: the threshold is ``+inf``). ``alpha`` is read as the decimal
    it prints as (0.1 is 1/10), so the rank is exact.

    Raises:
        ValueError: ``n`` not an integer >= 0, or ``alpha`` outside (0, 1).
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n must be an integer >= 0 (calibration rows); got {n!r}.")
    alpha = _check_level(alpha, "alpha")
    k = math.ceil((1 - _exact(alpha)) * (int(n) + 1))
    return min(k, int(n) + 1)


def min_calibration_rows(alpha: float) -> int:
    """The fewest calibration rows with a finite threshold at level ``alpha``:
    ``ceil(1 / alpha) - 1`` (19 for 0.05, 99 for 0.01).

    Raises:
        ValueError: ``alpha`` outside (0, 1).
    """
    return math.ceil(1 / _exact(_check_level(alpha, "alpha"))) - 1


def conformal_threshold(calibration: Any, alpha: float) -> float:
    """The split-conformal alarm threshold: the ``k``-th smallest calibration score,
    ``k = conformal_rank(n, alpha)``; ``+inf`` when ``k > n``.

    Guarantee: if the ``n`` calibration scores and a new inlier's score are exchangeable,
    ``P(score_new > threshold) <= alpha``, ties or not (``>= alpha - 1 / (n + 1)`` without
    ties).

    Args:
        calibration: (n,) scores of rows the model was not fitted on.
        alpha: the false-alarm rate, in (0, 1).

    Raises:
        ValueError: ``calibration`` not 1-d or with NaN; ``alpha`` outside (0, 1).
    """
    scores = _scores(calibration, "calibration")
    k = conformal_rank(scores.size, alpha)
    if k > scores.size:
        return math.inf
    return float(np.partition(scores, k - 1)[k - 1])


def conformal_p_values(scores: Any, calibration: Any) -> np.ndarray:
    """Conformal p-values ``(1 + #{cal >= s}) / (n + 1)`` of new scores, (m,).

    Guarantee: for a new inlier exchangeable with the calibration rows, ``P(p <= u) <= u``
    for every ``u`` in [0, 1]; an alarm ``score > conformal_threshold(calibration, alpha)``
    is ``p <= alpha`` when no scores tie.

    Args:
        scores: (m,) scores to test. calibration: (n,) calibration scores.

    Raises:
        ValueError: either not 1-d or with NaN.
    """
    tested = _scores(scores, "scores")
    ordered = np.sort(_scores(calibration, "calibration"))
    at_least = ordered.size - np.searchsorted(ordered, tested, side="left")
    return (1.0 + at_least) / (ordered.size + 1.0)


def benjamini_hochberg(p_values: Any, q: float) -> np.ndarray:
    """Benjamini-Hochberg step-up discoveries at false discovery rate ``q``, (m,) bool: with
    the p-values sorted, ``p_(1) <= ... <= p_(m)``, reject the ``i*`` smallest, ``i*`` the
    largest ``i`` with ``p_(i) <= i q / m`` (none when there is no such ``i``).

    Guarantee: the expected share of false discoveries among the discoveries is at most
    ``q m0 / m <= q`` (``m0`` true inliers) when the inliers' p-values are valid and
    independent, or positively dependent (PRDS), as conformal p-values sharing one
    calibration set are (Bates et al. 2023).

    Raises:
        ValueError: ``p_values`` not 1-d, NaN or outside [0, 1]; ``q`` outside (0, 1).
    """
    p = _scores(p_values, "p_values")
    q = _check_level(q, "q")
    if ((p < 0) | (p > 1)).any():
        raise ValueError("p_values must lie in [0, 1].")
    m = p.size
    rejected = np.zeros(m, dtype=bool)
    if m == 0:
        return rejected
    order = np.argsort(p, kind="stable")
    below = p[order] <= q * np.arange(1, m + 1) / m
    if below.any():
        last = int(np.flatnonzero(below)[-1])
        rejected[order[: last + 1]] = True
    return rejected


# ----------------------------------------------------------------------------- binned forms
def calibration_edges(lowest: float) -> np.ndarray:
    """The public grid of calibration-score bin edges, (B + 1,) = (4097,): ``lowest +
    CALIBRATION_OFFSETS`` (as ``trust.dp_quantile.score_grid``'s candidates, finer). Fixed
    before any score is read: ``lowest`` must come from the released model and public
    numbers only (e.g. minus the model's highest log-density).

    Raises:
        ValueError: ``lowest`` not finite, or so large that the first offsets vanish in
            its round-off (``|lowest|`` above about 1e11).
    """
    if isinstance(lowest, bool) or not isinstance(lowest, int | float | np.floating):
        raise ValueError(f"lowest must be a finite number; got {lowest!r}.")
    if not math.isfinite(float(lowest)):
        raise ValueError(f"lowest must be a finite number; got {lowest!r}.")
    edges = float(lowest) + CALIBRATION_OFFSETS
    if not (np.diff(edges) > 0).all():
        raise ValueError(
            f"lowest={lowest!r} is too large in magnitude for the grid's 1e-4 offsets; "
            "centre the scores first."
        )
    return edges


def histogram_counts(scores: Any, edges: Any) -> np.ndarray:
    """Counts of ``scores`` (n,) per bin of ``edges`` (B + 1,), (B + 2,) float64: bin 0
    (underflow) holds ``s <= edges[0]``, bin ``j`` (1..B) ``edges[j-1] < s <= edges[j]``,
    bin ``B + 1`` (overflow) ``s > edges[-1]``. One score moves one count by 1.

    Raises:
        ValueError: ``scores`` not 1-d or with NaN; bad ``edges``.
    """
    grid = _edges(edges)
    index = np.searchsorted(grid, _scores(scores, "scores"), side="left")
    return np.bincount(index, minlength=grid.size + 1).astype(np.float64)


def histogram_threshold(counts: Any, edges: Any, alpha: float) -> float:
    """The conservative split-conformal threshold of binned scores: with ``n`` the sum of
    ``counts`` clipped at 0 and ``k = conformal_rank(round(n), alpha)``, the upper edge of
    the first bin at which the cumulative count reaches ``k``; ``+inf`` when that is the
    overflow bin or ``k > round(n)``. For exact counts it is the smallest edge ``>=`` the
    exact threshold (``+inf`` above the grid), so the guarantee of
    :func:`conformal_threshold` holds for it too.

    Args:
        counts: (B + 2,) counts per bin (:func:`histogram_counts`; summed over clients, or
            noisy and non-integer). edges: (B + 1,). alpha: in (0, 1).

    Raises:
        ValueError: ``counts`` of another shape or not finite; bad ``edges`` or ``alpha``.
    """
    grid = _edges(edges)
    binned = _counts(counts, grid)
    n = round(float(binned.sum()))
    k = conformal_rank(n, alpha)
    if k > n:
        return math.inf
    reached = np.flatnonzero(np.cumsum(binned) >= k)
    return float(_upper_edges(grid)[reached[0]]) if reached.size else math.inf


def histogram_p_values(scores: Any, counts: Any, edges: Any) -> np.ndarray:
    """Conservative conformal p-values of ``scores`` (m,) against binned calibration scores:
    ``(1 + c(s)) / (n + 1)`` clipped to [0, 1], ``c(s)`` the counts of the bins whose upper
    edge is ``>= s`` (every binned score that may be ``>= s``) and ``n`` their total, counts
    clipped at 0. For exact counts each is ``>=`` :func:`conformal_p_values` of the scores
    behind them, and equal when those sit on edges.

    Raises:
        ValueError: ``scores`` not 1-d or with NaN; bad ``counts`` or ``edges``.
    """
    grid = _edges(edges)
    binned = _counts(counts, grid)
    tested = _scores(scores, "scores")
    tail = np.append(np.cumsum(binned[::-1])[::-1], 0.0)  # tail[j]: counts of bins j..B+1
    first = np.searchsorted(_upper_edges(grid), tested, side="left")
    p = (1.0 + tail[first]) / (float(binned.sum()) + 1.0)
    return np.clip(p, 0.0, 1.0)


def shrunk_threshold(own: Any, counts: Any, edges: Any, alpha: float, prior_rows: float) -> float:
    """The alarm threshold of a client with ``n_own`` calibration scores of its own, shrunk
    towards the federation's histogram.

    A weighted split-conformal quantile: each own score weighs 1, each of the histogram's
    ``N`` binned scores (read at its bin's upper edge) ``lam = prior_rows / N``, and the new
    point ``w + (1 - w) lam``, ``w = n_own / (n_own + prior_rows)``. The threshold is the
    smallest own score or upper edge ``t`` whose weight at or below it reaches ``1 - alpha``
    of the total weight, new point included (``+inf`` if none). The own scores carry a share
    ``w`` of the calibration weight. ``n_own = 0`` gives :func:`histogram_threshold`
    (returned as such); ``prior_rows = 0``, or an empty histogram, gives the client's own
    :func:`conformal_threshold`; as ``n_own`` grows it tends to the latter.

    Guarantee: only without the prior (``prior_rows = 0``) and with ``n_own >=
    min_calibration_rows(alpha)`` is this a split-conformal threshold with the guarantee of
    :func:`conformal_threshold`. Otherwise it is a shrinkage estimate: the federation's
    scores need not be exchangeable with the client's, so its false-alarm rate is whatever
    it achieves on the client's data and must be checked there.

    Args:
        own: (n_own,) the client's calibration scores. counts: (B + 2,) the federation's
            binned scores. edges: (B + 1,). alpha: in (0, 1). prior_rows: >= 0, the
            histogram's weight in rows.

    Raises:
        ValueError: bad ``own``, ``counts``, ``edges``, ``alpha``, or ``prior_rows`` not a
            finite number >= 0.
    """
    mine = np.sort(_scores(own, "own"))
    grid = _edges(edges)
    binned = _counts(counts, grid)
    alpha = _check_level(alpha, "alpha")
    if isinstance(prior_rows, bool) or not isinstance(prior_rows, int | float | np.number):
        raise ValueError(f"prior_rows must be a finite number >= 0; got {prior_rows!r}.")
    if not (math.isfinite(float(prior_rows)) and float(prior_rows) >= 0):
        raise ValueError(f"prior_rows must be a finite number >= 0; got {prior_rows!r}.")
    total = float(binned.sum())
    if mine.size == 0:
        return histogram_threshold(binned, grid, alpha)
    if float(prior_rows) == 0 or total <= 0:
        return conformal_threshold(mine, alpha)
    prior = float(prior_rows)
    lam = prior / total
    share = mine.size / (mine.size + prior)
    target = (1.0 - alpha) * (mine.size + prior + share + (1.0 - share) * lam)
    upper = _upper_edges(grid)
    candidates = np.union1d(mine, upper[np.isfinite(upper)])
    below_own = np.searchsorted(mine, candidates, side="right")
    below_hist = np.append(0.0, np.cumsum(binned))[np.searchsorted(upper, candidates, "right")]
    reached = np.flatnonzero(below_own + lam * below_hist >= target)
    return float(candidates[reached[0]]) if reached.size else math.inf


__all__ = [
    "CALIBRATION_BINS",
    "CALIBRATION_OFFSETS",
    "benjamini_hochberg",
    "calibration_edges",
    "conformal_p_values",
    "conformal_rank",
    "conformal_threshold",
    "histogram_counts",
    "histogram_p_values",
    "histogram_threshold",
    "min_calibration_rows",
    "shrunk_threshold",
]
