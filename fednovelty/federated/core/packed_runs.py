"""Replies unpacked together, with their triangles as they travelled.

:func:`~fednovelty.federated.core.wire_many.unpack_runs` unpacks a round's replies of one form
together: each symmetric (or triangular) tensor of a run of replies is one stacked triangle
(R, ..., d(d+1)/2) that one gather turns into the run's matrices (R, ..., d, d). A
:class:`PackedRun` keeps both for the server gate: the unpacked messages (what the server
step reads) and the stacked triangles they were unpacked from, so that the gate can check a
run's values on the triangles (half the entries of the matrices, each off-diagonal entry
once), already stacked, instead of finding and stacking the unpacked matrices again
(:mod:`~fednovelty.federated.trust.batch_checks`).

A run's triangles are the messages' matrices only while neither is written into: a run
records the version counters of both stacks when it is made (every view of a tensor shares
its counter, so a write through any message's tensor moves it), and :meth:`PackedRun.intact`
says whether they are still the same; a reader uses the triangles only then.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from torch import Tensor

from fednovelty.federated.core.base import Message

__all__ = ["PackedRun"]


@dataclass(frozen=True)
class PackedRun:
    """Consecutive replies unpacked together (:func:`~fednovelty.federated.core.wire_many.
    unpack_runs`).

    Attributes:
        keys: the replies' keys (client ids), in order.
        messages: the unpacked messages, one per key.
        triangles: tensor name -> ``(packed, form, unpacked)``: the messages' tensors of that
            name as they travelled, stacked (R, ..., d(d+1)/2), their form (``"symmetric"``,
            ``"upper"``, ``"lower"``) and the stacked matrices (R, ..., d, d) whose rows the
            messages hold.
        versions: the version counters of every ``packed`` and ``unpacked`` stack when the
            run was made, in the order of ``triangles``.
    """

    keys: tuple[Hashable, ...]
    messages: tuple[Message, ...]
    triangles: dict[str, tuple[Tensor, str, Tensor]]
    versions: tuple[int, ...]

    @staticmethod
    def make(
        keys: tuple[Hashable, ...],
        messages: tuple[Message, ...],
        triangles: dict[str, tuple[Tensor, str, Tensor]],
    ) -> PackedRun:
        """A run of ``messages`` whose tensors of each name in ``triangles`` are the rows of
        that entry's ``unpacked`` stack, with the stacks' version counters as they are now."""
        return PackedRun(keys, messages, dict(triangles), _versions(triangles))

    def intact(self) -> bool:
        """Whether no stack of the run was written into since it was made (the triangles
        are still the messages' matrices)."""
        return _versions(self.triangles) == self.versions


def _versions(triangles: dict[str, tuple[Tensor, str, Tensor]]) -> tuple[int, ...]:
    return tuple(
        v for packed, _, full in triangles.values() for v in (packed._version, full._version)
    )
