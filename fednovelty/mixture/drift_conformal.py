"""Conformal drift tests on a stream of per-row anomaly scores.

A client's *scores* are per-row anomaly scores (e.g. ``s = -log p(x)``, higher = less
likely), each row scored under the model the client had before the row's window, so that
no score is in-sample. The client keeps the scores of its latest rows as its *reference*.

- :func:`window_p_value`: a permutation (conformal) p-value of a window's mean score. The
  null is pseudo-windows of the window's size drawn without replacement from the pooled
  window and reference scores. If the ``n + m`` pooled scores are exchangeable (the window's
  rows and the reference rows are draws from one distribution, scored by one function), the
  window is one uniform split of the pool, so its mean ``T`` and the resampled means
  ``T_1..T_B`` are exchangeable given the pool, and the smoothed rank

  ``p = (#{b: T_b > T} + U (#{b: T_b = T} + 1)) / (B + 1)``,  ``U ~ Uniform(0, 1)``,

  is uniform on (0, 1): ``P(p <= alpha) = alpha`` exactly, for every ``B >= 0`` and every
  reference size ``m >= 1``. ``B`` decides only the power: ``p <= alpha`` needs the window
  above all but ``alpha (B + 1) - U`` of the resamples, so ``B >= 1 / alpha - 1`` (99 for 1 %)
  is the least that lets the data rather than ``U`` decide.
- :func:`row_p_values`: online smoothed conformal p-values of rows taken in order, each row
  ranked against the reference and the rows before it (Vovk, Gammerman & Shafer,
  *Algorithmic Learning in a Random World*, 2005, ch. 2 and 7). Under exchangeability and
  with every row in the reference they are independent and uniform.
- :func:`jumper_martingale`: Vovk's *simple jumper* conformal test martingale over
  p-values (Vovk et al., *Retrain or not retrain: conformal test martingales for
  change-point detection*, 2021, Algorithm 1): capital ``C_e`` on betting functions
  ``f_e(p) = 1 + e (p - 1/2)``; before each p-value a share ``jump`` of the total moves
  evenly to every ``e``. With independent uniform p-values it is a non-negative martingale
  from 1, so by Ville's inequality ``P(sup_n S_n >= 1 / alpha) <= alpha`` over the whole
  stream. ``epsilons=(-1, 0)`` bets only on small p-values (rows less likely than the
  reference).

What breaks the guarantees: rows within a window that share a window-level effect
(*over-dispersed* windows: a writer's session, a day's conditions, a few rows resampled)
make a window's mean vary more than a split of exchangeable rows, so :func:`window_p_value`
is too small too often; a score function that changes between the reference's rows and the
window's (a model that moves) does the same to a lesser degree; and a reference that keeps
only the latest ``m`` rows makes the online p-values dependent, so the martingale's bound
is no longer exact.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "jumper_martingale",
    "row_p_values",
    "smoothed_p_value",
    "window_p_value",
]

#: relative difference below which two resampled means count as tied (round-off in sums of
#: the same numbers in another order).
_TIE = 1e-12


def smoothed_p_value(statistic: float, null, u: float) -> float:
    """The smoothed conformal p-value of ``statistic`` against exchangeable ``null``
    values (B,): ``(#{null > statistic} + u (#{null = statistic} + 1)) / (B + 1)``, ties
    within a relative ``1e-12``. ``u`` in [0, 1] (uniform for an exact test).

    Example:
        >>> smoothed_p_value(3.0, [1.0, 2.0, 4.0, 3.0], 0.5)
        0.4
    """
    null = np.asarray(null, dtype=np.float64).reshape(-1)
    if not 0.0 <= u <= 1.0:
        raise ValueError(f"u must be in [0, 1]; got {u!r}.")
    tolerance = _TIE * max(abs(statistic), float(np.abs(null).max(initial=0.0)), 1e-300)
    above = int((null > statistic + tolerance).sum())
    tied = int((np.abs(null - statistic) <= tolerance).sum())
    return (above + u * (tied + 1)) / (null.size + 1)


def window_p_value(window, reference, *, n_resamples: int, rng: np.random.Generator) -> float:
    """Permutation p-value that the window's mean score is this high if its rows and the
    reference's are exchangeable (module docstring): (n,), (m,) -> a float in (0, 1].

    Args:
        window: (n,) the window's scores, n >= 1.
        reference: (m,) the reference scores, m >= 1.
        n_resamples: pseudo-windows ``B`` (>= 0).
        rng: the pseudo-windows' and ``U``'s generator.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> p = window_p_value([9.0, 8.0], np.arange(6.0), n_resamples=999, rng=rng)
        >>> p < 0.1  # the two highest of 8 scores: 1 split in 28
        True
    """
    window = _scores(window, "window")
    reference = _scores(reference, "reference")
    if int(n_resamples) < 0:
        raise ValueError(f"n_resamples must be >= 0; got {n_resamples!r}.")
    n, pooled = window.shape[0], np.concatenate([window, reference])
    keys = rng.random((int(n_resamples), pooled.shape[0]))
    picks = np.argpartition(keys, n - 1, axis=1)[:, :n]  # n distinct rows per pseudo-window
    null = pooled[picks].mean(axis=1)
    return smoothed_p_value(float(window.mean()), null, float(rng.random()))


def row_p_values(scores, reference, *, rng: np.random.Generator) -> np.ndarray:
    """Online smoothed conformal p-values of ``scores`` taken in order, each ranked against
    ``reference`` and the scores before it (higher = less conforming): (n,), (m,) -> (n,).

    ``p_j = (#{v > s_j} + U_j (#{v = s_j} + 1)) / (m + j + 1)`` over ``v`` in the reference
    and ``s_0..s_{j-1}`` (exact ties).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> float(row_p_values([5.0], [1.0, 2.0, 3.0], rng=rng)[0]) <= 0.25  # above all 3
        True
    """
    scores = _scores(scores, "scores", allow_empty=True)
    reference = np.sort(_scores(reference, "reference", allow_empty=True))
    n, m = scores.shape[0], reference.shape[0]
    u = rng.random(n)
    above = m - np.searchsorted(reference, scores, side="right")
    tied = np.searchsorted(reference, scores, side="right") - np.searchsorted(
        reference, scores, side="left"
    )
    earlier = np.tril(np.ones((n, n), dtype=bool), k=-1)  # [j, i]: row i came before row j
    above = above + (earlier & (scores[None, :] > scores[:, None])).sum(1)
    tied = tied + (earlier & (scores[None, :] == scores[:, None])).sum(1)
    return (above + u * (tied + 1)) / (m + np.arange(n) + 1)


def jumper_martingale(
    p_values,
    log_capital=None,
    *,
    epsilons: tuple[float, ...] = (-1.0, 0.0, 1.0),
    jump: float = 0.01,
) -> tuple[np.ndarray, np.ndarray]:
    """Vovk's simple jumper over ``p_values`` (n,), from ``log_capital`` (E,) (the log
    capital on each ``epsilons`` betting function; ``None``: ``log(1 / E)`` each, a
    martingale at 1). Returns ``(log capital after the last p-value (E,), log S_j after each
    p-value (n,))``.

    Example:
        >>> _, path = jumper_martingale([0.5, 0.5])  # p = 1/2 bets neither way
        >>> np.exp(path).round(6).tolist()
        [1.0, 1.0]
    """
    eps = np.asarray(epsilons, dtype=np.float64)
    if eps.ndim != 1 or eps.size == 0 or np.abs(eps).max() > 1.0:
        raise ValueError(f"epsilons must be a non-empty sequence in [-1, 1]; got {epsilons!r}.")
    if not 0.0 <= jump <= 1.0:
        raise ValueError(f"jump must be in [0, 1]; got {jump!r}.")
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    if p.size and not (np.all(p >= 0.0) and np.all(p <= 1.0)):
        raise ValueError("p_values must lie in [0, 1].")
    if log_capital is None:
        log_capital = np.full(eps.size, -math.log(eps.size))
    log_c = np.asarray(log_capital, dtype=np.float64).copy()
    if log_c.shape != eps.shape or np.isnan(log_c).any():
        raise ValueError(f"log_capital must be {eps.size} numbers; got {log_capital!r}.")
    stay = math.log1p(-jump) if jump < 1.0 else -math.inf
    move = math.log(jump / eps.size) if jump > 0.0 else -math.inf
    path = np.empty(p.size)
    for j, value in enumerate(p):
        total = float(np.logaddexp.reduce(log_c))
        log_c = np.logaddexp(stay + log_c, move + total)
        log_c = log_c + np.log1p(eps * (value - 0.5))
        path[j] = float(np.logaddexp.reduce(log_c))
    return log_c, path


def _scores(values, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """``values`` (a sequence, array or CPU tensor) as a flat float64 array, checked."""
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0 and not allow_empty:
        raise ValueError(f"{name} must hold at least one score; got none.")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds NaN or inf; scores must be finite.")
    return array
