"""Flower Datasets partitions as fednovelty's input: rows, labels and a client id per row.

`Flower Datasets <https://flower.ai/docs/datasets/>`_ (``flwr-datasets``, a Hugging Face
``datasets`` front end; ``pip install 'fednovelty[flower]'``) splits a dataset among clients
with a *partitioner* (``IidPartitioner``, ``DirichletPartitioner``,
``NaturalIdPartitioner``, ...); each partition is a ``datasets.Dataset``. A fednovelty
detector takes the pooled rows with one client id per row instead
(``fit(X, groups=groups)``). :func:`flower_partitions` turns the one into the other:
partition ``i`` becomes client ``i``.

It reads any of:

- a partitioner whose ``dataset`` is set (``partitioner.dataset = Dataset.from_dict(...)``,
  or one a ``FederatedDataset`` has used);
- a ``FederatedDataset`` (its partitioner of ``split``; the only one when ``split`` is not
  given); its first ``load_partition`` loads the dataset, from the Hugging Face Hub where it
  names one;
- a list of partitions (``datasets.Dataset`` objects, or anything with ``to_pandas()``).

Columns: ``features`` names the feature columns (default: every column but ``label`` and the
column a partitioner partitions by, e.g. ``NaturalIdPartitioner``'s id column); each must be a
numeric scalar column (integers, floats or booleans; a ``ClassLabel`` counts as integers).
``label`` names the label column (any values), returned as ``y``. A missing column, a
non-numeric feature column or a feature with a missing value raises a ``ValueError`` naming
it; a partition without rows raises an :class:`EmptyPartitionWarning` (its client then holds
no rows: it is not among ``groups``).

Example (offline, no Hub):
    >>> from datasets import Dataset
    >>> from flwr_datasets.partitioner import IidPartitioner
    >>> partitioner = IidPartitioner(num_partitions=3)
    >>> partitioner.dataset = Dataset.from_dict({"a": [0.0, 1, 2, 3, 4, 5], "b": [1.0] * 6})
    >>> X, groups = flower_partitions(partitioner)
    >>> list(X.columns), groups.tolist()
    (['a', 'b'], [0, 0, 1, 1, 2, 2])
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["EmptyPartitionWarning", "flower_partitions"]


class EmptyPartitionWarning(UserWarning):
    """A Flower Datasets partition without rows: its client holds nothing and has no rows in
    ``groups``."""


def _is_partitioner(source: Any) -> bool:
    return hasattr(source, "load_partition") and hasattr(source, "is_dataset_assigned")


def _is_federated_dataset(source: Any) -> bool:
    return hasattr(source, "load_partition") and hasattr(source, "partitioners")


def _partitions(source: Any, split: str | None) -> tuple[list[Any], str | None]:
    """The partitions of ``source`` in partition-id order, and the column its partitioner
    partitions by (``None`` where there is none or it is not known)."""
    if _is_federated_dataset(source):
        names = list(source.partitioners)
        if split is None:
            if len(names) != 1:
                raise ValueError(
                    f"this FederatedDataset partitions the splits {names}; say which with split=..."
                )
            split = names[0]
        if split not in source.partitioners:
            raise ValueError(f"split={split!r} is not partitioned here; partitioned: {names}.")
        partitioner = source.partitioners[split]
        count = int(partitioner.num_partitions if partitioner.is_dataset_assigned() else 0)
        first = [source.load_partition(0, split)] if count == 0 else []
        count = int(partitioner.num_partitions)  # known once the dataset is loaded
        rest = [source.load_partition(i, split) for i in range(len(first), count)]
        return first + rest, getattr(partitioner, "_partition_by", None)
    if split is not None:
        raise ValueError("split= applies to a FederatedDataset only.")
    if _is_partitioner(source):
        if not source.is_dataset_assigned():
            raise ValueError(
                f"the {type(source).__name__} has no dataset; set it first "
                "(partitioner.dataset = datasets.Dataset...), or pass a FederatedDataset."
            )
        count = int(source.num_partitions)
        return [source.load_partition(i) for i in range(count)], getattr(
            source, "_partition_by", None
        )
    if isinstance(source, Sequence) and not isinstance(source, str | bytes):
        if not source:
            raise ValueError("the list of partitions is empty; give at least one.")
        return list(source), None
    raise TypeError(
        "source must be a Flower Datasets partitioner (with its dataset set), a "
        f"FederatedDataset or a list of partitions; got {type(source).__name__}."
    )


def _frame(partition: Any, index: int) -> pd.DataFrame:
    if isinstance(partition, pd.DataFrame):
        return partition
    if not hasattr(partition, "to_pandas"):
        raise TypeError(
            f"partition {index} is a {type(partition).__name__}; a partition is a "
            "datasets.Dataset (or has to_pandas())."
        )
    return partition.to_pandas()


def _numeric(column: pd.Series) -> bool:
    return pd.api.types.is_bool_dtype(column) or (
        pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_complex_dtype(column)
    )


def _check_columns(frame: pd.DataFrame, features: list[str], label: str | None) -> None:
    """Every named column present, every feature a numeric scalar column without gaps."""
    wanted = [*features, *([label] if label is not None else [])]
    missing = [c for c in wanted if c not in frame.columns]
    if missing:
        raise ValueError(
            f"columns {missing} are not in the partitions; their columns: {list(frame.columns)}."
        )
    bad = {c: str(frame[c].dtype) for c in features if not _numeric(frame[c])}
    if bad:
        raise ValueError(
            f"feature columns must hold numbers (int, float, bool); {bad} do not. Name the "
            "numeric ones with features=[...], or map these to numbers first (e.g. the "
            "Dataset's .map)."
        )
    gaps = [c for c in features if frame[c].isna().any()]
    if gaps:
        raise ValueError(
            f"feature columns {gaps} have missing values; fill or drop them first "
            "(fednovelty's detectors take finite numbers)."
        )


def flower_partitions(
    source: Any,
    features: Sequence[str] | None = None,
    label: str | None = None,
    *,
    split: str | None = None,
) -> tuple[pd.DataFrame, np.ndarray] | tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The rows of every partition of ``source``, pooled, with a client id per row.

    Args:
        source: a Flower Datasets partitioner with its ``dataset`` set, a
            ``FederatedDataset``, or a list of partitions (module docstring).
        features: the feature columns, in this order; default: every column but ``label``
            and the partitioner's partition-by column, in the partitions' order.
        label: the label column (returned as ``y``); ``None``: no labels.
        split: the ``FederatedDataset``'s partitioned split (default: its only one).

    Returns:
        ``(X, groups)``, or ``(X, y, groups)`` with ``label``: ``X`` a ``DataFrame``
        (n_samples, n_features) of float64 named by ``features``; ``y`` (n_samples,) the
        labels as they are; ``groups`` (n_samples,) int64, the partition id of each row
        (partition ``i`` is client ``i``; rows in partition order).

    Raises:
        TypeError: a source or partition of another type. ValueError: a missing column, a
            non-numeric feature, a feature with missing values, a partitioner without its
            dataset, an unknown ``split``.
    """
    parts, partition_by = _partitions(source, split)
    frames = [_frame(p, i) for i, p in enumerate(parts)]
    template = next((f for f in frames if len(f.columns)), frames[0])
    if features is None:
        left_out = {label, partition_by} - {None}
        features = [c for c in template.columns if c not in left_out]
        if not features:
            raise ValueError(f"no feature column left besides {sorted(left_out)}; name them.")
    features = list(features)
    if label is not None and label in features:
        raise ValueError(f"column {label!r} is the label; it cannot be a feature too.")
    empty = [i for i, f in enumerate(frames) if len(f) == 0]
    if empty:
        warnings.warn(
            EmptyPartitionWarning(
                f"partitions {empty} hold no rows: their clients have nothing to train on "
                "and do not appear in groups."
            ),
            stacklevel=2,
        )
    kept = [(i, f) for i, f in enumerate(frames) if len(f)]
    if not kept:
        raise ValueError("every partition is empty; there are no rows.")
    for _, frame in kept:
        _check_columns(frame, features, label)
    X = pd.concat([f[features] for _, f in kept], ignore_index=True).astype(np.float64)
    groups = np.concatenate([np.full(len(f), i, dtype=np.int64) for i, f in kept])
    if label is None:
        return X, groups
    y = np.concatenate([f[label].to_numpy() for _, f in kept])
    return X, y, groups
