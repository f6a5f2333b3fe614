"""The benchmark's results table: its columns and its resumable CSV file.

A results file holds one row per finished cell, in the columns ``COLUMNS``; a cell is named by
its ``CONFIG_COLUMNS`` (:func:`cell_key`). Each row is appended as whole lines in one ``write``
and flushed to disk (:func:`append_row`); a row torn by a kill or a full disk (a last line
without its newline, too few fields) does not count as finished: :func:`read_finished` drops it
with a warning and rewrites the file atomically without it, so its cell runs again.

:func:`warnings_text` and :func:`error_text` write a cell's warnings and error as the one-line
text of its ``warning`` and ``error`` columns.
"""

from __future__ import annotations

import csv
import io
import math
import os
import stat
import traceback
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "COLUMNS",
    "CONFIG_COLUMNS",
    "METRICS",
    "append_row",
    "cell_key",
    "check_results_file",
    "error_text",
    "key_part",
    "read_finished",
    "short_text",
    "warnings_text",
]

METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1")
#: Columns that identify a cell; a resumed run skips a cell whose values all match.
CONFIG_COLUMNS = (
    "dataset",
    "protocol",
    "partition",
    "alpha",
    "n_clients",
    "seed",
    "n_components",
    "client_components",
    "covariance_type",
    "max_train",
    "max_test",
    "min_size",
    "method",
)
COLUMNS = (
    *CONFIG_COLUMNS,
    *METRICS,
    "rounds",
    "bytes_up",
    "bytes_down",
    "fit_seconds",
    "score_seconds",
    "n_train",
    "n_test",
    "n_features",
    "novel_share",
    "warning",
    "error",
)


