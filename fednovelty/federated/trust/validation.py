"""The server gate: client replies checked on receipt against what their step declared.

The server does not trust its clients: a reply can be malformed (another fednovelty version,
a bug) or hostile (a client that claims more rows than it has, sends a second moment no rows
could produce, or a local mixture with more components than the broadcast allowed). One NaN
or one impossible statistic in a sum would poison the whole model, so every engine passes
each round's replies through one :class:`ReplyValidator` and hands the server step only the
replies that pass. A reply that fails is dropped with a reason; the round goes on.

This module is the engine; it knows no message kind. What a reply of a kind must look like
is declared by the step that defines the message, as a
:class:`~fednovelty.federated.core.declarations.ReplySpec`, and the validator applies it: shapes,
values (finite, non-negative where declared, the declared checks such as
:func:`check_stats`) and what the client declared before (its row count, and the box its
declared moments fix); the checks are stated on :class:`ReplyValidator`. A reply of a kind
its algorithm declares nothing for is refused; :func:`check_reply` without a spec reads the
package's own declaration of the kind.

A client that lies consistently from its first reply on passes these checks: the robust
aggregation options bound it (``docs/robust.md``). What the server expects beyond the
broadcast's tensors (a covariance type, the most centroids, the rows' width after a
projection) is written into the broadcast's ``expect``
(:class:`~fednovelty.federated.core.base.Message`), which stays on the server. A skipped reply
(``scalars["skipped"]``) carries no statistics and is passed on as it is.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message, Scalar
from fednovelty.federated.core.declarations import (
    InvalidReplyError,
    ReplySpec,
    UndeclaredReplyError,
    declared_spec,
)

#: reply tensors that must be >= 0 wherever they appear.
NON_NEGATIVE: tuple[str, ...] = (
    "counts",
    "n_samples",
    "joint_counts",
    "weights",
    "n",
    "m2",
    "far_counts",
    "hard_counts",
    "client_vars",
    "loss",
    "class_counts",
)
#: reply tensors that are a client's row count.
ROW_COUNTS: tuple[str, ...] = ("n_samples", "n")
#: the most rows a reply may claim: 2**53, the largest count float64 holds exactly (a claim
#: above it cannot be a count of rows, and its products overflow the server's sums).
MAX_ROWS = float(2**53)
#: relative slack of the consistency checks in float64 (round-off of sums over many rows);
#: float32 replies get ``1e3`` times their machine epsilon where that is larger.
RTOL = 1e-6


def relative_tolerance(dtype: torch.dtype) -> float:
    """Slack of the consistency checks for statistics computed in ``dtype``."""
    return max(RTOL, 1e3 * torch.finfo(dtype).eps) if dtype.is_floating_point else RTOL


Dim = int | str  # a fixed size, or a symbol every use of which in one reply must agree on
Shape = tuple[Dim, ...]
#: how a validator finds the declaration of a kind (``algorithm.reply_spec``).
SpecLookup = Callable[[str], ReplySpec]


def covariance_shape(covariance_type: str, k: Dim, d: int) -> Shape:
    """Shape of per-component second moments / precision factors by covariance type."""
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if covariance_type not in shapes:
        raise InvalidReplyError(f"unknown covariance_type {covariance_type!r}.")
    return shapes[covariance_type]


def learner_count(broadcast: Message) -> int:
    """How many learners (``learner.{m}.*`` tensors) a broadcast carries."""
    return len({name.split(".")[1] for name in broadcast.tensors if name.startswith("learner.")})


def expectation(broadcast: Message, name: str) -> Scalar:
    """``broadcast.expect[name]``, or a ``ValueError`` (a server-side error: the algorithm
    did not say what replies to its round may hold)."""
    if name not in broadcast.expect:
        raise ValueError(
            f"a {broadcast.kind!r} broadcast must state expect[{name!r}] for its replies to be "
            "checked; the algorithm's configure sets it."
        )
    return broadcast.expect[name]


def round_width(broadcast: Message, n_features: int) -> int:
    """Width ``d`` of the rows a round works on: the federation's ``n_features``, or the
    broadcast's ``expect["n_features"]`` (e.g. a PCA projection's components)."""
    return int(broadcast.expect.get("n_features", n_features))


def is_skipped(reply: Message) -> bool:
    """Whether ``reply`` says the client did not take part (below its floor, refused)."""
    return bool(reply.scalars.get("skipped", False))


def resolve_spec(kind: str, specs: SpecLookup | None = None) -> ReplySpec:
    """The declaration of replies of ``kind``: ``specs(kind)`` (the run's algorithm), or
    the package's own (:func:`~fednovelty.federated.core.declarations.declared_spec`).

    Raises:
        InvalidReplyError: nothing declares ``kind`` (the reply is refused).
    """
    try:
        return declared_spec(kind) if specs is None else specs(kind)
    except UndeclaredReplyError as error:
        raise InvalidReplyError(f"refused: {error}") from None


# ----------------------------------------------------------------------------- shared rules
def stats_shapes(broadcast: Message, d: int, centers: str = "means") -> dict[str, Shape]:
    """A statistics reply's tensors: ``counts`` (K,), ``sums`` (K, d), ``second`` by the
    expected covariance type, ``log_likelihood`` and ``n_samples`` (); K is the number of
    rows of the broadcast's ``centers`` tensor."""
    k = int(broadcast.tensors[centers].shape[0])
    return {
        "counts": (k,),
        "sums": (k, d),
        "second": covariance_shape(str(expectation(broadcast, "covariance_type")), k, d),
        "log_likelihood": (),
        "n_samples": (),
    }


def close_or_below(value: float, limit: float, rtol: float = RTOL) -> bool:
    """``value <= limit`` up to ``rtol`` (relative, and absolute near 0)."""
    return value <= limit * (1 + rtol) + rtol


def check_counts_within(reply: Message, name: str, what: str) -> None:
    """Raise unless tensor ``name`` of ``reply`` adds up to at most its ``n_samples``."""
    counts = reply.tensors[name]
    total, n = float(counts.sum()), float(reply.tensors["n_samples"])
    if not close_or_below(total, n, relative_tolerance(counts.dtype)):
        raise InvalidReplyError(f"{what} add up to {total:g}, more than the {n:g} rows sent.")


def check_positive_rows(reply: Message, broadcast: Message) -> None:
    """A reply that must come from at least one row (models trained on rows)."""
    if not float(reply.tensors["n_samples"]) > 0:
        raise InvalidReplyError("a model reply must come from at least one row.")


def check_stats(reply: Message, broadcast: Message) -> None:
    """The reply's ``counts``, ``sums`` and ``second`` (of the broadcast's expected
    covariance type) are statistics some weighted rows could have produced
    (:func:`check_stats_tensors`)."""
    t = reply.tensors
    check_stats_tensors(
        t["counts"],
        t["sums"],
        t["second"],
        float(t["n_samples"]),
        str(expectation(broadcast, "covariance_type")),
    )


def check_stats_tensors(
    counts: Tensor, sums: Tensor, second: Tensor, n: float, covariance_type: str
) -> None:
    """Statistics that some weighted rows could have produced: ``counts`` (K,) add up to at
    most the row count ``n`` and ``n_k S_k - s_k s_k^T`` is positive semi-definite (per
    covariance type; ``sums`` (K, d), ``second`` by covariance type), with products that
    stay finite (statistics too large to check are refused). Besides the relative
    tolerance of the reply's dtype, each entry may be off by the dtype's smallest step
    near zero (``tiny * eps``: a float32 count of a nearly empty component rounds to 0
    while its moments stay subnormal)."""
    rtol = relative_tolerance(sums.dtype)
    step = _smallest_step(sums.dtype)
    if not close_or_below(float(counts.sum()), n, rtol):
        raise InvalidReplyError(
            f"component counts add up to {float(counts.sum()):g}, more than the {n:g} rows sent."
        )
    counts, sums, second = counts.double(), sums.double(), second.double()
    if covariance_type == "tied":  # one scatter of all rows: S - sum_k s_k s_k^T / n_k
        occupied = counts > 0
        if bool((~occupied & (sums.abs().amax(1) > 0)).any()):
            raise InvalidReplyError("a component with zero count has non-zero sums.")
        outer = sums[occupied].T @ (sums[occupied] / counts[occupied].unsqueeze(1))
        scale = second.abs().amax().reshape(1)
        check_psd((second - outer).unsqueeze(0), scale, "second", rtol)
        return
    if covariance_type == "full":
        gram = counts[:, None, None] * second - sums.unsqueeze(2) * sums.unsqueeze(1)
        scale = (counts[:, None, None] * second).abs().amax((1, 2)) + sums.square().amax(1)
        rounding = step * (second.abs().amax((1, 2)) + 2 * sums.abs().amax(1))
        check_psd(gram, scale + rounding / rtol, "second", rtol)
        return
    norms = sums.square() if covariance_type == "diag" else sums.square().sum(1)
    excess = counts.reshape(-1, *[1] * (second.ndim - 1)) * second - norms
    _require_finite(excess, "second")
    scale = (counts.reshape(excess.shape[0], *[1] * (excess.ndim - 1)) * second).abs() + norms
    root = sums.abs() if covariance_type == "diag" else sums.abs().sum(1)
    shape = (excess.shape[0], *[1] * (excess.ndim - 1))
    # (c + step)(S + step) - (|s| - step)^2: every entry up to one step from its true value
    rounding = step * (second.abs() + counts.reshape(shape) + 2 * root + 2 * step)
    if bool((excess < -rtol * scale - rounding - 1e-300).any()):
        raise InvalidReplyError(
            "tensor 'second' is smaller than its sums allow: no rows have these statistics."
        )


def _smallest_step(dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers near zero (``tiny * eps``; float32 1.4e-45)."""
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.finfo(torch.float64)
    return info.tiny * info.eps


def check_scatter(reply: Message, broadcast: Message) -> None:
    """The reply's ``scatter`` (d, d), a sum of outer products of rows about a mean, is
    symmetric positive semi-definite."""
    scatter = reply.tensors["scatter"].double()
    rtol = relative_tolerance(reply.tensors["scatter"].dtype)
    check_psd(scatter.unsqueeze(0), scatter.abs().amax().reshape(1), "scatter", rtol)


def _require_finite(values: Tensor, name: str) -> None:
    if not bool(torch.isfinite(values).all()):
        raise InvalidReplyError(
            f"tensor {name!r} is too large to check in float64 (its products with the "
            "counts and sums overflow): no rows the server accepts have these statistics."
        )


def certainly_psd(symmetric: Tensor, tolerance: Tensor) -> Tensor:
    """Which symmetric float64 matrices of ``symmetric`` (..., d, d) certainly have their
    lowest eigenvalue at or above ``-tolerance`` (shape ...), and would pass that test
    through ``torch.linalg.eigvalsh``: a bool tensor of shape (...).

    One Cholesky factorisation per matrix, of ``A + tolerance / 2 * I`` (about a tenth of
    the time of ``eigvalsh`` at d = 32). It succeeds only where ``A + tolerance / 2 * I +
    E`` is positive definite with ``||E|| <= (d + 1) eps d ||A||`` (the backward error of
    Cholesky, ``||A|| <= d max|a_ij|``), so the lowest eigenvalue of ``A`` is at least
    ``-tolerance / 2 - ||E||``. A matrix counts as certain only where that error bound and
    ``eigvalsh``'s own (``d^2 eps max|a_ij|``) stay below a quarter of ``tolerance`` each;
    a ``False`` says nothing (decide with ``eigvalsh``).
    """
    d = symmetric.shape[-1]
    eps = torch.finfo(torch.float64).eps
    size = symmetric.abs().amax((-1, -2))
    shifted = symmetric.clone()
    shifted.diagonal(dim1=-2, dim2=-1).add_((tolerance / 2).unsqueeze(-1))
    _, info = torch.linalg.cholesky_ex(shifted)
    return (info == 0) & (4 * (d + 1) ** 2 * d * eps * size <= tolerance / 4)


def check_psd(gram: Tensor, scale: Tensor, name: str, rtol: float) -> None:
    """Raise unless every matrix of ``gram`` (k, d, d) is PSD up to ``rtol`` of ``scale`` (k,):
    its lowest eigenvalue (``eigvalsh``) at or above ``-rtol * scale``. Matrices
    :func:`certainly_psd` clears skip the eigenvalues; the verdict is ``eigvalsh``'s."""
    _require_finite(gram, name)
    symmetric = (gram + gram.transpose(-1, -2)) / 2
    tolerance = rtol * scale + 1e-300
    if bool(((gram - symmetric).abs().amax((-1, -2)) > tolerance).any()):
        raise InvalidReplyError(f"tensor {name!r} is not symmetric.")
    symmetric = symmetric.double()
    if bool(certainly_psd(symmetric, tolerance.double()).all()):
        return
    lowest = torch.linalg.eigvalsh(symmetric).amin(-1)
    if bool((lowest < -tolerance).any()):
        raise InvalidReplyError(
            f"tensor {name!r} is not positive semi-definite about its means: no rows have "
            "these statistics."
        )


def second_diagonal(second: Tensor, covariance_type: str, n_features: int) -> Tensor:
    """Per-component diagonal of second moments, (n_components, n_features); ``spherical``
    gives the per-component sum over features in column 0 (the rest zero), ``tied`` one row."""
    if covariance_type == "full":
        return torch.diagonal(second, dim1=1, dim2=2)
    if covariance_type == "tied":
        return torch.diagonal(second).unsqueeze(0)
    if covariance_type == "diag":
        return second
    out = second.new_zeros(second.shape[0], n_features)
    out[:, 0] = second
    return out


# ----------------------------------------------------------------------------- the engine
def expected_shapes(
    broadcast: Message, reply: Message, n_features: int, spec: ReplySpec | None = None
) -> dict[str, Shape]:
    """Tensors a reply to ``broadcast`` must carry and their shapes: the declaration's
    ``spec.shapes(broadcast, d)`` (``spec`` default: the package's declaration of the
    broadcast's kind), ``{}`` for a skipped reply.

    Args:
        broadcast: the round's message to the clients.
        reply: the client's reply (a skipped reply carries at most ``n_samples``).
        n_features: the width of the federation's rows (the round's ``d`` unless the
            broadcast's ``expect`` names another, :func:`round_width`).
        spec: the declaration of the broadcast's kind.

    Returns:
        name -> shape; a string dimension (``"k"``) is free but equal wherever it appears.
    """
    if is_skipped(reply):
        return {}
    spec = resolve_spec(broadcast.kind) if spec is None else spec
    return dict(spec.shapes(broadcast, round_width(broadcast, n_features)))


def _match_shape(name: str, actual: tuple[int, ...], shape: Shape, bound: dict[str, int]) -> None:
    ok = len(actual) == len(shape)
    for size, want in zip(actual, shape, strict=False):
        if isinstance(want, str):
            ok = ok and bound.setdefault(want, size) == size
        else:
            ok = ok and size == want
    if not ok:
        pretty = tuple(bound.get(s, s) if isinstance(s, str) else s for s in shape)
        raise InvalidReplyError(f"tensor {name!r} has shape {actual}; expected {pretty}.")


def check_reply(
    reply: Message,
    broadcast: Message,
    n_features: int,
    spec: ReplySpec | None = None,
    noisy: bool = False,
) -> None:
    """Raise if ``reply`` is not a well-formed answer to ``broadcast`` by the declaration
    ``spec`` of its kind (form and values; :class:`ReplyValidator` adds what the client
    declared before).

    Args:
        reply: a decoded client reply.
        broadcast: the round's message.
        n_features: ``d`` of the federation's rows.
        spec: the declaration of the broadcast's kind; default the package's own
            (:func:`~fednovelty.federated.core.declarations.declared_spec`).
        noisy: the reply carries differential-privacy noise (a private kind under a
            ``dp_mode``): its form and finiteness are checked, not its values (noise makes
            counts negative and second moments indefinite; the server post-processes the
            sum instead).

    Raises:
        InvalidReplyError: wrong kind, a kind nothing declares, missing or unexpected
            tensor, wrong shape, NaN/inf, a negative count / weight, or values the
            declaration's checks refuse (statistics no rows could produce, ...).
    """
    if reply.kind != broadcast.kind:
        raise InvalidReplyError(f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round.")
    spec = resolve_spec(broadcast.kind) if spec is None else spec
    if spec.kind != broadcast.kind:
        raise ValueError(
            f"the declaration of {spec.kind!r} replies checks a {broadcast.kind!r} one."
        )
    if is_skipped(reply):
        if set(reply.tensors) - {"n_samples"}:
            raise InvalidReplyError("a skipped reply carries statistics.")
        _check_values(reply)
        return
    _check_form(reply, broadcast, n_features, spec)
    if noisy:
        _check_finite(reply)
        return
    _check_values(reply)
    for check in spec.checks:
        check(reply, broadcast)


def _check_form(reply: Message, broadcast: Message, n_features: int, spec: ReplySpec) -> None:
    """The tensors of a reply that is not skipped: every declared one present with its
    shape, a tensor named as a broadcast tensor with the broadcast's shape, no other."""
    shapes = expected_shapes(broadcast, reply, n_features, spec)
    missing = sorted(set(shapes) - set(reply.tensors))
    if missing:
        raise InvalidReplyError(f"reply lacks tensor(s) {missing}.")
    bound: dict[str, int] = {}
    for name, tensor in reply.tensors.items():
        if name in shapes:
            _match_shape(name, tuple(tensor.shape), shapes[name], bound)
        elif name in broadcast.tensors:
            _match_shape(name, tuple(tensor.shape), tuple(broadcast.tensors[name].shape), bound)
        else:
            raise InvalidReplyError(f"reply has unexpected tensor {name!r}.")


def _check_finite(reply: Message) -> None:
    """Floating tensors finite."""
    for name, tensor in reply.tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidReplyError(f"tensor {name!r} has NaN or inf values.")


def _check_values(reply: Message) -> None:
    """Floating tensors finite, :data:`NON_NEGATIVE` tensors >= 0, row counts at most
    :data:`MAX_ROWS`."""
    for name, tensor in reply.tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidReplyError(f"tensor {name!r} has NaN or inf values.")
        if name in NON_NEGATIVE and tensor.numel() and bool((tensor < 0).any()):
            raise InvalidReplyError(f"tensor {name!r} has negative values.")
        if name in ROW_COUNTS and tensor.numel() and bool((tensor > MAX_ROWS).any()):
            raise InvalidReplyError(
                f"tensor {name!r} claims more than {MAX_ROWS:.3g} rows: no client holds that many."
            )


# ----------------------------------------------------------------------------- in one batch
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
        ``max|G - G^T| <= tau / (4 d)`` (then ``G`` is finite and within ``tau / 8`` in
        norm of its symmetric part, and the symmetry test passes), ``scale`` is at most a
        quarter of the largest float (``G + G^T`` does not overflow) and the Cholesky
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
    asymmetry = _largest_magnitude(gram - gram.transpose(-1, -2))  # NaN/inf where not finite
    # (G + G^T) / 2, which one reply's check forms, stays finite
    symmetric = (asymmetry <= tolerance / (4 * d)) & (scale <= torch.finfo(scale.dtype).max / 4)
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
BATCH_BYTES = 1 << 20
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
            _check_form(replies[cids[0]], broadcast, n_features, spec)
        except _BATCH_ERRORS:
            continue
        reply_bytes = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype, _ in form)
        size = max(2, BATCH_BYTES // max(1, reply_bytes))
        for start in range(0, len(cids), size):
            part = cids[start : start + size]
            try:
                stacked = {
                    name: torch.stack([replies[c].tensors[name] for c in part]) for name, *_ in form
                }
                passes = _values_pass(stacked)
                for check in batched:
                    passes = passes & check(stacked, broadcast)
            except _BATCH_ERRORS:
                continue
            passed.update(c for c, ok in zip(part, passes.tolist(), strict=True) if ok)
    return passed


# ----------------------------------------------------------------------------- declared
@dataclass
class Declared:
    """What one client has declared so far.

    Attributes:
        n_samples: its row count (fixed by the first reply that carries one).
        mean, m2: per-feature mean and sum of squared deviations from the first reply that
            declares moments (``ReplySpec.moments``), each (n_features,); ``None`` before.
    """

    n_samples: float | None = None
    mean: Tensor | None = None
    m2: Tensor | None = None


@dataclass
class ReplyValidator:
    """One run's server gate, used by every engine.

    Holds the federation's row width (given, or the most common width of the first round's
    replies), how to find the declaration of a kind, and what each client declared
    (:class:`Declared`). It checks:

    - **shapes** (``spec.shapes(broadcast, d)``): every declared tensor present, with its shape
      (a string dimension is free but equal wherever it appears in one reply); a reply tensor
      named as a broadcast tensor has the broadcast's shape (learners, models); any other tensor
      is refused.
    - **values**: floating tensors finite; counts, row counts, weights and variances
      (:data:`NON_NEGATIVE`) non-negative; then the declared ``spec.checks`` (e.g. the shared
      :func:`check_stats`: counts add up to at most the row count and ``n_k S_k - s_k s_k^T`` is
      positive semi-definite, the Cauchy-Schwarz inequality any weighted set of rows satisfies).
    - **what the client declared before** (:class:`ReplyValidator`): the row count is fixed by a
      client's first reply that carries one and may not change later; the row width is the
      federation's. A reply that declares the client's moments (``spec.moments``: a ``moments``
      round's mean ``m`` and sum of squared deviations ``M2``, or the prior moments of
      variational Bayes) fixes a box: every row the client holds lies within ``|x_j - m_j| <=
      sqrt(M2_j)``, so every mean it sends later (``box="means"``: centroids, ranges) lies in
      that box, and the squared deviations about ``m`` that its statistics imply
      (``box="stats"``, ``box="moments"``) may not add up to more than ``M2``.

    :meth:`accept` first checks the form and values of a round's replies of one form
    together (:func:`batch_passes`: one stacked pass and one batched Cholesky for the
    statistics of all clients); a reply that batch does not clear is checked alone, which
    gives the same verdict and names the reason.

    Attributes:
        n_features: the federation's ``d`` (``None`` until known).
        declared: client id -> :class:`Declared`.
        specs: kind -> :class:`~fednovelty.federated.core.declarations.ReplySpec` (the run's
            ``algorithm.reply_spec``, set by the round loop); ``None``: the package's own
            declarations.
        private: the clients release noisy statistics (the algorithm's ``dp_mode``, set by
            the round loop): a reply of a kind with a private form is checked for form and
            finiteness only, and neither its row count nor the box binds it.
    """

    n_features: int | None = None
    declared: dict[int, Declared] = field(default_factory=dict)
    specs: SpecLookup | None = None
    private: bool = False
    #: during :meth:`accept`, the replies :func:`batch_passes` established as well formed.
    _formed: dict[int, Message] = field(default_factory=dict, init=False, repr=False)

    def accept(
        self,
        broadcast: Message,
        replies: Mapping[int, Message],
        widths: Mapping[int, int] | None = None,
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Split one round's replies into those the server step may use and those dropped.

        Args:
            broadcast: the round's message.
            replies: client id -> decoded reply.
            widths: client id -> the row width the client reports (Flower's reply
                header); default the federation's width for every client.

        Returns:
            ``(valid, dropped)``: valid replies by increasing client id, and client id ->
            reason for every dropped one.
        """
        widths = dict(widths or {})
        if self.n_features is None:
            width = self._federation_width(broadcast, widths)
            if width is None:
                raise ValueError("the federation's row width is not known; pass widths.")
            self.n_features = width
        valid, dropped = {}, {}
        self._formed = self._batch_formed(broadcast, replies)
        try:
            for cid in sorted(replies):
                reply = replies[cid]
                try:
                    reported = widths.get(cid, self.n_features)
                    if reported != self.n_features:
                        raise InvalidReplyError(
                            f"rows of {reported} features; the federation's have {self.n_features}."
                        )
                    self.check(cid, reply, broadcast)
                except InvalidReplyError as error:
                    dropped[cid] = str(error)
                    continue
                self._record(cid, reply, broadcast)
                valid[cid] = reply
        finally:
            self._formed = {}
        return valid, dropped

    def _batch_formed(self, broadcast: Message, replies: Mapping[int, Message]) -> dict:
        """The replies :func:`batch_passes` establishes as well formed (not for noisy
        replies, whose checks differ), by client id."""
        try:
            spec = self.spec(broadcast.kind)
        except InvalidReplyError:
            return {}
        if self.private and spec.private is not None:
            return {}
        return {c: replies[c] for c in batch_passes(broadcast, replies, self.n_features, spec)}

    def _federation_width(self, broadcast: Message, widths: Mapping[int, int]) -> int | None:
        for name in ("means", "centers", "shift", "offset"):
            if name in broadcast.tensors:
                return int(broadcast.tensors[name].shape[-1])
        if not widths:
            return None
        counts = Counter(widths.values())
        top = max(counts.values())
        return min(w for w, c in counts.items() if c == top)

    def spec(self, kind: str) -> ReplySpec:
        """The declaration of ``kind`` this validator reads (:func:`resolve_spec`)."""
        return resolve_spec(kind, self.specs)

    def check(self, client_id: int, reply: Message, broadcast: Message) -> None:
        """Raise :class:`InvalidReplyError` if the reply is malformed, undeclared, or
        contradicts what ``client_id`` declared before."""
        spec = self.spec(broadcast.kind)
        noisy = self.private and spec.private is not None
        if self._formed.get(client_id) is not reply:  # else established in one batch
            check_reply(reply, broadcast, self.n_features, spec, noisy=noisy)
        if is_skipped(reply) or noisy:
            return
        before = self.declared.get(client_id, Declared())
        n = reply.tensors.get("n_samples", reply.tensors.get("n"))
        if n is not None and before.n_samples is not None:
            if abs(float(n) - before.n_samples) > RTOL * max(before.n_samples, 1.0):
                raise InvalidReplyError(
                    f"reply claims {float(n):g} rows; the client declared {before.n_samples:g}."
                )
        if before.mean is not None and spec.box != "none":
            check_box(reply, broadcast, spec, before)

    def _record(self, client_id: int, reply: Message, broadcast: Message | None = None) -> None:
        if is_skipped(reply):
            return
        declared = self.declared.setdefault(client_id, Declared())
        n = reply.tensors.get("n_samples", reply.tensors.get("n"))
        if n is not None and declared.n_samples is None:
            declared.n_samples = float(n)
        moments = self.spec(reply.kind).moments
        if moments is not None and declared.mean is None:
            _, mean, m2 = (v.double().cpu() for v in moments(reply))
            if broadcast is not None and "box_scale" in broadcast.tensors:  # box units -> x
                offset = broadcast.tensors["box_offset"].double().cpu()
                scale = broadcast.tensors["box_scale"].double().cpu()
                mean, m2 = offset + scale * mean, m2 * scale.square()
            declared.mean, declared.m2 = mean, m2


# ----------------------------------------------------------------------------- the box
def check_box(reply: Message, broadcast: Message, spec: ReplySpec, before: Declared) -> None:
    """Raise unless ``reply`` lies in the box of the client's declared moments ``before``
    as ``spec.box`` says: ``"means"``: every row of the ``spec.points`` tensors within
    ``|x - m| <= sqrt(M2)``; ``"stats"`` (where the reply carries ``sums``): its component
    means in the box and the squared deviations about ``m`` its statistics imply at most
    ``M2``; ``"moments"``: the same for the moments the reply declares. In the units the
    round works in (z-scores when the broadcast carries ``offset`` and ``scale``)."""
    center, radius, m2 = before.mean, before.m2.sqrt(), before.m2
    if "scale" in broadcast.tensors:
        offset = broadcast.tensors["offset"].double().cpu()
        scale = broadcast.tensors["scale"].double().cpu()
        center, radius, m2 = (center - offset) / scale, radius / scale, m2 / scale.square()
    rtol = relative_tolerance(reply.tensors[next(iter(reply.tensors))].dtype)
    t = {k: v.double().cpu() for k, v in reply.tensors.items()}
    box = _Box(center, radius, m2, rtol)
    if spec.box == "means":
        for name in spec.points:
            box.inside(t[name].reshape(-1, center.shape[0]), "means")
    elif spec.box == "stats" and "sums" in t:
        ct = str(expectation(broadcast, "covariance_type"))
        shift = broadcast.tensors["shift"].double().cpu()
        diagonal = second_diagonal(t["second"], ct, shift.shape[0])
        box.spread(t["counts"], t["sums"], diagonal, shift, float(t["n_samples"]), ct)
    elif spec.box == "moments" and spec.moments is not None:
        n, mean, deviations = (torch.as_tensor(v).double().cpu() for v in spec.moments(reply))
        counts = n.reshape(1)
        box.spread(
            counts,
            torch.zeros_like(mean).unsqueeze(0),
            deviations.unsqueeze(0),
            mean,
            float(n),
            "diag",
        )


@dataclass(frozen=True)
class _Box:
    """``|x - center| <= radius`` and squared deviations about ``center`` at most ``m2``
    (each (n_features,)), up to ``rtol``."""

    center: Tensor
    radius: Tensor
    m2: Tensor
    rtol: float

    def inside(self, points: Tensor, what: str) -> None:
        slack = self.rtol * (self.radius + self.center.abs()) + 1e-12
        if points.numel() and bool(((points - self.center).abs() > self.radius + slack).any()):
            raise InvalidReplyError(
                f"{what} lie outside the range the client's declared moments allow."
            )

    def spread(
        self, counts: Tensor, sums: Tensor, diagonal: Tensor, shift: Tensor, n: float, ct: str
    ) -> None:
        """Statistics about ``shift``: ``counts`` (K,), ``sums`` (K, d), the second moments'
        ``diagonal`` (K, d) (:func:`second_diagonal`; ``ct="spherical"``: traces)."""
        occupied = counts > self.rtol * max(n, 1.0)
        self.inside(shift + sums[occupied] / counts[occupied].unsqueeze(1), "component means")
        m2 = self.m2
        delta = shift - self.center  # sum_i r (x - m)^2 = S + 2 delta s + n delta^2
        deviations = diagonal.sum(0)
        cross, square = 2 * delta * sums.sum(0), counts.sum() * delta.square()
        if ct == "spherical":  # traces: one number for all features
            deviations, cross, square, m2 = (
                deviations[:1],
                cross.sum().reshape(1),
                square.sum().reshape(1),
                m2.sum().reshape(1),
            )
        total = deviations + cross + square
        # the terms cancel when the shift is far from the client's mean: compare with a
        # slack relative to their size, not to the result's; a feature the client holds
        # constant (m2 = 0) still shows round-off of order n (rtol * its magnitude)^2
        scale = self.radius + self.center.abs()
        if ct == "spherical":
            scale = scale.square().sum().sqrt().reshape(1)
        slack = self.rtol * (deviations.abs() + cross.abs() + square + m2)
        slack = slack + max(n, 1.0) * (self.rtol * scale).square() + 1e-300
        if bool((total > m2 + slack).any()):
            raise InvalidReplyError(
                "statistics spread further than the client's declared moments allow."
            )
