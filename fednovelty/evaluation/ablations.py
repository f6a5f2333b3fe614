"""Ablations of the robust defaults: a benchmark runs a method also without them.

The mixture methods of the registry (:mod:`fednovelty.methods`) run with federated
standardisation and a covariance prior by default (``docs/robust.md``). An ablation runs a
method with the detector settings of :data:`ABLATIONS` instead; its results carry the name
``<method>-<ablation>`` (``"FedGenGMM-plain"``):

- ``plain``: neither, the papers' plain maximum-likelihood mixture;
- ``std``: standardisation only, no covariance prior;
- ``prior``: the covariance prior on the raw features, no standardisation.

A method takes an ablation when its detector has every setting the ablation names (and the
method does not fix one of them): the Gaussian-mixture methods, FedMFA and FedVB, not PyOD's
baselines. :func:`with_ablations` adds the ablations to a list of methods
(``run_benchmark(ablations=...)``, ``fednovelty bench --ablations plain,std``), and
:func:`resolve_method` reads any such name, so a runner can also be given an ablation alone.

Example:
    >>> from fednovelty.evaluation.ablations import ABLATIONS, resolve_method, with_ablations
    >>> from fednovelty.methods import get_method
    >>> with_ablations(["FedGenGMM", "IForest"], ["plain"])
    ['FedGenGMM', 'IForest', 'FedGenGMM-plain']
    >>> plain = resolve_method("DEM-kmeans-plain")
    >>> plain.fixed == {**get_method("DEM-kmeans").fixed, **ABLATIONS["plain"]}
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from fednovelty.detectors.options import Prior
from fednovelty.methods import METHODS, Method, check_known

__all__ = [
    "ABLATIONS",
    "ablated",
    "ablation_names",
    "check_ablations",
    "resolve_method",
    "takes_ablation",
    "with_ablations",
]

#: Ablation -> the detector settings it runs a method with (see the module doc).
ABLATIONS: dict[str, dict[str, Any]] = {
    "plain": {"prior": Prior(standardize=False, strength=None)},
    "std": {"prior": Prior(strength=None)},
    "prior": {"prior": Prior(standardize=False)},
}
#: What each ablation switches off, for descriptions.
ABLATION_TEXT = {
    "plain": "ablation: plain maximum likelihood, no standardisation, no prior",
    "std": "ablation: standardisation only, no covariance prior",
    "prior": "ablation: covariance prior on the raw features, no standardisation",
}


@dataclass(frozen=True)
class _Ablated:
    """Factory of ``factory(**settings, **params)``: a method's detector with an ablation's
    settings fixed (pairs, so that the factory stays hashable)."""

    factory: Callable[..., Any]
    settings: tuple[tuple[str, Any], ...]

    @property
    def fixed(self) -> dict[str, Any]:
        return {**getattr(self.factory, "fixed", {}), **dict(self.settings)}

    def __call__(self, **params):
        return self.factory(**dict(self.settings), **params)


def check_ablations(ablations: Iterable[str]) -> list[str]:
    """Ablation names as a list, in order, each once; ``"plain,std"`` is split at commas.

    Raises:
        ValueError: an unknown name (with the closest of :data:`ABLATIONS`).
    """
    ablations = [ablations] if isinstance(ablations, str) else list(ablations)
    names = [part.strip() for text in ablations for part in str(text).split(",") if part.strip()]
    check_known("ablation", names, list(ABLATIONS))
    return list(dict.fromkeys(names))


@functools.lru_cache(maxsize=256)
def _parameters(method: Method) -> tuple[str, ...]:
    return method.parameters()


@functools.lru_cache(maxsize=256)
def _reads(method: Method, ablation: str) -> bool:
    """Whether ``method``'s detector reads the fields ``ablation`` sets of its options (a
    field it does not read is refused by its parameter check)."""
    try:
        method.build(**ABLATIONS[ablation])._validate_params()
    except ValueError:
        return False
    return True


def takes_ablation(method: Method, ablation: str) -> bool:
    """Whether ``method``'s detector has every setting of ``ablation`` (reads the fields it
    sets) and fixes none."""
    return set(ABLATIONS[ablation]) <= set(_parameters(method)) and _reads(method, ablation)


def ablated(method: Method, ablation: str) -> Method:
    """``method`` run with the settings of ``ablation``, named ``<method>-<ablation>``.

    Raises:
        ValueError: an unknown ablation, or a method that does not take it.
    """
    check_known("ablation", [ablation], list(ABLATIONS))
    if not takes_ablation(method, ablation):
        raise ValueError(
            f"{method.name} does not take the ablation {ablation!r}: its detector has no "
            f"{' or '.join(ABLATIONS[ablation])} to set. Ablate a mixture method instead."
        )
    return replace(
        method,
        name=f"{method.name}-{ablation}",
        factory=_Ablated(method.factory, tuple(ABLATIONS[ablation].items())),
        description=f"{method.description} [{ABLATION_TEXT[ablation]}]",
    )


def ablation_names(methods: Iterable[str], ablations: Iterable[str] = ABLATIONS) -> list[str]:
    """``<method>-<ablation>`` for each registry method of ``methods`` (in order) and each
    of ``ablations`` (in order) that it takes; other names are left out."""
    ablations = check_ablations(ablations)
    return [
        f"{name}-{ablation}"
        for name in methods
        if name in METHODS
        for ablation in ablations
        if takes_ablation(METHODS[name], ablation)
    ]


def with_ablations(methods: Iterable[str], ablations: Iterable[str] = ()) -> list[str]:
    """``methods``, then the ablations of each that takes them (:func:`ablation_names`),
    each name once.

    Raises:
        ValueError: an unknown ablation, or ablations that none of ``methods`` takes.
    """
    methods = [methods] if isinstance(methods, str) else list(methods)
    ablations = check_ablations(ablations)
    added = ablation_names(methods, ablations)
    if ablations and not added:
        takers = [name for name in METHODS if ablation_names([name], ablations)]
        raise ValueError(
            f"none of the methods {', '.join(methods)} takes the ablation(s) "
            f"{', '.join(ablations)}; name a method that does: {', '.join(takers)}."
        )
    return list(dict.fromkeys([*methods, *added]))


def resolve_method(name: str) -> Method:
    """The registry method ``name``, or the ablation ``<method>-<ablation>`` of one.

    Raises:
        ValueError: neither (with the closest registry names).
    """
    if name in METHODS:
        return METHODS[name]
    base, _, ablation = str(name).rpartition("-")
    if ablation in ABLATIONS and base in METHODS:
        return ablated(METHODS[base], ablation)
    check_known(  # raises: name is not in METHODS
        "method",
        [name],
        list(METHODS),
        f" An ablation is named <method>-<ablation> with an ablation of "
        f"{', '.join(ABLATIONS)} (e.g. FedGenGMM-plain).",
    )
    raise AssertionError("unreachable")
