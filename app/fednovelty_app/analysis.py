"""The numbers behind each page, from a fitted detector and its :class:`DataBundle`.

Conventions (as in ``fednovelty.evaluation``): 1 = novel is the positive class and a
*score* is higher for more anomalous rows (PyOD's ``decision_function``; ``-log p(x)`` for
the mixtures). Pages show mixtures on the ``log p(x)`` axis (flag rows *below* a threshold)
and other detectors on their score axis (flag rows *above*); :func:`score_axis` says which.

Per-client views: a client's test rows are the ones with its id when the source knows them
(synthetic data and uploads), otherwise the whole test set; they are scored with the
client's own mixture weights ``pi_c`` when the detector has them (FedGMM) and with the global
model otherwise.

Components: the most responsible Gaussian of a row and each feature's share of its
Mahalanobis distance come from the detectors' per-component API (``predict_components``,
``explain``; see ``fednovelty.detectors.explain`` for what each detector's components are).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "AdaptationResult",
    "adaptation",
    "client_rows",
    "confusion_at",
    "curves",
    "explain_row",
    "has_components",
    "has_personal_weights",
    "history_frame",
    "is_joint",
    "joint_view",
    "metrics_or_none",
    "most_responsible",
    "novelty_scores",
    "partition_table",
    "per_client_auroc",
    "score_axis",
    "score_rows",
    "scored_test_rows",
    "training_clients",
]


def is_joint(detector) -> bool:
    """Whether the detector is FedGMM's joint model p(x, y) (it learned ``classes_``)."""
    return hasattr(detector, "classes_") and callable(getattr(detector, "log_py_given_x", None))


def has_personal_weights(detector) -> bool:
    """Whether the detector holds one mixture weight vector per client (FedGMM's
    ``client_weights_``, shape (n_clients, n_components)); the kNN markers' per-client
    weights are one number per client."""
    return np.ndim(getattr(detector, "client_weights_", None)) == 2


def score_axis(detector) -> tuple[str, int]:
    """``(axis name, sign)``: the value shown is ``sign * score``; mixtures show ``log p(x)``
    (sign -1), the kNN-distance markers the log of their tail probability (sign -1), other
    detectors their anomaly score (sign +1)."""
    if hasattr(detector, "tail_probability") and hasattr(detector, "history_"):
        return "log tail probability", -1
    if hasattr(detector, "score_samples") and hasattr(detector, "history_"):
        return "log p(x)", -1
    return "anomaly score", 1


def novelty_scores(detector, X, client=None) -> np.ndarray:
    """Anomaly scores (higher = more novel) of rows ``X``; with ``client`` (an id seen in
    fit, or an ``AdaptedClient``) and personal weights, under that client's weights."""
    if client is not None and (has_personal_weights(detector) or not np.isscalar(client)):
        return np.asarray(detector.decision_function(X, client=client), dtype=np.float64)
    return np.asarray(detector.decision_function(X), dtype=np.float64)


def client_rows(bundle, client) -> np.ndarray:
    """Boolean mask of the test rows shown for ``client`` (None: all rows)."""
    if client is None or bundle.groups_test is None:
        return np.ones(bundle.X_test.shape[0], bool)
    return np.asarray(bundle.groups_test == client)


def scored_test_rows(detector, bundle, client=None) -> pd.DataFrame:
    """The test rows of ``client`` (None: pooled) with their scores.

    Returns:
        DataFrame with ``score`` (higher = more novel), ``value`` (what the axis shows:
        ``log p(x)`` or the score), ``novel`` (0/1; -1 where unknown) and ``group``
        (``"normal"``, ``"novel"`` or ``"unknown"``).
    """
    rows = client_rows(bundle, client)
    X = bundle.frame(bundle.X_test[rows])
    scores = novelty_scores(detector, X, client if has_personal_weights(detector) else None)
    _, sign = score_axis(detector)
    if bundle.novel_test is None:
        novel = np.full(scores.shape[0], -1, np.int64)
    else:
        novel = bundle.novel_test[rows].astype(np.int64)
    names = np.array(["unknown", "normal", "novel"])
    return pd.DataFrame(
        {"score": scores, "value": sign * scores, "novel": novel, "group": names[novel + 1]}
    )


