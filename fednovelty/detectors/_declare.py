"""How an estimator's constructor parameters are declared, checked and routed.

A :class:`Param` is one constructor argument: its name, default, scikit-learn constraints,
one line of documentation and where its value goes (:attr:`Param.role`); the shared ones
are defined once in :mod:`fednovelty.detectors._params` (the table, :data:`~fednovelty.
detectors._params.SHARED` by name). An estimator writes its ``__init__`` out in its own file,
storing each argument, unchanged, under its own name (scikit-learn's rule; :func:`store`),
and declares with :func:`declare` only what the table does not have: its own parameters and
the option objects it reads with their fields::

    class MyDetector(MixtureDetector):
        _params = declare(Param("alpha", 1.0, ..., "..."), option(Privacy, fields=FLOOR))

        def __init__(self, n_components=1, *, alpha=1.0, covariance_type="full", ...,
                     privacy=None, contamination=0.1, random_state=None, ...):
            store(self, locals())

The signature is the one place of the names, their order and defaults; the table the one
place of their documentation and constraints. :func:`compose` (run by ``__init_subclass__``
of the estimator bases and of the option classes) completes the declaration from the
signature (:func:`complete`: a written name neither declared nor shared, or a default
outside its constraints, is refused when the class is defined) and writes
``_parameter_constraints`` and the ``Args:`` section of the class docstring.

A parameter made by :func:`option` holds an option object (``Privacy``, ``Robustness``, ...
of :mod:`fednovelty.detectors.options`: rarely set settings grouped under one name);
``None`` means the option's defaults. The estimator reads the fields it declares (an option
written but not declared is read whole; the fields not read must keep their defaults:
:meth:`ParamSet.check_options`); :meth:`ParamSet.settings` routes each field as a parameter
of its own, and :meth:`ParamSet.option_values` gives the values with a field's ``"auto"``
resolved for the estimator.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
from sklearn.utils._param_validation import InvalidParameterError, validate_parameter_constraints

#: where a parameter's value goes: the algorithm's settings, the engine (client sampling,
#: dropout), the estimator itself (scores, torch placement, progress, seeds), or fields of
#: an option object, each routed by its own role.
ROLES = ("algorithm", "engine", "estimator", "options")

#: option classes by the estimator parameter that holds them (``"privacy"`` -> ``Privacy``),
#: filled as each class is defined.
OPTION_CLASSES: dict[str, type] = {}


@dataclass(frozen=True)
class Param:
    """One constructor argument (or one field of an option object).

    Attributes:
        name: the argument's name (and the attribute ``__init__`` stores it under).
        default: its default value (immutable: a number, string, tuple or None).
        constraints: scikit-learn ``_parameter_constraints`` entries for it.
        doc: its documentation, one or a few sentences (the docstring's ``Args:`` entry).
        role: where the value goes (:data:`ROLES`).
        setting: the algorithm's name for it, where different (``role="algorithm"``).
        convert: ``convert(value, n_features)`` -> the algorithm's value (e.g. ``"auto"``
            resolved once the width is known); ``None`` passes the value as is.
        legacy: an option field's name when it was an estimator parameter of its own (what
            files saved then hold), e.g. ``"dp_epsilon"`` for ``Privacy.epsilon``.
        option: the option class a parameter made by :func:`option` holds.
        fields: the option's fields the estimator reads (each routed by its own role).
        auto: ``(field, value)`` pairs: what a field's ``"auto"`` is for the estimator.
    """

    name: str
    default: Any
    constraints: list
    doc: str
    role: str = "algorithm"
    setting: str | None = None
    convert: Callable[[Any, int], Any] | None = None
    legacy: str | None = None
    option: type | None = None
    fields: tuple[Param, ...] = ()
    auto: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(
                f"Param {self.name!r}: role must be one of {ROLES}, got {self.role!r}."
            )


Group = tuple[Param, ...]


def option(
    cls: type,
    *,
    fields: Iterable[str] | None = None,
    auto: dict[str, Any] | None = None,
    docs: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
) -> Param:
    """The estimator parameter (``cls.param_name``, default ``None``) that holds a ``cls``
    option object, of which the estimator reads ``fields`` (default: all, in the class's
    order); ``auto`` says what a field's ``"auto"`` is here (on top of the class's
    ``auto_defaults``), ``docs`` adds what a field means for this estimator and ``settings``
    names a field as this estimator's algorithm spells it.

    Raises:
        TypeError: a name that is not a field of ``cls``.
    """
    spec: ParamSet = cls._params
    names = spec.names if fields is None else tuple(fields)
    auto = {**cls.auto_defaults, **(auto or {})}
    docs, settings = docs or {}, settings or {}
    for what, given in (("fields", names), ("auto", auto), ("docs", docs), ("settings", settings)):
        unknown = sorted(set(given) - set(spec.names))
        if unknown:
            raise TypeError(f"{what} names fields {cls.__name__} does not have: {unknown}.")
    read = tuple(
        replace(spec[name], setting=settings.get(name, spec[name].setting))
        for name in spec.names
        if name in names
    )
    auto = {name: value for name, value in auto.items() if name in names}
    listed = ", ".join(f"``{name}``" for name in spec.names if name in names)
    doc = f"{cls.summary} (:class:`~fednovelty.{cls.__name__}`; ``None``: its defaults)"
    if len(read) < len(spec.names):
        doc += f"; reads {listed} (the other fields keep their defaults)"
    doc += "."
    if auto:
        doc += " Here " + ", ".join(f'``{k}="auto"`` is ``{v!r}``' for k, v in auto.items()) + "."
    doc += "".join(f" ``{name}``: {text}" for name, text in docs.items())
    return Param(
        cls.param_name,
        None,
        [cls, None],
        doc,
        "options",
        option=cls,
        fields=read,
        auto=tuple(auto.items()),
    )


def _same(value: Any, default: Any) -> bool:
    """Whether an option field's ``value`` is its ``default`` (arrays never are)."""
    if value is default:
        return True
    if isinstance(value, np.ndarray | list | tuple) or hasattr(value, "__array__"):
        return False
    return type(value) is type(default) and value == default


