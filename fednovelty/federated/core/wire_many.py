"""Many messages packed or unpacked at once: :func:`~fednovelty.federated.core.wire.pack` and
:func:`~fednovelty.federated.core.wire.unpack` of each, one tensor operation per form.

The in-process engine packs thousands of clients' replies a round and the round loop
unpacks them. :func:`pack_many` and :func:`unpack_many` give each message what ``pack`` and
``unpack`` give it, bit for bit: messages of one form (kind, tensor names, shapes, dtypes,
devices; for ``unpack_many`` also the same :data:`~fednovelty.federated.core.wire.WIRE`
description) are stacked (views where they already are one,
:func:`~fednovelty.federated.core.stacking.stacked_runs`) and each tensor name is turned into
its triangle, back into its matrix, or cast, for all of them in one gather or cast; each
message gets its own slice. Which form a matrix travels in is decided per message, by the
same exact comparisons :func:`~fednovelty.federated.core.wire.matrix_form` makes; a message
whose forms differ from the others' of its run is packed alone. A description ``unpack``
refuses is refused for every message that carries it, with ``unpack``'s error.

:func:`unpack_runs` also returns the runs unpacked together, each with its stacked triangles
(:class:`~fednovelty.federated.core.packed_runs.PackedRun`): the server gate checks those
instead of the matrices.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.core.packed_runs import PackedRun
from fednovelty.federated.core.stacking import stacked_runs
from fednovelty.federated.core.wire import (
    FLAT_INDEX_ENTRIES,
    WIRE,
    _description,
    _unpack,
    _wire_scalar,
    from_triangle,
    pack,
    packed_side,
    to_triangle,
    unpack,
    wire_dtype_of,
)

__all__ = ["pack_many", "unpack_many", "unpack_runs"]


def _signature(message: Message) -> tuple:
    """What messages packed or unpacked together share: kind and each tensor's name,
    shape, dtype and device."""
    return (
        message.kind,
        tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in message.tensors.items()),
    )


def _run_size(entries: int) -> int:
    """Messages per run where each message's matrices hold ``entries`` entries: a run's
    matrices fit one cached flat gather index of
    :data:`~fednovelty.federated.core.wire.FLAT_INDEX_ENTRIES` entries."""
    return max(2, FLAT_INDEX_ENTRIES // max(1, entries))


@functools.lru_cache(maxsize=16)
def _flat_pairs(d: int, n_matrices: int, device: torch.device) -> Tensor:
    """For ``n_matrices`` (d, d) matrices stored one after another, matrix by matrix: the
    flat positions of its upper triangle as :func:`~fednovelty.federated.core.wire.
    to_triangle`'s symmetric form orders them, then of each entry's mirror ``(j, i)``:
    (n_matrices * 2 * d(d+1)/2,). One gather reads each matrix once while it is in cache."""
    rows, cols = torch.triu_indices(d, d)
    pair = torch.cat([rows * d + cols, cols * d + rows])
    return (torch.arange(n_matrices).unsqueeze(1) * (d * d) + pair).reshape(-1).to(device)


def _square(stack: Tensor) -> bool:
    """Whether the items of ``stack`` (R, ...) are floating (..., d, d), d >= 2: tensors
    :func:`~fednovelty.federated.core.wire.matrix_form` may pack."""
    item = stack.shape[1:]
    return (
        len(item) >= 2 and stack.dtype.is_floating_point and item[-1] >= 2 and item[-2] == item[-1]
    )


def _symmetric_triangles(stack: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The upper triangles (R, ..., d(d+1)/2) of the matrices of ``stack`` (R, ..., d, d),
    the values :func:`~fednovelty.federated.core.wire.to_triangle` gives for the symmetric
    form (a strided view), and where each entry equals its mirror (same shape, bool; the
    diagonal compared with itself, so a NaN anywhere makes its matrix unequal, as in
    ``torch.equal(m, m.mT)``); ``(None, None)`` where the matrices exceed one flat gather
    index."""
    d = stack.shape[-1]
    n = stack.numel() // (d * d)
    if n * d * d > FLAT_INDEX_ENTRIES:
        return None, None
    size = d * (d + 1) // 2
    pairs = stack.reshape(-1).index_select(0, _flat_pairs(d, n, stack.device))
    upper, mirror = pairs.view(*stack.shape[:-2], 2, size).unbind(-2)
    return upper, upper == mirror


