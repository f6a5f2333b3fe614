"""Sums of per-row values a client may release, backed under every contrast.

A sum of per-row values (a log-likelihood sum, a mean score, a window's moments of ``log p``)
tells a reader about the rows through how the values differ, and a reader of several such
sums can form any linear combination of them: two cluster rows' log-likelihoods can agree on
every row but one, and their difference is then that row's value. :func:`contrast_rows`
bounds the effective rows behind a vector of sums under every contrast (an exact search where
affordable, :data:`CONTRAST_BUDGET`, else a leverage bound; the proofs are in its docstring),
and :func:`contrast_backed` leaves out the fewest outlying rows that back the others' sums.

A client step sums the per-row values :func:`winsorised_row_values` returns (for one sum,
:func:`clipped_deviations`: deviations from the median clipped so that the sum is backed by
construction), with the effective rows it states as their backing.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fednovelty.federated.trust.backing import backed, deviation_rows

#: the most combined values (candidate directions times rows) the exact search of
#: :func:`contrast_rows` evaluates; beyond it the leverage bound stands alone.
CONTRAST_BUDGET = 2**20


def contrast_rows(values: Tensor, floor: float | None = None) -> Tensor:
    """Effective rows behind a vector of sums of per-row values, under any contrast: a
    lower bound of the minimum, exact where it is affordable.

    A reader of ``C`` released sums ``s_c = sum_i v_ic`` can form any linear combination
    ``sum_c l_c s_c``: two cluster rows' log-likelihoods, each a V-shaped log-sum-exp of
    two equal-covariance Gaussians, can agree on every row but one, and their difference
    is then that row's value. The sums are backed by the smallest :func:`deviation_rows`
    of the combined values ``f_i = l . v_i`` over all directions ``l``,
    ``m(V) = min_l K(l)``, ``K(l) = ||f - med f||_1^2 / ||f - med f||_2^2``. Both ways of
    computing it below work on ``Y`` (n, r): the left singular vectors of the centred
    values ``W = V - mean(V)`` of rank ``r`` (singular values above ``max(n, C) * eps``
    times the largest); ``f = W l + const`` and ``W l = Y u`` with ``u = S Vh l``, so
    ``m(V)`` is the same minimum over ``u`` for ``Y``.

    **Exact search.** The directions ``u`` orthogonal to ``r - 1`` linearly independent
    row differences ``y_i - y_j`` (combined values equal on those pairs) contain a
    minimiser. Proof: the hyperplanes ``(y_i - y_j) . u = 0`` cut the directions into
    cones in which the order of the ``f_i`` is fixed, hence the median row ``m`` and the
    signs ``s_i`` of ``f_i - f_m``; there ``sqrt K(u) = g . u / ||A u||_2`` with the fixed
    ``g = sum_i s_i (y_i - y_m)`` and ``A = Y - 1 y_m^T``. Its superlevel sets
    ``{u : g . u - t ||A u||_2 >= 0}`` are convex (a linear minus a norm), so ``K`` is
    quasi-concave on the cone, ``K`` is continuous, and its minimum over the cone's
    closure (a pointed cone, as ``Y`` has rank ``r``) lies on an extreme ray: on
    ``r - 1`` independent hyperplanes. The search evaluates every such direction (the
    vectors orthogonal to each choice of ``r - 1`` of the ``n (n - 1) / 2`` differences)
    when their number times ``n`` is at most :data:`CONTRAST_BUDGET` (``C = 2``: ``n <= 127``;
    ``C = 3``: ``n <= 24``).

    **Leverage bound.** For every direction, ``K >= 1 / (h + 1 / n)`` with
    ``h = max_i ||y_i||^2``, the largest leverage of the centred values. Proof: take
    ``||u|| = 1``, so ``f - mean f = Y u`` has ``||Y u||_2^2 = 1`` (``Y`` orthonormal),
    ``|f_i - mean f| = |y_i . u| <= sqrt h``, and let ``delta = |mean f - med f|``, at
    most the standard deviation ``1 / sqrt n`` (``|mean - med| = |E(f - med)| <=
    E|f - med| <= E|f - mean| <= sd``, the lower median minimising ``E|f - c|``). With
    ``x = f - med f``: ``||x||_1 >= ||x||_2^2 / ||x||_inf``, so ``K >= ||x||_2^2 /
    ||x||_inf^2 >= (1 + n delta^2) / (sqrt h + delta)^2``, whose least value over
    ``delta`` (at ``delta = 1 / (n sqrt h)``) is ``n / (1 + n h)``. It is exact for one
    row apart from equal others (``h = 1 - 1/n``: 1 row), and about ``n / (1 + 2 ln n)``
    for normally distributed values.

    Args:
        values: per-row values, (n_samples, C).
        floor: when given, the exact search is skipped once the leverage bound reaches it
            (the sums are backed either way); None: search whenever affordable.

    Returns:
        The effective rows, a () tensor: the exact minimum where searched, else the
        leverage bound (never above it); ``n_samples`` when no direction separates rows.
    """
    n, c = values.shape
    if n == 0:
        return values.new_zeros(())
    centred = values - values.mean(0)
    u, s, _ = torch.linalg.svd(centred, full_matrices=False)
    tol = s.max() * max(n, c) * torch.finfo(values.dtype).eps if s.numel() else 0.0
    y = u[:, s > tol] if bool((s > 0).any()) else u[:, :0]
    r = y.shape[1]
    if r == 0:
        return values.new_tensor(float(n))
    bound = torch.clamp(1.0 / (y.square().sum(1).max() + 1.0 / n), max=float(n))
    if floor is not None and bool(backed(bound, floor)):
        return bound
    directions = _vertex_directions(y)
    if directions is None:
        return bound
    rows = min(float(deviation_rows(y[:, 0])), float(n))
    for chunk in directions.split(max(1, CONTRAST_BUDGET // (16 * n))):
        rows = min(rows, float(deviation_rows(y @ chunk.T).min()))
    return values.new_tensor(rows)


def _vertex_directions(y: Tensor) -> Tensor | None:
    """The directions orthogonal to ``r - 1`` linearly independent differences of the
    rows of ``y`` (n, r): (n_directions, r); None when their number times ``n`` exceeds
    :data:`CONTRAST_BUDGET`. For ``r = 1``: the one direction."""
    n, r = y.shape
    if r == 1:
        return y.new_ones((1, 1))
    if math.comb(n * (n - 1) // 2, r - 1) * n > CONTRAST_BUDGET:
        return None
    pairs = torch.combinations(torch.arange(n, device=y.device), 2)
    differences = y[pairs[:, 1]] - y[pairs[:, 0]]  # (P, r)
    if r == 2:
        directions = torch.stack([-differences[:, 1], differences[:, 0]], 1)
    else:
        picks = torch.combinations(torch.arange(pairs.shape[0], device=y.device), r - 1)
        chosen = differences[picks]  # (n_directions, r - 1, r)
        if r == 3:
            directions = torch.linalg.cross(chosen[:, 0], chosen[:, 1])
        else:
            directions = torch.linalg.svd(chosen, full_matrices=True).Vh[:, -1, :]
    # any direction's combined values are backed by at least the minimum, so directions of
    # dependent differences (round-off) only add candidates; exact zeros are dropped
    return directions[directions.norm(dim=1) > 0]


def contrast_backed(values: Tensor, min_rows: int) -> tuple[Tensor, Tensor]:
    """The rows whose per-row values may be summed and released: all of them when their
    sums are backed (:func:`contrast_rows` >= ``min_rows``), else all but the ``m`` rows
    farthest from the median (``m`` = 1, 2, 4, ... up to half the rows), the fewest left
    out that back the sums of the others. An honest client's outlying row can make a
    contrast of its sums (two clusters' mean log-likelihoods) mostly that row's value;
    leaving it out of the sums releases nothing of it.

    Args:
        values: per-row values, (n_samples, C).
        min_rows: the floor.

    Returns:
        ``(keep, rows)``: bool (n_samples,), the rows summed, and the effective rows behind
        their sums (a () tensor; below ``min_rows`` when no such ``m`` backs them).
    """
    n = values.shape[0]
    keep = torch.ones(n, dtype=torch.bool, device=values.device)
    rows = contrast_rows(values, min_rows)
    if bool(backed(rows, min_rows)) or n == 0:
        return keep, rows
    order = (values - values.median(0).values).norm(dim=1).argsort(descending=True)
    m = 1
    while m <= n // 2:
        trial = keep.clone()
        trial[order[:m]] = False
        trial_rows = contrast_rows(values[trial], min_rows)
        if bool(backed(trial_rows, min_rows)):
            return trial, trial_rows
        m *= 2
    return keep, rows


def clipped_deviations(per_row: Tensor, min_rows: int) -> tuple[Tensor, Tensor]:
    """Per-row values whose one sum is backed by ``min_rows`` rows by construction.

    Where the sum's deviations (:func:`deviation_rows`) are already backed, the values as
    they are. Else every deviation from the median is clipped to ``c``, the ``min_rows``-th
    largest ``|v_i - median|``: then at least ``min_rows`` rows deviate by exactly ``c`` and
    none by more, so ``sum_i d_i^2 <= c sum_i |d_i|`` and the effective rows
    ``(sum |d|)^2 / sum d^2 >= sum |d| / c >= min_rows``. A value that one row alone makes
    (a probe) is clipped to the others'; honest sums lose the tail of their
    ``min_rows - 1`` most outlying rows. Clipping about the median keeps the median.

    Args:
        per_row: (n_samples,) each row's value, ``n_samples >= 1``.
        min_rows: the client's floor.

    Returns:
        ``(values, rows)``: (n_samples,) values to sum, and the effective rows behind the
        sum (``>= min(min_rows, n_samples)``), a () tensor.
    """
    rows = deviation_rows(per_row)
    if bool(backed(rows, min_rows)):
        return per_row, rows
    median = per_row.median()
    deviation = per_row - median
    c = deviation.abs().topk(min(int(min_rows), per_row.shape[0])).values[-1]
    clipped = median + deviation.clamp(-c, c)
    return clipped, deviation_rows(clipped)


def winsorised_row_values(
    per_row: Tensor, min_rows: int, powers: tuple[int, ...] = (1,)
) -> tuple[Tensor, Tensor]:
    """Per-row values whose sums of powers (``sum_i v_i^p`` for ``p`` in ``powers``: a
    log-likelihood sum, a window's mean and variance of ``log p``) a client may release,
    and the effective rows behind those sums.

    A crafted broadcast can make one row stand out in such sums, and so can an honest
    outlying row. When the sums are not backed by ``min_rows`` rows under every contrast
    (:func:`contrast_backed`), the rows it would leave out are winsorised to the range of
    the others (a clipped row equals a kept one, so no contrast singles it out) where that
    backs the sums, which keeps every row and most of the spread; else they are left out.
    With ``min_rows <= 1`` (no floor) the values are returned as they are.

    Args:
        per_row: (n_samples,) each row's value.
        min_rows: the client's floor.
        powers: the powers whose sums are released.

    Returns:
        ``(values, rows)``: the values to sum, (m,) with m <= n_samples, and the effective
        rows behind their sums, a () tensor.
    """
    n = per_row.shape[0]
    if min_rows <= 1 or n == 0:
        return per_row, per_row.new_tensor(float(n))
    if tuple(powers) == (1,):
        return clipped_deviations(per_row, min_rows)

    centre = per_row.median()

    def stack(values: Tensor) -> Tensor:
        # the powers about the median: with the row count, the contrasts of sums of
        # ``(v - c)^p`` are those of sums of ``v^p``, and near the values their differences
        # keep their precision (raw powers of values far from 0 agree to ~1e-10 of their
        # size, and the search then overstates the rows behind them)
        return torch.stack([(values - centre) ** p for p in powers], 1)

    keep, rows = contrast_backed(stack(per_row), min_rows)
    if bool(keep.all()) or not bool(keep.any()):
        return per_row[keep], rows
    kept = per_row[keep]
    clipped = per_row.clamp(float(kept.min()), float(kept.max()))
    clipped_rows = contrast_rows(stack(clipped), floor=min_rows)
    if bool(backed(clipped_rows, min_rows)):
        return clipped, clipped_rows
    return kept, rows
