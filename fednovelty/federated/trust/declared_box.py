"""What a client declared before, and the box its declared moments fix.

A client's row count is fixed by its first reply that carries one (:class:`Declared`). A
reply that declares the client's moments (``ReplySpec.moments``: a ``moments`` round's mean
``m`` and sum of squared deviations ``M2``, or the prior moments of variational Bayes) fixes a
box: every row the client holds lies within ``|x_j - m_j| <= sqrt(M2_j)``, so every mean it
sends later (``box="means"``: centroids, ranges) lies in that box, and the squared deviations
about ``m`` that its statistics imply (``box="stats"``, ``box="moments"``) may not add up to
more than ``M2`` (:func:`check_box`). The server gate
(:class:`~fednovelty.federated.trust.validation.ReplyValidator`) records and applies both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError, ReplySpec
from fednovelty.federated.trust.reply_form import expectation
from fednovelty.federated.trust.value_checks import relative_tolerance


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
