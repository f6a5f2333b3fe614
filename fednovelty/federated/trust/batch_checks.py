"""A round's replies of one form checked together: the verdicts of one by one, sooner.

:func:`batch_passes` groups a round's replies by form (tensor names, shapes, dtypes,
devices), checks one reply's shapes per group, and the group's values and declared checks on
its tensors stacked (one pass; one batched Cholesky for statistics,
:func:`stats_batch_passes`), :data:`BATCH_BYTES` of replies at a time. It only clears
replies: one it does not clear is checked alone
(:func:`~fednovelty.federated.trust.reply_form.check_reply`), which gives the same verdict and
names the reason. A declared check batches through its entry in :data:`BATCH_CHECKS`; a kind
with a check that has none is checked reply by reply.

Replies the wire unpacked together (:class:`~fednovelty.federated.core.packed_runs.PackedRun`,
``runs``) are checked on the triangles they travelled in, stacked already: the statistics'
Gram matrices are formed on the triangles (each off-diagonal entry once, and exactly
symmetric, so no symmetry test) and gathered into matrices only for the Cholesky
factorisation, a batch at a time. The matrices formed are entry for entry those formed from
the unpacked replies, so the same replies are cleared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec
from fednovelty.federated.core.packed_runs import PackedRun
from fednovelty.federated.core.stacking import stacked_runs
from fednovelty.federated.core.wire import from_triangle
from fednovelty.federated.trust.reply_form import (
    MAX_ROWS,
    NON_NEGATIVE,
    ROW_COUNTS,
    check_form,
    expectation,
    is_skipped,
)
from fednovelty.federated.trust.value_checks import check_stats, relative_tolerance


def stats_batch_passes(
    stacked: Mapping[str, Tensor], broadcast: Message, forms: Mapping[str, str] | None = None
) -> Tensor:
    """:func:`check_stats` of ``R`` replies at once, for ``full`` and ``diag`` statistics.

    Args:
        stacked: the replies' tensors stacked along a new dim 0: ``counts`` (R, K), ``sums``
            (R, K, d), ``second`` (R, K, d, d) or (R, K, d), ``n_samples`` (R,).
        broadcast: the round's message (its expected covariance type).
        forms: name -> wire form (``"symmetric"``, ``"upper"``, ``"lower"``) of the tensors
            of ``stacked`` given as their triangles (..., d(d+1)/2); ``full`` second
            moments as symmetric triangles (R, K, d(d+1)/2) are checked as such, any other
            triangle is unpacked first.

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
    forms = dict(forms or {})
    triangle = ct == "full" and forms.get("second") == "symmetric"
    stacked = _unpacked(stacked, forms, keep=("second",) if triangle else ())
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
    if triangle:
        return passes & _triangle_gram_passes(counts, sums, second, rtol)
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


def _triangle_gram_passes(counts: Tensor, sums: Tensor, second: Tensor, rtol: float) -> Tensor:
    """The ``full`` test of :func:`stats_batch_passes` on second moments given as their
    symmetric triangles: ``counts`` (R, K), ``sums`` (R, K, d), ``second`` (R, K,
    d(d+1)/2), all float64; (R,) bool.

    ``n_k S_k`` is formed on the triangle (its largest magnitude is the matrix's) and
    gathered into matrices (:func:`~fednovelty.federated.core.wire.from_triangle`), from
    which ``s_k s_k^T`` is subtracted: ``G = n_k S_k - s_k s_k^T`` entry for entry as from
    the unpacked reply, and exactly symmetric (``S_ji = S_ij`` and ``s_j s_i = s_i s_j``),
    so the symmetry test passes without being made."""
    weighted = counts.unsqueeze(2) * second
    scale = _largest_magnitude(weighted, 1) + sums.square().amax(2)  # at least max |G|
    tolerance = rtol * scale + 1e-300
    gram = from_triangle(weighted, "symmetric")
    gram.sub_(sums.unsqueeze(3) * sums.unsqueeze(2))
    # G finite (|G| <= 2 scale), and (G + G^T) / 2, which one reply's check forms, too
    finite = scale <= torch.finfo(scale.dtype).max / 4
    gram.diagonal(dim1=-2, dim2=-1).add_((tolerance / 2).unsqueeze(-1))
    _, info = torch.linalg.cholesky_ex(gram)
    return (finite & (info == 0)).all(1)


def _unpacked(
    stacked: Mapping[str, Tensor], forms: Mapping[str, str], keep: Sequence[str] = ()
) -> dict[str, Tensor]:
    """``stacked`` with its triangles (``forms``) unpacked into matrices, but ``keep``."""
    return {
        name: from_triangle(t, forms[name]) if name in forms and name not in keep else t
        for name, t in stacked.items()
    }


def _largest_magnitude(matrices: Tensor, dims: int = 2) -> Tensor:
    """``matrices.abs().amax(...)`` over the last ``dims`` dimensions (NaN where one holds
    a NaN), without the temporary: the larger of ``-min`` and ``max``."""
    over = tuple(range(-dims, 0))
    return torch.maximum(-matrices.amin(over), matrices.amax(over))


