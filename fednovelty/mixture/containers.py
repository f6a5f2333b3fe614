"""What the frozen tensor containers of this package share.

Parameters (:class:`~fednovelty.mixture.model.MixtureParams`,
:class:`~fednovelty.mixture.factor.FactorParams`,
:class:`~fednovelty.mixture.variational.VBPosterior`) and summable statistics
(:class:`~fednovelty.mixture.stats.SufficientStats`, ...) are frozen dataclasses of tensors
with a few strings: :class:`ComponentTensors` gives them their sizes and their tensors by
name, and :class:`SummableStats` the ``+`` that merges statistics of disjoint rows.
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
