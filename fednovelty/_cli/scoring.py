"""``fednovelty score``'s table: each row's ``log p(x)``, anomaly score and label, under its
client's own model when ``--client-column`` names the clients and the detector has one.

A detector has a model per client when it holds personal mixture weights
(``FedGMMDetector`` with ``mixture_weights="personal"``, ``ClusteredGMMDetector``: their
``client_weights_``) or one mixture per client (``LocalGMMDetector``: ``client_models_``).
A row whose client was not seen in training (or, for ``LocalGMMDetector``, was left out of
it for too few rows) is scored with the detector's global model, and the command warns
once, naming those clients; so is every row of a detector with one global model only
(``FedGenGMM``, ``DEM-*``, ``CentralGMM``, ...), with a warning that says so. ``is_anomaly``
compares each row's anomaly score with the detector's ``threshold_``, set on the training
rows' global scores.

A detector fitted with ``calibration="conformal"`` adds a ``p_value`` column (its conformal
p-value: small = unlike the calibration rows) and sets ``is_anomaly`` by the row's client's
own threshold (``predict(X, client=...)``; a client without one, or no ``--client-column``:
the federation's threshold); ``--fdr q`` adds ``discovery``, Benjamini-Hochberg at false
discovery rate ``q`` over the file's rows as one batch (:func:`conformal_columns`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "client_key",
    "conformal_columns",
    "personal_scorer",
    "score_table",
    "unseen_message",
]


def personal_scorer(detector) -> Callable | None:
    """``f(X, client) -> log p_c(x)`` (n_samples,) under one client's own model, or None when
    ``detector`` has only a global model."""
    if hasattr(detector, "client_models_") and hasattr(detector, "score_samples_client"):
        return detector.score_samples_client
    if hasattr(detector, "client_weights_"):
        if hasattr(detector, "score_samples_client"):
            return detector.score_samples_client
        return lambda X, client: -np.asarray(detector.decision_function(X, client=client))
    return None


def client_key(value: object, known: list) -> object | None:
    """The id of ``known`` (the detector's ``client_ids_``) that ``value`` names, matched as
    is or by its text (a CSV column may read ``7`` where training read ``"7"``); None when
    it names none."""
    if isinstance(value, np.generic):
        value = value.item()
    if value in known:
        return value
    by_text = {str(client): client for client in known}
    return by_text.get(str(value))


def _has_own_model(detector, client) -> bool:
    """Whether ``client`` (a known id) has a model of its own (``LocalGMMDetector`` leaves a
    client with too few rows out of ``client_models_``)."""
    fitted = getattr(detector, "client_n_components_", None)
    return fitted is None or client in fitted


def unseen_message(unseen: list[str]) -> str:
    """The warning for the clients ``unseen`` (names) whose rows the global model scored."""
    shown = ", ".join(map(repr, unseen[:10])) + (", ..." if len(unseen) > 10 else "")
    return (
        f"{len(unseen)} client(s) have no model of their own ({shown}: not seen in "
        "training, or left out of it for too few rows); their rows are scored with "
        "the global model."
    )


def score_table(
    detector,
    frame: pd.DataFrame,
    clients: pd.Series | None,
    warn: Callable[[str], None],
    unseen_clients: Callable[[list[str]], None] | None = None,
) -> pd.DataFrame:
    """``log_px``, ``anomaly_score`` and ``is_anomaly`` of each row of ``frame`` (n_samples,
    n_features), shape (n_samples, 3): the detector's ``score_samples``,
    ``decision_function`` and ``predict``; with ``clients`` (n_samples,), each row under its
    client's own model where the detector has one (``anomaly_score`` is then ``-log_px`` and
    ``is_anomaly`` compares it with ``threshold_``). ``warn`` receives one line per thing
    the user should know (a fallback to the global model); ``unseen_clients``, if given,
    receives the names of the clients scored with the global model instead (a caller that
    scores a file in chunks warns once for all of them, :func:`unseen_message`)."""
    import pandas as pd

    from fednovelty.detectors._probability import outlier_labels

    log_px = np.asarray(detector.score_samples(frame), dtype=np.float64)
    anomaly = np.asarray(detector.decision_function(frame), dtype=np.float64)
    labels = np.asarray(detector.predict(frame))
    scorer = personal_scorer(detector) if clients is not None else None
    if clients is not None and scorer is None:
        warn(
            f"{type(detector).__name__} has one global model and no model per client: every "
            "row is scored with it (--client-column only labels the rows)."
        )
    if scorer is not None:
        known = list(np.asarray(detector.client_ids_).tolist())
        values = clients.to_numpy()
        unseen: list[str] = []
        for value in pd.unique(values):
            key = client_key(value, known)
            if key is None or not _has_own_model(detector, key):
                unseen.append(str(value))
                continue
            rows = np.flatnonzero(values == value)
            log_px[rows] = scorer(frame.iloc[rows], key)
            anomaly[rows] = -log_px[rows]
            labels[rows] = outlier_labels(anomaly[rows], detector.threshold_)
        if unseen and unseen_clients is not None:
            unseen_clients(unseen)
        elif unseen:
            warn(unseen_message(unseen))
    return pd.DataFrame({"log_px": log_px, "anomaly_score": anomaly, "is_anomaly": labels})


def is_conformal(detector) -> bool:
    """Whether ``detector`` was fitted with ``calibration="conformal"`` (it has per-client
    thresholds)."""
    return getattr(detector, "calibration", None) == "conformal" and hasattr(
        detector, "client_thresholds_"
    )


def conformal_columns(
    detector, frame: pd.DataFrame, clients: pd.Series | None, fdr: float | None
) -> dict[str, np.ndarray]:
    """``p_value`` and ``is_anomaly`` (n_samples,) of a conformal detector's rows, each row
    under its client's threshold and p-values where the detector holds that client's
    (``client_thresholds_``), else the federation's; with ``fdr``, ``discovery``:
    Benjamini-Hochberg at ``fdr`` over all the rows' p-values."""
    from fednovelty.federated.core.conformal import benjamini_hochberg

    n = len(frame)
    p_values = np.empty(n, dtype=np.float64)
    alarms = np.empty(n, dtype=np.int64)
    known = list(detector.client_thresholds_)
    keys = (
        np.full(n, None, dtype=object)
        if clients is None
        else np.array([client_key(v, known) for v in clients.to_numpy()], dtype=object)
    )
    by_client: dict = {}
    for row, key in enumerate(keys.tolist()):
        by_client.setdefault(key, []).append(row)
    for key, rows in by_client.items():
        part = frame.iloc[rows]
        p_values[rows] = detector.p_values(part, client=key)
        alarms[rows] = detector.predict(part, client=key)
    out = {"p_value": p_values, "is_anomaly": alarms}
    if fdr is not None:
        out["discovery"] = benjamini_hochberg(p_values, fdr).astype(np.int64)
    return out