#: value checks of ``ReplySpec.checks`` -> the same check of many replies at once
#: (``(stacked tensors, broadcast, forms) -> (R,) bool``, ``True`` where the check certainly
#: passes; ``forms``: name -> wire form of the tensors stacked as triangles, or ``None``),
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
    broadcast: Message,
    replies: Mapping[int, Message],
    n_features: int,
    spec: ReplySpec,
    runs: Sequence[PackedRun] = (),
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
        runs: replies the wire unpacked together
            (:func:`~fednovelty.federated.core.wire_many.unpack_runs`): a run whose
            messages are the replies of its keys here, none skipped, and whose stacks
            nobody wrote into (:meth:`~fednovelty.federated.core.packed_runs.PackedRun.
            intact`) is checked on its stacked triangles (module docstring); the other
            replies as above.
    """
    batched = [BATCH_CHECKS.get(check) for check in spec.checks]
    if spec.kind != broadcast.kind or None in batched:
        return set()
    formed: dict[tuple, bool] = {}  # form -> whether its shapes pass (one reply checked)

    def well_formed(form: tuple, reply: Message) -> bool:
        if form not in formed:
            try:
                check_form(reply, broadcast, n_features, spec)
                formed[form] = True
            except _BATCH_ERRORS:
                formed[form] = False
        return formed[form]

    passed: set[int] = set()
    covered: set[int] = set()
    for run in runs:
        if not _usable(run, replies, broadcast.kind):
            continue
        form = _form(run.messages[0])
        if well_formed(form, run.messages[0]):
            covered.update(run.keys)
            passed.update(_run_passes(run, form, broadcast, batched))
    groups: dict[tuple, list[int]] = {}
    for cid, reply in replies.items():
        if cid in covered or reply.kind != broadcast.kind or is_skipped(reply):
            continue
        groups.setdefault(_form(reply), []).append(cid)
    for form, cids in groups.items():
        if len(cids) < 2 or not well_formed(form, replies[cids[0]]):
            continue
        columns = {name: [replies[c].tensors[name] for c in cids] for name, *_ in form}
        try:  # views where the replies' tensors are slices of one batch already
            runs_of_views = stacked_runs(columns, _batch_size(form))
        except _BATCH_ERRORS:
            continue
        for items, stacked in runs_of_views:
            passes = _stacked_passes(stacked, broadcast, batched)
            part = cids[items.start : items.stop]
            passed.update(c for c, ok in zip(part, passes, strict=True) if ok)
    return passed


def _form(reply: Message) -> tuple:
    """What replies checked together share: each tensor's name, shape, dtype and device."""
    return tuple((n, tuple(t.shape), t.dtype, t.device) for n, t in reply.tensors.items())


def _batch_size(form: tuple) -> int:
    """Replies of ``form`` (:func:`_form`) stacked at a time: :data:`BATCH_BYTES` of them."""
    reply_bytes = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype, _ in form)
    return max(2, BATCH_BYTES // max(1, reply_bytes))


def _stacked_passes(
    stacked: Mapping[str, Tensor],
    broadcast: Message,
    batched: Sequence[Callable[..., Tensor]],
    forms: Mapping[str, str] | None = None,
) -> list[bool]:
    """Per stacked reply, whether its values and every check of ``batched`` certainly
    pass; all ``False`` where checking the stack fails."""
    n = next(iter(stacked.values())).shape[0]
    try:
        passes = _values_pass(stacked)
        for check in batched:
            passes = passes & check(stacked, broadcast, forms)
    except _BATCH_ERRORS:
        return [False] * n
    return passes.tolist()


def _usable(run: PackedRun, replies: Mapping[int, Message], kind: str) -> bool:
    """Whether ``run``'s messages are the replies of its keys in ``replies``, of ``kind``,
    none skipped, its stacks as they were unpacked."""
    return (
        len(run.keys) > 1
        and all(replies.get(k) is m for k, m in zip(run.keys, run.messages, strict=True))
        and all(m.kind == kind and not is_skipped(m) for m in run.messages)
        and run.intact()
    )


def _run_passes(
    run: PackedRun, form: tuple, broadcast: Message, batched: Sequence[Callable[..., Tensor]]
) -> list[int]:
    """The keys of ``run`` (of reply form ``form``) that certainly pass: its triangles
    checked as they travelled, its other tensors stacked, :func:`_batch_size` replies at a
    time."""
    size = _batch_size(form)
    forms = {name: triangle[1] for name, triangle in run.triangles.items()}
    out: list[int] = []
    for start in range(0, len(run.keys), size):
        part = run.messages[start : start + size]
        stacked = {
            name: run.triangles[name][0][start : start + size]
            if name in run.triangles
            else torch.stack([m.tensors[name] for m in part])
            for name, *_ in form
        }
        passes = _stacked_passes(stacked, broadcast, batched, forms)
        out.extend(k for k, ok in zip(run.keys[start : start + size], passes, strict=True) if ok)
    return out
