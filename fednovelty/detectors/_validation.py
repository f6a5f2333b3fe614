"""Input checks for the detectors: every failure is a ``ValueError`` that names the argument,
says what was wrong and what to do. Nothing the caller passed is modified."""

from __future__ import annotations

import numpy as np

from fednovelty.detectors import _columns
from fednovelty.exceptions import ClientDataError
from fednovelty.mixture.rows import is_row_source
from fednovelty.runtime.rows import SelectedRows


def feature_names(X) -> np.ndarray | None:
    """Column names of a DataFrame-like ``X`` (all strings), else ``None``."""
    columns = getattr(X, "columns", None)
    if columns is None:
        return None
    names = np.asarray([str(c) for c in columns], dtype=object)
    return names if all(isinstance(c, str) for c in columns) else None


def largest_value(dtype: str = "float64") -> float:
    """The largest magnitude a feature may have in ``dtype`` (``"float64"``, ``"float32"``):
    ``sqrt(finfo(dtype).max)``, about 1.3e154 for float64 and 1.8e19 for float32, beyond which
    its square overflows to inf (distances, variances and log-densities then turn inf or
    NaN)."""
    return float(np.sqrt(np.finfo(np.dtype(dtype)).max))


#: ``check_X``'s ``feature_names_in`` when the caller does not say which names fit saw: the
#: column names of ``X`` are then not compared (only their repeats refused).
NOT_COMPARED = object()


def check_X(
    X,
    *,
    name: str = "X",
    n_features: int | None = None,
    fitted_by: str = "",
    dtype: str = "float64",
    feature_names_in=NOT_COMPARED,
) -> np.ndarray:
    """Validate a sample matrix and return it as a float64 array (n_samples, n_features).

    ``dtype`` is the precision the rows are computed in (the estimator's ``dtype``): values
    whose square overflows in it (:func:`largest_value`) are refused. ``feature_names_in``:
    the column names seen in fit (None: fitted without names), checked against those of
    ``X`` as scikit-learn does (``_columns.check_feature_names``: a ``UserWarning`` when only
    one side has names). Messages name a DataFrame's columns by name, others' by number.

    A row source (:mod:`fednovelty.runtime.rows`) is refused here: the estimators that
    stream one check it chunk by chunk (:mod:`fednovelty.detectors._row_input`).

    Raises:
        TypeError: ``X`` is a row source.
        ValueError: repeated column names, other column names than in fit (naming the missing
            and unexpected ones), not 2-D, empty, non-numeric (naming the column, a value and
            its row), NaN/inf (naming the first bad cell by row and column, and how many),
            a value too large to square in ``dtype`` (naming its row and column), or a
            different number of features than at fit time.
    """
    if is_row_source(X):
        raise TypeError(
            f"{name} is a {type(X).__name__} (rows read in chunks), which this estimator reads "
            "in memory; pass the rows as an array (FedGMMDetector's fit and every mixture "
            "detector's scores stream a row source)."
        )
    _columns.check_unique_columns(X, name)
    if feature_names_in is not NOT_COMPARED:
        _columns.check_feature_names(
            feature_names(X), feature_names_in, X, fitted_by or "the detector", name
        )
    try:
        complex_values = np.iscomplexobj(X) or np.asarray(X).dtype.kind == "c"
        array = None if complex_values else np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as error:  # text, or rows of different lengths
        raise ValueError(_columns.non_numeric_message(X, name, error)) from None
    if complex_values:
        raise ValueError(f"{name} has complex values; give real-valued features.")
    if array.ndim == 1:
        raise ValueError(
            f"{name} must be 2-D (n_samples, n_features), got a 1-D array of shape "
            f"{array.shape}. Use X.reshape(-1, 1) for one feature or X.reshape(1, -1) for "
            "one sample."
        )
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {array.shape}.")
    if array.shape[0] == 0:
        raise ValueError(f"{name} has 0 samples; need at least one row.")
    if array.shape[1] == 0:
        raise ValueError(f"{name} has 0 features; need at least one column.")
    if not np.isfinite(array).all():
        raise ValueError(_columns.non_finite_message(array, X, name))
    _check_magnitude(array, X, name, dtype)
    if n_features is not None and array.shape[1] != n_features:
        raise ValueError(
            f"{name} has {array.shape[1]} features, but {fitted_by or 'the detector'} was fitted "
            f"with {n_features} features. Pass rows of the {n_features} columns seen in fit, in "
            "the same order."
        )
    return _columns.mark_checked(array)


