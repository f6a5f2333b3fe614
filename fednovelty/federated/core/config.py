"""Shared settings machinery: the :class:`Settings` base (JSON in and out, equality by value)
and the field groups the algorithms' configs are composed of.

Every federated algorithm holds one frozen dataclass as ``algorithm.config``, defined beside
the algorithm (``EMConfig`` in :mod:`~fednovelty.federated.mixtures.em`, ...); both halves read
their settings from it and Flower's ClientApp rebuilds it from the run config
(``from_json(to_json())`` round-trips). A config inherits exactly the field groups it uses:
the generic ones here, those of federated EM's preparation rounds and differential privacy
in :mod:`~fednovelty.federated.init.settings`, variational Bayes' priors in
:mod:`~fednovelty.federated.bayesian.variational`. Each group's ``__post_init__`` runs the rest of
the chain first, then normalises its own fields and raises a ``ValueError`` naming a bad
one; a group that needs another (initial tensors need the dtype) inherits it. A config
narrows a group's choices by a class-level tuple (``AGGREGATION_CHOICES``,
``COVARIANCE_CHOICES``, ``MIXTURE_WEIGHT_CHOICES``).

JSON form (:meth:`Settings.to_json`): dtypes as ``"float64"``, devices as ``"cpu"``, tuples
and tensors as (nested) lists, a learner factory by name (a custom one is code, which JSON
cannot carry).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.core.learners import LEARNERS, as_learner
from fednovelty.federated.core.wire import wire_dtype_of
from fednovelty.mixture.covariance import COVARIANCE_TYPES

#: JSON names of the floating dtypes the settings accept.
DTYPES: dict[str, torch.dtype] = {
    str(t).removeprefix("torch."): t
    for t in (torch.float64, torch.float32, torch.float16, torch.bfloat16)
}


#: the aggregations a robust setting names (:mod:`fednovelty.federated.trust.robust`).
AGGREGATIONS: tuple[str, ...] = ("sum", "trimmed", "median")


def check_robust_arguments(
    aggregation: str,
    trim: float,
    client_weight_cap: float | None,
    allowed: tuple[str, ...] = AGGREGATIONS,
    owner: str = "",
    name: str = "aggregation",
) -> tuple[str, float, float | None]:
    """Validated ``(aggregation, trim, client_weight_cap)``, or a ``ValueError`` naming the
    bad one; ``allowed`` lists the aggregations the algorithm ``owner`` has, and ``name``
    is the aggregation's setting there."""
    if aggregation not in allowed:
        has = f"{owner} has" if owner else "the algorithm has"
        raise ValueError(
            f"{name} must be one of {allowed} (the robust options {has}), got {aggregation!r}."
        )
    if not 0.0 <= float(trim) < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}.")
    if client_weight_cap is not None and not float(client_weight_cap) >= 1.0:
        raise ValueError(
            f"client_weight_cap must be >= 1 (a multiple of the median client's rows) or "
            f"None, got {client_weight_cap}."
        )
    cap = None if client_weight_cap is None else float(client_weight_cap)
    return aggregation, float(trim), cap


def as_dtype(value: Any) -> torch.dtype:
    """A floating torch dtype from a dtype or its JSON name, or a ``ValueError`` naming
    ``'dtype'``."""
    if isinstance(value, str) and value.removeprefix("torch.") in DTYPES:
        return DTYPES[value.removeprefix("torch.")]
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return value
    raise ValueError(
        f"'dtype' must be a floating torch dtype or one of {sorted(DTYPES)}, got {value!r}."
    )


def at_least(name: str, value: Any, low: float, optional: bool = False) -> Any:
    """``value`` unchanged if it is ``>= low`` (or ``None`` when ``optional``), else a
    ``ValueError`` naming ``name``."""
    if value is None and optional:
        return None
    if value is None or isinstance(value, bool) or not float(value) >= low:
        bound = f">= {low:g}" + (" or None" if optional else "")
        raise ValueError(f"{name} must be {bound}, got {value!r}.")
    return value


def optional_count(name: str, value: Any) -> int | None:
    """``value`` as an int >= 1, or ``None``; else a ``ValueError`` naming ``name``."""
    value = at_least(name, value, 1, optional=True)
    return None if value is None else int(value)


