"""The export list of a package's ``__init__``, read from what it imports.

A package's ``__init__`` imports its public names once; :func:`public_names` turns those
bindings into ``__all__``, so that no second list has to be kept in step with the imports.
"""

from __future__ import annotations
import __future__

from collections.abc import Mapping
from types import ModuleType

__all__ = ["public_names"]


def public_names(namespace: Mapping[str, object]) -> list[str]:
    """Sorted public names bound in ``namespace`` (a module's ``globals()``): every name not
    starting with ``_``, but submodules and ``from __future__`` features."""
    return sorted(
        name
        for name, value in namespace.items()
        if not name.startswith("_") and not isinstance(value, ModuleType | __future__._Feature)
    )
