"""Draw a partition as the FedGenGMM paper's Figure 1: a dot per (client, group) cell.

:func:`partition_counts` is the pure-numpy table behind the plot (rows per client and group);
:func:`partition_dot_plot` draws it with matplotlib, imported only when called, without needing a
display (it uses whatever backend is active; headless machines get Agg).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from fednovelty.datasets.partition._common import _check_groups, _check_parts, _check_positive

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

__all__ = ["partition_counts", "partition_dot_plot"]


def partition_counts(parts: list[ArrayLike], groups: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Rows of each group held by each client.

    ``parts`` need not cover every row (e.g. only the training rows may be counted), but rows in
    two parts are counted twice.

    Args:
        parts: ``n_clients`` index arrays into ``groups`` (as a partitioner returns; empty
            clients allowed).
        groups: shape (n_samples,); the labels the partition was skewed over (any dtype).

    Returns:
        ``(counts, group_values)``: ``counts`` int64 of shape (n_clients, n_groups) with
        ``counts[c, g]`` the number of client ``c``'s rows whose label is ``group_values[g]``;
        ``group_values`` of shape (n_groups,), the sorted distinct labels (``np.unique(groups)``),
        including groups that no part holds.

    Raises:
        ValueError: ``groups`` not a non-empty 1-D array, or an index out of range.

    Example:
        >>> counts, values = partition_counts([[0, 1], [2, 3]], ["a", "a", "a", "b"])
        >>> counts.tolist(), values.tolist()
        ([[2, 0], [1, 1]], ['a', 'b'])
    """
    labels = _check_groups(groups)
    arrays = _check_parts(parts, labels.shape[0])
    values, codes = np.unique(labels, return_inverse=True)
    codes = codes.ravel()
    counts = np.zeros((len(arrays), values.shape[0]), dtype=np.int64)
    for client, idx in enumerate(arrays):
        if idx.size:
            counts[client] = np.bincount(codes[idx.astype(np.int64)], minlength=values.shape[0])
    return counts, values


def partition_dot_plot(
    parts: list[ArrayLike],
    groups: ArrayLike,
    *,
    ax: Axes | None = None,
    group_names: Sequence[str] | None = None,
    title: str | None = None,
    max_area: float = 300.0,
) -> Axes:
    """Dot plot of a partition (FedGenGMM paper, Figure 1): clients on x, groups on y.

    Each non-empty (client, group) cell gets one dot whose area is proportional to the number of
    that client's rows in that group (the largest cell gets ``max_area`` points^2); empty cells
    get no dot. All dots are one scatter collection.

    Args:
        parts: ``n_clients`` index arrays into ``groups``, as a partitioner returns.
        groups: shape (n_samples,); the labels (classes or k-means clusters) to show on y.
        ax: matplotlib Axes to draw on; None makes a new figure (via ``pyplot``).
        group_names: ``n_groups`` tick labels for y, in the order of ``np.unique(groups)``;
            None uses the group values themselves.
        title: Axes title; None sets none.
        max_area: marker area in points^2 of the largest cell, > 0.

    Returns:
        The matplotlib Axes drawn on.

    Raises:
        ValueError: bad ``parts`` / ``groups`` (see :func:`partition_counts`), a
            ``group_names`` of the wrong length, or ``max_area <= 0``.

    Example:
        >>> import matplotlib
        >>> matplotlib.use("Agg")
        >>> labels = np.repeat(np.arange(10), 100)
        >>> parts = dirichlet_partition(labels, 10, alpha=0.5, random_state=0)
        >>> ax = partition_dot_plot(parts, labels, title="Dir(0.5), 10 clients")
        >>> ax.figure.savefig("partition.png")  # doctest: +SKIP
    """
    counts, values = partition_counts(parts, groups)
    n_clients, n_groups = counts.shape
    if group_names is None:
        names = [str(v) for v in values.tolist()]
    else:
        names = [str(n) for n in group_names]
        if len(names) != n_groups:
            raise ValueError(
                f"group_names has {len(names)} entries but groups has {n_groups} distinct "
                f"values ({values.tolist()[:10]}...); give one name per value of "
                f"np.unique(groups)."
            )
    _check_positive(max_area, "max_area")

    from matplotlib.ticker import MaxNLocator

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(max(4.0, 0.3 * n_clients + 2.0), max(3.0, 0.3 * n_groups)))
    client_idx, group_idx = np.nonzero(counts)
    cells = counts[client_idx, group_idx]
    peak = cells.max() if cells.size else 1
    ax.scatter(
        client_idx,
        group_idx,
        s=cells / peak * float(max_area),
        c="tab:blue",
        alpha=0.7,
        edgecolors="none",
    )
    ax.set_xlim(-0.75, n_clients - 0.25)
    ax.set_ylim(-0.75, n_groups - 0.25)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_yticks(np.arange(n_groups))
    ax.set_yticklabels(names)
    ax.set_xlabel("client")
    ax.set_ylabel("group")
    if title is not None:
        ax.set_title(title)
    return ax