def as_tensor(value: Any, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """A setting's array as a tensor in ``dtype`` on ``device`` (a copy); ``None`` stays."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return value.detach().to(dtype=dtype, device=device, copy=True)
    return torch.tensor(np.asarray(value), dtype=dtype, device=device)


def _json_value(value: Any) -> Any:
    """A setting as a JSON value (dtype and device as strings, tuples and tensors as lists,
    a learner factory by name)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if callable(value):
        names = [name for name, factory in LEARNERS.items() if factory is value]
        if not names:
            raise ValueError(
                f"a custom learner factory cannot be written as JSON; use one of "
                f"{sorted(LEARNERS)} where the settings must travel (Flower)."
            )
        return names[0]
    return value


class Settings:
    """Base of the settings dataclasses: JSON in and out, equality by value, and the end of
    the groups' ``__post_init__`` chain.

    ``JSON_NAMES`` maps a field to its JSON key where they differ (e.g. the joint model's
    ``learner_factory`` is ``"learner"``).
    """

    JSON_NAMES: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:  # the end of the groups' chain
        pass

    def to_json(self) -> dict[str, Any]:
        """Every setting as a JSON value, keyed by its JSON name."""
        return {
            self.JSON_NAMES.get(f.name, f.name): _json_value(getattr(self, f.name))
            for f in fields(self)
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        """The settings ``to_json`` wrote (missing keys keep their defaults).

        Raises:
            ValueError: an unknown key (naming it and the known ones), or a bad value.
        """
        by_json = {cls.JSON_NAMES.get(f.name, f.name): f.name for f in fields(cls)}
        unknown = sorted(set(data) - set(by_json))
        if unknown:
            raise ValueError(
                f"unknown setting(s) {unknown} for {cls.__name__}; known: {sorted(by_json)}."
            )
        values = {by_json[key]: value for key, value in data.items()}
        for name, read in (("dtype", as_dtype), ("learner_factory", as_learner)):
            if name in values:  # named before any missing setting
                values[name] = read(values[name])
        return cls(**values)

    def _values(self) -> dict[str, Any]:
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            values[f.name] = value if callable(value) else _json_value(value)
        return values

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(repr(sorted(self._values().items(), key=lambda item: item[0])))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_choice(self, name: str, choices: tuple[str, ...]) -> None:
        """A ``ValueError`` naming ``name``, the config and ``choices`` unless the setting is
        one of them."""
        if getattr(self, name) not in choices:
            raise ValueError(
                f"{name} must be one of {list(choices)} for {type(self).__name__}; got "
                f"{getattr(self, name)!r}."
            )


#: the decorator of every settings dataclass and field group (frozen, keyword-only).
settings_dataclass = dataclass(frozen=True, eq=False, kw_only=True)


@settings_dataclass
class RobustSettings(Settings):
    """The robust options of an algorithm that sums or averages its clients' replies
    (:mod:`fednovelty.federated.trust.robust`, ``docs/robust.md``); off by default.

    Attributes:
        aggregation: ``"sum"`` (the exact sum or weighted mean), ``"trimmed"`` or
            ``"median"``, as far as the config has them (``AGGREGATION_CHOICES``).
        trim: share of clients a ``"trimmed"`` aggregation leaves out (at each end).
        client_weight_cap: no client counts for more than this many times the median
            client's row count (``None``: no cap).
    """

    AGGREGATION_CHOICES: ClassVar[tuple[str, ...]] = AGGREGATIONS

    aggregation: str = "sum"
    trim: float = 0.1
    client_weight_cap: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        robust = check_robust_arguments(
            self.aggregation,
            self.trim,
            self.client_weight_cap,
            self.AGGREGATION_CHOICES,
            owner=type(self).__name__,
        )
        for name, value in zip(("aggregation", "trim", "client_weight_cap"), robust, strict=True):
            self._set(name, value)


@settings_dataclass
class TorchSettings(Settings):
    """Seed and placement: ``random_state`` (integer seed), ``dtype`` (floating; client rows
    arrive in it), ``device`` (where the server computes) and ``wire_dtype``: ``None``
    (tensors travel in ``dtype``) or ``"float32"`` (float64 tensors travel as float32, half
    the bytes, rounded; :mod:`~fednovelty.federated.core.wire`)."""

    random_state: int = 0
    dtype: torch.dtype = torch.float64
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    wire_dtype: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("random_state", int(self.random_state))
        self._set("dtype", as_dtype(self.dtype))
        self._set("device", torch.device(self.device))
        wire = wire_dtype_of(self.wire_dtype)
        self._set("wire_dtype", None if wire is None else str(wire).removeprefix("torch."))


@settings_dataclass
class ComponentSettings(Settings):
    """``n_components``: the mixture's K (>= 1; an upper bound for variational Bayes), and
    ``chunk_size``: rows per E-step chunk (memory bound; ``None``: from K and d)."""

    n_components: int
    chunk_size: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("n_components", int(at_least("n_components", self.n_components, 1)))
        self._set("chunk_size", optional_count("chunk_size", self.chunk_size))


@settings_dataclass
class CovarianceSettings(Settings):
    """``covariance_type`` (one of ``COVARIANCE_CHOICES``: ``full``, ``tied``, ``diag``,
    ``spherical`` unless the config narrows them) and ``reg_covar`` (>= 0, added to
    covariance diagonals)."""

    COVARIANCE_CHOICES: ClassVar[tuple[str, ...]] = COVARIANCE_TYPES

    covariance_type: str = "full"
    reg_covar: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_choice("covariance_type", self.COVARIANCE_CHOICES)
        self._set("reg_covar", float(at_least("reg_covar", self.reg_covar, 0)))


@settings_dataclass
class IterationSettings(Settings):
    """``tol`` (>= 0): the convergence threshold on the change of mean log-likelihood (of
    the ELBO for variational Bayes); ``max_iter`` (>= 1): most iterations."""

    tol: float = 1e-3
    max_iter: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        self._set("tol", float(at_least("tol", self.tol, 0)))
        self._set("max_iter", int(at_least("max_iter", self.max_iter, 1)))
