"""Labels of the joint model (``JointFedGMMDetector``): ``fit``'s labels to classes and
codes, and the labels of rows to score to codes into the fitted classes. Every failure is a
``ValueError`` that names ``y`` and says what to do."""

from __future__ import annotations

import numpy as np
import torch


def encode_labels(y, n_rows: int, classes=None) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, codes)`` of fit's labels: the sorted distinct values (n_classes,) (or of
    ``classes``, every label the model will know, a superset of ``y``'s) and each row's
    index into them (n_rows,) int64.

    Raises:
        ValueError: ``y`` is missing, not 1-D, not one label per row, holds NaN/inf or a
            single class, or a label not in ``classes``.
    """
    if y is None:
        raise ValueError(
            "JointFedGMMDetector.fit needs y, one label per row: fit(X, y, groups). For a "
            "model of X alone use FedGMMDetector."
        )
    y_array = np.asarray(y)
    if y_array.ndim != 1:
        raise ValueError(f"y must be 1-D (one label per row), got shape {y_array.shape}.")
    if y_array.dtype.kind == "f" and not np.isfinite(y_array).all():
        raise ValueError("y contains NaN or inf; every row needs a label.")
    if len(y_array) != n_rows:
        raise ValueError(
            f"y has {len(y_array)} labels but X has {n_rows} rows; give one label per row."
        )
    if classes is not None:
        known = np.unique(np.asarray(classes))
        missing = np.setdiff1d(np.unique(y_array), known)
        if missing.size:
            raise ValueError(
                f"y has label(s) {missing[:5].tolist()} not in classes; classes must hold every "
                "label the model will see."
            )
        codes = np.searchsorted(known, y_array)
        if len(known) < 2:
            raise ValueError("classes has a single class; the joint model needs at least 2.")
        return known, codes.astype(np.int64)
    classes, codes = np.unique(y_array, return_inverse=True)
    if len(classes) < 2:
        raise ValueError("y has a single class; the joint model needs at least 2 classes.")
    return classes, codes.astype(np.int64)


def label_codes(y, classes: np.ndarray, n_rows: int, device) -> torch.Tensor:
    """Each row's index into ``classes`` (n_rows,) int64 on ``device``.

    Args:
        y: one label per row to score.
        classes: the labels seen in fit, sorted (``classes_``).
        n_rows: the number of rows scored (``len(y)`` must equal it).
        device: the torch device of the rows.

    Raises:
        ValueError: not one label per row, or a label not seen in fit.
    """
    y_array = np.asarray(y)
    if y_array.ndim != 1 or len(y_array) != n_rows:
        raise ValueError(
            f"y has {len(y_array) if y_array.ndim == 1 else y_array.shape} labels but X has "
            f"{n_rows} rows; give one label per row."
        )
    unknown = ~np.isin(y_array, classes)
    if unknown.any():
        raise ValueError(
            f"y has label(s) {np.unique(y_array[unknown])[:5].tolist()} not seen in fit; "
            f"known classes: {classes.tolist()}."
        )
    return torch.as_tensor(np.searchsorted(classes, y_array), device=device)
