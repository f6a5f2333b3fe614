"""The client gate's release of many in-process clients' replies at once.

:func:`release_many` gives each reply what :func:`~fednovelty.federated.trust.release.release`
gives it under its own client's policy, bit for bit, with the floor's work done for many
replies of one form together: the in-process engine answers thousands of clients a round
(:func:`fednovelty.federated.trust.gate.answer_many`), and one call of ``release`` per client
spends more time in Python than on the values.

A reply goes through the batch only where nothing in it can differ from the common case:
no differential-privacy policy (noise and the ledger are the client's own, one release at a
time), not skipped, every tensor classified and backed, no ``"model"`` tensor (whose removed
entries change its shape). Replies of one form (kind, names, shapes, dtypes, devices, the
backings' shapes and which tensors share one) are stacked (views where they already are
one, :func:`~fednovelty.federated.core.stacking.stacked_runs`); each client's floor is its own
``min_rows``, compared as :func:`~fednovelty.federated.trust.backing.backed` compares it;
entries below it are zeroed and ``-0.0`` made ``+0.0`` with the same elementwise operations
``release`` applies to one reply. A reply the gate would refuse (a whole value below the
floor, a cluster row below it, no grouped entry kept, a backing that does not index its
tensor, more entries than the client's own limit) is released one by one: ``release`` says
why. So every decision and every released value is ``release``'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import ReplySpec
from fednovelty.federated.core.stacking import stacked_runs
from fednovelty.federated.core.wire import WIRE, _wire_scalar, pack, to_triangle, wire_dtype_of
from fednovelty.federated.core.wire_many import _forms_of, _square, _symmetric_triangles
from fednovelty.federated.trust.backing import backed
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.release import release

__all__ = ["STACK_BYTES", "release_many"]

#: bytes of replies stacked at a time where they are not views of one tensor already.
STACK_BYTES = 1 << 22


def release_many(
    replies: Sequence[Any],
    spec: ReplySpec,
    policies: Sequence[PrivacyPolicy],
    config: Any,
    broadcast: Any,
    clients: Sequence[Any] | None = None,
    rows_shapes: Sequence[tuple[int, ...] | None] | None = None,
    wire: Sequence[bool] | None = None,
    wire_dtype: Any = None,
) -> list[Any]:
    """``[release(reply, spec, policy, config, broadcast, client, shape) ...]`` of each
    reply with its own client's ``policy``, ``client`` terms and ``rows_shape``, the
    floor of replies of one form applied at once (module docstring); where ``wire[i]``,
    the released reply packed as ``pack(released, wire_dtype)`` packs it.

    Args:
        replies: the client steps' ``Message`` replies (with ``backing``), one per client.
        spec: the ``ReplySpec`` of their kind.
        policies: each client's ``PrivacyPolicy``.
        config: the clients' configuration (the algorithm's settings), for ``spec.limit``.
        broadcast: the message the replies answer.
        clients: each client's terms (``None``: one-off releases), as ``release`` takes.
        rows_shapes: each client's rows' shape, as ``release`` takes (``None``: unknown).
        wire: which replies cross a wire (``ClientContext.wire``; default none).
        wire_dtype: the dtype float64 tensors travel as (:func:`~fednovelty.federated.core.
            wire.pack`'s ``wire_dtype``).

    Returns:
        The released (and where asked, packed) messages in the order of ``replies``, each
        equal (values, dtypes, scalars, refusals and their reasons) to ``release``'s (and
        ``pack``'s).
    """
    n = len(replies)
    clients = [None] * n if clients is None else list(clients)
    rows_shapes = [None] * n if rows_shapes is None else list(rows_shapes)
    wire = [False] * n if wire is None else [bool(w) for w in wire]
    narrow = wire_dtype_of(wire_dtype)

    def alone(i: int) -> Any:
        released = release(
            replies[i], spec, policies[i], config, broadcast, clients[i], rows_shapes[i]
        )
        return pack(released, wire_dtype) if wire[i] else released

    out: list[Any] = [None] * n
    forms: dict[tuple, list[int]] = {}
    kinds: dict[str, str | None] = {}
    for i, (reply, policy) in enumerate(zip(replies, policies, strict=True)):
        form = _form(reply, spec, policy, kinds)
        if form is None:
            out[i] = alone(i)
        else:
            forms.setdefault(form, []).append(i)
    limits = None
    for form, members in forms.items():
        if len(members) > 1 and limits is None and spec.limit is not None:
            limits = spec.limit(config, broadcast)
        batch = _Batch(form, [replies[i] for i in members], [wire[i] for i in members], narrow)
        floors = [float(policies[i].min_rows) for i in members]
        for i, message in zip(members, batch.release(floors, limits), strict=True):
            out[i] = alone(i) if message is None else message  # None: alone says why
    return out


def _form(reply: Any, spec: ReplySpec, policy: PrivacyPolicy, kinds: dict) -> tuple | None:
    """The form a batch of releases shares, or ``None`` where the reply is released alone:
    ``(kind, class, ((name, shape, dtype, device, backing kind, backing shape, index of the
    first tensor with the same backing object), ...))``. ``kinds`` caches
    ``spec.backing_of`` by tensor name."""
    if policy.dp is not None or reply.scalars.get("skipped") or WIRE in reply.scalars:
        return None
    tensors, backing = reply.tensors, reply.backing
    if len(backing) != len(tensors) or not tensors:
        return None
    first: dict[int, int] = {}
    entries = []
    for j, (name, value) in enumerate(tensors.items()):
        kind = kinds[name] if name in kinds else kinds.setdefault(name, spec.backing_of(name))
        rows = backing.get(name)
        if kind is None or kind == "model" or not isinstance(rows, Tensor):
            return None
        shared = first.setdefault(id(rows), j)
        entries.append((name, value.shape, value.dtype, value.device, kind, rows.shape, shared))
    return (reply.kind, type(reply), tuple(entries))


def _over_limit(limits: Any, kind: str, entries: int) -> bool:
    """Whether ``entries`` grouped entries of ``kind`` exceed the client's own limit."""
    limit = limits.get(kind) if isinstance(limits, Mapping) else limits
    return limit is not None and entries > limit


def _unsigned(value: Tensor) -> Tensor:
    """``value + 0.0`` of a floating tensor (``-0.0`` made ``+0.0``), else ``value``."""
    return value + 0.0 if value.is_floating_point() else value


class _Batch:
    """The replies of one form (:func:`_form`) released together, run by run."""

    def __init__(
        self, form: tuple, replies: Sequence[Any], wire: Sequence[bool], narrow: Any
    ) -> None:
        self.kind, self.cls, self.entries = form
        self.replies, self.wire, self.narrow = replies, wire, narrow
        self.names = [entry[0] for entry in self.entries]
        self.cast = [
            name
            for name, _, dtype, *_ in self.entries
            if narrow is not None and dtype == torch.float64
        ]

    def release(self, floors: list[float], limits: Any) -> list[Any]:
        """Each reply released (packed where it crosses a wire), ``None`` for each the gate
        refuses or that is released alone (:func:`release_many`)."""
        replies, entries = self.replies, self.entries
        if len(replies) < 2:
            return [None] * len(replies)
        for _, shape, _, _, backing_kind, rows_shape, _ in entries:
            if rows_shape and (
                rows_shape != shape[: len(rows_shape)]
                or _over_limit(limits, backing_kind, rows_shape[0])
            ):
                return [None] * len(replies)  # refused alike: each alone says why
        columns: dict[str, list[Tensor]] = {}
        for j, (name, *_, shared) in enumerate(entries):
            columns[name] = [reply.tensors[name] for reply in replies]
            if shared == j:  # one column per backing object the replies share
                columns["\0" + name] = [reply.backing[name] for reply in replies]
        item_bytes = sum(
            values[0].numel() * values[0].element_size() for values in columns.values()
        )
        limit = torch.tensor(floors, dtype=torch.float64)
        out: list[Any] = [None] * len(replies)
        for items, stacks in stacked_runs(columns, max(2, STACK_BYTES // max(1, item_bytes))):
            self._run(items, stacks, limit[items.start : items.stop], out)
        return out

    def _run(self, items: range, stacks: Mapping[str, Tensor], floors: Tensor, out: list) -> None:
        """Release the replies ``items`` from their stacked tensors into ``out``."""
        r = len(items)
        masks, clean = self._verdicts(stacks, floors)
        wired = [self.wire[i] for i in items]
        plain: dict[str, tuple[Tensor, ...]] = {}
        packed: dict[str, tuple[Tensor, ...]] = {}
        fits = [True] * r  # packed as the run's forms say (others alone)
        forms: dict[str, str | None] = {}
        for name, *_ in self.entries:
            value, mask = stacks[name], masks[name]
            if not all(wired):
                plain[name] = _masked(value, mask).unbind(0)
            if any(wired):
                travel, forms[name], symmetric = _packed(value, mask)
                if symmetric is not None:
                    fits = [a and b for a, b in zip(fits, symmetric, strict=True)]
                if name in self.cast:
                    travel = travel.to(self.narrow)
                packed[name] = travel.unbind(0)
        description = _wire_scalar(forms, self.cast) if any(wired) else None
        for j, (i, ok) in enumerate(zip(items, clean.tolist(), strict=True)):
            if not ok or (self.wire[i] and not fits[j]):
                continue  # refused, or of a form of its own: alone
            scalars = dict(self.replies[i].scalars)
            if not self.wire[i]:
                out[i] = self.cls(self.kind, {n: plain[n][j] for n in self.names}, scalars)
                continue
            if description is not None:
                scalars[WIRE] = description
            out[i] = Message(self.kind, {n: packed[n][j] for n in self.names}, scalars)

    def _verdicts(
        self, stacks: Mapping[str, Tensor], floors: Tensor
    ) -> tuple[dict[str, Tensor | None], Tensor]:
        """Per tensor name the (R, *backing shape) entries each client's floor keeps
        (``None``: every entry of the run), and which replies the gate releases (R,)."""
        n = floors.shape[0]
        clean = torch.ones(n, dtype=torch.bool)
        grouped_any = torch.zeros(n, dtype=torch.bool)
        has_grouped = False
        verdicts: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
        masks: dict[str, Tensor | None] = {}
        for name, _, _, device, kind, rows_shape, shared in self.entries:
            if shared not in verdicts:
                rows = stacks["\0" + self.entries[shared][0]].to(dtype=torch.float64)
                floor = floors.to(rows.device).reshape(n, *[1] * len(rows_shape))
                keep = backed(rows, floor)  # each client's own floor, as backed compares it
                flat = keep.reshape(n, -1)
                verdicts[shared] = (keep, flat.all(1).cpu(), flat.any(1).cpu())
            keep, all_kept, any_kept = verdicts[shared]
            if not rows_shape:  # a whole value: below the floor refuses the reply
                clean &= all_kept
                masks[name] = None
                continue
            has_grouped = True
            grouped_any |= any_kept
            if kind == "clusters":
                clean &= all_kept
            masks[name] = None if bool(all_kept.all()) else keep.to(device)
        if has_grouped:
            clean &= grouped_any
        return masks, clean


def _masked(value: Tensor, mask: Tensor | None) -> Tensor:
    """``release``'s released tensors of stacked ``value`` (R, ...): the entries ``mask``
    (R, *backing shape) drops as zeros, then ``-0.0`` made ``+0.0``."""
    if mask is None:
        return _unsigned(value)
    mask = mask.reshape(*mask.shape, *[1] * (value.ndim - mask.ndim))
    return _unsigned(torch.where(mask, value, torch.zeros((), dtype=value.dtype)))


def _packed(value: Tensor, mask: Tensor | None) -> tuple[Tensor, str | None, list[bool] | None]:
    """The released stacked ``value`` (:func:`_masked`) in the form it travels: ``(tensor,
    form, which items have that form or None where every item has it)``.

    A square floating tensor travels as its triangle where it is exactly symmetric
    (:func:`~fednovelty.federated.core.wire.matrix_form`'s first test); here the test and the
    triangle are formed from ``value`` before the floor: a released matrix is symmetric
    where it was (the floor's zeros and ``+ 0.0`` change no comparison) or where the floor
    zeroed it, and the triangle of the released matrices is the floor and ``+ 0.0``
    applied to the triangle. Other tensors travel as released.
    """
    released = None
    if _square(value) and (mask is None or mask.ndim <= value.ndim - 2):
        upper, same = _symmetric_triangles(value)
        if upper is not None:
            lead = same.all(-1)  # (R, *leading dims): matrix by matrix
            if mask is not None:
                keep = mask.reshape(*mask.shape, *[1] * (lead.ndim - mask.ndim))
                lead = lead | ~keep
            symmetric = lead.reshape(lead.shape[0], -1).all(1).tolist()
            return _masked(upper, mask).contiguous(), "symmetric", symmetric
    released = _masked(value, mask)
    if not _square(value):
        return released, None, None
    forms, upper = _forms_of(released)
    form = forms[0] if len(set(forms)) == 1 else "mixed"
    if form is None or form == "mixed":  # every item alone but where none is packed
        return released, None, [f is None for f in forms]
    if form == "symmetric" and upper is not None:
        return upper.contiguous(), form, None
    return to_triangle(released, form), form, None
