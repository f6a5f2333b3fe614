"""What ``fit`` and ``score`` check in a table before a detector sees it: a header that names
a column twice, a named column that is not there (with the closest names), and a column of
text among the features (named, with a bad value, and a hint when it looks like client ids).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING

from fednovelty._cli.choices import alternatives, closest
from fednovelty._cli.files import UsageError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["check_header", "check_numeric", "pop_column", "repeated_names"]

#: A text column with at most this many distinct values (and fewer than half the rows) looks
#: like client ids.
CLIENT_LIKE_VALUES = 50


def repeated_names(names: list[str]) -> dict[str, list[int]]:
    """Each name that occurs more than once in ``names``, with its positions (1-based)."""
    positions: dict[str, list[int]] = {}
    for position, name in enumerate(names, start=1):
        positions.setdefault(name, []).append(position)
    return {name: where for name, where in positions.items() if len(where) > 1}


def csv_header(path: Path) -> list[str]:
    """The names of the first line of the CSV file ``path`` as written (pandas renames a
    repeated name ``f0`` to ``f0.1``, so the header is read here); empty for an empty file."""
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as stream:
        return next(csv.reader(stream), [])


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


def check_header(path: Path, names: list[str]) -> None:
    """A ``ValueError`` naming the first repeated column of the table in ``path`` (its header
    as written for a CSV file, else ``names``), and what to do."""
    header = csv_header(path) if path.suffix.lower() != ".parquet" else [str(n) for n in names]
    repeated = repeated_names(header)
    if repeated:
        name, where = next(iter(repeated.items()))
        raise ValueError(
            f"{path}: the header names column {name!r} {_times(len(where))} (columns "
            f"{', '.join(map(str, where))}); give every column its own name."
        )


def pop_column(frame: pd.DataFrame, name: str, option: str, path: object) -> pd.Series:
    """Remove the column ``name`` from ``frame`` and return it; a ``UsageError`` naming
    ``option`` and the closest column names when there is no such column."""
    if name not in frame.columns:
        near = closest(name, list(frame.columns))
        hint = f"did you mean {alternatives(near)}? " if near else ""
        shown = ", ".join(map(str, frame.columns[:20]))
        more = ", ..." if len(frame.columns) > 20 else ""
        raise UsageError(
            f"{option} {name!r}: no such column in {path}; {hint}(columns: {shown}{more})."
        )
    return frame.pop(name)


def _first_text(column: pd.Series) -> tuple[int, object] | None:
    """The position and value of the first cell of ``column`` that is not a number (missing
    cells are numbers here: NaN); None if every cell is one."""
    import pandas as pd

    numbers = pd.to_numeric(column, errors="coerce")
    bad = numbers.isna().to_numpy() & column.notna().to_numpy()
    if not bad.any():
        return None
    position = int(bad.argmax())
    return position, column.iloc[position]


def looks_like_client_ids(column: pd.Series) -> bool:
    """Whether a text ``column`` looks like client ids: mostly text (not numbers with a
    stray word) and few distinct values (at most ``CLIENT_LIKE_VALUES`` and fewer than half
    the rows)."""
    import pandas as pd

    present = column.dropna()
    text = pd.to_numeric(present, errors="coerce").isna().sum()
    distinct = present.nunique()
    few = 1 <= distinct <= CLIENT_LIKE_VALUES and distinct < max(len(column), 2) / 2
    return few and text >= len(present) / 2


def check_numeric(frame: pd.DataFrame, path: object, client_column: str | None) -> None:
    """A ``ValueError`` naming the first feature column of ``frame`` that holds text, the row
    (0-based, as ``frame``'s position) and value of its first text cell, and, when the column
    looks like client ids and no ``--client-column`` was given, to pass it."""
    for name in frame.columns:
        column = frame[name]
        if column.dtype.kind in "biufc":  # numbers, booleans
            continue
        found = _first_text(column)
        if found is None:
            continue
        row, value = found
        text = (
            f"{path}: column {str(name)!r} holds text, not numbers (row {row}: {value!r}); "
            "the features must be numeric"
        )
        if client_column is None and looks_like_client_ids(column):
            n = column.nunique()
            text += f". It looks like client ids ({n} distinct values): pass --client-column {name}"
        else:
            text += "; convert or remove the column"
        raise ValueError(text + ".")
