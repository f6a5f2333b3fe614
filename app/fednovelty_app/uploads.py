"""Checks of uploaded tables: every problem becomes an :class:`UploadError` whose message
names the column, the row or the client and says what to do, before anything is trained or
scored (the pages show it with ``st.error``; a bad file never reaches a traceback).

- :func:`read_table`: a ``.csv`` or ``.parquet`` upload as a DataFrame.
- :func:`check_table`: a training table (feature columns, client column, optional class-label
  and novelty columns, enough normal rows per client).
- :func:`check_score_table`: rows to score with a fitted model (its feature columns by name,
  or by count for a model fitted on an array).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import PurePath

import numpy as np
import pandas as pd

__all__ = [
    "MIN_ROWS_PER_CLIENT",
    "TEST_SHARE",
    "UploadError",
    "check_score_table",
    "check_table",
    "digest",
    "numeric_features",
    "read_table",
]

#: Share of every training client's normal rows kept back for the test set.
TEST_SHARE = 0.3
#: Fewest normal rows an uploaded client may hold (before the test share is kept back).
MIN_ROWS_PER_CLIENT = 10


class UploadError(ValueError):
    """A table the dashboard cannot use; the message says what is wrong and what to do."""


def digest(data: bytes) -> str:
    """Short content hash of a file (a cache key for uploaded tables)."""
    return hashlib.sha1(data).hexdigest()[:16]


def read_table(filename: str, data: bytes) -> pd.DataFrame:
    """An uploaded ``.csv`` or ``.parquet`` file as a DataFrame.

    Raises:
        UploadError: another extension, a file that does not parse, or no rows.
    """
    suffix = PurePath(filename).suffix.lower()
    try:
        if suffix in (".csv", ".txt"):
            frame = pd.read_csv(io.BytesIO(data))
        elif suffix in (".parquet", ".pq"):
            frame = pd.read_parquet(io.BytesIO(data))
        else:
            raise UploadError(f"{filename}: expected a .csv or .parquet file, got {suffix!r}.")
    except UploadError:
        raise
    except Exception as error:  # pandas raises many parser error types
        kind = "CSV" if suffix in (".csv", ".txt") else "Parquet"
        raise UploadError(f"could not read {filename} as {kind}: {error}") from None
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise UploadError(f"{filename} has no data rows; upload a table with a header and rows.")
    return frame


def _column_list(columns) -> str:
    shown = [repr(str(c)) for c in list(columns)[:12]]
    return ", ".join(shown) + (", ..." if len(columns) > 12 else "")


def numeric_features(frame: pd.DataFrame, columns: list) -> np.ndarray:
    """The named columns as float64 (n_rows, n_columns), or an UploadError naming the first
    non-numeric value or missing value (row numbers count data rows from 1)."""
    bad = []
    for name in columns:
        col = frame[name]
        if col.dtype == bool:
            continue
        values = pd.to_numeric(col, errors="coerce")
        wrong = values.isna() & col.notna()
        if wrong.any():
            row = int(np.flatnonzero(wrong.to_numpy())[0])
            bad.append(f"{name!r} (data row {row + 1} holds {col.iloc[row]!r})")
    if bad:
        raise UploadError(
            f"non-numeric values in feature column(s) {', '.join(bad[:3])}"
            f"{' and more' if len(bad) > 3 else ''}. Features must be numbers: encode these "
            "columns as numbers, drop them, or choose them as the client / label column."
        )
    X = frame[columns].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    missing = ~np.isfinite(X)
    if missing.any():
        rows, cols = np.nonzero(missing)
        counts = missing.sum(axis=0)
        affected = [
            f"{columns[j]!r} ({int(counts[j])} value(s))" for j in np.flatnonzero(counts)[:3]
        ]
        raise UploadError(
            f"missing or infinite values (NaN, empty cells, inf) in {', '.join(affected)}; the "
            f"first is column {columns[cols[0]]!r} at data row {rows[0] + 1}. Fill in or drop "
            "those rows first."
        )
    return X


def _novel_flags(frame: pd.DataFrame, column) -> np.ndarray:
    values = frame[column]
    if values.isna().any():
        row = int(np.flatnonzero(values.isna().to_numpy())[0])
        raise UploadError(f"novelty column {column!r} is empty at data row {row + 1}.")
    allowed = {0, 1, "0", "1"}  # True and False compare equal to 1 and 0
    odd = [v for v in values.unique() if v not in allowed]
    if odd:
        raise UploadError(
            f"novelty column {column!r} must hold 0 (normal) or 1 (novel); found "
            f"{odd[0]!r}. Choose another column or none."
        )
    return np.array([v in (1, "1") for v in values], dtype=np.int64)


def check_table(
    frame: pd.DataFrame,
    client_column,
    label_column=None,
    novel_column=None,
    *,
    min_rows: int = MIN_ROWS_PER_CLIENT,
) -> tuple[list, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validate an uploaded training table.

    Args:
        frame: the table; every column other than the chosen ones is a feature.
        client_column: column holding each row's client id.
        label_column: optional class-label column (FedGMM's joint model).
        novel_column: optional 0/1 column, 1 = novel (kept out of training, tested).
        min_rows: fewest normal rows a client must hold.

    Returns:
        ``(feature_columns, X, groups, labels or None, novel or None)``.

    Raises:
        UploadError: a missing or repeated column choice, no feature columns, non-numeric or
            missing feature values, missing client ids or labels, a label column with one
            class, a novelty column that is not 0/1, or a client with too few rows.
    """
    chosen = [c for c in (client_column, label_column, novel_column) if c is not None]
    for name in chosen:
        if name not in frame.columns:
            raise UploadError(
                f"no column {name!r} in the file; its columns are {_column_list(frame.columns)}."
            )
    if len(set(chosen)) != len(chosen):
        raise UploadError("the client, label and novelty columns must be different columns.")
    features = [c for c in frame.columns if c not in chosen]
    if not features:
        raise UploadError("no feature columns are left after the client / label columns.")
    X = numeric_features(frame, features)
    groups = frame[client_column]
    if groups.isna().any():
        row = int(np.flatnonzero(groups.isna().to_numpy())[0])
        raise UploadError(
            f"client column {client_column!r} is empty at data row {row + 1}; every row needs "
            "a client id."
        )
    groups = groups.to_numpy()
    labels = None
    if label_column is not None:
        col = frame[label_column]
        if col.isna().any():
            row = int(np.flatnonzero(col.isna().to_numpy())[0])
            raise UploadError(f"label column {label_column!r} is empty at data row {row + 1}.")
        labels = col.to_numpy()
        if np.unique(labels.astype(str)).size < 2:
            raise UploadError(
                f"label column {label_column!r} holds a single class; the joint model needs "
                "at least 2 (or choose no label column)."
            )
    novel = None if novel_column is None else _novel_flags(frame, novel_column)
    normal = np.ones(len(groups), bool) if novel is None else novel == 0
    ids, counts = np.unique(groups[normal].astype(str), return_counts=True)
    small = [(str(i), int(n)) for i, n in zip(ids, counts, strict=True) if n < min_rows]
    missing = sorted(set(groups.astype(str)) - set(ids))
    small += [(i, 0) for i in missing]
    if small:
        listed = ", ".join(f"{i!r} has {n}" for i, n in small[:5])
        raise UploadError(
            f"too few rows per client: {listed}{' and more' if len(small) > 5 else ''} normal "
            f"row(s); each client needs at least {min_rows} ({TEST_SHARE:.0%} of them are kept "
            "back for testing). Merge small clients or choose another client column."
        )
    return features, X, groups, labels, novel


