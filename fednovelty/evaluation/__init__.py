"""Evaluation: novelty-detection metrics (positive class = novel, higher score = more anomalous).

Every function takes ``(y_true, scores)`` with ``y_true`` of shape ``(n_samples,)``, 1 = novel /
anomalous (the positive class) and 0 = inlier, and ``scores`` of shape ``(n_samples,)`` where
higher means more anomalous (PyOD's ``decision_function``).
"""

from fednovelty.evaluation.metrics import (
    aupr_in,
    aupr_out,
    auroc,
    evaluate,
    fpr_at_95_tpr,
    max_f1,
)

__all__ = ["aupr_in", "aupr_out", "auroc", "evaluate", "fpr_at_95_tpr", "max_f1"]