def key_part(value) -> str:
    """Canonical text of a configuration value, equal for ``4``, ``4.0``, ``"4"`` (CSV)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, str):
        try:
            return repr(float(value))
        except ValueError:
            return value
    if isinstance(value, int | float | np.integer | np.floating):
        return repr(float(value))
    return str(value)


def cell_key(row) -> tuple[str, ...]:
    """The cell a results row (a mapping with the ``CONFIG_COLUMNS``) belongs to."""
    return tuple(key_part(row[c]) for c in CONFIG_COLUMNS)


def check_results_file(out_csv: str | os.PathLike[str]) -> None:
    """Check that ``out_csv`` is absent, empty or a results file of
    :func:`~fednovelty.evaluation.benchmark.run_benchmark` (its header names ``dataset`` and
    ``method``), so that resuming into it never rewrites another file. It is looked at with
    ``os.lstat``: a symbolic link, a FIFO or a device there is refused, never written through.

    Raises:
        ValueError: ``out_csv`` is a folder, not a regular file, or a file with another header.
    """
    path = Path(out_csv)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; out_csv must name a .csv file.")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"{path} is not a regular file (a symbolic link, a FIFO, a device?); results are "
            "written only to a regular file. Remove it or choose another output."
        )
    with open(path, "rb") as handle:
        first = handle.readline()
    if not first.endswith(b"\n"):  # empty, or a header torn while it was written
        return
    columns = next(csv.reader([first.decode("utf-8", errors="replace")]), [])
    missing = [c for c in ("dataset", "method") if c not in columns]
    if missing:
        raise ValueError(
            f"{path} exists and is not a fednovelty bench results file (its header lacks "
            f"{', '.join(missing)}); resuming would rewrite it. Choose another output."
        )


def read_finished(out_csv: Path) -> pd.DataFrame:
    """The finished cells stored in ``out_csv`` (columns as its header).

    A row is finished only if it is whole: a last line without its newline (a run killed or
    a disk filled while it was written) or a row with another number of fields than the
    header is dropped with a ``RuntimeWarning``, its cell runs again, and the file is
    rewritten (atomically) without it so the next appended row starts on a line of its own.
    A file of an older version (missing columns) is rewritten with the current columns.
    """
    if not out_csv.is_file() or out_csv.stat().st_size == 0:
        return pd.DataFrame(columns=list(COLUMNS))
    text = out_csv.read_bytes().decode("utf-8", errors="replace")
    header, rows, dropped = _whole_rows(text)
    if header is None:  # not even a whole header line: nothing was finished
        _replace_text(out_csv, "")
        return pd.DataFrame(columns=list(COLUMNS))
    if dropped:
        warnings.warn(
            f"{out_csv}: dropped {len(dropped)} incomplete row(s) at line(s) {dropped} (a run "
            "stopped while writing them); their cells run again.",
            RuntimeWarning,
            stacklevel=3,
        )
    clean = _csv_text([header, *rows])
    done = pd.read_csv(io.StringIO(clean), dtype={"dataset": str, "method": str, "error": str})
    missing = [c for c in COLUMNS if c not in done.columns]
    if missing:  # a file from an older version: rewrite it with the current columns
        done = done.reindex(columns=[*COLUMNS, *[c for c in done.columns if c not in COLUMNS]])
        _replace_text(out_csv, done.to_csv(index=False, lineterminator="\n"))
    elif dropped:
        _replace_text(out_csv, clean)
    return done


def _whole_rows(text: str) -> tuple[list[str] | None, list[list[str]], list[int]]:
    """``(header, rows, dropped)`` of CSV ``text``: the rows with as many fields as the header
    and a dataset and a method, and the 1-based line numbers of the rows left out (a last line
    without its newline is always left out)."""
    complete = text.endswith("\n")
    records = list(csv.reader(io.StringIO(text)))
    lines = _record_lines(text)
    dropped = []
    if not complete and records:
        dropped.append(lines[-1])
        records, lines = records[:-1], lines[:-1]
    if not records:
        return None, [], dropped
    header, keep = records[0], []
    named = [header.index(c) for c in ("dataset", "method") if c in header]
    for record, line in zip(records[1:], lines[1:], strict=True):
        if len(record) == len(header) and all(record[i] for i in named):
            keep.append(record)
        elif record:  # an empty record is a blank line, not a torn row
            dropped.append(line)
    return header, keep, sorted(dropped)


def _record_lines(text: str) -> list[int]:
    """1-based line on which each CSV record of ``text`` starts (quoted newlines included)."""
    starts, reader = [], csv.reader(io.StringIO(text))
    line = 1
    for _ in reader:
        starts.append(line)
        line = reader.line_num + 1
    return starts


def _csv_text(records: list[list[str]]) -> str:
    """CSV text of ``records`` (quoted where needed, ``\\n`` line ends)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(records)
    return out.getvalue()


def _replace_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file in the same folder, flushed to
    disk, renamed over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def append_row(out_csv: Path, row: dict, header: list[str]) -> None:
    """Append ``row`` (and the header, to an empty file) as whole lines in one ``write``
    on a file opened for appending, then flush it to disk: a row is on disk whole or, if the
    process dies or the disk fills mid-write, torn at the end, which ``read_finished`` drops.
    A symbolic link at ``out_csv`` is not followed (``OSError``)."""
    new = not out_csv.is_file() or out_csv.stat().st_size == 0
    frame = pd.DataFrame([row]).reindex(columns=header)
    data = frame.to_csv(index=False, header=new, lineterminator="\n").encode("utf-8")
    descriptor = os.open(out_csv, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def short_text(message: str, limit: int = 300) -> str:
    """``message`` on one line, cut to ``limit`` characters with ``...``."""
    message = " ".join(str(message).split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


def warnings_text(caught) -> str | None:
    """The warnings ``caught`` (``warnings.catch_warnings(record=True)``'s list) as one
    :func:`short_text` line, ``"Category: message"`` once each joined by `` | ``; None
    when there were none."""
    messages = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught))
    return short_text(" | ".join(messages)) if messages else None


def error_text(error: Exception) -> str:
    """``error`` as one :func:`short_text` line: its type, message and the file and line it
    was raised at (``"ValueError: ... (em.py:42)"``)."""
    where = traceback.extract_tb(error.__traceback__)[-1]
    return short_text(
        f"{type(error).__name__}: {error} ({Path(where.filename).name}:{where.lineno})"
    )
