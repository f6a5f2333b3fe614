"""``fednovelty score`` streams its input: the table is read ``CHUNK_ROWS`` rows at a time and
each chunk's scores are appended to the output before the next is read, so the command's
memory is one chunk's whatever the file's size (``docs/scaling.md``).

Inputs: ``.csv``/``.txt`` (pandas' chunked reader), ``.parquet`` (pyarrow record batches:
hold large files in row groups of bounded size) and ``.npy`` (memory-mapped; its columns are
the model's ``feature_names_in_``, in order, or unnamed; a ``.npy`` has no client or id
column). The row numbers (the default id column) count over the whole file. Warnings about
the rows (clients scored with the global model) are gathered over the chunks and said once
at the end.

``--fdr`` (Benjamini-Hochberg over the file's conformal p-values) needs every p-value before
the first discovery is known: the command then makes two passes, the first keeping one
p-value a row (8 bytes), the second writing the table with the discoveries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fednovelty._cli.files import UsageError
from fednovelty._cli.tables import check_header, check_numeric, pop_column

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CHUNK_ROWS", "score_file", "table_chunks"]

#: rows of the input read, scored and written at a time.
CHUNK_ROWS = 65_536


def table_chunks(path: Path, chunk_rows: int, names: Any = None) -> Iterator[pd.DataFrame]:
    """The table in ``path`` (.csv, .txt, .parquet or .npy) as DataFrames of at most
    ``chunk_rows`` rows, indexed by their row numbers in the file; a ``.npy`` file's columns
    are ``names`` when it has as many (the model's feature names), else 0, 1, ...

    Raises:
        ValueError: the file cannot be parsed (naming it).
    """
    import pandas as pd

    suffix = path.suffix.lower()
    kind = {".parquet": "Parquet", ".npy": "NumPy .npy"}.get(suffix, "CSV")
    try:
        if suffix == ".npy":
            rows = np.load(path, mmap_mode="r")
            if rows.ndim != 2:
                raise ValueError(f"it holds an array of shape {rows.shape}, not rows (n, d)")
            columns = list(names) if names is not None and len(names) == rows.shape[1] else None
            for start in range(0, rows.shape[0], chunk_rows):
                part = np.array(rows[start : start + chunk_rows])
                index = pd.RangeIndex(start, start + len(part))
                yield pd.DataFrame(part, columns=columns, index=index)
        elif suffix == ".parquet":
            import pyarrow.parquet as pq

            start = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows):
                frame = batch.to_pandas()
                frame.index = pd.RangeIndex(start, start + len(frame))
                start += len(frame)
                yield frame
        else:
            yield from pd.read_csv(path, chunksize=chunk_rows)
    except (ValueError, ImportError, OSError) as error:
        raise ValueError(f"{path}: cannot read it as a {kind} table ({error}).") from None


class Notes:
    """What the chunks' scoring had to say, said once at the end: each message once, and
    the clients scored with the global model gathered over every chunk."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.unseen: list[str] = []

    def warn(self, message: str) -> None:
        if message not in self.messages:
            self.messages.append(message)

    def add_unseen(self, names: list[str]) -> None:
        self.unseen.extend(name for name in names if name not in self.unseen)

    def emit(self, warn: Callable[[str], None]) -> None:
        from fednovelty._cli.scoring import unseen_message

        for message in self.messages:
            warn(message)
        if self.unseen:
            warn(unseen_message(self.unseen))


def _split(frame: pd.DataFrame, args: Any, data: Path):
    """A chunk's feature columns, ``--client-column`` and ``--id-column`` (each or None)."""
    clients = ids = None
    if args.client_column:
        clients = pop_column(frame, args.client_column, "--client-column", args.data)
    if args.id_column:
        ids = pop_column(frame, args.id_column, "--id-column", args.data)
    check_numeric(frame, args.data, args.client_column)
    return frame, clients, ids


def _chunks(args: Any, data: Path, names: Any) -> Iterator[tuple]:
    """The file's chunks split into features, clients and ids, its header checked first."""
    for number, frame in enumerate(table_chunks(data, args.chunk_rows, names)):
        if number == 0 and data.suffix.lower() != ".npy":
            check_header(data, [str(name) for name in frame.columns])
        yield _split(frame, args, data)


def score_file(detector: Any, args: Any, data: Path, out_path: str, warn) -> tuple[int, int]:
    """Score the file ``data`` chunk by chunk into the CSV ``out_path`` (a new file): the
    columns of :func:`fednovelty._cli.scoring.score_table` (and the conformal ones), after
    the id (``--id-column`` or the row number) and client columns. Returns the rows written
    and how many are flagged.

    Raises:
        UsageError: ``--client-column``/``--id-column`` with a ``.npy`` file, ``--fdr`` on a
            model that is not conformal, a column written twice.
    """
    from fednovelty._cli.scoring import conformal_columns, is_conformal, score_table
    from fednovelty.federated.core.conformal import benjamini_hochberg

    conformal = is_conformal(detector)
    if args.fdr is not None and not conformal:
        raise UsageError(
            "--fdr needs conformal p-values: fit the model with --alpha (calibration="
            "'conformal'), or score without --fdr."
        )
    if data.suffix.lower() == ".npy" and (args.client_column or args.id_column):
        raise UsageError(
            "a .npy file has no named columns: score it without --client-column "
            "and --id-column (the rows are numbered)."
        )
    names = getattr(detector, "feature_names_in_", None)
    discoveries = None
    if args.fdr is not None:  # first pass: every row's p-value, for Benjamini-Hochberg
        p_values = [
            conformal_columns(detector, frame, clients, None)["p_value"]
            for frame, clients, _ in _chunks(args, data, names)
        ]
        discoveries = benjamini_hochberg(np.concatenate(p_values), args.fdr).astype(np.int64)
    notes, written, flagged = Notes(), 0, 0
    for frame, clients, ids in _chunks(args, data, names):
        scores = score_table(detector, frame, clients, notes.warn, notes.add_unseen)
        if conformal:
            for name, values in conformal_columns(detector, frame, clients, None).items():
                scores[name] = values
        if discoveries is not None:
            scores["discovery"] = discoveries[written : written + len(frame)]
        labels = {args.id_column or "row": frame.index if ids is None else ids}
        if clients is not None:
            labels[args.client_column] = clients
        for position, (name, values) in enumerate(labels.items()):
            if name in scores.columns:
                raise UsageError(f"column {name!r} would be written twice; rename it in the data.")
            scores.insert(position, name, list(values))
        scores.to_csv(out_path, mode="a" if written else "w", header=not written, index=False)
        written += len(scores)
        flagged += int(scores.is_anomaly.sum())
    if not written:
        raise ValueError(f"{data} has no rows to score.")
    notes.emit(warn)
    return written, flagged