def metrics_or_none(novel, scores) -> dict[str, float] | None:
    """``fednovelty.evaluation.evaluate`` (AUROC, AUPR-In, AUPR-Out, FPR@95TPR, Max-F1), or
    None when the labels are unknown or hold one class."""
    from fednovelty.evaluation import evaluate

    novel = np.asarray(novel)
    if novel.size == 0 or (novel < 0).any() or np.unique(novel).size < 2:
        return None
    return evaluate(novel, scores)


def curves(novel, scores) -> dict[str, np.ndarray]:
    """ROC (``fpr``, ``tpr``) and precision-recall (``recall``, ``precision``) points,
    novel = positive, from scikit-learn."""
    from sklearn.metrics import precision_recall_curve, roc_curve

    fpr, tpr, _ = roc_curve(novel, scores)
    precision, recall, _ = precision_recall_curve(novel, scores)
    return {"fpr": fpr, "tpr": tpr, "precision": precision, "recall": recall}


def confusion_at(novel, scores, threshold: float) -> dict[str, int | float]:
    """Counts when rows with ``score > threshold`` are flagged as novel.

    Returns:
        ``{"flagged", "tp", "fp", "fn", "tn", "precision", "recall", "fpr"}`` (rates NaN
        when undefined; without labels (any novel < 0) only ``flagged`` is meaningful).
    """
    novel = np.asarray(novel)
    flag = np.asarray(scores) > threshold
    tp = int(np.sum(flag & (novel == 1)))
    fp = int(np.sum(flag & (novel == 0)))
    fn = int(np.sum(~flag & (novel == 1)))
    tn = int(np.sum(~flag & (novel == 0)))

    def ratio(a, b):
        return a / b if b else float("nan")

    return {
        "flagged": int(flag.sum()),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "precision": ratio(tp, tp + fp),
        "recall": ratio(tp, tp + fn),
        "fpr": ratio(fp, fp + tn),
    }


# ----------------------------------------------------------------------------- joint view
def joint_view(detector, bundle, *, max_rows: int = 1500, seed: int = 0):
    """The FedGMM paper's Figure 2: log p(x) against log p(y|x) for normal test rows (their
    labels), novel inputs (their labels) and the normal rows with labels permuted by a
    derangement of the classes (``fednovelty.datasets.permute_labels``).

    Args:
        detector: FedGMM's joint model, a fitted ``JointFedGMMDetector``.
        bundle: with ``y_test`` and ``novel_test``.
        max_rows: at most this many rows per group (a random subset) for the plot.

    Returns:
        ``(frame, aurocs)``: a DataFrame with ``log_px``, ``log_py_given_x`` and ``group``;
        ``aurocs`` maps ``"novel inputs by log p(x)"``, ``"novel inputs by log p(y|x)"``,
        ``"permuted labels by log p(x)"`` and ``"permuted labels by log p(y|x)"`` to AUROC
        against the normal rows (NaN where a group is empty).
    """
    from fednovelty.datasets import permute_labels
    from fednovelty.evaluation import auroc

    classes = np.asarray(detector.classes_)
    known = np.isin(bundle.y_test, classes)
    rng = np.random.default_rng(seed)
    normal = np.flatnonzero((bundle.novel_test == 0) & known)
    novel = np.flatnonzero((bundle.novel_test == 1) & known)
    normal = np.sort(rng.permutation(normal)[:max_rows])
    novel = np.sort(rng.permutation(novel)[:max_rows])
    codes = np.searchsorted(classes, bundle.y_test[normal])
    permuted, _ = permute_labels(codes, n_classes=classes.size, random_state=seed)
    groups = {
        "normal": (bundle.X_test[normal], bundle.y_test[normal]),
        "novel inputs": (bundle.X_test[novel], bundle.y_test[novel]),
        "permuted labels": (bundle.X_test[normal], classes[permuted]),
    }
    parts = []
    for name, (X, y) in groups.items():
        if X.shape[0] == 0:
            continue
        frame = bundle.frame(X)
        parts.append(
            pd.DataFrame(
                {
                    "log_px": detector.log_px(frame),
                    "log_py_given_x": detector.log_py_given_x(frame, y),
                    "group": name,
                }
            )
        )
    table = pd.concat(parts, ignore_index=True)
    aurocs = {}
    base = table[table.group == "normal"]
    for name in ("novel inputs", "permuted labels"):
        other = table[table.group == name]
        for column, label in (("log_px", "log p(x)"), ("log_py_given_x", "log p(y|x)")):
            key = f"{name} by {label}"
            if base.empty or other.empty:
                aurocs[key] = float("nan")
                continue
            y = np.r_[np.zeros(len(base)), np.ones(len(other))].astype(int)
            aurocs[key] = auroc(y, -np.r_[base[column].to_numpy(), other[column].to_numpy()])
    return table, aurocs