@dataclass(frozen=True)
class ParamSet:
    """An estimator's parameters in signature order (:func:`declare`)."""

    params: tuple[Param, ...]
    positional: int = 0
    #: ``docs``/``settings`` given to :func:`declare` for parameters it does not list: they
    #: apply when :func:`compose` takes those from the shared table.
    pending: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise TypeError(f"parameters declared twice: {twice}; declare each name once.")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def options(self) -> tuple[Param, ...]:
        """The parameters that hold option objects."""
        return tuple(p for p in self.params if p.option is not None)

    def __getitem__(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def constraints(self) -> dict[str, list]:
        """``_parameter_constraints``: name -> constraints."""
        return {p.name: list(p.constraints) for p in self.params}

    def option_values(self, estimator: Any, name: str) -> SimpleNamespace:
        """Every field of the option ``name`` as ``estimator`` uses it: the object's value
        (its class's default where the estimator holds ``None``), a field the estimator
        reads with ``"auto"`` replaced by what it is here (:func:`option`'s ``auto``). An
        option the estimator does not declare gives the class's defaults."""
        declared = next((p for p in self.options if p.name == name), None)
        cls = OPTION_CLASSES[name] if declared is None else declared.option
        given = None if declared is None else getattr(estimator, name)
        values = (given or cls()).get_params(deep=False)
        if declared is not None:
            for field, value in declared.auto:
                if values[field] == "auto":
                    values[field] = value
        return SimpleNamespace(**values)

    def check_options(self, estimator: Any) -> None:
        """Validate every option object ``estimator`` holds (its constraints) and refuse a
        field the estimator does not read that is set away from its default.

        Raises:
            sklearn's InvalidParameterError: a field outside its constraints (the message
                starts with the estimator's parameter, e.g. ``"privacy: ..."``).
            ValueError: a field set that this estimator does not read, named.
        """
        for p in self.options:
            given = getattr(estimator, p.name)
            if given is None:
                continue
            try:
                given._validate_params()
            except InvalidParameterError as error:  # named by the estimator's parameter
                raise InvalidParameterError(f"{p.name}: {error}") from None
            read = {f.name for f in p.fields}
            for field in p.option._params.params:
                value = getattr(given, field.name)
                if field.name not in read and not _same(value, field.default):
                    raise ValueError(
                        f"{type(estimator).__name__} does not read {p.name}.{field.name} "
                        f"(got {value!r}): leave that field of {p.name} at its default "
                        f"{field.default!r}; it reads "
                        f"{', '.join(sorted(read)) or 'none of its fields'}."
                    )

    def settings(
        self,
        estimator: Any,
        n_features: int,
        role: str = "algorithm",
        config: type | None = None,
    ) -> dict:
        """The values of ``estimator``'s ``role`` parameters (an option's fields each by
        its own role) as the algorithm (or engine) takes them: renamed by
        :attr:`Param.setting`, converted by :attr:`Param.convert`; with ``config`` (a
        settings dataclass), only the settings it has (an estimator that runs two
        algorithms, e.g. a stream's first fit and its windows)."""
        accepted = None if config is None else {f.name for f in fields(config)}
        out = {}
        for p in self.params:
            if p.option is not None:
                values = vars(self.option_values(estimator, p.name))
                chosen = [(f, values[f.name]) for f in p.fields]
            else:
                chosen = [(p, getattr(estimator, p.name))]
            for param, value in chosen:
                key = param.setting or param.name
                if param.role != role or (accepted is not None and key not in accepted):
                    continue
                out[key] = value if param.convert is None else param.convert(value, n_features)
        return out

    def from_names(self, config: dict) -> dict:
        """Constructor arguments from an algorithm's ``config`` where the names agree: each
        parameter whose name ``config`` has, and each option field whose name before it
        joined its option (:attr:`Param.legacy`, else its own) ``config`` has, gathered
        into its option object."""
        out: dict[str, Any] = {}
        for p in self.params:
            if p.option is None:
                if p.name in config:
                    out[p.name] = config[p.name]
                continue
            found = {
                f.name: config[f.legacy or f.name]
                for f in p.fields
                if (f.legacy or f.name) in config
            }
            if found:
                out[p.name] = p.option(**found)
        return out

    def doc(self) -> str:
        """The ``Args:`` section (Google style), one entry per parameter."""
        lines = ["Args:"]
        for p in self.params:
            entry = f"{p.name}: {p.doc} Default ``{p.default!r}``."
            lines.append(textwrap.fill(entry, 92, initial_indent="    ", subsequent_indent=" " * 8))
        return "\n".join(lines)


def store(estimator: Any, arguments: dict[str, Any]) -> None:
    """Keep each constructor argument of ``estimator`` under its own name, unchanged:
    an ``__init__`` ends with ``store(self, locals())``, so that it only stores its
    arguments (scikit-learn's rule) and its signature stays the one place they are written.

    Raises:
        TypeError: a parameter of the signature missing from ``arguments``.
    """
    signature = inspect.signature(type(estimator).__init__)
    for name in list(signature.parameters)[1:]:
        if name not in arguments:
            raise TypeError(
                f"{type(estimator).__name__}.__init__ must pass locals() to store(); "
                f"{name!r} is missing."
            )
        setattr(estimator, name, arguments[name])


def declare(
    *items: Param | Iterable[Param],
    docs: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
) -> ParamSet:
    """What an estimator declares beside its written signature: ``items``, the parameters
    of its own and the option objects it reads with their fields (:func:`option`), or any
    shared parameter or group; ``docs`` extends a parameter's documentation with what it
    means for this estimator and ``settings`` names one as this estimator's algorithm spells
    it (:attr:`Param.setting`). :func:`compose` takes every other written parameter from the
    shared table, and every default from the signature.

    Raises:
        TypeError: a name declared twice.
    """
    params: list[Param] = []
    for item in items:
        params.extend([item] if isinstance(item, Param) else item)
    docs, settings = docs or {}, settings or {}
    listed = {p.name for p in params}
    params = [
        replace(
            p,
            doc=f"{p.doc} {docs[p.name]}" if p.name in docs else p.doc,
            setting=settings.get(p.name, p.setting),
        )
        for p in params
    ]
    pending = tuple(
        (kind, name, text)
        for kind, given in (("docs", docs), ("settings", settings))
        for name, text in given.items()
        if name not in listed
    )
    return ParamSet(tuple(params), pending=pending)


def complete(cls: type, declared: ParamSet, shared: Mapping[str, Param]) -> ParamSet:
    """The parameters of ``cls.__init__`` as written, in its order: each one ``declared``
    lists, else the ``shared`` table's of that name, else (an option object's parameter,
    ``privacy``, ...) its option class read whole; every default the signature's, checked
    against the parameter's constraints; the positional ones counted from the signature.

    Raises:
        TypeError: ``cls`` writes no ``__init__``; a written parameter that is neither
            declared nor shared; a declared one not written; ``docs``/``settings`` for a
            name not written; a default outside its constraints.
    """
    if "__init__" not in cls.__dict__:
        raise TypeError(f"{cls.__qualname__}.__init__ writes no __init__ of its own.")
    written = list(inspect.signature(cls.__dict__["__init__"]).parameters.values())[1:]
    names = [p.name for p in written]
    unwritten = sorted(set(declared.names) - set(names))
    if unwritten:
        raise TypeError(f"{cls.__qualname__}.__init__ does not write declared {unwritten}.")
    params = []
    for parameter in written:
        if parameter.name in declared.names:
            param = declared[parameter.name]
        elif parameter.name in shared:
            param = shared[parameter.name]
        elif parameter.name in OPTION_CLASSES:
            param = option(OPTION_CLASSES[parameter.name])
        else:
            raise TypeError(
                f"{cls.__qualname__}.__init__ writes {parameter.name!r}, which is neither "
                "declared in its _params nor a shared parameter of "
                "fednovelty.detectors._params: declare it (a Param of its own)."
            )
        params.append(replace(param, default=parameter.default))
    for kind, name, text in declared.pending:
        if name not in names:
            raise TypeError(f"{kind} of {cls.__qualname__} name {name!r}, not a parameter.")
        index = names.index(name)
        change = {"doc": f"{params[index].doc} {text}"} if kind == "docs" else {"setting": text}
        params[index] = replace(params[index], **change)
    for param in params:
        try:
            validate_parameter_constraints(
                {param.name: param.constraints}, {param.name: param.default}, cls.__qualname__
            )
        except InvalidParameterError as error:
            raise TypeError(f"{cls.__qualname__}.__init__'s default: {error}") from None
    positional = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in written)
    return ParamSet(tuple(params), positional)


