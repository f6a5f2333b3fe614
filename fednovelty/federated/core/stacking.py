"""Many messages' tensors of one name as one tensor: a view where they already are one.

The in-process engine answers a round's clients in batched computations
(:mod:`~fednovelty.federated.mixtures.batched_e_step`), so the tensors of consecutive replies
are often views ``base[0], base[1], ...`` of one tensor a batch computed. The batched paths
of the client gate, the wire and the server gate stack such tensors again to work on many
replies at once. :func:`stacked_runs` gives them the stacks without copying where the
tensors are equally spaced views of one base, and a ``torch.stack`` elsewhere: the stacked
values are the tensors' values either way, so whatever is computed from them is the same
bit for bit.

Nothing here writes into a stack; a stack that is a view must not be written into by its
reader either (it is other messages' tensors).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["stacked_runs"]


def _places(values: Sequence[Tensor]) -> list[tuple]:
    """Each tensor's base (``None``: not a view), data address and layout (strides, shape,
    dtype, negation bit)."""
    return [(t._base, t.data_ptr(), t.stride(), t.shape, t.dtype, t.is_neg()) for t in values]


def _view_runs(columns: Mapping[str, Sequence[Tensor]], n: int, most: int) -> list[range]:
    """Consecutive runs of items (at most ``most``) whose tensors of every name are views
    of one real base of their own dtype with one layout, their data equally spaced (a
    positive whole number of elements apart); items in no such run form runs of one."""
    places = [_places(values) for values in columns.values()]
    runs: list[range] = []
    start = 0
    while start < n:
        heads = [column[start] for column in places]
        stop = start + 1
        if all(
            h[0] is not None and h[0].dtype == h[4] and not h[4].is_complex and not h[5]
            for h in heads
        ):
            gaps = [
                column[start + 1][1] - h[1] if start + 1 < n else 0
                for column, h in zip(places, heads, strict=True)
            ]
            if all(g > 0 and g % h[4].itemsize == 0 for g, h in zip(gaps, heads, strict=True)):
                while stop < n and stop - start < most:
                    step = stop - start
                    if not all(
                        p[0] is h[0] and p[1] - h[1] == step * g and p[2:] == h[2:]
                        for p, h, g in zip([c[stop] for c in places], heads, gaps, strict=True)
                    ):
                        break
                    stop += 1
        runs.append(range(start, stop))
        start = stop
    return runs


def _as_view(values: Sequence[Tensor], items: range) -> Tensor:
    """The tensors ``items`` of ``values`` (a view run, :func:`_view_runs`) as one view."""
    first = values[items[0]]
    gap = (values[items[1]].data_ptr() - first.data_ptr()) // first.element_size()
    return first._base.as_strided(
        (len(items), *first.shape), (gap, *first.stride()), first.storage_offset()
    )


def stacked_runs(
    columns: Mapping[str, Sequence[Tensor]], most: int
) -> list[tuple[range, dict[str, Tensor]]]:
    """The items of ``columns`` (name -> one tensor per item, all of one length) cut into
    consecutive runs of at most ``most`` items, each with its tensors stacked per name.

    A run is as long as the items' tensors of every name stay views of one base tensor
    (``_base``) with one shape, strides, dtype and device whose data start equally spaced
    in its storage: the stack is then ``base.as_strided((n, *shape), (step, *strides),
    offset)``, no copy. Items in no such run are gathered into runs stacked with
    ``torch.stack``. Every stack equals ``torch.stack([columns[name][i] for i in run])``.

    Returns:
        ``(range of item indices, name -> (len(range), *shape))`` in item order, the ranges
        covering every item once (none where ``columns`` is empty).

    Raises:
        RuntimeError: ``torch.stack`` of tensors of different shapes (as ``torch.stack``).
    """
    n = len(next(iter(columns.values()), ()))
    most = max(1, int(most))
    out: list[tuple[range, dict[str, Tensor]]] = []
    loose: list[int] = []  # consecutive items outside any view run, stacked by copy

    def flush() -> None:
        for start in range(0, len(loose), most):
            part = loose[start : start + most]
            stacks = {
                name: torch.stack([values[i] for i in part]) for name, values in columns.items()
            }
            out.append((range(part[0], part[-1] + 1), stacks))
        loose.clear()

    for run in _view_runs(columns, n, most):
        if len(run) < 2:
            loose.extend(run)
            continue
        flush()
        stacks = {name: _as_view(values, run) for name, values in columns.items()}
        out.append((run, stacks))
    flush()
    return out
