"""Streams of client data whose mix of two populations moves over time (the pFedEM paper's
shift settings).

:func:`schedule_share` is the share of population A in window ``t``: the paper's *linear*
cycle (0 -> 1 -> 0, a triangle), its *cosine* cycle (``(1 - cos 2 pi f) / 2``, same ends) or
a *constant* share (a stationary stream), over ``cycles`` cycles in ``n_windows`` windows.

:func:`writer_stream` makes such a stream from FEMNIST writers: population A is each writer's
digits (classes 0-9), B its letters, as the paper pairs EMNIST digits with letters. In window
``t`` every writer contributes ``rows_per_window`` of its own images, each drawn from its A
images with probability ``share(t)`` (so the count is binomial) and else from its B images,
with replacement from one split of the writer's images. A writer with no images of one
population draws all its rows from the other.

**Novelty streams** ("novelty under drift"): :func:`domain_stream` makes a stream
of two domains, A and B, *plus novel rows that belong to neither*, for scoring a detector
window by window. Its input is a :class:`~fednovelty.datasets.domain_pools.DomainPools`: each
domain's training and test inliers and a pool of novel rows, raw (before features), from
ADBench sets, FEMNIST writers or a stream's name (:mod:`fednovelty.datasets.domain_pools`).

Window 0 of a :class:`DomainStream` is the *warm-up*: A's share ``first_share`` (1/2, both
domains), the rows a detector is first fitted on and the features are learned from; windows
``1..n_windows`` follow :func:`schedule_share`. In every window each client draws
``rows_per_window`` training rows, each from A with the window's share (binomial counts,
with replacement; from the whole pool, or, for writer pools, from the client's own images,
a writer without images of one domain drawing all from the other), and the window's test
set is ``test_inliers`` rows of the test pools in the same mix plus ``test_novel`` novel rows
(``y_test`` 1 = novel, the positive class).

Features (learned on the warm-up window's training rows only, as a federation could at the
start, then fixed): ``"pca"`` projects on ``n_axes`` (16) principal axes from the clients'
summed moments; ``"polar"`` is ``make_task("femnist")``'s: each row's direction on ``n_axes``
(24) principal axes plus the log of its norm, min-max scaled with the clients' merged range;
``"none"`` keeps the raw rows. The functions are ``make_task``'s own
(:func:`~fednovelty.datasets.protocols.polar_rows` and its federated PCA).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fednovelty.datasets.domain_pools import DomainPools, positive_int
from fednovelty.datasets.femnist import FederatedWriters

__all__ = [
    "SCHEDULES",
    "STREAM_FEATURES",
    "DomainStream",
    "DomainWindow",
    "StreamWindow",
    "domain_stream",
    "schedule_share",
    "writer_stream",
]

SCHEDULES = ("linear", "cosine", "constant")
#: Feature maps of :func:`domain_stream` (module docstring) and their default axes.
STREAM_FEATURES = {"none": None, "pca": 16, "polar": 24}


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


def _draw(pool_a: np.ndarray, pool_b: np.ndarray, n: int, share: float, rng):
    """``n`` indices, each from ``pool_a`` with probability ``share`` (else ``pool_b``;
    all from the other pool where one is empty), with replacement; and the A flags."""
    from_a = rng.random(n) < share
    if pool_a.size == 0:
        from_a[:] = False
    if pool_b.size == 0:
        from_a[:] = True
    rows = np.empty(n, dtype=np.int64)
    n_a = int(from_a.sum())
    rows[from_a] = pool_a[rng.integers(0, pool_a.size, n_a)] if n_a else []
    rows[~from_a] = pool_b[rng.integers(0, pool_b.size, n - n_a)] if n_a < n else []
    return rows, from_a


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
        parts = [_draw(pool_a, pool_b, rows_per_window, share, rng) for pool_a, pool_b in pools]
        index = np.concatenate([p[0] for p in parts])
        chosen = images[index]
        out.append(
            StreamWindow(
                images=chosen,
                X=chosen.reshape(chosen.shape[0], -1).astype(np.float64) / 255.0,
                y=labels[index].astype(np.int64),
                groups=groups[index].astype(np.int64),
                from_a=np.concatenate([p[1] for p in parts]),
                share=share,
            )
        )
    return out


# ----------------------------------------------------------------------------- novelty streams
@dataclass(frozen=True)
class DomainWindow:
    """One window of a :class:`DomainStream` (features already applied).

    Attributes:
        t: the window's index (0 = the warm-up window).
        share: A's share in the window.
        X: (n, n_features) training rows; groups: (n,) int64 client of each row.
        from_a: (n,) bool, whether the training row was drawn from A.
        client_share: (n_clients,) A's expected share of each client's rows (the window's
            share, or 0 / 1 for a writer without images of A / of B).
        X_test: (m, n_features) test rows: inliers in the window's mix, then novel rows.
        y_test: (m,) int64, 1 = novel (the positive class), 0 = inlier.
        test_from_a: (m,) bool, whether a test inlier came from A (False for B and novel).
    """

    t: int
    share: float
    X: np.ndarray
    groups: np.ndarray
    from_a: np.ndarray
    client_share: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    test_from_a: np.ndarray


@dataclass(frozen=True)
class DomainStream:
    """A two-domain novelty stream: ``windows[0]`` is the warm-up window, ``windows[1:]``
    follow the schedule (module docstring).

    Attributes:
        name: the pools' name; kind, cycles, constant, first_share: the schedule.
        n_clients, rows_per_window: clients per window and rows per client.
        features, n_axes: the feature map applied (learned on ``windows[0]``).
        windows: ``n_windows + 1`` :class:`DomainWindow`.
    """

    name: str
    kind: str
    cycles: int
    constant: float
    first_share: float
    n_clients: int
    rows_per_window: int
    features: str
    n_axes: int | None
    windows: tuple[DomainWindow, ...]

    @property
    def n_windows(self) -> int:
        """Windows after the warm-up one."""
        return len(self.windows) - 1

    @property
    def n_features(self) -> int:
        return int(self.windows[0].X.shape[1])


def _share(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1]; got {value!r}.")
    return float(value)


def _check_pools(pools: DomainPools) -> None:
    if not isinstance(pools, DomainPools):
        raise ValueError(
            f"pools must be a DomainPools (adbench_pools, femnist_pools, stream_pools); got "
            f"{type(pools).__name__}."
        )
    arrays = {n: getattr(pools, n) for n in ("train_a", "train_b", "test_a", "test_b", "novel")}
    for name, rows in arrays.items():
        if rows.ndim != 2 or rows.shape[0] == 0:
            raise ValueError(f"pools.{name} must be a non-empty 2-D array; got {rows.shape}.")
    widths = {name: rows.shape[1] for name, rows in arrays.items()}
    if len(set(widths.values())) > 1:
        raise ValueError(f"the pools' widths differ: {widths}; every pool needs one width.")
    if (pools.clients_a is None) != (pools.clients_b is None):
        raise ValueError("give both clients_a and clients_b (writer pools) or neither.")
    if pools.clients_a is not None and (
        pools.clients_a.shape != (pools.train_a.shape[0],)
        or pools.clients_b.shape != (pools.train_b.shape[0],)
    ):
        raise ValueError("clients_a / clients_b must hold one client per training row.")


def _client_pools(pools: DomainPools, n_clients: int, offset_b: int) -> list[tuple]:
    """Per client ``(rows of A, rows of B)`` as indices into the stacked pools."""
    n_a = pools.train_a.shape[0]
    if pools.clients_a is None:
        both = (np.arange(n_a), offset_b + np.arange(pools.train_b.shape[0]))
        return [both] * n_clients
    return [
        (np.flatnonzero(pools.clients_a == c), offset_b + np.flatnonzero(pools.clients_b == c))
        for c in range(n_clients)
    ]


def _features(features: str, n_axes: int | None, warm, groups, rows) -> np.ndarray:
    """``rows`` (n, d) through the feature map learned on the warm-up rows ``warm`` (their
    clients ``groups``), with ``make_task``'s own functions (module docstring)."""
    from fednovelty.datasets.protocols import _federated_pca, polar_rows
    from fednovelty.datasets.scaling import MinMaxScaling

    if features == "none":
        return np.asarray(rows, dtype=np.float64)
    parts = [np.flatnonzero(groups == c) for c in np.unique(groups)]
    if features == "pca":
        return _federated_pca(warm, rows, parts, n_axes)[1]
    (warm_unit, warm_norm), (unit, norm) = polar_rows(warm), polar_rows(rows)
    warm_axes, axes = _federated_pca(warm_unit, unit, parts, n_axes)
    scaling = MinMaxScaling.from_clients([np.c_[warm_axes, warm_norm][p] for p in parts])
    return scaling.transform(np.c_[axes, norm])


