"""Rewrite a saved detector file the way an older version (or a forger) would: its JSON
document and tensors changed, the checksum recomputed so that only the content is judged."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from fednovelty.detectors.persistence import _CHECKSUM_KEY, _METADATA_KEY, checksum


def rewrite(path: Path, edit_text: Callable[[str], str] = lambda text: text, edit_tensors=None):
    """Rewrite ``path`` in place with ``edit_text`` applied to its JSON document and
    ``edit_tensors`` (dict -> dict) to its tensors, with a matching checksum."""
    with safe_open(str(path), framework="pt") as handle:
        text = handle.metadata()[_METADATA_KEY]
    tensors = load_file(str(path))
    text = edit_text(text)
    if edit_tensors is not None:
        tensors = edit_tensors(tensors)
    save_file(tensors, str(path), {_METADATA_KEY: text, _CHECKSUM_KEY: checksum(text, tensors)})


def with_keys_renamed(text: str, renamed: dict[str, str]) -> str:
    """JSON ``text`` with every key ``"old"`` of ``renamed`` written ``"new"``, all at once
    (``renamed`` may swap names)."""
    pattern = "|".join(re.escape(f'"{old}"') for old in renamed)
    return re.sub(pattern, lambda match: f'"{renamed[match.group(0)[1:-1]]}"', text)


def with_flat_options(text: str) -> str:
    """JSON ``text`` of a file saved today written as files were before the option objects
    (``fednovelty.detectors.options``): each field the class reads of an option it holds
    becomes a setting of its own under the name it had then (``privacy={"epsilon": 1.0}``
    -> ``dp_epsilon=1.0``; an option left at ``None`` is left out, as a setting a file of an
    older version lacks)."""
    from fednovelty.detectors.persistence import REGISTRY

    document = json.loads(text)
    params = document["params"]
    for option in REGISTRY[document["class"]]._params.options:
        value = params.pop(option.name, None)
        for field in option.fields:
            if value is not None and field.name in value:
                params[field.legacy or field.name] = value[field.name]
    return json.dumps(document)
