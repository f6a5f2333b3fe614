"""Paths, tables and numbers on the command line: what ``fit``, ``score`` and ``bench`` check
before they read or write anything, and how they write (a temporary file, then a rename)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

TABLE_SUFFIXES = (".csv", ".txt", ".parquet")


class UsageError(Exception):
    """A mistake in the command line (exit status 2): a bad option value, a missing input file,
    an output that would overwrite a file or whose folder does not exist."""


def number_type(convert: type, low: float, strict: bool, expected: str):
    """An argparse type: ``convert(text)``, finite, ``> low`` (``strict``) or ``>= low``."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not (value > low if strict else value >= low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
        return value

    return parse


positive_int = number_type(int, 1, False, "an integer >= 1")
non_negative_int = number_type(int, 0, False, "an integer >= 0")
positive_float = number_type(float, 0.0, True, "a finite number > 0")


def check_input(path: str, option: str) -> Path:
    """``path`` as a ``Path`` if it names an existing file, else a ``UsageError``."""
    source = Path(path)
    if not source.exists():
        raise UsageError(f"{option} {path}: no such file.")
    if not source.is_file():
        raise UsageError(f"{option} {path}: not a file (a folder?); name a file.")
    return source


def check_table_path(path: str) -> Path:
    """``path`` as a ``Path`` if it names an existing .csv, .txt or .parquet file."""
    source = check_input(path, "data")
    if source.suffix.lower() not in TABLE_SUFFIXES:
        raise UsageError(f"data {path}: expected a .csv or .parquet file.")
    return source


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (links and relative paths included)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_output(out: str, inputs: Sequence[Path], overwrite: bool) -> Path:
    """``--out`` as a ``Path`` once it is safe to write: not one of ``inputs``, not an existing
    file unless ``overwrite``, not a folder, in a folder that exists. Else a ``UsageError``."""
    path = Path(out)
    for source in inputs:
        if _same_file(path, source):
            raise UsageError(
                f"--out {out} is the input file {source}; refusing to write over an input. "
                "Choose another --out."
            )
    if path.is_dir():
        raise UsageError(f"--out {out} is a folder; give a file name in it.")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise UsageError(
            f"--out {out}: the folder {folder} does not exist; create it first "
            f"(mkdir -p {folder}) or choose another --out."
        )
    if path.exists() and not overwrite:
        raise UsageError(
            f"--out {out} exists; pass --overwrite to replace it, or choose another --out."
        )
    return path


def write_atomically(path: Path, write: Callable[[str], None], overwrite: bool) -> None:
    """Call ``write(temporary_path)`` for a file beside ``path``, then rename it to ``path``
    (atomic on one file system): readers see the old file or the new one, never a part."""
    temporary = str(path.absolute().with_name(f".{path.name}.{os.getpid()}.tmp"))
    try:
        write(temporary)
        if path.exists() and not overwrite:  # appeared while this command ran
            raise UsageError(
                f"--out {path} was created while this command ran; pass --overwrite to "
                "replace it, or choose another --out."
            )
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def read_table(path: Path) -> pd.DataFrame:
    """The table in ``path`` (.csv, .txt or .parquet); a ``ValueError`` naming the file if it
    cannot be parsed."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except (ValueError, ImportError) as error:
        kind = "Parquet" if suffix == ".parquet" else "CSV"
        raise ValueError(f"{path}: cannot read it as a {kind} table ({error}).") from None
