"""The API reference's Griffe extension (mkdocs.yml: ``extensions`` of the mkdocstrings handler).

The package's docstrings are written with Sphinx roles (``:class:`~a.b.C```, ``:meth:`fit```);
mkdocstrings renders Markdown, where a role would show as text. At build time, and without
touching the sources, this extension:

- rewrites each role into an optional cross-reference to the object's canonical path
  (``<autoref identifier="a.b.C" optional>`C`</autoref>``): a link where the object is rendered
  somewhere in the reference, inline code otherwise (a private helper, another library);
- gives the estimators' constructor parameters a type, read from scikit-learn's
  ``_parameter_constraints`` (the signatures are written without annotations);
- records each class's nearest public bases (``extra["fednovelty"]["public_bases"]``), which
  docs/_templates/python/material/class.html.jinja shows in place of private bases.

Every object is read from the imported package (the handler's ``force_inspection``), so names
are resolved by importing them, as Python would.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import re
from numbers import Integral, Real
from types import ModuleType
from typing import Any

import griffe

#: a Sphinx role: ``:kind:`target```, ``:kind:`~target``` or ``:kind:`title <target>```
#: (``py:`` domain prefix allowed; a target may be wrapped across lines).
ROLE = re.compile(
    r":(?:py:)?(?P<kind>class|func|meth|mod|attr|data|exc|obj|const|type):"
    r"`(?P<tilde>~?)(?P<body>[^`]+)`"
)
_MISSING = object()


def _import(path: str) -> Any:
    """The object at dotted ``path`` (a module, or attributes of one), or ``_MISSING``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # any failure means "not a module"
            continue
        for name in parts[cut:]:
            try:
                found = getattr(found, name)
            except Exception:  # a lazy attribute may raise anything
                return _MISSING
        return found
    return _MISSING


@functools.cache
def canonical(path: str) -> str | None:
    """Where the object at ``path`` is defined (``a.b.C`` -> ``a.b._c.C``), or None if
    ``path`` names nothing importable."""
    found = _import(path)
    if found is _MISSING:
        return None
    if isinstance(found, ModuleType):
        return found.__name__
    target = getattr(found, "__func__", None) or getattr(found, "fget", None) or found
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if inspect.isclass(target) or inspect.isroutine(target):
        if isinstance(module, str) and isinstance(qualname, str) and "<locals>" not in qualname:
            return f"{module}.{qualname}"
    # An attribute or constant: its owner's canonical path and its own name.
    owner, _, name = path.rpartition(".")
    owner_path = canonical(owner) if owner else None
    return f"{owner_path}.{name}" if owner_path else path


def scopes(path: str) -> list[str]:
    """The scopes a relative name in the docstring of ``path`` is looked up in, innermost
    first: the object itself, its parents up to the top package, then nothing (absolute)."""
    parts = path.split(".")
    return [".".join(parts[:cut]) for cut in range(len(parts), 0, -1)] + [""]


def resolve(name: str, owner: str) -> str | None:
    """The canonical path a role's target ``name`` names in the docstring of ``owner``."""
    name = name.lstrip(".")
    for scope in scopes(owner):
        found = canonical(f"{scope}.{name}" if scope else name)
        if found:
            return found
    return None


def convert_roles(text: str, owner: str) -> str:
    """``text`` with every Sphinx role replaced by an optional cross-reference (see module)."""

    def replace(match: re.Match) -> str:
        body = re.sub(r"\s+", "", match["body"])
        title, target = body, body
        if explicit := re.fullmatch(r"(?P<title>.+?)<(?P<target>[^>]+)>", match["body"].strip()):
            title, target = explicit["title"].strip(), re.sub(r"\s+", "", explicit["target"])
        elif match["tilde"]:
            title = target.rsplit(".", 1)[-1]
        target, title = target.lstrip("~"), title.lstrip("~.")
        identifier = resolve(target, owner) or target
        return f'<autoref identifier="{identifier}" optional>`{title}`</autoref>'

    return ROLE.sub(replace, text)


