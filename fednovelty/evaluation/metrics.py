"""Threshold-free novelty-detection metrics: AUROC, AUPR-In, AUPR-Out, FPR@95TPR, Max-F1.

Convention, the same for every function here:

- ``y_true`` has shape ``(n_samples,)`` with **1 = novel/anomalous (the positive class)** and
  0 = inlier;
- ``scores`` has shape ``(n_samples,)`` and is **higher = more anomalous**, like PyOD's
  ``decision_function`` (for a mixture model, ``-log p(x)``). Pass ``-score_samples(X)``,
  not ``score_samples(X)``.

Each metric is a thin wrapper over ``sklearn.metrics`` so that numbers agree with the wider
literature to the last bit; the value added here is the single, stated convention and input
checks whose messages say what to do. AUPR-In is the average precision with the roles
swapped (inliers positive, scores negated), as in the OOD-detection literature (Hendrycks and
Gimpel, 2017). Ties in ``scores`` are handled as scikit-learn does: all samples sharing a score
are flagged together, so tied scores never earn credit from their order in the input.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import (
    average_precision_score,
    precision_recall_curve,
    roc_auc_score,
    roc_curve,
)

__all__ = ["aupr_in", "aupr_out", "auroc", "evaluate", "fpr_at_95_tpr", "max_f1"]


def _check_inputs(y_true: ArrayLike, scores: ArrayLike, metric: str) -> tuple[np.ndarray, ...]:
    """Validate and convert; returns ``y_true`` as int64 and ``scores`` as float64, both 1-D."""
    y = np.asarray(y_true)
    try:
        s = np.asarray(scores, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"{metric}: scores must be numbers (higher = more anomalous); could not convert "
            f"them to float64 ({exc})."
        ) from exc
    if y.ndim != 1 or s.ndim != 1:
        raise ValueError(
            f"{metric}: y_true and scores must be 1-D arrays of shape (n_samples,); got "
            f"y_true.shape={y.shape} and scores.shape={s.shape}. Use np.ravel for column vectors."
        )
    if y.shape[0] != s.shape[0]:
        raise ValueError(
            f"{metric}: y_true and scores must have the same length; got {y.shape[0]} labels "
            f"and {s.shape[0]} scores."
        )
    if y.shape[0] == 0:
        raise ValueError(f"{metric}: y_true and scores are empty; pass at least two samples.")
    is_binary = y.dtype == bool or (y.dtype.kind in "biuf" and bool(np.all((y == 0) | (y == 1))))
    if not is_binary:
        bad = np.unique(y[~np.isin(y, [0, 1])]) if y.dtype.kind in "biuf" else np.unique(y)
        raise ValueError(
            f"{metric}: y_true must contain only 0 (inlier) and 1 (novel/anomalous, the "
            f"positive class); found other values {bad[:5].tolist()}. Map your labels so "
            f"that 1 marks the novel class, e.g. y_true = (labels == novel_label).astype(int)."
        )
    y = y.astype(np.int64)
    n_novel = int(y.sum())
    if n_novel == 0 or n_novel == y.shape[0]:
        present = "novel (1)" if n_novel else "inlier (0)"
        raise ValueError(
            f"{metric}: y_true contains only {present} samples ({y.shape[0]} of them); "
            f"{metric} needs at least one novel (1) and one inlier (0) sample. Evaluate on a "
            f"set that mixes both."
        )
    bad_rows = np.flatnonzero(~np.isfinite(s))
    if bad_rows.size:
        raise ValueError(
            f"{metric}: scores contains {bad_rows.size} NaN or infinite values (first at index "
            f"{bad_rows[0]}). NaN usually means the detector failed on those rows: fix or "
            f"drop them. For +inf (e.g. -log p(x) with p(x) = 0) clip first, e.g. "
            f"np.nan_to_num(scores, posinf=np.finfo(np.float64).max)."
        )
    return y, s


def auroc(y_true: ArrayLike, scores: ArrayLike) -> float:
    """Area under the ROC curve, novel (1) as the positive class.

    Args:
        y_true: shape (n_samples,); 1 = novel/anomalous (positive), 0 = inlier.
        scores: shape (n_samples,); higher = more anomalous (PyOD ``decision_function``).

    Returns:
        The probability that a random novel sample scores above a random inlier (ties
        count one half): 1.0 is perfect, 0.5 is chance, 0.0 is perfectly reversed.

    Raises:
        ValueError: lengths differ, ``y_true`` not 0/1, one class only, NaN/inf in scores.

    Example:
        >>> auroc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
        0.75
    """
    y, s = _check_inputs(y_true, scores, "auroc")
    return float(roc_auc_score(y, s))


def aupr_out(y_true: ArrayLike, scores: ArrayLike) -> float:
    """Area under the precision-recall curve with novel (1) as the positive class.

    Computed as average precision (``sklearn.metrics.average_precision_score``), the step-wise
    sum ``sum_k (R_k - R_{k-1}) P_k`` with no interpolation. Chance level is the novel share.

    Args:
        y_true: shape (n_samples,); 1 = novel/anomalous (positive), 0 = inlier.
        scores: shape (n_samples,); higher = more anomalous (PyOD ``decision_function``).

    Returns:
        Average precision in [0, 1] for detecting the novel samples.

    Raises:
        ValueError: lengths differ, ``y_true`` not 0/1, one class only, NaN/inf in scores.

    Example:
        >>> round(aupr_out([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]), 4)
        0.8333
    """
    y, s = _check_inputs(y_true, scores, "aupr_out")
    return float(average_precision_score(y, s))


def aupr_in(y_true: ArrayLike, scores: ArrayLike) -> float:
    """Area under the precision-recall curve with the *inliers* (0) as the positive class.

    The input convention is unchanged (1 = novel, higher score = more anomalous); internally
    the labels are flipped and the scores negated, so this measures how well low scores pick
    out inliers. Chance level is the inlier share.

    Args:
        y_true: shape (n_samples,); 1 = novel/anomalous, 0 = inlier (positive *here*).
        scores: shape (n_samples,); higher = more anomalous (PyOD ``decision_function``).

    Returns:
        Average precision in [0, 1] for retrieving the inliers.

    Raises:
        ValueError: lengths differ, ``y_true`` not 0/1, one class only, NaN/inf in scores.

    Example:
        >>> round(aupr_in([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]), 4)
        0.8333
    """
    y, s = _check_inputs(y_true, scores, "aupr_in")
    return float(average_precision_score(1 - y, -s))


def fpr_at_95_tpr(y_true: ArrayLike, scores: ArrayLike) -> float:
    """False-positive rate at the threshold that flags 95% of the novel samples.

    Novel (1) is the positive class. The threshold is the highest one whose true-positive rate
    (share of novel samples with ``score >= threshold``) is at least 0.95; the result is the
    share of inliers with ``score >= threshold``, i.e. the smallest FPR on the ROC curve with
    TPR >= 0.95. Lower is better; 0.0 is perfect.

    Args:
        y_true: shape (n_samples,); 1 = novel/anomalous (positive), 0 = inlier.
        scores: shape (n_samples,); higher = more anomalous (PyOD ``decision_function``).

    Returns:
        FPR in [0, 1].

    Raises:
        ValueError: lengths differ, ``y_true`` not 0/1, one class only, NaN/inf in scores.

    Example:
        >>> fpr_at_95_tpr([0, 0, 0, 0, 1, 1], [0.1, 0.2, 0.3, 0.9, 0.5, 0.8])
        0.25
    """
    y, s = _check_inputs(y_true, scores, "fpr_at_95_tpr")
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    # tpr is non-decreasing along the curve and reaches 1.0, so argmax finds the first hit.
    return float(fpr[np.argmax(tpr >= 0.95)])


def max_f1(y_true: ArrayLike, scores: ArrayLike) -> float:
    """Largest F1 score over all thresholds, novel (1) as the positive class.

    Every distinct score is tried as a threshold (flag ``score >= threshold``), using the
    points of ``sklearn.metrics.precision_recall_curve``; F1 = 2PR / (P + R), taken as 0
    where P + R = 0. An oracle-threshold number: it says what the best cut could achieve.

    Args:
        y_true: shape (n_samples,); 1 = novel/anomalous (positive), 0 = inlier.
        scores: shape (n_samples,); higher = more anomalous (PyOD ``decision_function``).

    Returns:
        Max F1 in (0, 1].

    Raises:
        ValueError: lengths differ, ``y_true`` not 0/1, one class only, NaN/inf in scores.

    Example:
        >>> round(max_f1([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]), 4)
        0.8
    """
    y, s = _check_inputs(y_true, scores, "max_f1")
    precision, recall, _ = precision_recall_curve(y, s)
    denom = precision + recall
    f1 = np.divide(2.0 * precision * recall, denom, out=np.zeros_like(denom), where=denom > 0)
    return float(f1.max())


def evaluate(y_true: ArrayLike, scores: ArrayLike) -> dict[str, float]:
    """All five metrics at once, novel (1) as the positive class.

    Args:
        y_true: shape (n_samples,); 1 = novel/anomalous (positive), 0 = inlier.
        scores: shape (n_samples,); higher = more anomalous (PyOD ``decision_function``).

    Returns:
        ``{"auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr", "max_f1"}`` mapped to plain floats.

    Raises:
        ValueError: lengths differ, ``y_true`` not 0/1, one class only, NaN/inf in scores.

    Example:
        >>> result = evaluate([0, 0, 1, 1], [0.1, 0.2, 0.8, 0.9])
        >>> result
        {'auroc': 1.0, 'aupr_in': 1.0, 'aupr_out': 1.0, 'fpr_at_95_tpr': 0.0, 'max_f1': 1.0}
    """
    y, s = _check_inputs(y_true, scores, "evaluate")
    return {
        "auroc": auroc(y, s),
        "aupr_in": aupr_in(y, s),
        "aupr_out": aupr_out(y, s),
        "fpr_at_95_tpr": fpr_at_95_tpr(y, s),
        "max_f1": max_f1(y, s),
    }
