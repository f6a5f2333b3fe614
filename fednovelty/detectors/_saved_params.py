"""A saved detector's constructor arguments: written as JSON, read back under today's names.

``save`` writes ``get_params(deep=False)`` as JSON (:func:`jsonable`): an array becomes a
tensor of the file (``param.<name>``) referred to by ``{"__tensor__": key}``, an option
object (:mod:`fednovelty.detectors.options`) the object of its fields. ``load`` reads them
back (:func:`constructor_params`), after :func:`current_params` has put a file of an older
layout under today's names: a renamed setting (the class's ``_renamed_params``) and a
setting that has since joined an option object (e.g. ``dp_epsilon`` -> ``privacy`` with
``epsilon``, ``standardize`` -> ``prior``; each field's ``legacy`` name in the table),
whose tensors are re-keyed as a file saved today names them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from fednovelty.detectors.options import _Options
from fednovelty.exceptions import ModelFormatError


def jsonable(value: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``value`` (a setting named ``name``) as JSON; arrays are added to ``tensors``."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, _Options):
        value = value.get_params(deep=False)
    if isinstance(value, tuple | list):
        return [jsonable(v, f"{name}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): jsonable(v, f"{name}.{k}", tensors) for k, v in value.items()}
    if isinstance(value, np.ndarray | torch.Tensor):
        key = f"param.{name}"
        tensors[key] = torch.as_tensor(np.asarray(value)).contiguous()
        return {"__tensor__": key}
    if isinstance(value, torch.device | torch.dtype):
        return str(value).replace("torch.", "")
    # e.g. a numpy RandomState: not representable; the fitted model does not need it.
    return None


def restore(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """A JSON value with ``{"__tensor__": key}`` replaced by that tensor as a numpy array."""
    if isinstance(value, dict) and set(value) == {"__tensor__"}:
        key = value["__tensor__"]
        if not isinstance(key, str) or key not in tensors:
            raise ModelFormatError(f"{where} refers to a tensor {key!r} that the file lacks.")
        return tensors[key].numpy()
    if isinstance(value, list):  # e.g. bounds: (low, high) arrays
        return [restore(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def current_names(params: dict, renamed: dict[str, str]) -> dict:
    """Saved settings ``params`` under their current names: ``renamed`` maps a setting's
    older name to its new one (it may swap names, ``{"a": "b", "c": "a"}``). A file that
    holds a new name no older name uses was written with the current names and is read as
    it is."""
    fresh = set(renamed.values()) - set(renamed)
    if fresh & set(params):
        return dict(params)
    return {renamed.get(k, k): v for k, v in params.items()}


def _rekeyed(value: Any, old: str, new: str, moves: dict[str, str]) -> Any:
    """``value`` with every tensor reference ``param.<old>...`` renamed ``param.<new>...``
    (the renames recorded in ``moves``)."""
    if isinstance(value, dict) and set(value) == {"__tensor__"}:
        key = value["__tensor__"]
        prefix = f"param.{old}"
        if isinstance(key, str) and (key == prefix or key.startswith(prefix + ".")):
            moves[key] = f"param.{new}{key[len(prefix) :]}"
            return {"__tensor__": moves[key]}
        return value
    if isinstance(value, list):
        return [_rekeyed(v, old, new, moves) for v in value]
    return value


def current_params(
    cls: type, params: dict, tensors: dict[str, torch.Tensor]
) -> tuple[dict, dict[str, torch.Tensor]]:
    """A file's settings ``params`` (JSON) and ``tensors`` as a file of ``cls`` saved today
    holds them: renamed settings under their new names, and the settings that have since
    joined an option object gathered into it (the object of its fields); tensors of those
    settings re-keyed to match. A file saved today is returned as it is."""
    params = current_names(params, getattr(cls, "_renamed_params", {}))
    spec = cls._params
    moves: dict[str, str] = {}
    for p in spec.options:
        if p.name in params:  # the file holds the option: today's layout
            continue
        found = {}
        for field in p.fields:
            old = field.legacy or field.name
            if old in params and old not in spec.names:
                value = params.pop(old)
                found[field.name] = _rekeyed(value, old, f"{p.name}.{field.name}", moves)
        if found:
            params[p.name] = found
    if moves:
        tensors = {moves.get(key, key): tensor for key, tensor in tensors.items()}
    return params, tensors


def constructor_params(cls: type, params: dict, tensors: dict[str, torch.Tensor]) -> dict:
    """The constructor arguments of ``cls`` a checked file's ``params`` hold: tensors
    restored as arrays, an option's object of fields as the option object.

    Raises:
        ModelFormatError: a reference to a missing tensor; an option that is not an object
            of its class's fields.
    """
    out = {k: restore(v, tensors, f"params[{k!r}]") for k, v in params.items()}
    for p in cls._params.options:
        value = out.get(p.name)
        if value is None:
            continue
        fields = set(p.option._params.names)
        if not isinstance(value, dict) or not set(value) <= fields:
            unknown = sorted(set(value) - fields) if isinstance(value, dict) else value
            raise ModelFormatError(
                f"the setting {p.name!r} must be an object of {p.option.__name__}'s fields "
                f"{sorted(fields)}; got {unknown!r}."
            )
        where = f"params[{p.name!r}]"
        fields = {k: restore(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        out[p.name] = p.option(**fields)
    return out
