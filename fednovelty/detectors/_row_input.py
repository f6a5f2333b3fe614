"""Rows larger than memory given to a detector: what ``fit`` and the scores do with them.

A detector takes, besides in-memory rows, rows it reads chunk by chunk
(:class:`~fednovelty.mixture.rows.RowSource`, :mod:`fednovelty.runtime.rows`):

- a ``RowSource`` (``ArrayRows``, ``ParquetRows``, ``ChunkedRows``, ...);
- a path (``str`` or ``os.PathLike``) of a ``.npy`` file (memory-mapped) or a ``.parquet``
  file (its columns, all numeric, are the features and their names ``feature_names_in_``);
- an ``np.memmap`` (``np.load(path, mmap_mode="r")``).

``fit(X, groups=...)`` on such rows (:func:`fit_source`): only a family whose client steps
sum their statistics chunk by chunk takes them (the class's ``_row_sources``; today
``FedGMMDetector``, which the ``FedGMM`` and ``DEM-*`` methods build) with settings whose
steps stream (:func:`unstreamable_settings`); any other family or setting refuses a source
or path by name, and reads an ``np.memmap`` into memory as before. The rows are validated
in one pass (finite values that square without overflow, chunk by chunk; nothing is
copied); ``groups`` (one client id per row, in memory: 8 bytes a row for its codes) splits
them into clients whose passes each read the rows and keep their own
(:class:`~fednovelty.runtime.rows.SelectedRows`).

``score_samples``, ``decision_function`` and ``predict`` of every mixture detector on such
rows stream them through the shared scoring path (:func:`stream_scores`): one chunk at a
time, each validated as it is read, into an output of one float a row. The methods that
need rows in memory (``responsibilities``, ``explain``, ``adapt``, per-client scores) refuse a
source or path with a message, and read an ``np.memmap`` as an array, as before.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fednovelty.detectors import _columns
from fednovelty.detectors._params import front_end_axes
from fednovelty.detectors._validation import feature_names, largest_value
from fednovelty.mixture.rows import RowSource, numbered_chunks
from fednovelty.runtime.rows import ArrayRows, row_source
from fednovelty.runtime.threads import scoring_threads

#: methods that stream a row source (the rest need rows in memory).
STREAMED_METHODS = "score_samples, decision_function, predict and predict_proba"


def row_input(X: Any) -> RowSource | None:
    """``X`` as a row source when it is given as one (module docstring), else None (rows in
    memory: arrays, DataFrames, lists)."""
    if isinstance(X, RowSource):
        return X
    if isinstance(X, str | os.PathLike):
        return row_source(X)
    if isinstance(X, np.memmap):
        return ArrayRows(X)
    return None


def streaming_classes() -> list[str]:
    """Names of the estimator classes whose ``fit`` takes a row source."""
    from fednovelty.detectors.persistence import REGISTRY

    return sorted(name for name, cls in REGISTRY.items() if getattr(cls, "_row_sources", False))


def unstreamable_settings(estimator: Any, n_features: int) -> list[str]:
    """The settings of ``estimator`` under which its fit cannot read rows chunk by chunk,
    each with what to do (empty: it can)."""
    problems = []
    if getattr(estimator, "calibration", "contamination") == "conformal":
        problems.append(
            "calibration='conformal' (it holds rows of each client out of training): use "
            "calibration='contamination'"
        )
    axes = getattr(estimator, "pca_components", None)
    if getattr(estimator, "_pca_front_end", False) and front_end_axes(axes, n_features):
        problems.append(
            f"pca_components={axes!r} on {n_features} features (federated PCA's rounds read "
            "rows in memory): use pca_components=None"
        )
    if estimator._option("privacy").epsilon is not None:
        problems.append("privacy.epsilon (the private rounds read rows in memory): no epsilon")
    init = getattr(estimator, "init_params", "kmeans")
    if init != "kmeans":
        problems.append(f"init_params={init!r} (its round reads rows in memory): 'kmeans'")
    return problems


def fit_source(estimator: Any, X: Any) -> RowSource | None:
    """The rows ``fit`` reads chunk by chunk, validated (:func:`check_rows`) and yielding
    the estimator's dtype and device; None when ``X`` is rows in memory, or an ``np.memmap``
    given to a family that reads rows in memory (it reads the map as an array).

    Raises:
        TypeError: a source or path given to a family that cannot stream it, or settings
            under which the fit cannot (naming them and what to do).
        ValueError: the rows fail validation (:func:`check_rows`).
    """
    source = row_input(X)
    if source is None or (isinstance(X, np.memmap) and not estimator._row_sources):
        return None
    name = type(estimator).__name__
    if not estimator._row_sources:
        raise TypeError(
            f"{name}.fit reads its rows in memory and X is {type(X).__name__} (rows read in "
            f"chunks); the classes whose fit streams rows are {streaming_classes()} (methods "
            "FedGMM, DEM-kmeans). Pass an array, or fit one of those."
        )
    problems = unstreamable_settings(estimator, source.n_features)
    if problems:
        raise TypeError(f"{name}.fit cannot read rows in chunks with " + "; ".join(problems) + ".")
    checked = check_rows(source, dtype=estimator.dtype)
    return checked.astype(**estimator._torch_options())


def check_rows(source: RowSource, *, name: str = "X", dtype: str = "float64") -> RowSource:
    """``source`` checked in one pass, as ``check_X`` checks an array: at least one row and
    one column, every value finite and small enough to square in ``dtype``. Returns a copy
    marked ``checked`` (nothing of the rows is kept).

    Raises:
        ValueError: no rows or columns, NaN/inf or a value too large (naming its row and
            column, counted from 0 over the whole source).
    """
    if source.n_rows == 0:
        raise ValueError(f"{name} has 0 samples; need at least one row.")
    if source.n_features == 0:
        raise ValueError(f"{name} has 0 features; need at least one column.")
    exact = source.astype(torch.float64)
    for start, rows in numbered_chunks(exact):
        check_chunk(rows, start, source, name, dtype)
    checked = source.astype()
    checked.checked = True
    return checked


def check_chunk(rows: Tensor, start: int, source: RowSource, name: str, dtype: str) -> None:
    """A ``ValueError`` naming the first value of the float64 chunk ``rows`` (its first row
    at position ``start`` of ``source``) that is NaN, inf or too large to square in
    ``dtype``."""
    limit = largest_value(dtype)
    bad = ~torch.isfinite(rows) | (rows.abs() > limit)
    if not bool(bad.any()):
        return
    i, j = (int(v) for v in bad.nonzero()[0])
    value = float(rows[i, j])
    where = f"row {start + i}, {_columns.column(source, j)}"
    if not np.isfinite(value):
        raise ValueError(
            f"{name} has {value} at {where}; every value must be finite. Clean the rows (drop "
            "or impute them) before fitting or scoring."
        )
    raise ValueError(
        f"{name} has {value:.3g} at {where}: beyond +-{limit:.3g}, where squares overflow "
        f"{dtype} (distances and densities would be inf or NaN). Rescale the features (e.g. "
        "standardise them) before fitting or scoring."
    )


def score_source(estimator: Any, X: Any) -> RowSource | None:
    """The rows a fitted ``estimator`` scores chunk by chunk (module docstring), their width
    and column names checked against fit's; None for rows in memory.

    Raises:
        ValueError: another width than in fit, or other column names.
    """
    source = row_input(X)
    if source is None:
        return None
    fitted_by = type(estimator).__name__
    if source.n_features != estimator.n_features_in_:
        raise ValueError(
            f"X has {source.n_features} features, but {fitted_by} was fitted with "
            f"{estimator.n_features_in_} features. Pass rows of the {estimator.n_features_in_} "
            "columns seen in fit, in the same order."
        )
    fitted = getattr(estimator, "feature_names_in_", None)
    _columns.check_feature_names(feature_names(source), fitted, source, fitted_by, "X")
    return source


def stream_scores(estimator: Any, source: RowSource, fn: Any) -> np.ndarray:
    """``fn(rows)`` (a (m,) tensor per chunk of torch rows in the estimator's dtype and
    device) over the chunks of ``source``, each validated as it is read (unless ``source``
    was, :func:`check_rows`), into one float64 array (n_rows,)."""
    options = estimator._torch_options()
    out = np.empty(source.n_rows, dtype=np.float64)
    k = getattr(estimator, "n_components_", 1)
    # the threads the whole rows' work calls for, as in memory (one chunk's would be fewer)
    with torch.no_grad(), scoring_threads(*source.shape, k):
        for start, rows in numbered_chunks(source.astype(torch.float64)):
            if not source.checked:
                check_chunk(rows, start, source, "X", estimator.dtype)
            out[start : start + rows.shape[0]] = fn(rows.to(**options)).cpu().numpy()
    return out


def refuse_source(estimator: Any, X: Any) -> None:
    """A ``TypeError`` when ``X`` is a row source or path, which a method that needs its rows
    in memory cannot take (an ``np.memmap`` is read as an array)."""
    if isinstance(X, RowSource | str | os.PathLike):
        raise TypeError(
            f"this method of {type(estimator).__name__} needs its rows in memory and X is "
            f"{type(X).__name__} (rows read in chunks); {STREAMED_METHODS} stream it. Pass "
            "the rows as an array."
        )