def _check_magnitude(array: np.ndarray, X, name: str, dtype: str) -> None:
    """ValueError naming the first value of ``array`` (n_samples, n_features), the float rows
    of ``X``, whose square overflows in ``dtype`` (row-major order), by row and column."""
    limit = largest_value(dtype)
    too_large = np.abs(array) > limit
    if too_large.any():
        row, col = np.argwhere(too_large)[0]
        raise ValueError(
            f"{name} has {array[row, col]:.3g} at {_columns.row(X, row)}, "
            f"{_columns.column(X, col)}: beyond +-{limit:.3g}, "
            f"where squares overflow {dtype} (distances and densities would be inf or NaN). "
            "Rescale the features (e.g. standardise them, or divide by a power of ten) before "
            "fitting or scoring."
        )


def check_groups(groups, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Client id of each row -> ``(client_ids, codes)``.

    ``client_ids`` are the distinct ids in sorted order (n_clients,); ``codes`` maps each row
    to its client's position in ``client_ids`` (n_samples,). ``groups=None`` is one client
    (its codes a read-only view of one zero: no memory a row, whatever ``n_samples``).

    Raises:
        ValueError: wrong length, not 1-D, missing values, or ids of mixed types.
    """
    if groups is None:
        return np.array([0]), np.broadcast_to(np.zeros((), dtype=np.int64), (n_samples,))
    array = np.asarray(groups)
    if array.ndim != 1:
        raise ValueError(f"groups must be 1-D (one client id per row), got shape {array.shape}.")
    if array.shape[0] != n_samples:
        raise ValueError(
            f"groups has {array.shape[0]} entries but X has {n_samples} rows; give one client "
            "id per row of X."
        )
    if array.dtype.kind == "f" and np.isnan(array).any():
        raise ValueError("groups contains NaN; every row needs a client id.")
    if array.dtype.kind == "O" and any(g is None for g in array):
        raise ValueError("groups contains None; every row needs a client id.")
    if array.dtype.kind == "O":
        kinds = sorted({type(g).__name__ for g in array})
        if len(kinds) > 1:
            raise ValueError(
                f"groups mixes client ids of types {kinds}; give every client id the same "
                "type (e.g. all strings: groups.astype(str))."
            )
    client_ids, codes = np.unique(array, return_inverse=True)
    return client_ids, codes.astype(np.int64)


def split_by_client(X: np.ndarray, codes: np.ndarray, n_clients: int) -> list[np.ndarray]:
    """Rows of each client, in client order; views or copies, never written to. Of a row
    source, each client's rows as a source (the source itself for one client)."""
    if is_row_source(X):
        return [X] if n_clients == 1 else [SelectedRows(X, codes, c) for c in range(n_clients)]
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(n_clients + 1))
    return [X[order[bounds[c] : bounds[c + 1]]] for c in range(n_clients)]


def check_client_sizes(
    parts: list[np.ndarray], client_ids: np.ndarray, minimum: int, why: str
) -> None:
    """Raise ``ClientDataError`` naming the first client with fewer than ``minimum`` rows."""
    for cid, part in zip(client_ids, parts, strict=True):
        if part.shape[0] < minimum:
            raise ClientDataError(
                f"client {cid!r} has {part.shape[0]} sample(s); need >= {minimum} ({why}). "
                "Merge small clients or drop them from groups."
            )
