"""Row sources of a client's rows that are not one in-memory tensor.

Each is a :class:`~fednovelty.mixture.rows.RowSource`: it knows its row count, width and
dtype, and yields float tensors of at most ``chunk_rows`` rows, each converted when it is
read, so a pass over the rows holds one chunk (the module docstring of
:mod:`fednovelty.mixture.rows` says which computations take a source).

- :class:`ArrayRows`: a 2-D array read by slices: ``np.memmap`` / ``np.load(path,
  mmap_mode="r")`` (a ``.npy`` path opens one), or any array-like that slices into numpy
  rows. The pages of a read-only (or shared) memory map are handed back to the system after
  each chunk is copied (``madvise(MADV_DONTNEED)``; they stay in the page cache), so the
  process's resident memory does not grow with the file (a copy-on-write map, ``mode="c"``,
  keeps them: dropping them would drop the caller's changes).
- :class:`ParquetRows`: a Parquet file read by record batches (pyarrow); its numeric columns,
  or those named. Peak memory is about one row group's columns: write large files in row
  groups of bounded size (``pyarrow.parquet.write_table(..., row_group_size=...)``).
- :class:`ChunkedRows`: chunks from a function that returns a new iterable of 2-D arrays or
  tensors each time it is called (a generator function), or from a list of them. Its first
  pass counts the rows; an empty chunk is skipped with an :class:`EmptyChunkWarning`.
- :class:`SelectedRows`: the rows of one client of a source whose rows belong to several,
  by a code per row (``fit(X, groups=...)`` on a source): every pass reads all the rows.

:func:`row_source` builds the source of a path, a memory map, a function or a list.
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fednovelty.mixture.rows import MappedRows, RowSource, chunks, is_row_source

__all__ = [
    "ArrayRows",
    "ChunkedRows",
    "EmptyChunkWarning",
    "MappedRows",
    "ParquetRows",
    "RowSource",
    "SelectedRows",
    "chunks",
    "default_chunk_rows",
    "is_row_source",
    "row_source",
]

#: bytes of float64 rows a chunk holds by default (16 MiB: 65,536 rows of 32 features).
CHUNK_BYTES = 1 << 24


class EmptyChunkWarning(UserWarning):
    """A chunk of a :class:`ChunkedRows` source had no rows; it is skipped."""


def default_chunk_rows(n_features: int) -> int:
    """Rows of ``n_features`` float64 values that fill :data:`CHUNK_BYTES` (at least 1)."""
    return max(1, CHUNK_BYTES // (8 * max(1, int(n_features))))


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty(0, dtype=dtype).numpy().dtype


def _to_tensor(part: Any, source: RowSource) -> Tensor:
    """A chunk (m, d) as a new tensor in the source's dtype and device (a copy: never the
    caller's memory)."""
    if isinstance(part, Tensor):
        return part.to(dtype=source.dtype, device=source.device, copy=True)
    array = np.array(part, dtype=_numpy_dtype(source.dtype), copy=True, order="C")
    return torch.from_numpy(array).to(source.device)


def _releasable(array: Any) -> mmap.mmap | None:
    """The memory map behind ``array`` whose pages may be handed back after a read: a
    C-contiguous ``np.memmap`` opened read-only or shared (never copy-on-write); else None."""
    if not isinstance(array, np.memmap) or not array.flags.c_contiguous:
        return None
    handle = getattr(array, "_mmap", None)
    if not isinstance(handle, mmap.mmap) or getattr(array, "mode", "c") not in ("r", "r+", "w+"):
        return None
    return handle


