"""Client data as the engines take it: a row tensor, or a tuple whose first entry it is.

A client's data is its rows ``X`` (n_samples, n_features), a tensor or a
:class:`~fednovelty.mixture.rows.RowSource` (rows read in chunks: the steps that take one
sum their statistics chunk by chunk; :mod:`fednovelty.runtime.rows`), or, for an algorithm
whose ``labelled`` attribute is true, a tuple ``(X, y, ...)`` whose other entries have one entry
per row. Both engines check it here before any round: the simulation for every client at
once, a Flower node for its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from fednovelty.exceptions import ClientDataError
from fednovelty.mixture.rows import RowSource, is_row_source, numbered_chunks


def check_source_finite(cid: Any, X: RowSource) -> None:
    """A pass over a row source's chunks (unless its ``checked`` says one was made): a
    ``ClientDataError`` naming the client and the first row holding NaN or inf."""
    if X.checked:
        return
    for start, rows in numbered_chunks(X):
        bad = ~torch.isfinite(rows).all(1)
        if bool(bad.any()):
            row = start + int(bad.nonzero()[0, 0])
            raise ClientDataError(
                f"client {cid}: row {row} of its row source holds NaN or inf; clean the rows first."
            )


def client_rows(data: Any) -> Any:
    """The row tensor of client data: ``X``, or the first entry of ``(X, y, ...)``."""
    return data[0] if isinstance(data, tuple | list) else data


def check_clients(clients: Mapping[int, Any], *, labelled: bool = False) -> None:
    """Reject client data an algorithm cannot use, naming the client.

    Args:
        clients: client id -> rows (n_samples, n_features), or a tuple ``(X, y, ...)``.
        labelled: the algorithm needs labelled tuples (its ``labelled`` attribute).

    Raises:
        ClientDataError: a labelled algorithm got rows without labels; a client's rows (a
            tensor, or the first of a tuple whose other entries have one entry per row) are
            not a 2-D floating tensor, have a different number of columns than the others,
            or contain NaN/inf. Empty clients are fine (they contribute nothing).
    """
    widths = {}
    for cid, data in clients.items():
        X = client_rows(data)
        if labelled and not isinstance(data, tuple | list):
            raise ClientDataError(
                f"client {cid}: this algorithm needs labelled data, a tuple (X, y) with one "
                "label per row; got rows alone."
            )
        if isinstance(data, tuple | list) and any(len(part) != len(X) for part in data[1:]):
            raise ClientDataError(
                f"client {cid}: the tensors of its data tuple have different lengths "
                f"{[len(part) for part in data]}; give one entry per row."
            )
        if is_row_source(X):
            widths[cid] = X.shape[1]
            check_source_finite(cid, X)
            continue
        if not isinstance(X, Tensor) or X.ndim != 2 or not X.is_floating_point():
            raise ClientDataError(
                f"client {cid}: rows must be a 2-D floating torch tensor (n_samples, n_features)"
                f" or a row source, got {type(X).__name__} of shape "
                f"{tuple(getattr(X, 'shape', ()))}."
            )
        widths[cid] = X.shape[1]
        if X.shape[0] and not bool(torch.isfinite(X).all()):
            raise ClientDataError(f"client {cid}: rows contain NaN or inf; clean them first.")
    if len(set(widths.values())) > 1:
        first = next(iter(widths))
        odd = next(c for c, w in widths.items() if w != widths[first])
        raise ClientDataError(
            f"client {odd} has {widths[odd]} features but client {first} has "
            f"{widths[first]}; every client needs the same columns."
        )