# ----------------------------------------------------------------------------- clients
def partition_table(bundle) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows per client and group for the dot plot (``fednovelty.datasets.partition_counts``).

    Returns:
        ``(counts (n_clients, n_groups), client_ids (n_clients,), group_values (n_groups,))``;
        clients held out of training are included (their normal rows).
    """
    from fednovelty.datasets import partition_counts

    ids = np.unique(bundle.partition_clients)
    parts = [np.flatnonzero(bundle.partition_clients == c) for c in ids]
    counts, values = partition_counts(parts, bundle.partition_labels)
    return counts, ids, values


def per_client_auroc(detector, bundle) -> pd.DataFrame | None:
    """AUROC of each training client's view of the test set (see the module doc).

    Returns:
        DataFrame with ``client``, ``auroc`` (NaN if its rows hold one class), ``n_rows``,
        ``n_novel`` and ``weights`` (``"own pi_c"`` or ``"global"``); None when every
        client would see the same numbers (no personal weights, no per-client test rows) or
        nothing is known about novelty.
    """
    if bundle.novel_test is None:
        return None
    personal = has_personal_weights(detector) and len(detector.client_weights_) == len(
        bundle.client_ids
    )
    if not personal and bundle.groups_test is None:
        return None
    rows = []
    for client in bundle.client_ids:
        mask = client_rows(bundle, client)
        X = bundle.frame(bundle.X_test[mask])
        novel = bundle.novel_test[mask]
        scores = novelty_scores(detector, X, client if personal else None)
        result = metrics_or_none(novel, scores)
        rows.append(
            {
                "client": str(client),
                "auroc": np.nan if result is None else result["auroc"],
                "n_rows": int(mask.sum()),
                "n_novel": int(novel.sum()),
                "weights": "own pi_c" if personal else "global",
            }
        )
    return pd.DataFrame(rows)


def history_frame(detector) -> pd.DataFrame | None:
    """One row per communication round (``history_``): ``round``, ``kind``, ``bytes_up``,
    ``bytes_down``, ``seconds`` and, where reported, ``mean_log_likelihood``; None for a
    detector that never communicated."""
    history = getattr(detector, "history_", None)
    if not history:
        return None
    frame = pd.DataFrame(history)
    keep = [
        c
        for c in ("round", "kind", "bytes_up", "bytes_down", "seconds", "mean_log_likelihood")
        if c in frame
    ]
    return frame[keep]


# ----------------------------------------------------------------------------- unseen client
@dataclass(frozen=True)
class AdaptationResult:
    """Before (global weights) and after (``adapt``) numbers for one unseen client.

    Attributes:
        n_samples: rows adaptation used; labelled: whether their labels were used.
        auroc_before, auroc_after: AUROC on the client's evaluation rows (NaN if undefined).
        accuracy_before, accuracy_after: label accuracy on its normal evaluation rows (joint
            models; NaN otherwise).
        trace: (n_iter + 1, n_components) Gaussian weights after each EM iteration (row 0 =
            the global weights); n_iter, converged: the EM run.
        weights: (n_components,) the adapted Gaussian weights.
    """

    n_samples: int
    labelled: bool
    auroc_before: float
    auroc_after: float
    accuracy_before: float
    accuracy_after: float
    trace: np.ndarray
    n_iter: int
    converged: bool
    weights: np.ndarray


def adaptation(
    detector, bundle, client_id, n_samples: int, *, use_labels: bool = True
) -> AdaptationResult:
    """Adapt the mixture weights to an unseen client's first ``n_samples`` adaptation rows
    (``adapt`` of FedGMM's detectors: only ``pi`` is re-estimated) and compare with the global
    weights on its evaluation rows.

    Raises:
        ValueError: the detector cannot adapt (FedGMM / DEM / CentralGMM can),
            ``n_samples < 2``, or an unknown client.
    """
    if not hasattr(detector, "adapt"):
        raise ValueError(
            f"{type(detector).__name__} cannot adapt to a new client; train FedGMM or DEM."
        )
    client = bundle.unseen_client(client_id)
    n = int(min(n_samples, client.X_adapt.shape[0]))
    X = bundle.frame(client.X_adapt[:n])
    joint = is_joint(detector)
    labelled = joint and use_labels and client.y_adapt is not None
    adapted = detector.adapt(X, client.y_adapt[:n]) if labelled else detector.adapt(X)
    X_eval = bundle.frame(client.X_eval)
    before = novelty_scores(detector, X_eval)
    after = novelty_scores(detector, X_eval, adapted)
    m_before = metrics_or_none(client.novel_eval, before)
    m_after = metrics_or_none(client.novel_eval, after)
    acc_before = acc_after = float("nan")
    if joint and client.y_eval is not None:
        normal = client.novel_eval == 0
        X_norm, y_norm = bundle.frame(client.X_eval[normal]), client.y_eval[normal]
        acc_before = float(np.mean(detector.predict_y(X_norm) == y_norm))
        acc_after = float(np.mean(detector.predict_y(X_norm, client=adapted) == y_norm))
    trace = adapted.trace
    weights = adapted.weights
    if trace.ndim == 3:  # joint (M1, M2) weights: the Gaussians' share
        trace, weights = trace.sum(axis=2), weights.sum(axis=1)
    return AdaptationResult(
        n_samples=n,
        labelled=labelled,
        auroc_before=float("nan") if m_before is None else m_before["auroc"],
        auroc_after=float("nan") if m_after is None else m_after["auroc"],
        accuracy_before=acc_before,
        accuracy_after=acc_after,
        trace=trace,
        n_iter=adapted.n_iter,
        converged=adapted.converged,
        weights=weights,
    )


# ----------------------------------------------------------------------------- components
def has_components(detector) -> bool:
    """Whether the detector has fednovelty's per-component API (its mixture detectors do;
    PyOD baselines do not)."""
    return callable(getattr(detector, "explain", None)) and hasattr(detector, "history_")


def training_clients(detector, values) -> list:
    """The client id seen in fit that each of ``values`` names, compared as text (an uploaded
    column may hold ``"3"`` for client ``3``), or None where no training client matches."""
    known = {str(c): c for c in np.asarray(getattr(detector, "client_ids_", [])).tolist()}
    return [known.get(str(value)) for value in values]


def most_responsible(detector, X, clients=None) -> np.ndarray | None:
    """Index of the most responsible component of each row (``predict_components``), or
    None for a detector without components (PyOD baselines).

    Args:
        detector: a fitted detector.
        X: (n_samples, n_features) rows, array or DataFrame with the model's names.
        clients: optional (n_samples,) ids seen in fit (None entries: the model's weights);
            rows of a client are weighted by its personal ``pi_c`` (FedGMM).
    """
    if not has_components(detector):
        return None
    labels = np.asarray(detector.predict_components(X), dtype=np.int64)
    if clients is not None and has_personal_weights(detector):
        for client, rows in _rows_by_client(clients):
            labels[rows] = detector.predict_components(_take(X, rows), client=client)
    return labels


def explain_row(detector, bundle, row: int, client=None) -> dict | None:
    """Why one test row of ``client``'s view (None: pooled) scores as it does:
    ``detector.explain`` of that row under the view's weights (its own ``pi_c`` where the
    model has them).

    Args:
        row: position of the row among the view's rows (as in :func:`scored_test_rows`).

    Returns:
        ``{"component", "responsibility", "mahalanobis_sq", "shares"}`` with ``shares`` a
        Series of each feature's share of the squared Mahalanobis distance (summing to 1,
        negative possible with correlated features), or None for a detector without
        components.
    """
    if not has_components(detector):
        return None
    X = bundle.X_test[client_rows(bundle, client)]
    if not 0 <= row < X.shape[0]:
        raise ValueError(f"row must be in [0, {X.shape[0] - 1}], got {row}.")
    personal = client if client is not None and has_personal_weights(detector) else None
    table = detector.explain(bundle.frame(X[row : row + 1]), client=personal)
    first = table.iloc[0]
    return {
        "component": int(first["component"]),
        "responsibility": float(first["responsibility"]),
        "mahalanobis_sq": float(first["mahalanobis_sq"]),
        "shares": first.iloc[3:].astype(np.float64),
    }


# ----------------------------------------------------------------------------- new rows
def _take(X, rows):
    return X.iloc[rows] if hasattr(X, "iloc") else np.asarray(X)[rows]


def _rows_by_client(clients) -> list[tuple[object, np.ndarray]]:
    """``(client id, row positions)`` for every client id in ``clients`` (None skipped)."""
    rows: dict = {}
    for position, client in enumerate(clients):
        if client is not None:
            rows.setdefault(client, []).append(position)
    return [(client, np.asarray(positions)) for client, positions in rows.items()]


def score_rows(
    detector, X, *, clients=None, labels=None, threshold: float | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """Score new rows (the Score your data page).

    Args:
        detector: a fitted detector.
        X: rows, a DataFrame with the model's feature names or an array.
        clients: optional (n_samples,) client ids: rows of a client seen in fit are scored
            with its personal weights (FedGMM), others with the global weights.
        labels: optional (n_samples,) class labels: adds ``log_py_given_x`` (joint models).
        threshold: flag rows whose anomaly score is above it (default the detector's
            ``threshold_``).

    Returns:
        ``(table, notes)``: columns ``log_px`` (mixtures), ``log_py_given_x`` (joint, with
        labels), ``anomaly_score``, ``flag`` (1 = novel) and ``component`` (most responsible
        Gaussian, where defined); notes explain anything skipped.
    """
    notes: list[str] = []
    n = len(X)
    scores = np.asarray(detector.decision_function(X), dtype=np.float64)
    personal = has_personal_weights(detector)
    own = None
    if clients is not None and not personal:
        notes.append("the model has no per-client weights; every row uses the global model.")
    elif clients is not None:
        own = training_clients(detector, clients)
        unknown = sorted({str(c) for c, i in zip(clients, own, strict=True) if i is None})
        if unknown:
            notes.append(
                f"client(s) {', '.join(unknown[:5])} were not in training; their rows use the "
                "global weights."
            )
        for client, rows in _rows_by_client(own):
            scores[rows] = novelty_scores(detector, _take(X, rows), client)
    table = pd.DataFrame(index=range(n))
    if score_axis(detector)[1] == -1:
        table["log_px"] = -scores
    if labels is not None:
        if is_joint(detector):
            known = np.isin(labels, detector.classes_)
            values = np.full(n, np.nan)
            if known.any():
                part = _take(X, np.flatnonzero(known))
                values[known] = detector.log_py_given_x(part, np.asarray(labels)[known])
            if not known.all():
                notes.append(
                    f"{int((~known).sum())} row(s) have labels the model never saw; their "
                    "log p(y|x) is empty."
                )
            table["log_py_given_x"] = values
        else:
            notes.append("the model was trained without labels, so there is no log p(y|x).")
    table["anomaly_score"] = scores
    cut = float(detector.threshold_ if threshold is None else threshold)
    table["flag"] = (scores > cut).astype(int)
    component = most_responsible(detector, X, own)
    if component is None:
        notes.append("this model has no Gaussian components, so no responsible component.")
    else:
        table["component"] = component
    return table, notes
