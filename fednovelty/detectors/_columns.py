"""Where a bad input is: the messages of :func:`fednovelty.detectors._validation.check_X` that
name a column (by name for a DataFrame, by number otherwise), a row (by position, with its
index label when a DataFrame's index is not ``0..n-1``) and the fix; the checks of a
DataFrame's column names (repeated names, the names seen in fit) and scikit-learn's
feature-name warnings.

Rows the checks return are remembered (:func:`mark_checked`) so that an estimator passing
them on to its own public methods (e.g. ``decision_function`` on its training rows) is not
warned that they have no feature names: only what a caller passes is.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np

#: at most this many names or positions are listed in a message.
MAX_LISTED = 5
_CHECKED: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def mark_checked(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` (same memory, same values) remembered as checked rows."""
    view = array.view()
    _CHECKED[id(view)] = view
    return view


def is_checked(X) -> bool:
    """Whether ``X`` is rows a check returned (:func:`mark_checked`)."""
    return _CHECKED.get(id(X)) is X


def listed(items) -> str:
    """``items`` as a list in a message, the first :data:`MAX_LISTED` and how many more."""
    items = list(items)
    shown = ", ".join(repr(i) for i in items[:MAX_LISTED])
    more = f", ... and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return f"[{shown}{more}]"


def column(X, j: int) -> str:
    """Column ``j`` of ``X`` in a message: ``column 'ash'`` for a DataFrame (its label),
    ``column 2`` otherwise."""
    columns = getattr(X, "columns", None)
    if columns is None or len(columns) <= j:
        return f"column {j}"
    return f"column {columns[j]!r}"


def _label(X, j: int):
    """Column ``j``'s label: the DataFrame's, else the position."""
    columns = getattr(X, "columns", None)
    return columns[j] if columns is not None and len(columns) > j else int(j)


def row(X, i: int) -> str:
    """Row ``i`` (a position) of ``X`` in a message, with its index label when ``X`` is a
    DataFrame whose index is not ``0..n-1`` (``row 5 (index 'b')``)."""
    index = getattr(X, "index", None) if hasattr(X, "columns") else None  # a DataFrame's
    if index is None or len(index) <= i or index[i] == i:
        return f"row {i}"
    return f"row {i} (index {index[i]!r})"


def non_finite_message(array: np.ndarray, X, name: str) -> str:
    """The message for NaN or inf in ``array`` (n_samples, n_features), the float rows of
    ``X``: the first bad cell in row order, by row and column of that one cell, how many
    cells and which columns are bad, and the fix."""
    bad = ~np.isfinite(array)
    i, j = np.argwhere(bad)[0]
    bad_columns = np.flatnonzero(bad.any(axis=0))
    n_bad = int(bad.sum())
    frame = hasattr(X, "columns")
    drop = f"{name}.dropna()" if frame else f"{name}[np.isfinite({name}).all(axis=1)]"
    where = (
        f"{n_bad} such cells in all, in {len(bad_columns)} column(s) "
        f"{listed(_label(X, c) for c in bad_columns)}"
        if n_bad > 1
        else "the only one"
    )
    return (
        f"{name} contains NaN or inf in {column(X, j)} at {row(X, i)} (value {array[i, j]}; "
        f"{where}). Remove or impute these values before fitting or scoring (e.g. "
        f"{drop}, or sklearn.impute.SimpleImputer)."
    )


def _first_text_cell(values: np.ndarray) -> tuple[int, object, int] | None:
    """``(row, value, count)`` of the first cell of a column (n_samples,) that is not a
    number and how many such cells it has, or None when it converts to float."""
    try:
        np.asarray(values, dtype=np.float64)
        return None
    except (TypeError, ValueError):
        pass
    bad = []
    for i, value in enumerate(values):
        try:
            float(value)
        except (TypeError, ValueError):
            bad.append(i)
    return (bad[0], values[bad[0]], len(bad)) if bad else None


