"""Rows that are not one tensor: a source read chunk by chunk.

A client whose rows do not fit in memory (a memory-mapped ``.npy`` file, a Parquet file,
chunks a function produces) holds a :class:`RowSource` instead of a tensor. A source knows
its shape ``(n_rows, n_features)`` and the dtype and device of its chunks, and yields them as
float tensors of at most ``size`` rows, converted one chunk at a time: a pass over the rows
needs one chunk's memory whatever the row count. Every pass reads the rows again.

The math this package runs on a client's rows is, almost all of it, a sum over rows
(sufficient statistics, feature moments, k-means assignments and centre sums), so the same
code takes a tensor or a source: it loops over :func:`chunks`, which yields a tensor itself
(one chunk, so the tensor path computes what it always did) or the source's chunks. What
needs a value per row across the pass (each row's log-likelihood for a client's
winsorised release, k-means++'s distance of each row to its nearest centre) keeps one number
a row (8 bytes in float64), never a copy of the rows.

The row-wise views a federated algorithm applies to a client's rows before a round
(standardisation, a projection, clipping) apply to a source lazily: :meth:`RowSource.map`.

The concrete sources (arrays and memory maps, Parquet files, iterables of chunks) are in
:mod:`fednovelty.runtime.rows`; this module is the protocol the math reads (torch only).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

__all__ = ["MappedRows", "RowSource", "chunks", "is_row_source", "numbered_chunks"]


class RowSource(ABC):
    """Rows (n_rows, n_features) read in chunks (module docstring).

    Tensor-like where the library's steps read a client's rows without computing on them:
    ``shape``, ``ndim``, ``len``, ``dtype``, ``device``, ``is_floating_point()``,
    ``new_zeros`` and ``new_empty``. Computing on the rows goes through :meth:`chunks`.

    Attributes:
        n_rows, n_features: the shape of the rows.
        dtype, device: of the chunks' tensors (``astype`` gives another source with others).
        chunk_rows: rows per chunk when :meth:`chunks` is given no size.
        checked: every value was found finite by a pass over the rows (the detectors'
            validation sets it; the engines' check of client data then skips its own pass).
    """

    ndim = 2

    def __init__(
        self,
        n_rows: int,
        n_features: int,
        *,
        chunk_rows: int,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str = "cpu",
    ) -> None:
        self.n_rows = int(n_rows)
        self.n_features = int(n_features)
        self.chunk_rows = int(chunk_rows)
        self.dtype = dtype
        self.device = torch.device(device)
        self.checked = False
        if self.chunk_rows < 1:
            raise ValueError(f"chunk_rows must be an integer >= 1, got {chunk_rows!r}.")
        if not dtype.is_floating_point:
            raise ValueError(f"a row source yields float tensors; got dtype={dtype}.")

    # ------------------------------------------------------------------ tensor-like
    @property
    def shape(self) -> tuple[int, int]:
        return (self.n_rows, self.n_features)

    def __len__(self) -> int:
        return self.n_rows

    def is_floating_point(self) -> bool:
        return True

    def new_zeros(self, *size: Any) -> Tensor:
        """Zeros of ``size`` in the chunks' dtype and device (as ``Tensor.new_zeros``)."""
        return torch.zeros(*size, dtype=self.dtype, device=self.device)

    def new_empty(self, *size: Any) -> Tensor:
        """An uninitialised tensor of ``size`` in the chunks' dtype and device."""
        return torch.empty(*size, dtype=self.dtype, device=self.device)

    def like(self) -> Tensor:
        """An empty chunk (0, n_features): what a function of the chunks makes of none."""
        return self.new_empty(0, self.n_features)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(shape={self.shape}, dtype={self.dtype}, "
            f"chunk_rows={self.chunk_rows})"
        )

    # ------------------------------------------------------------------ chunks
    def chunks(self, size: int | None = None) -> Iterator[Tensor]:
        """The rows in order as tensors of at least 1 and at most ``size`` rows (default,
        and never more than, ``chunk_rows``), in ``dtype`` on ``device``; each made when it
        is asked for."""
        size = self.chunk_rows if size is None else min(int(size), self.chunk_rows)
        if size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}.")
        for chunk in self._chunks(size):
            for start in range(0, chunk.shape[0], size):  # a source's chunk may be longer
                yield chunk[start : start + size]

    @abstractmethod
    def _chunks(self, size: int) -> Iterator[Tensor]:
        """The rows in order as non-empty tensors (``dtype``, ``device``), preferably of
        ``size`` rows."""

    def rows_at(self, index: Tensor) -> Tensor:
        """The rows at positions ``index`` (m,), in that order, as a tensor (m, n_features):
        one pass over the chunks (a source with random access reads them directly)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        out = self.new_empty(index.shape[0], self.n_features)
        found = torch.zeros(index.shape[0], dtype=torch.bool)
        start = 0
        for chunk in self.chunks():
            stop = start + chunk.shape[0]
            inside = (index >= start) & (index < stop)
            if bool(inside.any()):
                out[inside.to(out.device)] = chunk[(index[inside] - start).to(chunk.device)]
                found |= inside
            start = stop
            if bool(found.all()):
                break
        if not bool(found.all()):
            raise IndexError(f"row positions {index[~found][:5].tolist()} are beyond {start} rows.")
        return out

    def astype(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> RowSource:
        """The same rows yielded in ``dtype`` on ``device`` (a shallow copy; the rows are
        not read)."""
        other = copy.copy(self)
        other.dtype = self.dtype if dtype is None else dtype
        other.device = self.device if device is None else torch.device(device)
        return other

    def map(self, fn: Callable[[Tensor], Tensor]) -> MappedRows:
        """The source whose chunks are ``fn`` of this one's: ``fn`` maps rows (n, d) to rows
        (n, d') one by one (a standardisation, a projection), so it commutes with
        chunking."""
        return MappedRows(self, fn)


class MappedRows(RowSource):
    """A source's rows through a row-wise function (:meth:`RowSource.map`), applied to each
    chunk as it is read. ``fn`` runs once at once on an empty chunk, which sets the width
    (and raises what ``fn`` raises for every chunk, e.g. a client that cannot apply it)."""

    def __init__(self, source: RowSource, fn: Callable[[Tensor], Tensor]) -> None:
        like = fn(source.like())
        super().__init__(
            source.n_rows,
            like.shape[1],
            chunk_rows=source.chunk_rows,
            dtype=like.dtype,
            device=like.device,
        )
        self.source, self.fn = source, fn
        self.checked = source.checked

    def _chunks(self, size: int) -> Iterator[Tensor]:
        for chunk in self.source.chunks(size):
            yield self.fn(chunk)

    def rows_at(self, index: Tensor) -> Tensor:
        return self.fn(self.source.rows_at(index))

    def astype(self, dtype=None, device=None) -> MappedRows:
        return MappedRows(self.source.astype(dtype, device), self.fn)


def is_row_source(X: Any) -> bool:
    """Whether ``X`` is a :class:`RowSource` (rows read in chunks) rather than a tensor."""
    return isinstance(X, RowSource)


def chunks(X: Tensor | RowSource, size: int | None = None) -> Iterator[Tensor]:
    """Row chunks of ``X`` (n, d): a tensor's slices of at most ``size`` rows (``None``: the
    tensor itself, one chunk), or a source's chunks of at most ``size`` and its
    ``chunk_rows`` rows. Rows or not, there is at least one chunk: ``X`` without rows is one
    chunk of 0 rows."""
    if isinstance(X, RowSource):
        if X.n_rows == 0:
            yield X.like()
        else:
            yield from X.chunks(size)
        return
    n = X.shape[0]
    if size is None or size >= n:
        yield X
        return
    for start in range(0, n, int(size)):
        yield X[start : start + size]


def numbered_chunks(X: Tensor | RowSource, size: int | None = None) -> Iterator[tuple[int, Tensor]]:
    """:func:`chunks` with each chunk's first row's position in ``X``."""
    start = 0
    for chunk in chunks(X, size):
        yield start, chunk
        start += chunk.shape[0]
