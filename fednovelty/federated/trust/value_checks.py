"""The value checks a reply's declaration names (``ReplySpec.checks``).

One NaN or one impossible statistic in a sum would poison the whole model, so a reply's values
must be ones some rows could have produced. :func:`check_stats` (counts add up to at most the
row count and ``n_k S_k - s_k s_k^T`` is positive semi-definite, the Cauchy-Schwarz
inequality any weighted set of rows satisfies; :func:`check_stats_tensors` for statistics
outside a reply), :func:`check_scatter`, :func:`check_counts_within` and
:func:`check_positive_rows` each raise
:class:`~fednovelty.federated.core.declarations.InvalidReplyError` naming what no rows could
produce. Every test is relative, with the slack of the reply's dtype
(:func:`relative_tolerance`); :func:`check_psd` decides by ``eigvalsh``, after one Cholesky
factorisation that clears most matrices at a tenth of the cost (:func:`certainly_psd`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.trust.reply_form import expectation

#: relative slack of the consistency checks in float64 (round-off of sums over many rows);
#: float32 replies get ``1e3`` times their machine epsilon where that is larger.
RTOL = 1e-6


def relative_tolerance(dtype: torch.dtype) -> float:
    """Slack of the consistency checks for statistics computed in ``dtype``."""
    return max(RTOL, 1e3 * torch.finfo(dtype).eps) if dtype.is_floating_point else RTOL


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