def _forms_of(stack: Tensor) -> tuple[list[str | None], Tensor | None]:
    """:func:`~fednovelty.federated.core.wire.matrix_form` of each item of ``stack`` (R,
    ...), and the items' upper triangles (R, ..., d(d+1)/2) where they were formed on the way
    (``None`` otherwise). An item is symmetric where every entry of its upper triangle
    equals its mirror (:func:`_symmetric_triangles`), as ``torch.equal(item, item.mT)``
    compares them; the others are tried as upper, then lower triangular, by
    ``torch.equal``'s comparison."""
    r = stack.shape[0]
    if not _square(stack):
        return [None] * r, None
    upper, same = _symmetric_triangles(stack)
    if same is None:
        same = stack == stack.mT
    symmetric = same.reshape(r, -1).all(1).tolist()
    forms: list[str | None] = ["symmetric" if ok else None for ok in symmetric]
    rest = [i for i, ok in enumerate(symmetric) if not ok]
    for form, make in (("upper", torch.triu), ("lower", torch.tril)):
        if not rest:
            break
        part = stack[rest]
        fits = (part == make(part)).reshape(len(rest), -1).all(1).tolist()
        for i, ok in zip(rest, fits, strict=True):
            if ok:
                forms[i] = form
        rest = [i for i, ok in zip(rest, fits, strict=True) if not ok]
    return forms, upper


def pack_many(messages: Sequence[Message], wire_dtype: Any = None) -> list[Message]:
    """``[pack(message, wire_dtype) for message in messages]``, bit for bit, messages of one
    form packed together (module docstring)."""
    narrow = wire_dtype_of(wire_dtype)
    out: list[Message | None] = [None] * len(messages)
    groups: dict[tuple, list[int]] = {}
    for i, message in enumerate(messages):
        if WIRE in message.scalars:
            out[i] = message
        else:
            groups.setdefault(_signature(message), []).append(i)
    for members in groups.values():
        names = list(messages[members[0]].tensors)
        if len(members) < 2 or not names:
            for i in members:
                out[i] = pack(messages[i], wire_dtype)
            continue
        columns = {name: [messages[i].tensors[name] for i in members] for name in names}
        cast = [n for n in names if narrow is not None and columns[n][0].dtype == torch.float64]
        entries = max(values[0].numel() for values in columns.values())
        for items, stacks in stacked_runs(columns, _run_size(entries)):
            odd: set[int] = set()  # items whose forms differ from the run's: packed alone
            common: dict[str, str | None] = {}
            packed: dict[str, tuple[Tensor, ...]] = {}
            for name, stack in stacks.items():
                forms, upper = _forms_of(stack)
                form = common[name] = Counter(forms).most_common(1)[0][0]
                odd.update(j for j, f in enumerate(forms) if f != form)
                if form is not None:
                    stack = (
                        upper.contiguous()
                        if form == "symmetric" and upper is not None
                        else to_triangle(stack, form)
                    )
                if name in cast:
                    stack = stack.to(narrow)
                packed[name] = stack.unbind(0)
            description = _wire_scalar(common, cast)
            for j, index in enumerate(items):
                message = messages[members[index]]
                if j in odd:
                    out[members[index]] = pack(message, wire_dtype)
                    continue
                scalars = dict(message.scalars)
                if description is not None:
                    scalars[WIRE] = description
                tensors = {name: packed[name][j] for name in names}
                out[members[index]] = Message(message.kind, tensors, scalars)
    return out  # type: ignore[return-value]


def unpack_many(
    messages: Mapping[Hashable, Message], dtype: torch.dtype | None = None
) -> tuple[dict[Hashable, Message], dict[Hashable, InvalidReplyError]]:
    """``unpack(message, dtype)`` of each message, messages of one form and one
    :data:`~fednovelty.federated.core.wire.WIRE` description unpacked together.

    Returns:
        ``(unpacked, refused)``: key -> the message ``unpack`` returns, and key -> the
        :class:`~fednovelty.federated.core.wire.WireFormatError` it raises, each in the
        order of ``messages``.
    """
    unpacked, refused, _ = unpack_runs(messages, dtype)
    return unpacked, refused


