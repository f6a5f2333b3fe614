"""A round's replies of one form checked together: the verdicts of one by one, sooner.

:func:`batch_passes` groups a round's replies by form (tensor names, shapes, dtypes,
devices), checks one reply's shapes per group, and the group's values and declared checks on
its tensors stacked (one pass; one batched Cholesky for statistics,
:func:`stats_batch_passes`), :data:`BATCH_BYTES` of replies at a time. It only clears
replies: one it does not clear is checked alone
(:func:`~fednovelty.federated.trust.reply_form.check_reply`), which gives the same verdict and
names the reason. A declared check batches through its entry in :data:`BATCH_CHECKS`; a kind
with a check that has none is checked reply by reply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec
from fednovelty.federated.core.stacking import stacked_runs
from fednovelty.federated.trust.reply_form import (
    MAX_ROWS,
    NON_NEGATIVE,
    ROW_COUNTS,
    check_form,
    expectation,
    is_skipped,
)
from fednovelty.federated.trust.value_checks import check_stats, relative_tolerance


def stats_batch_passes(stacked: Mapping[str, Tensor], broadcast: Message) -> Tensor:
    """:func:`check_stats` of ``R`` replies at once, for ``full`` and ``diag`` statistics.

    Args:
        stacked: the replies' tensors stacked along a new dim 0: ``counts`` (R, K), ``sums``
            (R, K, d), ``second`` (R, K, d, d) or (R, K, d), ``n_samples`` (R,).
        broadcast: the round's message (its expected covariance type).

    Returns:
        (R,) bool: ``True`` where :func:`check_stats` certainly passes the reply; ``False``
        (every reply of ``tied`` and ``spherical`` statistics) says nothing: check that
        reply alone. The count total (whose sum may round differently) passes with a
        margin of its round-off; ``diag`` second moments by the same elementwise test as one
        reply's. For ``full`` ones (:func:`check_psd` of ``G = n_k S_k - s_k s_k^T`` with
        tolerance ``tau = rtol * scale``) a reply passes where, per component,
        ``G = G^T`` exactly or ``max|G - G^T| <= tau / (4 d)`` (then ``G`` is within
        ``tau / 8`` in norm of its symmetric part, and the symmetry test passes), ``scale``
        is at most a quarter of the largest float (``G`` is finite, ``|G| <= 2 scale``, and
        ``G + G^T`` does not overflow) and the Cholesky
        factorisation of ``G + tau / 2 * I`` (one triangle read) succeeds; as in
        :func:`certainly_psd`, ``eigvalsh`` then finds no eigenvalue below ``-tau``
        (for d with ``8 (d + 1)^3 eps <= rtol``; wider replies are checked alone).
    """
    ct = str(expectation(broadcast, "covariance_type"))
    counts, sums, second = stacked["counts"], stacked["sums"], stacked["second"]
    n_replies = counts.shape[0]
    d = sums.shape[-1]
    rtol = relative_tolerance(sums.dtype)
    wide = 8 * (d + 1) ** 3 * torch.finfo(torch.float64).eps > rtol
    if ct not in ("full", "diag") or counts.ndim != 2 or (ct == "full" and wide):
        return torch.zeros(n_replies, dtype=torch.bool, device=counts.device)
    roundoff = 2 * (counts.shape[1] + 1) * torch.finfo(counts.dtype).eps
    total = counts.sum(1).double() + roundoff * counts.abs().sum(1).double()
    passes = total <= stacked["n_samples"].double() * (1 + rtol) + rtol
    counts, sums, second = counts.double(), sums.double(), second.double()
    if ct == "diag":
        norms = sums.square()
        weighted = counts.unsqueeze(2) * second
        excess = weighted - norms
        low = excess < -rtol * (weighted.abs() + norms) - 1e-300
        return passes & torch.isfinite(excess).all(2).all(1) & ~low.any(2).any(1)
    gram = counts[:, :, None, None] * second
    scale = _largest_magnitude(gram) + sums.square().amax(2)  # at least max |G|
    tolerance = rtol * scale + 1e-300
    gram.sub_(sums.unsqueeze(3) * sums.unsqueeze(2))
    # G = G^T exactly (so |G - G^T| = 0; statistics that travelled as a symmetric triangle
    # are), else the bound on max |G - G^T| (NaN/inf where not finite)
    symmetric = (gram == gram.transpose(-1, -2)).flatten(2).all(2)
    if not bool(symmetric.all()):
        asymmetry = _largest_magnitude(gram - gram.transpose(-1, -2))
        symmetric = symmetric | (asymmetry <= tolerance / (4 * d))
    # G finite (an inf equals itself), and (G + G^T) / 2, which one reply's check forms, too
    symmetric = symmetric & (scale <= torch.finfo(scale.dtype).max / 4)
    gram.diagonal(dim1=-2, dim2=-1).add_((tolerance / 2).unsqueeze(-1))
    _, info = torch.linalg.cholesky_ex(gram)
    return passes & (symmetric & (info == 0)).all(1)


def _largest_magnitude(matrices: Tensor) -> Tensor:
    """``matrices.abs().amax((-1, -2))`` (NaN where a matrix holds one), without the
    temporary: the larger of ``-min`` and ``max``."""
    return torch.maximum(-matrices.amin((-1, -2)), matrices.amax((-1, -2)))


#: value checks of ``ReplySpec.checks`` -> the same check of many replies at once
#: (``(stacked tensors, broadcast) -> (R,) bool``, ``True`` where the check certainly passes),
#: read by :func:`batch_passes`.
BATCH_CHECKS: dict[Callable[[Message, Message], None], Callable[..., Tensor]] = {
    check_stats: stats_batch_passes,
}


#: bytes of replies :func:`batch_passes` stacks at a time: their temporaries stay in cache.
BATCH_BYTES = 1 << 22


#: what can go wrong while stacking and checking replies of one form; the replies are then
#: checked one by one, which says why.
_BATCH_ERRORS = (InvalidReplyError, ValueError, RuntimeError, KeyError, TypeError, IndexError)


def _values_pass(stacked: Mapping[str, Tensor]) -> Tensor:
    """:func:`_check_values` of stacked replies (each tensor (R, ...)): (R,) bool, ``True``
    where the reply certainly passes. A floating tensor passes where its sum is finite
    (inf and NaN propagate into a sum; one that overflows is left to the reply alone)."""
    passes = None
    for name, tensor in stacked.items():
        flat = tensor.reshape(tensor.shape[0], -1)
        good = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
        if flat.shape[1]:
            if tensor.is_floating_point():
                good &= torch.isfinite(flat.sum(1))
            if name in NON_NEGATIVE:
                good &= flat.amin(1) >= 0
            if name in ROW_COUNTS:
                good &= flat.amax(1) <= MAX_ROWS
        passes = good if passes is None else passes & good
    return passes


def batch_passes(
    broadcast: Message, replies: Mapping[int, Message], n_features: int, spec: ReplySpec
) -> set[int]:
    """Client ids whose replies certainly pass ``check_reply(reply, broadcast, n_features,
    spec)``, established for a whole round at once.

    Replies are grouped by form (tensor names, shapes, dtypes, devices); the shapes of a
    group are checked on one of its replies, the values and the declared checks on the
    group's tensors stacked, :data:`BATCH_BYTES` of replies at a time (each of
    ``spec.checks`` needs an entry in :data:`BATCH_CHECKS`, else nothing is established).
    Skipped replies, replies of another kind and forms held by one reply only are left out.
    A client id not in the result says nothing about its reply: check it alone
    (:func:`check_reply`), which gives the reason.

    Args:
        broadcast: the round's message; replies: client id -> reply; n_features: the
            federation's ``d``; spec: the declaration of the broadcast's kind.
    """
    batched = [BATCH_CHECKS.get(check) for check in spec.checks]
    if spec.kind != broadcast.kind or None in batched:
        return set()
    groups: dict[tuple, list[int]] = {}
    for cid, reply in replies.items():
        if reply.kind != broadcast.kind or is_skipped(reply):
            continue
        form = tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in reply.tensors.items())
        groups.setdefault(form, []).append(cid)
    passed: set[int] = set()
    for form, cids in groups.items():
        if len(cids) < 2:
            continue
        try:
            check_form(replies[cids[0]], broadcast, n_features, spec)
        except _BATCH_ERRORS:
            continue
        reply_bytes = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype, _ in form)
        size = max(2, BATCH_BYTES // max(1, reply_bytes))
        columns = {name: [replies[c].tensors[name] for c in cids] for name, *_ in form}
        try:  # views where the replies' tensors are slices of one batch already
            runs = stacked_runs(columns, size)
        except _BATCH_ERRORS:
            continue
        for items, stacked in runs:
            part = cids[items.start : items.stop]
            try:
                passes = _values_pass(stacked)
                for check in batched:
                    passes = passes & check(stacked, broadcast)
            except _BATCH_ERRORS:
                continue
            passed.update(c for c, ok in zip(part, passes.tolist(), strict=True) if ok)
    return passed
