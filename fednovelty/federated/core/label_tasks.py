"""Label log-likelihoods of many clients' rows under the round's learners, in few forward passes.

A joint model's client E-step needs ``log P_m(y_i | z_i)`` of each of its rows under each
broadcast learner ``m`` (FedGMM's joint round). One client at a time that is ``M`` small
forward passes per client; a round of 539 writers makes 1,617 of them, each a dozen kernel
launches. A client's round yields these as :class:`LabelTask` objects (the protocol of
:data:`~fednovelty.federated.core.learners.ClientRound`), and :func:`label_log_likelihoods_many`
answers all the tasks a round's clients asked for at once:

* tasks whose learner is the same module with the same parameter tensors (by storage, shape
  and strides: the broadcast's, which every client reads) form one group;
* a group's rows are concatenated and go through the learner in passes of at most
  :data:`FORWARD_ROWS` rows, and each task gets its own rows' values back.

Each row's value is the same function of the same parameters and row as in a pass over its
client's rows alone; a pass over more rows may sum in another order inside the matrix
products, so values agree to rounding, not always bit for bit. A task alone in its group
(a learner only one client holds, as a local learner) is one pass over its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

__all__ = ["FORWARD_ROWS", "LabelTask", "label_log_likelihoods", "label_log_likelihoods_many"]

#: most rows one forward pass takes (bounds the activations: a CNN's first layers hold about
#: 60 KiB per 28 x 28 row in float32).
FORWARD_ROWS = 8192


@dataclass(frozen=True)
class LabelTask:
    """``log P(y_i | X_i)`` of one client's rows under one learner.

    Attributes:
        module: the learner's template (evaluated with ``functional_call``).
        params: the learner's parameters by name.
        X: rows (n_samples, n_features); y: labels (n_samples,) int64.
    """

    module: nn.Module
    params: dict[str, Tensor]
    X: Tensor
    y: Tensor


def label_log_likelihoods(
    module: nn.Module, params: dict[str, Tensor], X: Tensor, y: Tensor
) -> Tensor:
    """``log P_theta(y_i | x_i)`` of each row, shape (n_samples,), without gradients."""
    with torch.no_grad():
        logits = functional_call(module, params, (X,))
        return -nn.functional.cross_entropy(logits, y, reduction="none")


def _learner_key(task: LabelTask) -> tuple:
    """Tasks with equal keys evaluate the same function: the same module and parameter
    tensors on the same storage, shape, strides, dtype and device."""
    params = tuple(
        (name, p.data_ptr(), tuple(p.shape), p.stride(), p.dtype, p.device)
        for name, p in task.params.items()
    )
    return (id(task.module), params, task.X.dtype, task.X.device)


def _in_passes(task: LabelTask, X: Tensor, y: Tensor) -> Tensor:
    """:func:`label_log_likelihoods` of ``task``'s learner on ``X``, ``y`` in passes of at
    most :data:`FORWARD_ROWS` rows, (n,)."""
    passes = [
        label_log_likelihoods(
            task.module, task.params, X[s : s + FORWARD_ROWS], y[s : s + FORWARD_ROWS]
        )
        for s in range(0, X.shape[0], FORWARD_ROWS)
    ]
    return torch.cat(passes) if passes else X.new_zeros(0)


def label_log_likelihoods_many(tasks: list[LabelTask]) -> list[Tensor]:
    """Each task's ``log P(y_i | X_i)``, (n_i,), in the order of ``tasks`` (module docstring)."""
    if not tasks:
        return []
    groups: dict[tuple, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(_learner_key(task), []).append(i)
    out: list[Tensor] = [tasks[0].X.new_zeros(0)] * len(tasks)
    for members in groups.values():
        first = tasks[members[0]]
        if len(members) == 1:
            out[members[0]] = _in_passes(first, first.X, first.y)
            continue
        X = torch.cat([tasks[i].X for i in members])
        y = torch.cat([tasks[i].y for i in members])
        lengths = [tasks[i].X.shape[0] for i in members]
        for i, part in zip(members, _in_passes(first, X, y).split(lengths), strict=True):
            out[i] = part
    return out