# ------------------------------------------------------------------ parameter types
def _constraint_type(constraint: Any) -> str | None:
    """One scikit-learn constraint as a type (``Interval(Integral, ...)`` -> ``int``)."""
    if constraint is None:
        return "None"
    if isinstance(constraint, str):
        return {
            "boolean": "bool",
            "random_state": "int | RandomState | None",
            "array-like": "ArrayLike",
            "sparse matrix": "sparse matrix",
        }.get(constraint, constraint)
    kind = getattr(constraint, "type", None)
    name = type(constraint).__name__
    if name in ("Interval", "Options") and kind is not None:
        if isinstance(kind, type) and issubclass(kind, Integral):
            return "int"
        if isinstance(kind, type) and issubclass(kind, Real):
            return "float"
        return getattr(kind, "__name__", None)
    if name == "StrOptions":
        options = sorted(constraint.options - getattr(constraint, "deprecated", set()))
        return "Literal[" + ", ".join(repr(option) for option in options) + "]"
    if name == "Hidden":
        return None
    if constraint is callable:
        return "Callable"
    if isinstance(constraint, type):
        name = {"Real": "float", "Integral": "int"}.get(constraint.__name__, constraint.__name__)
        package = constraint.__module__.split(".")[0]
        return name if package in ("builtins", "numbers", "fednovelty") else f"{package}.{name}"
    return None


def constraints_type(constraints: list) -> str | None:
    """A parameter's scikit-learn constraints as one annotation (``int | None``), or None
    where a constraint has no plain type."""
    names: list[str] = []
    for constraint in constraints:
        kind = _constraint_type(constraint)
        if kind is None:
            return None
        for part in kind.split(" | "):
            if part not in names:
                names.append(part)
    if "float" in names and "int" in names:
        names.remove("int")
    if "None" in names:
        names.remove("None")
        names.append("None")
    return " | ".join(names) or None


def factory_call(factory: Any) -> str:
    """A dataclass field's default factory as Python: ``name()``, a lambda's value where its
    repr is Python (``device(type='cpu')``), else ``...``."""
    name = getattr(factory, "__name__", "")
    if name.isidentifier():
        return f"{name}()"
    try:
        value = repr(factory())
        ast.parse(value, mode="eval")
    except Exception:  # any failure: no value to show
        return "..."
    return value


def annotate_parameters(cls: griffe.Class, runtime: type) -> None:
    """Give ``cls.__init__``'s unannotated parameters the types of their constraints, and a
    dataclass field's ``<factory>`` default (not Python: no formatter reads it) its factory
    call (``default_device()``)."""
    init = cls.members.get("__init__")
    if init is None or init.is_alias:
        return
    constraints = getattr(runtime, "_parameter_constraints", None) or {}
    factories = {
        field.name: field.default_factory
        for field in (dataclasses.fields(runtime) if dataclasses.is_dataclass(runtime) else ())
        if field.default_factory is not dataclasses.MISSING
    }
    for parameter in init.parameters:
        if parameter.annotation is None and parameter.name in constraints:
            parameter.annotation = constraints_type(constraints[parameter.name])
        if parameter.name in factories and str(parameter.default) == "<factory>":
            parameter.default = factory_call(factories[parameter.name])


# ------------------------------------------------------------------ public bases
def _is_public(runtime: type) -> bool:
    path = f"{runtime.__module__}.{runtime.__qualname__}"
    return not any(part.startswith("_") for part in path.split("."))


def public_bases(runtime: type) -> list[str]:
    """The nearest public ancestors of ``runtime``: each private base replaced by its own
    bases, in order (``object`` and ``typing.Generic`` left out)."""
    found: list[str] = []
    for base in runtime.__bases__:
        if base is object or base.__module__ == "typing":
            continue
        paths = (
            [f"{base.__module__}.{base.__qualname__}"] if _is_public(base) else public_bases(base)
        )
        found += [path for path in paths if path not in found]
    return found


class FednoveltyReference(griffe.Extension):
    """Sphinx roles to cross-references, parameter types, public bases (see the module)."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = convert_roles(obj.docstring.value, obj.path)
        if obj.is_class:
            runtime = _import(obj.path)
            if inspect.isclass(runtime):
                annotate_parameters(obj, runtime)
                obj.extra["fednovelty"]["public_bases"] = public_bases(runtime)