def non_numeric_message(X, name: str, error: Exception) -> str:
    """The message for rows ``X`` that do not convert to float: the first column holding a
    value that is not a number, that value and its row, which other columns do, and the fix;
    numpy's ``error`` when no single cell is to blame (e.g. rows of different lengths)."""
    fix = (
        "Encode such columns as numbers first (e.g. pandas.get_dummies or "
        "sklearn.preprocessing.OrdinalEncoder) or drop them; a column of client ids goes in "
        "groups=, not in X."
    )
    try:
        cells = np.asarray(X, dtype=object)
    except (TypeError, ValueError):
        cells = None
    if cells is None or cells.ndim != 2:
        return (
            f"{name} must be numeric (n_samples, n_features); could not convert it to float: "
            f"{str(error).rstrip('.')}. {fix}"
        )
    found = [(j, f) for j in range(cells.shape[1]) if (f := _first_text_cell(cells[:, j]))]
    if not found:
        return f"{name} must be numeric (n_samples, n_features): {error}. {fix}"
    j, (i, value, count) = found[0]
    others = (
        f"; columns {listed(_label(X, c) for c, _ in found)} are not numeric"
        if len(found) > 1
        else ""
    )
    return (
        f"{name} must be numeric (n_samples, n_features), but {column(X, j)} holds text: "
        f"{value!r} at {row(X, i)} (values that are not numbers: {count} of {cells.shape[0]}"
        f"{others}). {fix}"
    )


def check_unique_columns(X, name: str) -> None:
    """Refuse a DataFrame ``X`` whose column names repeat.

    Raises:
        ValueError: naming each repeated name and how often it occurs.
    """
    columns = getattr(X, "columns", None)
    if columns is None:
        return
    labels = list(columns)
    seen: dict = {}
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
    repeated = [f"{label!r} ({n} times)" for label, n in seen.items() if n > 1]
    if repeated:
        raise ValueError(
            f"{name} has duplicate column names: {', '.join(repeated)}; each column needs its "
            f"own name. Rename or drop the repeated columns (e.g. "
            f"{name}.loc[:, ~{name}.columns.duplicated()] keeps the first of each)."
        )


def check_feature_names(
    names: np.ndarray | None, fitted: np.ndarray | None, X, fitted_by: str, name: str
) -> None:
    """Check the column names ``names`` of ``X`` (None: no valid names) against ``fitted``,
    those seen in fit (None: fitted without names), as scikit-learn's
    ``_check_feature_names`` does: a ``UserWarning`` when only one of the two has names
    (rows a check returned, :func:`is_checked`, excepted), a ``ValueError`` naming the
    missing and unexpected columns when they differ.

    Raises:
        ValueError: ``names`` not ``fitted`` (missing, unexpected, or in another order).
    """
    if names is None and fitted is None:
        return
    if fitted is None:
        warnings.warn(
            f"{name} has feature names, but {fitted_by} was fitted without feature names",
            UserWarning,
            stacklevel=2,
        )
        return
    if names is None:
        if not is_checked(X):
            warnings.warn(
                f"{name} does not have valid feature names, but {fitted_by} was fitted with "
                "feature names",
                UserWarning,
                stacklevel=2,
            )
        return
    if len(names) == len(fitted) and (names == fitted).all():
        return
    given, seen = set(names), set(fitted)
    missing = [n for n in fitted if n not in given]
    unexpected = [n for n in names if n not in seen]
    if not missing and not unexpected:
        raise ValueError(
            f"The feature names of {name} differ from those seen in fit: {names.tolist()} vs "
            f"{fitted.tolist()} (the same names in another order). Reorder the columns: "
            f"{name}[detector.feature_names_in_]."
        )
    parts = [f"missing {listed(missing)} (seen in fit)"] if missing else []
    parts += [f"unexpected {listed(unexpected)} (not seen in fit)"] if unexpected else []
    raise ValueError(
        f"The feature names of {name} differ from those {fitted_by} saw in fit: "
        f"{'; '.join(parts)}. Pass the {len(fitted)} columns seen in fit, in their order: "
        f"{name}[detector.feature_names_in_]."
    )
