"""Saving and loading detectors without pickle.

A saved detector is one ``.safetensors`` file: its tensors (parameters, decision scores,
client weights) in safetensors, and a JSON document in the file's metadata with the
format tag, the detector class, its constructor arguments and its scalar fitted
attributes. Loading parses JSON and reads raw tensors: it never runs code from the file,
and it rejects files without the fednovelty tag or naming an unknown class.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from fednovelty.exceptions import ModelFormatError

FORMAT_TAG = "fednovelty-detector"
FORMAT_VERSION = 1
_METADATA_KEY = "fednovelty"
REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: make a detector class loadable by name."""
    REGISTRY[cls.__name__] = cls
    return cls


def _jsonable(value: Any, name: str, tensors: dict[str, torch.Tensor]) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple | list):
        return [_jsonable(v, f"{name}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{name}.{k}", tensors) for k, v in value.items()}
    if isinstance(value, np.ndarray | torch.Tensor):
        key = f"param.{name}"
        tensors[key] = torch.as_tensor(np.asarray(value)).contiguous()
        return {"__tensor__": key}
    if isinstance(value, torch.device | torch.dtype):
        return str(value).replace("torch.", "")
    # e.g. a numpy RandomState: not representable; the fitted model does not need it.
    return None


def _restore(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, dict) and set(value) == {"__tensor__"}:
        return tensors[value["__tensor__"]].numpy()
    return value


def save_detector(
    detector, path: str | os.PathLike, tensors: dict[str, torch.Tensor], attrs: dict
) -> None:
    """Write ``tensors`` and JSON metadata for ``detector`` to ``path``."""
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    params = {
        name: _jsonable(value, name, tensors)
        for name, value in detector.get_params(deep=False).items()
    }
    document = {
        "format": FORMAT_TAG,
        "format_version": FORMAT_VERSION,
        "class": type(detector).__name__,
        "params": params,
        "attrs": _jsonable(attrs, "attrs", tensors),
    }
    save_file(tensors, os.fspath(path), metadata={_METADATA_KEY: json.dumps(document)})


def read_detector_file(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """Read and check a saved detector: ``(document, tensors)``.

    Raises:
        ModelFormatError: the file is missing the fednovelty tag, is not safetensors, or
            was written by a newer format version.
        FileNotFoundError: no such file.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No saved model at {path!r}.")
    try:
        with safe_open(path, framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFormatError(
            f"{path!r} is not a fednovelty model file (not a safetensors file: {error})."
        ) from None
    try:
        document = json.loads(metadata.get(_METADATA_KEY, "null"))
    except json.JSONDecodeError:
        document = None
    if not isinstance(document, dict) or document.get("format") != FORMAT_TAG:
        raise ModelFormatError(
            f"{path!r} is not a fednovelty model file (no '{FORMAT_TAG}' tag); save models "
            "with detector.save(path)."
        )
    if int(document.get("format_version", 0)) > FORMAT_VERSION:
        raise ModelFormatError(
            f"{path!r} was written by a newer fednovelty (format {document['format_version']}); "
            "upgrade fednovelty to load it."
        )
    return document, tensors


def load(path: str | os.PathLike, expected: type | None = None):
    """Load any fednovelty detector saved with ``save`` (no code runs from the file).

    Args:
        path: file written by ``detector.save``.
        expected: if given, the file must hold this class (or a subclass).
    """
    document, tensors = read_detector_file(path)
    name = document.get("class")
    cls = REGISTRY.get(name)
    if cls is None:
        raise ModelFormatError(f"{os.fspath(path)!r} holds an unknown detector class {name!r}.")
    if expected is not None and not issubclass(cls, expected):
        raise ModelFormatError(
            f"{os.fspath(path)!r} holds a {name}, not a {expected.__name__}; use "
            "fednovelty.load(path) to load any detector."
        )
    params = {k: _restore(v, tensors) for k, v in document["params"].items()}
    detector = cls(**params)
    attrs = {k: _restore(v, tensors) for k, v in document["attrs"].items()}
    detector._set_state(tensors, attrs)
    return detector