def compose(cls: type) -> None:
    """Complete ``cls._params`` (declared on ``cls`` itself) from ``cls.__init__``'s written
    signature (:func:`complete`, with ``cls._shared_params``, the shared table, where the
    class has one), check the signature's kinds (the positional ones first, the rest after
    ``*``: :func:`signature_mismatch`) and write ``cls._parameter_constraints`` and the
    ``Args:`` section of ``cls.__doc__``.

    Raises:
        TypeError: see :func:`complete`; a keyword-only parameter before a positional one.
    """
    spec = complete(cls, cls.__dict__["_params"], getattr(cls, "_shared_params", {}))
    problem = signature_mismatch(cls, spec)
    if problem:
        raise TypeError(
            f"{cls.__qualname__}.__init__ does not match its declared _params: {problem}. "
            "Write the positional parameters first, the rest after '*'."
        )
    cls._params = spec
    cls._parameter_constraints = spec.constraints()
    cls.__doc__ = _with_args(cls.__doc__ or "", spec.doc())


def signature_mismatch(cls: type, spec: ParamSet) -> str:
    """What differs between ``cls.__init__``'s written signature and ``spec``: names, order,
    defaults (equal and of the same type) and kinds (the first ``spec.positional``
    positional-or-keyword, the rest keyword-only); ``""`` if nothing does."""
    if "__init__" not in cls.__dict__:
        return "the class writes no __init__ of its own"
    parameters = list(inspect.signature(cls.__dict__["__init__"]).parameters.values())[1:]
    written = [p.name for p in parameters]
    if written != list(spec.names):
        return f"parameters {written}, declared {list(spec.names)}"
    for index, (param, declared) in enumerate(zip(parameters, spec.params, strict=True)):
        kind = (
            inspect.Parameter.POSITIONAL_OR_KEYWORD
            if index < spec.positional
            else inspect.Parameter.KEYWORD_ONLY
        )
        if param.kind is not kind:
            return f"{param.name} is {param.kind.description}, declared {kind.description}"
        default = param.default
        if type(default) is not type(declared.default) or default != declared.default:
            return f"{param.name}={default!r}, declared {declared.default!r}"
    return ""


_SECTIONS = ("Attributes:", "Examples:", "Example:", "Notes:", "References:")


def _with_args(doc: str, args: str) -> str:
    """``doc`` (dedented) with ``args`` placed before its first ``Attributes:``/``Examples:``
    section, or at its end."""
    text = inspect.cleandoc(doc)
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if line.strip() in _SECTIONS and not line.startswith(" "):
            return "\n".join([*lines[:index], args, "", *lines[index:]])
    return f"{text}\n\n{args}" if text else args
