"""Sufficient statistics over a stream of windows: exponential forgetting (stepwise EM).

A streaming mixture keeps the summed statistics of everything it has seen, discounted by a
forgetting factor ``rho`` per window: ``S_t = rho S_{t-1} + S_window`` (Cappe and Moulines'
online EM in its stepwise form; ``rho = 1`` keeps everything, ``rho = 0`` only the newest
window). The M-step on ``S_t`` then gives parameters that follow a moving population while
only statistics cross the wire, so the update composes with secure aggregation and with
noise added to statistics. A window of ``n`` rows counts for ``n`` rows; with forgetting the
statistics hold an effective ``n / (1 - rho)`` rows of a stationary stream
(:func:`memory_rows`).

Statistics are moments about a shift (:mod:`fednovelty.mixture.stats`); a model that moves
moves its shift too, so the carried statistics are first re-expressed about the new window's
shift (:func:`reshift_stats`, exact).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fednovelty.mixture.stats import SufficientStats

__all__ = ["decay_stats", "forget_and_add", "memory_rows", "reshift_stats"]


def reshift_stats(stats: SufficientStats, shift: Tensor) -> SufficientStats:
    """The same statistics as moments about ``shift`` (n_features,) instead of
    ``stats.shift``; exact (with ``d = old - new``, ``x - new = (x - old) + d``).

    Example:
        >>> import torch
        >>> from fednovelty.mixture import stats_from_resp
        >>> X = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
        >>> resp = torch.ones(2, 1, dtype=torch.float64)
        >>> s = stats_from_resp(X, resp, "full", torch.zeros(1, dtype=torch.float64))
        >>> reshift_stats(s, torch.tensor([2.0], dtype=torch.float64)).second.item()
        2.0
    """
    shift = torch.as_tensor(shift, dtype=stats.shift.dtype, device=stats.shift.device)
    if shift.shape != stats.shift.shape:
        raise ValueError(
            f"shift must have shape {tuple(stats.shift.shape)} (n_features,); got "
            f"{tuple(shift.shape)}."
        )
    d = stats.shift - shift
    counts, sums, second = stats.counts, stats.sums, stats.second
    ct = stats.covariance_type
    if ct == "full":
        outer = sums.unsqueeze(2) * d.view(1, 1, -1)  # s_k d^T, (K, d, d)
        second = second + outer + outer.transpose(1, 2) + counts.view(-1, 1, 1) * torch.outer(d, d)
    elif ct == "tied":
        total = sums.sum(0)
        outer = torch.outer(total, d)
        second = second + outer + outer.T + counts.sum() * torch.outer(d, d)
    elif ct == "diag":
        second = second + 2.0 * sums * d + counts.unsqueeze(1) * d.square()
    else:  # spherical: sum_i r_ik ||x_i - c||^2
        second = second + 2.0 * (sums @ d) + counts * d.square().sum()
    return replace(stats, sums=sums + counts.unsqueeze(1) * d, second=second, shift=shift.clone())


def decay_stats(stats: SufficientStats, rho: float) -> SufficientStats:
    """Every sum (counts, moments, log-likelihood, rows) times ``rho`` in [0, 1]."""
    rho = _check_rho(rho)
    return replace(
        stats,
        counts=stats.counts * rho,
        sums=stats.sums * rho,
        second=stats.second * rho,
        log_likelihood=stats.log_likelihood * rho,
        n_samples=stats.n_samples * rho,
    )


def forget_and_add(
    carry: SufficientStats | None, window: SufficientStats, rho: float
) -> SufficientStats:
    """``rho * carry + window``, the carry first moved to the window's shift; ``carry=None``
    (the first window) returns ``window``.

    Raises:
        ValueError: ``rho`` outside [0, 1], or statistics of other shapes or covariance types.
    """
    rho = _check_rho(rho)
    if carry is None:
        return window
    return decay_stats(reshift_stats(carry, window.shift), rho) + window


def memory_rows(window_rows: float, rho: float) -> float:
    """Rows the carried statistics hold in the long run when every window has
    ``window_rows``: ``window_rows / (1 - rho)`` (infinite for ``rho = 1``)."""
    rho = _check_rho(rho)
    return float("inf") if rho == 1.0 else window_rows / (1.0 - rho)


def _check_rho(rho: float) -> float:
    if isinstance(rho, bool) or not isinstance(rho, int | float) or not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho (the forgetting factor) must be a number in [0, 1]; got {rho!r}.")
    return float(rho)