def check_score_table(
    frame: pd.DataFrame,
    feature_names: list[str] | None,
    n_features: int,
    *,
    client_column=None,
    label_column=None,
) -> tuple[pd.DataFrame | np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Validate rows to score with a fitted model.

    Args:
        frame: the uploaded rows.
        feature_names: the model's ``feature_names_in_`` (columns looked up by name; others
            ignored), or None (the model was fitted on an array: every column other than the
            client / label columns is a feature, in order).
        n_features: the model's ``n_features_in_``.
        client_column, label_column: optional columns with each row's client id and label.

    Returns:
        ``(features, clients or None, labels or None)``; features are a DataFrame with the
        model's column names, or a float64 array when the model has none.

    Raises:
        UploadError: missing columns, a wrong number of features, non-numeric or missing
            values, or empty client / label cells.
    """
    for name in (client_column, label_column):
        if name is not None and name not in frame.columns:
            raise UploadError(f"no column {name!r}; columns: {_column_list(frame.columns)}.")
    if feature_names is not None:
        missing = [c for c in feature_names if c not in frame.columns]
        if missing:
            raise UploadError(
                f"the rows lack the model's feature column(s) {_column_list(missing)}; the "
                f"model was trained on {_column_list(feature_names)}."
            )
        columns = list(feature_names)
    else:
        columns = [c for c in frame.columns if c not in (client_column, label_column)]
        if len(columns) != n_features:
            raise UploadError(
                f"the rows have {len(columns)} feature column(s) but the model expects "
                f"{n_features}."
            )
    X = pd.DataFrame(numeric_features(frame, columns), columns=[str(c) for c in columns])
    if feature_names is None:
        X = X.to_numpy()
    extra = []
    for name in (client_column, label_column):
        if name is None:
            extra.append(None)
            continue
        if frame[name].isna().any():
            row = int(np.flatnonzero(frame[name].isna().to_numpy())[0])
            raise UploadError(f"column {name!r} is empty at data row {row + 1}.")
        extra.append(frame[name].to_numpy())
    return X, extra[0], extra[1]
