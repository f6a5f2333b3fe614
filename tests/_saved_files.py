"""Rewrite a saved detector file the way an older version (or a forger) would: its JSON
document and tensors changed, the checksum recomputed so that only the content is judged."""

from __future__ import annotations

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
