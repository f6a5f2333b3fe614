"""Streams of client data whose mix of two populations moves over time (the pFedEM paper's
shift settings, issue 21).

:func:`schedule_share` is the share of population A in window ``t``: the paper's *linear*
cycle (0 -> 1 -> 0, a triangle), its *cosine* cycle (``(1 - cos 2 pi f) / 2``, same ends) or
a *constant* share (a stationary stream), over ``cycles`` cycles in ``n_windows`` windows.

:func:`writer_stream` makes such a stream from FEMNIST writers: population A is each writer's
digits (classes 0-9), B its letters, as the issue pairs EMNIST digits with letters. In window
``t`` every writer contributes ``rows_per_window`` of its own images, each drawn from its A
images with probability ``share(t)`` (so the count is binomial) and else from its B images,
with replacement from one split of the writer's images. A writer with no images of one
population draws all its rows from the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednovelty.datasets.femnist import FederatedWriters

__all__ = ["SCHEDULES", "StreamWindow", "schedule_share", "writer_stream"]

SCHEDULES = ("linear", "cosine", "constant")


@dataclass(frozen=True)
class StreamWindow:
    """One window of a stream.

    Attributes:
        images: (n, h, w) uint8, ink bright (MNIST's convention).
        X: (n, h * w) float64 pixels / 255.
        y: (n,) int64 class labels.
        groups: (n,) int64 client (writer) of each row.
        from_a: (n,) bool, whether the row was drawn from population A.
        share: the schedule's share of A in this window.
    """

    images: np.ndarray
    X: np.ndarray
    y: np.ndarray
    groups: np.ndarray
    from_a: np.ndarray
    share: float


def schedule_share(
    t: int, n_windows: int, kind: str = "linear", cycles: int = 1, constant: float = 0.5
) -> float:
    """Share of population A in window ``t`` of ``n_windows`` (module docstring).

    Example:
        >>> [round(schedule_share(t, 4, "linear"), 2) for t in range(4)]
        [0.0, 0.5, 1.0, 0.5]
    """
    if kind not in SCHEDULES:
        raise ValueError(f"kind must be one of {SCHEDULES}; got {kind!r}.")
    if n_windows < 1 or not 0 <= t:
        raise ValueError(f"need n_windows >= 1 and t >= 0; got t={t}, n_windows={n_windows}.")
    if kind == "constant":
        if not 0.0 <= constant <= 1.0:
            raise ValueError(f"constant must be in [0, 1]; got {constant!r}.")
        return float(constant)
    if int(cycles) < 1:
        raise ValueError(f"cycles must be an integer >= 1; got {cycles!r}.")
    frac = (cycles * t / n_windows) % 1.0
    if kind == "linear":
        return 2.0 * frac if frac <= 0.5 else 2.0 * (1.0 - frac)
    return 0.5 * (1.0 - math.cos(2.0 * math.pi * frac))


def writer_stream(
    data: FederatedWriters,
    n_windows: int,
    *,
    kind: str = "linear",
    cycles: int = 1,
    constant: float = 0.5,
    rows_per_window: int = 50,
    split: str = "train",
    random_state=0,
) -> list[StreamWindow]:
    """``n_windows`` windows of FEMNIST writers' images with digits (A) and letters (B)
    mixed by :func:`schedule_share` (module docstring).

    Args:
        data: the writers (``make_femnist_federated``).
        n_windows, kind, cycles, constant: the schedule.
        rows_per_window: images per writer and window (>= 1).
        split: ``"train"``, ``"val"`` or ``"test"``: the writer images drawn from.
        random_state: seed of the draws.

    Returns:
        One :class:`StreamWindow` per window.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test'; got {split!r}.")
    if int(rows_per_window) < 1:
        raise ValueError(f"rows_per_window must be >= 1; got {rows_per_window!r}.")
    rng = np.random.default_rng(random_state)
    images = getattr(data, f"images_{split}")
    labels = getattr(data, f"y_{split}")
    groups = getattr(data, f"groups_{split}")
    pools = []
    for c in range(data.n_writers):
        rows = np.flatnonzero(groups == c)
        digits = labels[rows] < 10
        pools.append((rows[digits], rows[~digits]))
    out = []
    for t in range(n_windows):
        share = schedule_share(t, n_windows, kind, cycles, constant)
        picked, from_a = [], []
        for pool_a, pool_b in pools:
            want_a = rng.random(rows_per_window) < share
            if pool_a.size == 0:
                want_a[:] = False
            if pool_b.size == 0:
                want_a[:] = True
            n_a = int(want_a.sum())
            rows = np.empty(rows_per_window, dtype=np.int64)
            rows[want_a] = rng.choice(pool_a, n_a) if n_a else []
            rows[~want_a] = (
                rng.choice(pool_b, rows_per_window - n_a) if n_a < rows_per_window else []
            )
            picked.append(rows)
            from_a.append(want_a)
        index = np.concatenate(picked)
        chosen = images[index]
        out.append(
            StreamWindow(
                images=chosen,
                X=chosen.reshape(chosen.shape[0], -1).astype(np.float64) / 255.0,
                y=labels[index].astype(np.int64),
                groups=groups[index].astype(np.int64),
                from_a=np.concatenate(from_a),
                share=share,
            )
        )
    return out