def unpack_runs(
    messages: Mapping[Hashable, Message], dtype: torch.dtype | None = None
) -> tuple[dict[Hashable, Message], dict[Hashable, InvalidReplyError], list[PackedRun]]:
    """:func:`unpack_many`, and the runs of messages unpacked together whose triangles
    were unpacked by one gather each: ``(unpacked, refused, runs)``, each run's messages
    those of ``unpacked`` (:class:`~fednovelty.federated.core.packed_runs.PackedRun`)."""
    unpacked: dict[Hashable, Message] = {}
    refused: dict[Hashable, InvalidReplyError] = {}
    runs: list[PackedRun] = []
    groups: dict[tuple, list[Hashable]] = {}
    for key, message in messages.items():
        raw = message.scalars.get(WIRE)
        if raw is None:
            unpacked[key] = message
        elif not isinstance(raw, str):
            groups.setdefault((id(message),), []).append(key)  # unpack says why, alone
        else:
            groups.setdefault((raw, *_signature(message)), []).append(key)
    for members in groups.values():
        first = messages[members[0]]
        together = len(members) > 1
        if together:
            try:
                _unpack(first, dtype)  # its description and shapes are every member's
            except InvalidReplyError:
                together = False
        if together:
            group = _unpack_group(first, [messages[k] for k in members], dtype)
            unpacked.update(zip(members, group[0], strict=True))
            runs.extend(
                PackedRun.make(
                    tuple(members[i] for i in items), tuple(group[0][i] for i in items), t
                )
                for items, t in group[1]
            )
            continue
        for key in members:  # one by one: each with unpack's own error
            try:
                unpacked[key] = unpack(messages[key], dtype)
            except InvalidReplyError as error:
                refused[key] = error
    order = {key: i for i, key in enumerate(messages)}
    return (
        dict(sorted(unpacked.items(), key=lambda item: order[item[0]])),
        dict(sorted(refused.items(), key=lambda item: order[item[0]])),
        runs,
    )


Triangles = dict[str, tuple[Tensor, str, Tensor]]


def _unpack_group(
    first: Message, messages: Sequence[Message], dtype: torch.dtype | None
) -> tuple[list[Message], list[tuple[range, Triangles]]]:
    """``unpack`` of messages with ``first``'s form and description (which unpacks), and
    the runs unpacked together: ``(range of message indices, name -> (stacked triangles,
    form, stacked matrices))`` for the tensors that travelled as triangles and are not cast
    (:class:`~fednovelty.federated.core.packed_runs.PackedRun`)."""
    description = _description(first)
    forms = {name: form for form, names in description.items() if form != "cast" for name in names}
    cast = set(description.get("cast", [])) if dtype is not None else set()
    changed = [name for name in first.tensors if name in forms or name in cast]
    columns = {name: [m.tensors[name] for m in messages] for name in changed}
    out = [
        Message(m.kind, dict(m.tensors), {k: v for k, v in m.scalars.items() if k != WIRE})
        for m in messages
    ]
    runs: list[tuple[range, Triangles]] = []
    if not columns:
        return out, runs
    entries = max(
        values[0].numel() // values[0].shape[-1] * _side(values[0]) ** 2
        if name in forms
        else values[0].numel()
        for name, values in columns.items()
    )
    for items, stacks in stacked_runs(columns, _run_size(entries)):
        triangles: Triangles = {}
        for name, stack in stacks.items():
            if name in forms:
                packed, stack = stack, from_triangle(stack, forms[name])
                if name not in cast:
                    triangles[name] = (packed, forms[name], stack)
            if name in cast:
                stack = stack.to(dtype)
            for index, tensor in zip(items, stack.unbind(0), strict=True):
                out[index].tensors[name] = tensor
        if triangles and len(items) > 1:
            runs.append((items, triangles))
    return out, runs


def _side(packed: Tensor) -> int:
    """``d`` of a packed triangle (..., d(d+1)/2) that unpacks."""
    return packed_side(packed.shape[-1]) or 1