def domain_stream(
    pools: DomainPools,
    n_windows: int,
    *,
    kind: str = "linear",
    cycles: int = 1,
    constant: float = 0.5,
    n_clients: int | None = None,
    rows_per_window: int = 100,
    test_inliers: int = 300,
    test_novel: int = 30,
    first_share: float = 0.5,
    features: str | None = None,
    n_axes: int | None = None,
    random_state=0,
) -> DomainStream:
    """A two-domain novelty stream from ``pools`` (module docstring): a warm-up window and
    ``n_windows`` windows whose share of A follows :func:`schedule_share`.

    Args:
        pools: the rows (:mod:`fednovelty.datasets.domain_pools`' ``adbench_pools``,
            ``femnist_pools``, ``stream_pools``, or your own ``DomainPools``).
        n_windows: windows after the warm-up (>= 1).
        kind, cycles, constant: the schedule (:func:`schedule_share`).
        n_clients: clients per window; None: every writer of writer pools, else 10. Writer
            pools take their first ``n_clients`` writers.
        rows_per_window: training rows per client and window (>= 1).
        test_inliers, test_novel: the window's test set: inliers in its mix and novel rows.
        first_share: A's share in the warm-up window.
        features: ``"none"``, ``"pca"`` or ``"polar"``; None: the pools' default.
        n_axes: principal axes of ``"pca"`` / ``"polar"``; None: the pools' or the map's
            default (16 / 24).
        random_state: seed of every draw.

    Returns:
        A :class:`DomainStream`.

    Raises:
        ValueError: bad pools, counts, shares, schedule or features (the message names it).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> pools = DomainPools(
        ...     "toy", rng.normal(0, 1, (50, 3)), rng.normal(4, 1, (50, 3)),
        ...     rng.normal(0, 1, (20, 3)), rng.normal(4, 1, (20, 3)), rng.normal(9, 1, (10, 3)))
        >>> stream = domain_stream(pools, 4, n_clients=2, rows_per_window=10,
        ...                        test_inliers=8, test_novel=2)
        >>> [w.share for w in stream.windows], stream.windows[1].X.shape
        ([0.5, 0.5, 1.0, 0.5, 0.0], (20, 3))
    """
    _check_pools(pools)
    n_windows = positive_int(n_windows, "n_windows")
    rows_per_window = positive_int(rows_per_window, "rows_per_window")
    test_inliers = positive_int(test_inliers, "test_inliers")
    test_novel = positive_int(test_novel, "test_novel")
    first_share = _share(first_share, "first_share")
    schedule_share(0, n_windows, kind, cycles, constant)  # validates the schedule
    writers = pools.n_writers
    if n_clients is None:
        n_clients = writers if writers is not None else 10
    n_clients = positive_int(n_clients, "n_clients")
    if writers is not None and n_clients > writers:
        raise ValueError(
            f"n_clients={n_clients} but the pools {pools.name!r} hold {writers} writers; ask "
            f"for at most {writers} clients or build the pools with more writers."
        )
    features = pools.features if features is None else features
    if features not in STREAM_FEATURES:
        raise ValueError(f"features must be one of {tuple(STREAM_FEATURES)}; got {features!r}.")
    if features == "none":
        n_axes = None
    else:
        n_axes = n_axes or pools.n_axes or STREAM_FEATURES[features]
        if not 1 <= int(n_axes) <= pools.n_features:
            raise ValueError(f"n_axes must be in [1, {pools.n_features}]; got {n_axes!r}.")
    rng = np.random.default_rng(random_state)

    # one stacked array of raw rows; windows are drawn as indices into it
    stacked = [pools.train_a, pools.train_b, pools.test_a, pools.test_b, pools.novel]
    offsets = np.cumsum([0] + [p.shape[0] for p in stacked])
    clients = _client_pools(pools, n_clients, offsets[1])
    test_a = offsets[2] + np.arange(pools.test_a.shape[0])
    test_b = offsets[3] + np.arange(pools.test_b.shape[0])
    novel = offsets[4] + np.arange(pools.novel.shape[0])
    drawn = []
    for t in range(n_windows + 1):
        share = first_share if t == 0 else schedule_share(t, n_windows, kind, cycles, constant)
        parts = [_draw(a, b, rows_per_window, share, rng) for a, b in clients]
        inliers, test_from_a = _draw(test_a, test_b, test_inliers, share, rng)
        drawn.append(
            {
                "t": t,
                "share": share,
                "rows": np.concatenate([p[0] for p in parts]),
                "from_a": np.concatenate([p[1] for p in parts]),
                "client_share": np.array(
                    [share if a.size and b.size else float(a.size > 0) for a, b in clients]
                ),
                "test": np.r_[inliers, novel[rng.integers(0, novel.size, test_novel)]],
                "test_from_a": np.r_[test_from_a, np.zeros(test_novel, dtype=bool)],
            }
        )
    groups = np.repeat(np.arange(n_clients, dtype=np.int64), rows_per_window)
    raw = np.concatenate(stacked)
    used = np.unique(np.concatenate([np.r_[d["rows"], d["test"]] for d in drawn]))
    lookup = np.full(raw.shape[0], -1, dtype=np.int64)
    lookup[used] = np.arange(used.size)
    # each drawn row through the features once; the map is learned on the warm-up rows
    rows = _features(features, n_axes, raw[drawn[0]["rows"]], groups, raw[used])
    y_test = np.r_[np.zeros(test_inliers, np.int64), np.ones(test_novel, np.int64)]
    windows = tuple(
        DomainWindow(
            t=d["t"],
            share=d["share"],
            X=rows[lookup[d["rows"]]],
            groups=groups,
            from_a=d["from_a"],
            client_share=d["client_share"],
            X_test=rows[lookup[d["test"]]],
            y_test=y_test,
            test_from_a=d["test_from_a"],
        )
        for d in drawn
    )
    return DomainStream(
        name=pools.name,
        kind=kind,
        cycles=int(cycles),
        constant=float(constant),
        first_share=first_share,
        n_clients=n_clients,
        rows_per_window=rows_per_window,
        features=features,
        n_axes=None if n_axes is None else int(n_axes),
        windows=windows,
    )
