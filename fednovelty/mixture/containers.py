"""What the frozen tensor containers of this package share.

Parameters (:class:`~fednovelty.mixture.model.MixtureParams`,
:class:`~fednovelty.mixture.factor.FactorParams`,
:class:`~fednovelty.mixture.variational.VBPosterior`) and summable statistics
(:class:`~fednovelty.mixture.stats.SufficientStats`, ...) are frozen dataclasses of tensors
with a few strings: :class:`ComponentTensors` gives them their sizes and their tensors by
name, and :class:`SummableStats` the ``+`` that merges statistics of disjoint rows;
:func:`union` joins mixtures into one whose density is the mean of theirs, and
:func:`split` takes them apart again.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import ClassVar

import torch
from torch import Tensor


class ComponentTensors:
    """Mixin for a frozen dataclass of tensors with a (n_components, n_features, ...) field.

    ``SHAPE_FIELD`` names that field (``"means"`` unless a class sets another);
    :meth:`tensors` is every tensor field by name, in field order (strings such as
    ``covariance_type`` are left out): what a broadcast or a reply carries.
    """

    SHAPE_FIELD: ClassVar[str] = "means"

    @property
    def n_components(self) -> int:
        return getattr(self, self.SHAPE_FIELD).shape[0]

    @property
    def n_features(self) -> int:
        return getattr(self, self.SHAPE_FIELD).shape[1]

    def tensors(self) -> dict[str, Tensor]:
        """The tensor fields by name, in field order."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                out[f.name] = value
        return out


class SummableStats:
    """Mixin for a frozen dataclass of statistics about a ``shift`` field, merged with ``+``.

    Statistics of disjoint rows taken about the same shift add: ``a + b`` is ``a`` with each
    field named in ``SUMMED`` replaced by ``a.<name> + b.<name>``. A class sets ``SUMMED``,
    ``SHAPED`` (fields whose shapes must agree; ``AXES`` names the first one's dimensions in
    the error) and ``WHAT`` (its name in errors); :meth:`check_mergeable` may check more.
    """

    SUMMED: ClassVar[tuple[str, ...]]
    SHAPED: ClassVar[tuple[str, ...]]
    AXES: ClassVar[str]
    WHAT: ClassVar[str] = "statistics"

    def check_mergeable(self, other) -> None:
        """Raise a ``ValueError`` unless ``other``'s ``SHAPED`` fields have this one's shapes
        and its ``shift`` is this one's."""
        if any(getattr(self, n).shape != getattr(other, n).shape for n in self.SHAPED):
            mine, theirs = getattr(self, self.SHAPED[0]).shape, getattr(other, self.SHAPED[0]).shape
            raise ValueError(
                f"Cannot merge {self.WHAT} of shapes {tuple(mine)} and {tuple(theirs)} {self.AXES}."
            )
        if not torch.equal(self.shift, other.shift):  # type: ignore[attr-defined]
            raise ValueError(
                f"Cannot merge {self.WHAT} taken about different shifts; compute them about "
                "the same broadcast shift."
            )

    def __add__(self, other):
        if not isinstance(other, type(self)):
            return NotImplemented
        self.check_mergeable(other)
        summed = {n: getattr(self, n) + getattr(other, n) for n in self.SUMMED}
        return replace(self, **summed)  # type: ignore[type-var]


def union(mixtures: list, shares: Tensor | None = None):
    """One mixture whose density is the ``shares``-weighted mean of the ``mixtures``'
    densities: ``p(x) = sum_m shares[m] p_m(x)``, each member's components kept with their
    weights times ``shares[m]`` (default ``1 / M`` each: the bagged density estimate).

    Args:
        mixtures: M >= 1 containers of one class (``MixtureParams``, ``FactorParams``, ...)
            whose every tensor field has the components first (K_m, ...) and a ``weights``
            field; their other fields (``covariance_type``) equal and their tensors of one
            dtype, device and shape past the first axis.
        shares: (M,) non-negative, summing to 1; default uniform.

    Returns:
        A container of the same class with ``sum_m K_m`` components, member 0's first.

    Raises:
        ValueError: no mixtures, mixed classes or settings, a field without the components
            first (a ``tied`` covariance), shapes or shares that do not fit.
    """
    if not mixtures:
        raise ValueError("union needs at least one mixture; got none.")
    first = mixtures[0]
    kinds = {type(m) for m in mixtures}
    if len(kinds) > 1:
        names = sorted(k.__name__ for k in kinds)
        raise ValueError(f"union needs mixtures of one class; got {names}.")
    settings = {f.name for f in fields(first) if not isinstance(getattr(first, f.name), Tensor)}
    for name in settings:
        values = {getattr(m, name) for m in mixtures}
        if len(values) > 1:
            raise ValueError(f"union needs mixtures of one {name}; got {sorted(values)}.")
    if shares is None:
        shares = torch.full((len(mixtures),), 1.0 / len(mixtures), dtype=first.weights.dtype)
    shares = torch.as_tensor(shares, dtype=first.weights.dtype, device=first.weights.device)
    if (
        shares.shape != (len(mixtures),)
        or bool((shares < 0).any())
        or not torch.isclose(shares.sum(), torch.ones((), dtype=shares.dtype))
    ):
        raise ValueError(
            f"shares must be {len(mixtures)} non-negative numbers summing to 1 (one per "
            f"mixture); got {shares.tolist()}."
        )
    joined = {}
    for name in first.tensors():
        parts = [getattr(m, name) for m in mixtures]
        if any(
            p.ndim == 0 or p.shape[0] != m.n_components
            for p, m in zip(parts, mixtures, strict=True)
        ):
            raise ValueError(
                f"union keeps every member's components, so each tensor needs them on its "
                f"first axis; {type(first).__name__}.{name} has shape {tuple(parts[0].shape)} "
                f"for {first.n_components} components (a tied covariance is shared, not per "
                "component: use full, diag or spherical)."
            )
        if name == "weights":
            parts = [p * s for p, s in zip(parts, shares, strict=True)]
        try:
            joined[name] = torch.cat(parts)
        except RuntimeError as error:
            raise ValueError(
                f"union needs the members' {name!r} to agree past the components' axis: {error}"
            ) from None
    return replace(first, **joined)


def split(mixture, sizes: list[int]) -> list:
    """The members a :func:`union` joined: ``mixture``'s consecutive blocks of ``sizes``
    components, each block's weights rescaled to sum to 1.

    Args:
        mixture: a container whose tensor fields have the components first.
        sizes: positive component counts summing to ``mixture.n_components``.

    Returns:
        ``len(sizes)`` containers of ``mixture``'s class.

    Raises:
        ValueError: sizes that do not cover the components, or a block of weight 0.
    """
    sizes = [int(k) for k in sizes]
    if not sizes or min(sizes) < 1 or sum(sizes) != mixture.n_components:
        raise ValueError(
            f"sizes must be positive component counts summing to the mixture's "
            f"{mixture.n_components} components; got {sizes}."
        )
    members, start = [], 0
    for k in sizes:
        block = {name: value[start : start + k] for name, value in mixture.tensors().items()}
        total = block["weights"].sum()
        if not bool(total > 0):
            raise ValueError(
                f"components {start}..{start + k - 1} have weight 0 in all: no member's mixture."
            )
        block["weights"] = block["weights"] / total
        members.append(replace(mixture, **block))
        start += k
    return members
