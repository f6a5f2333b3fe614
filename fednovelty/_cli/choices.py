"""The command line's fixed choices and its "did you mean" for a mistyped one.

Printing ``fednovelty --help`` or ``--version`` imports neither torch, PyOD nor scikit-learn,
so the choices the parser offers are plain tuples here: copies of the constants of the
modules that use them (``tests/test_cli_startup.py`` checks each copy equals its source).
Method names come from the registry (:mod:`fednovelty.methods`), which reads without
importing a detector.

:class:`Parser` is ``argparse.ArgumentParser`` whose refusal of a choice names the closest
choices (:func:`closest`, by :mod:`difflib`) instead of listing every one of a long list.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence

__all__ = [
    "ABLATION_NAMES",
    "COVARIANCE_TYPES",
    "METRICS",
    "PARTITIONS",
    "SCHEDULES",
    "STREAM_ROLES",
    "Parser",
    "alternatives",
    "closest",
    "did_you_mean",
]

#: :data:`fednovelty.datasets.protocols.PARTITIONS`.
PARTITIONS = ("dirichlet", "quantity", "iid")
#: :data:`fednovelty.datasets.streams.SCHEDULES`.
SCHEDULES = ("linear", "cosine", "constant")
#: the keys of :data:`fednovelty.evaluation.ablations.ABLATIONS`.
ABLATION_NAMES = ("plain", "std", "prior")
#: :data:`fednovelty.evaluation.results.METRICS`.
METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1")
#: :data:`fednovelty.mixture.covariance.COVARIANCE_TYPES`.
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
#: :data:`fednovelty.evaluation.streams.STREAM_ROLES`.
STREAM_ROLES = ("static", "refit")
#: :data:`fednovelty.evaluation.streams.DEFAULT_REFITTED`.
DEFAULT_REFITTED = "FedGenGMM-plain"

#: A list of choices this long or shorter is printed whole beside the closest names.
SHORT_LIST = 8


def closest(name: str, choices: Sequence[object], n: int = 3) -> list[str]:
    """Up to ``n`` of ``choices`` (as strings) closest to ``name`` by :mod:`difflib`, best
    first; a case-insensitive match comes first; empty when none is close."""
    names = [str(choice) for choice in choices]
    same_case = [choice for choice in names if choice.lower() == str(name).lower()]
    lowered = {choice.lower(): choice for choice in names}
    near = difflib.get_close_matches(str(name).lower(), list(lowered), n=n, cutoff=0.6)
    found = [*same_case, *(lowered[choice] for choice in near)]
    return list(dict.fromkeys(found))[:n]


def alternatives(names: Sequence[str]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'``: ``names`` quoted, as a sentence says them."""
    quoted = [repr(str(name)) for name in names]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def did_you_mean(name: str, choices: Sequence[object], what: str = "choice") -> str:
    """``invalid WHAT: 'name'; did you mean 'a' or 'b'?`` (the closest of ``choices``), with
    the whole list when it is short (``SHORT_LIST``)."""
    names = [str(choice) for choice in choices]
    near = closest(name, names)
    text = f"invalid {what}: {str(name)!r}"
    if near:
        text += f"; did you mean {alternatives(near)}?"
    if len(names) <= SHORT_LIST:
        text += f" (choose from {', '.join(names)})"
    elif not near:
        text += f" ({len(names)} choices; --help lists them)"
    return text


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose refusal of a value outside an option's ``choices``
    names the closest choices (:func:`did_you_mean`) rather than all of them; its
    subcommands' parsers are of this class too (argparse makes them with the parent's
    class)."""

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, did_you_mean(value, list(action.choices)))