def _release(handle: mmap.mmap, part: np.ndarray) -> None:
    """Drop the pages of ``part`` (a slice of the map ``handle``) from this process's
    resident memory; the file's pages stay in the system's page cache."""
    base = np.frombuffer(handle, dtype=np.uint8).ctypes.data
    start = part.ctypes.data - base
    page = mmap.PAGESIZE
    low = start - start % page
    high = min(len(handle), -(-(start + part.nbytes) // page) * page)
    if high > low:
        handle.madvise(mmap.MADV_DONTNEED, low, high - low)


class ArrayRows(RowSource):
    """A 2-D array (n_rows, n_features) read by slices of ``chunk_rows`` rows (module
    docstring): a memory map's pages are handed back after each chunk.

    Args:
        array: ``np.memmap``, ``np.ndarray`` or an array-like with ``shape`` and ``dtype``
            whose row slices convert to numpy; never written to.
        chunk_rows: rows per chunk (default: 16 MiB of float64 rows).
        dtype, device: of the chunks' tensors.
    """

    def __init__(
        self,
        array: Any,
        *,
        chunk_rows: int | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = tuple(getattr(array, "shape", ()))
        if len(shape) != 2:
            raise ValueError(
                f"ArrayRows needs a 2-D array (n_rows, n_features); got shape {shape}."
            )
        kind = np.dtype(getattr(array, "dtype", np.float64)).kind
        if kind not in "biuf":
            raise ValueError(
                f"ArrayRows needs numeric rows; got an array of dtype {array.dtype}. Convert "
                "the file to numbers first."
            )
        rows = default_chunk_rows(shape[1]) if chunk_rows is None else chunk_rows
        super().__init__(shape[0], shape[1], chunk_rows=rows, dtype=dtype, device=device)
        self.array = array

    def rows_at(self, index: Tensor) -> Tensor:
        """The rows at positions ``index`` (m,), read directly (m, n_features)."""
        positions = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu().numpy()
        if positions.size and (positions.min() < 0 or positions.max() >= self.n_rows):
            raise IndexError(f"row positions beyond the {self.n_rows} rows: {positions[:5]}.")
        return _to_tensor(
            np.stack([np.asarray(self.array[i]) for i in positions])
            if positions.size
            else np.empty((0, self.n_features)),
            self,
        )

    def _chunks(self, size: int) -> Iterator[Tensor]:
        handle = _releasable(self.array)
        for start in range(0, self.n_rows, size):
            part = self.array[start : start + size]
            chunk = _to_tensor(part, self)
            if handle is not None:
                _release(handle, part)
            yield chunk


class ParquetRows(RowSource):
    """A Parquet file's rows read by record batches (module docstring).

    Args:
        path: the ``.parquet`` file.
        columns: the feature columns, in order (default: every column; each must be
            numeric).
        chunk_rows, dtype, device: as :class:`ArrayRows`.

    Attributes:
        columns: the feature columns' names (a detector fitted on the source keeps them as
            ``feature_names_in_``).

    Raises:
        ValueError: a column that is not numeric (named), or a column named that the file
            lacks.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        columns: Iterable[str] | None = None,
        chunk_rows: int | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = Path(path)
        meta = pq.ParquetFile(self.path)
        schema = meta.schema_arrow
        names = list(schema.names) if columns is None else [str(c) for c in columns]
        for name in names:
            if name not in schema.names:
                raise ValueError(
                    f"{self.path}: no column {name!r}; its columns are {schema.names[:20]}."
                )
            kind = schema.field(name).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise ValueError(
                    f"{self.path}: column {name!r} holds {kind}, not numbers; pass "
                    "columns=[...] naming the numeric feature columns."
                )
        self.columns = names
        rows = default_chunk_rows(len(names)) if chunk_rows is None else chunk_rows
        n_rows = meta.metadata.num_rows
        super().__init__(n_rows, len(names), chunk_rows=rows, dtype=dtype, device=device)

    def _chunks(self, size: int) -> Iterator[Tensor]:
        import pyarrow.parquet as pq

        reader = pq.ParquetFile(self.path)
        numpy_dtype = _numpy_dtype(self.dtype)
        for batch in reader.iter_batches(batch_size=size, columns=self.columns):
            if batch.num_rows == 0:
                continue
            out = np.empty((batch.num_rows, self.n_features), dtype=numpy_dtype)
            for j in range(self.n_features):  # missing values read as NaN
                out[:, j] = batch.column(j).to_numpy(zero_copy_only=False)
            yield torch.from_numpy(out).to(self.device)


class ChunkedRows(RowSource):
    """Rows given as chunks (module docstring).

    Args:
        chunks: a function returning a new iterable of 2-D chunks (numpy arrays, tensors or
            array-likes, each (m, n_features)) every time it is called, or a list or tuple
            of them. A generator object is refused: it can be read once, and every round
            reads the rows again.
        chunk_rows: most rows per chunk yielded (longer chunks are split; default: 16 MiB
            of float64 rows).
        dtype, device: of the chunks' tensors.

    Raises:
        TypeError: ``chunks`` is an iterator (read once) or neither callable nor a list.
        ValueError: a chunk that is not 2-D or has another width than the first (naming
            it), no chunk with rows, or a later pass that yields other rows than the first.
    """

    def __init__(
        self,
        chunks: Callable[[], Iterable[Any]] | list | tuple,
        *,
        chunk_rows: int | None = None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        if isinstance(chunks, Iterator):
            raise TypeError(
                "chunks is an iterator (a generator object), which can be read once; every "
                "round reads the rows again. Pass the function that makes it (e.g. "
                "ChunkedRows(make_chunks) rather than ChunkedRows(make_chunks()))."
            )
        if not callable(chunks) and not isinstance(chunks, list | tuple):
            raise TypeError(
                f"chunks must be a function returning an iterable of 2-D chunks, or a list of "
                f"chunks; got {type(chunks).__name__}."
            )
        self._make = chunks if callable(chunks) else (lambda: chunks)
        n_rows, n_features, empty = self._count()
        if n_features is None:
            raise ValueError("chunks yielded no chunk with rows; give at least one row.")
        if empty:
            warnings.warn(
                EmptyChunkWarning(
                    f"{len(empty)} chunk(s) of the source have no rows (chunk(s) "
                    f"{empty[:10]}, counted from 0); they are skipped."
                ),
                stacklevel=2,
            )
        rows = default_chunk_rows(n_features) if chunk_rows is None else chunk_rows
        super().__init__(n_rows, n_features, chunk_rows=rows, dtype=dtype, device=device)

    def _parts(self) -> Iterator[tuple[int, Any]]:
        """Each chunk the function gives with its position, its shape checked 2-D."""
        for index, part in enumerate(self._make()):
            shape = tuple(np.shape(part))
            if len(shape) != 2:
                raise ValueError(
                    f"chunk {index} has shape {shape}; every chunk must be 2-D (m, n_features)."
                )
            yield index, part

    def _count(self) -> tuple[int, int | None, list[int]]:
        """The first pass: rows, width (None without rows) and the empty chunks."""
        n_rows, n_features, empty = 0, None, []
        for index, part in self._parts():
            rows, width = (int(v) for v in np.shape(part))
            if rows == 0:
                empty.append(index)
                continue
            if n_features is not None and width != n_features:
                raise ValueError(
                    f"chunk {index} has {width} columns but the first has {n_features}; every "
                    "chunk needs the same columns."
                )
            n_rows, n_features = n_rows + rows, width
        return n_rows, n_features, empty

    def _chunks(self, size: int) -> Iterator[Tensor]:
        seen = 0
        for index, part in self._parts():
            rows, width = (int(v) for v in np.shape(part))
            if rows == 0:
                continue
            if width != self.n_features:
                raise ValueError(
                    f"chunk {index} has {width} columns but the source has {self.n_features}."
                )
            seen += rows
            if seen > self.n_rows:
                break
            yield _to_tensor(part, self)
        if seen != self.n_rows:
            raise ValueError(
                f"the chunks held {self.n_rows} rows on the first pass and {seen} on a later "
                "one; the function must give the same rows every time it is called."
            )


class SelectedRows(RowSource):
    """The rows of ``source`` whose ``codes`` entry is ``code``, in order.

    Args:
        source: the rows of every client (n_rows, n_features).
        codes: (n_rows,) integer code of each row's client.
        code: the client's code.
    """

    def __init__(self, source: RowSource, codes: np.ndarray, code: int) -> None:
        codes = np.asarray(codes)
        if codes.shape != (source.n_rows,):
            raise ValueError(
                f"codes has shape {codes.shape}; give one code per row of the source "
                f"({source.n_rows},)."
            )
        n_rows = int(np.count_nonzero(codes == code))
        super().__init__(
            n_rows,
            source.n_features,
            chunk_rows=source.chunk_rows,
            dtype=source.dtype,
            device=source.device,
        )
        self.source, self.codes, self.code = source, codes, code
        self.checked = source.checked

    def rows_at(self, index: Tensor) -> Tensor:
        positions = np.flatnonzero(self.codes == self.code)
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu().numpy()
        source = self.source.astype(self.dtype, self.device)
        return source.rows_at(torch.from_numpy(positions[index]))

    def _chunks(self, size: int) -> Iterator[Tensor]:
        start = 0
        for chunk in self.source.astype(self.dtype, self.device).chunks(size):
            stop = start + chunk.shape[0]
            keep = self.codes[start:stop] == self.code
            start = stop
            if keep.all():
                yield chunk
            elif keep.any():
                yield chunk[torch.from_numpy(keep).to(chunk.device)]


def row_source(
    X: Any,
    *,
    chunk_rows: int | None = None,
    columns: Iterable[str] | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
) -> RowSource:
    """The row source of ``X``:

    - a :class:`~fednovelty.mixture.rows.RowSource`: itself (in ``dtype`` on ``device``);
    - a path (str or ``os.PathLike``) to a ``.npy`` file (opened memory-mapped, read-only)
      or a ``.parquet`` file (:class:`ParquetRows`, ``columns``);
    - an ``np.memmap`` or other 2-D array: :class:`ArrayRows`;
    - a function returning an iterable of chunks, or a list or tuple of 2-D chunks:
      :class:`ChunkedRows`.

    Raises:
        ValueError: a path of another kind, or one that does not exist.
        TypeError: anything else.
    """
    options = {"dtype": dtype, "device": device}
    if isinstance(X, RowSource):
        return X.astype(**options)
    if isinstance(X, str | os.PathLike):
        path = Path(X)
        if not path.is_file():
            raise ValueError(f"{path}: no such file; give a .npy or .parquet file of rows.")
        suffix = path.suffix.lower()
        if suffix == ".npy":
            return ArrayRows(np.load(path, mmap_mode="r"), chunk_rows=chunk_rows, **options)
        if suffix == ".parquet":
            return ParquetRows(path, columns=columns, chunk_rows=chunk_rows, **options)
        raise ValueError(
            f"{path}: rows are read from .npy or .parquet files; got {suffix or 'no suffix'}."
        )
    if callable(X) or (isinstance(X, list | tuple) and X and np.ndim(X[0]) == 2):
        return ChunkedRows(X, chunk_rows=chunk_rows, **options)
    if len(getattr(X, "shape", ())) == 2:
        return ArrayRows(X, chunk_rows=chunk_rows, **options)
    raise TypeError(
        f"cannot read rows from {type(X).__name__}; give a RowSource, a .npy or .parquet "
        "path, a 2-D array or memory map, or a function returning chunks."
    )
