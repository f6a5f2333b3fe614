"""Paths, tables and numbers on the command line: what ``fit``, ``score`` and ``bench`` check
before they read or write anything, and how they write (a temporary file, then a rename).

Only a regular file is ever replaced, ``--overwrite`` or not: what sits at an output path is
read with ``os.lstat`` (a symbolic link is not followed), and a symbolic link (even to a regular
file), a FIFO, a device, a socket or a folder there is refused by name. The new content goes to a
temporary file in the same folder, renamed over the path with ``os.replace``, which replaces a
link itself and never writes through it.
"""

from __future__ import annotations

import argparse
import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported when a table is read
    import pandas as pd

TABLE_SUFFIXES = (".csv", ".txt", ".parquet")
#: what ``score`` reads (chunk by chunk): the tables and memory-mapped ``.npy`` rows.
SCORE_SUFFIXES = (*TABLE_SUFFIXES, ".npy")
#: What to do about an output path that cannot be replaced.
REMOVE_IT = "Remove it or choose another --out."


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


def check_table_path(path: str, suffixes: Sequence[str] = TABLE_SUFFIXES) -> Path:
    """``path`` as a ``Path`` if it names an existing file with one of ``suffixes`` (default
    .csv, .txt or .parquet)."""
    source = check_input(path, "data")
    if source.suffix.lower() not in suffixes:
        kinds = "a .csv, .parquet or .npy file" if ".npy" in suffixes else "a .csv or .parquet file"
        raise UsageError(f"data {path}: expected {kinds}.")
    return source


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (links and relative paths included)."""
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


#: What ``os.lstat`` may find at an output path besides a regular file, as error messages say it.
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(path: Path) -> str | None:
    """What is at ``path`` without following a link: None (nothing, not even a dangling link),
    ``"a regular file"``, or one of the kinds of ``_KINDS`` (``"something else"`` otherwise)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((kind for is_kind, kind in _KINDS if is_kind(mode)), "something else")


def check_replaceable(path: Path, name: str, remedy: str) -> bool:
    """Whether something is at ``path`` (``os.lstat``); a ``UsageError`` naming ``name`` and
    ``remedy`` if it is anything but a regular file, which nothing here ever replaces."""
    kind = file_kind(path)
    if kind not in (None, "a regular file"):
        raise UsageError(
            f"{name} is {kind}, not a regular file; fednovelty never replaces anything but "
            f"a regular file. {remedy}"
        )
    return kind is not None


def check_output(out: str, inputs: Sequence[Path], overwrite: bool) -> Path:
    """``--out`` as a ``Path`` once it is safe to write: not one of ``inputs``, not an existing
    file unless ``overwrite``, nothing but a regular file even then (no link, FIFO, device or
    folder), in a folder that exists. Else a ``UsageError``."""
    path = Path(out)
    for source in inputs:
        if _same_file(path, source):
            raise UsageError(
                f"--out {out} is the input file {source}; refusing to write over an input. "
                "Choose another --out."
            )
    if file_kind(path) == "a folder":
        raise UsageError(f"--out {out} is a folder; give a file name in it.")
    folder = path.absolute().parent
    if not folder.is_dir():
        raise UsageError(
            f"--out {out}: the folder {folder} does not exist; create it first "
            f"(mkdir -p {folder}) or choose another --out."
        )
    if check_replaceable(path, f"--out {out}", REMOVE_IT) and not overwrite:
        raise UsageError(
            f"--out {out} exists; pass --overwrite to replace it, or choose another --out."
        )
    return path


def write_atomically(
    path: Path,
    write: Callable[[str], None],
    overwrite: bool,
    *,
    name: str | None = None,
    remedy: str = "pass --overwrite to replace it, or choose another --out",
) -> None:
    """Call ``write(temporary_path)`` for a file beside ``path``, then rename it to ``path``
    (atomic on one file system): readers see the old file or the new one, never a part.

    Just before the rename, ``path`` is checked again (it may have changed while the command
    ran): a regular file there is replaced only if ``overwrite``, anything else never. The
    ``UsageError`` names ``name`` (default ``--out PATH``) and says ``remedy``.
    """
    name = f"--out {path}" if name is None else name
    temporary = str(path.absolute().with_name(f".{path.name}.{os.getpid()}.tmp"))
    try:
        write(temporary)
        exists = check_replaceable(path, name, REMOVE_IT)
        if exists and not overwrite:  # appeared while this command ran
            raise UsageError(f"{name} was created while this command ran; {remedy}.")
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def read_table(path: Path) -> pd.DataFrame:
    """The table in ``path`` (.csv, .txt or .parquet); a ``ValueError`` naming the file if it
    cannot be parsed."""
    import pandas as pd

    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path)
    except (ValueError, ImportError) as error:
        kind = "Parquet" if suffix == ".parquet" else "CSV"
        raise ValueError(f"{path}: cannot read it as a {kind} table ({error}).") from None
