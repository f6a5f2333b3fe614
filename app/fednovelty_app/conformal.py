"""The numbers the pages show for a detector fitted with ``calibration="conformal"``.

Such a detector holds one alarm threshold per client (``client_thresholds_``, from the
client's held-out calibration rows; ``calibration_sources_`` says whether it is the client's
own or the federation's), the federation's threshold (``threshold_``), conformal p-values
(``p_values``) and ``calibrate`` for a client that brings rows of its own. Everything here
uses those public methods and attributes only.

- :func:`threshold_table`: each client's threshold and the share of its normal test rows it
  flags (the achieved false-alarm rate, with an exact 95 % interval), beside ``alpha``.
- :func:`view_p_values`, :func:`p_value_grid`, :func:`p_value_edges`: the p-values of a
  Scores view's test rows, each against its own client's calibration, and histogram bins
  fitted to the values a conformal p-value can take (exactly uniform p-values then look
  flat; see :func:`p_value_edges`).
- :func:`unseen_alarms`: a held-out client's false-alarm rate under the federation's
  threshold and under its own after ``calibrate`` with its first rows.
- :func:`row_alarms`: uploaded rows' p-values and alarms, each row by its client's
  threshold (the federation's for a row without one), as ``fednovelty score`` does.

Client ids are matched by value or by their text (an uploaded column may read ``"3"`` where
training read ``3``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pandas as pd
from fednovelty_app.analysis import _take, client_rows

__all__ = [
    "FEDERATION",
    "UnseenAlarms",
    "is_conformal",
    "p_value_edges",
    "p_value_grid",
    "row_alarms",
    "threshold_key",
    "threshold_table",
    "unseen_alarms",
    "view_p_values",
]

#: The threshold table's row for the federation's threshold (``threshold_``).
FEDERATION = "(federation)"


def is_conformal(detector) -> bool:
    """Whether ``detector`` was fitted with ``calibration="conformal"`` (it holds per-client
    thresholds); False for PyOD baselines and contamination fits."""
    return getattr(detector, "calibration", None) == "conformal" and hasattr(
        detector, "client_thresholds_"
    )


def threshold_key(detector, value):
    """The key of ``detector.client_thresholds_`` that ``value`` names, as is or by its text;
    None when ``value`` is None or names no client with a threshold."""
    if value is None:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    known = list(detector.client_thresholds_)
    if value in known:
        return value
    return {str(key): key for key in known}.get(str(value))


def _rate(flags: np.ndarray) -> dict:
    """Rows, false alarms, their share and its exact (Clopper-Pearson) 95 % interval."""
    from scipy.stats import binomtest

    n, k = int(flags.size), int(np.sum(flags))
    if n == 0:
        nan = float("nan")
        return {"normal test rows": 0, "false alarms": 0, "false-alarm rate": nan,
                "95 % low": nan, "95 % high": nan}  # fmt: skip
    interval = binomtest(k, n).proportion_ci(0.95, method="exact")
    return {"normal test rows": n, "false alarms": k, "false-alarm rate": k / n,
            "95 % low": float(interval.low), "95 % high": float(interval.high)}  # fmt: skip


def threshold_table(detector, bundle) -> pd.DataFrame:
    """One row per client with a threshold, then the federation's (``FEDERATION``).

    A client's achieved false-alarm rate is the share of its normal test rows that
    ``predict(X, client=c)`` flags: the test rows it holds (``bundle.groups_test``), which
    never trained nor calibrated. The federation's row flags all normal test rows with
    ``predict(X)``. Rates are NaN where there are no such rows (a pooled test set has none
    per client; data without novelty labels have none).

    Returns:
        DataFrame (n_clients + 1 rows): ``client`` (text), ``calibration rows``, ``source``
        (``calibration_sources_``: own / private / federation / calibrated), ``threshold``
        (an alarm is ``score > threshold``), ``normal test rows``, ``false alarms``,
        ``false-alarm rate``, ``95 % low`` / ``95 % high`` (its exact binomial interval) and
        ``alpha``.
    """
    alpha = float(detector.alpha)
    normal = None if bundle.novel_test is None else np.asarray(bundle.novel_test) == 0
    groups = None if bundle.groups_test is None else np.asarray(bundle.groups_test).astype(str)
    rows = []
    for client, threshold in detector.client_thresholds_.items():
        flags = np.empty(0, np.int64)
        if normal is not None and groups is not None:
            mask = normal & (groups == str(client))
            if mask.any():
                X = bundle.frame(bundle.X_test[mask])
                flags = np.asarray(detector.predict(X, client=client))
        rows.append({"client": str(client),
                     "calibration rows": int(detector.calibration_rows_[client]),
                     "source": detector.calibration_sources_[client],
                     "threshold": float(threshold), **_rate(flags)})  # fmt: skip
    flags = np.empty(0, np.int64)
    if normal is not None and normal.any():
        flags = np.asarray(detector.predict(bundle.frame(bundle.X_test[normal])))
    released = float(np.sum(detector.calibration_counts_))
    rows.append({"client": FEDERATION, "calibration rows": round(released),
                 "source": "federation", "threshold": float(detector.threshold_),
                 **_rate(flags)})  # fmt: skip
    table = pd.DataFrame(rows)
    table["alpha"] = alpha
    return table


def view_p_values(detector, bundle, client=None) -> tuple[pd.DataFrame, int | None]:
    """Conformal p-values of a Scores view's test rows (``analysis.client_rows``), each
    against its client's calibration histogram (:func:`row_alarms`): a client's view
    against ``client``'s; the pooled view (``client=None``) each row against its own
    client's where the test rows' clients are known (``bundle.groups_test``), else all
    against the federation's. A client without a histogram of its own uses the
    federation's.

    Returns:
        ``(frame, grid)``: DataFrame (n_rows,) with ``p_value`` and ``group`` (normal /
        novel / unknown); ``grid`` the p-values' common :func:`p_value_grid` (None when
        the histograms used differ in it or have none).
    """
    rows = client_rows(bundle, client)
    X = bundle.frame(bundle.X_test[rows])
    if client is None and bundle.groups_test is not None:
        owners = list(np.asarray(bundle.groups_test)[rows])
    else:
        owners = [client] * len(X)
    table, _ = row_alarms(detector, X, owners)
    grids = {p_value_grid(detector, key) for key in {threshold_key(detector, o) for o in owners}}
    if bundle.novel_test is None:
        novel = np.full(len(X), -1, np.int64)
    else:
        novel = np.asarray(bundle.novel_test)[rows].astype(np.int64)
    names = np.array(["unknown", "normal", "novel"])
    frame = pd.DataFrame({"p_value": table.p_value.to_numpy(), "group": names[novel + 1]})
    return frame, grids.pop() if len(grids) == 1 else None


def p_value_grid(detector, client=None) -> int | None:
    """``n + 1`` when the p-values against ``client``'s histogram (None or a client without
    one: the federation's) lie on ``{1, ..., n + 1} / (n + 1)``: its counts are whole
    numbers summing to ``n``. None when they are not (noise of differential privacy, or a
    calibrated client's counts mixed with the federation's)."""
    key = threshold_key(detector, client)
    counts = detector.calibration_counts_
    if key is not None:
        counts = detector.client_calibration_counts_.get(key, counts)
    counts = np.asarray(counts, dtype=np.float64)
    if not np.allclose(counts, np.round(counts), rtol=0.0, atol=1e-9):
        return None
    return round(float(counts.sum())) + 1


def p_value_edges(grid: int | None, n_bins: int = 20) -> np.ndarray:
    """Bin edges on [0, 1], shape (B + 1,), for a histogram of conformal p-values.

    A conformal p-value takes the values ``j / grid``, ``j = 1..grid``; equal-width bins
    would hold unequally many of them (21 values in 20 bins: one bin holds two), so exactly
    uniform p-values would not look flat. With ``grid``, the edges are ``c_i / grid`` with
    ``c_i = floor(i * grid / B + 1/2)`` and ``B = min(n_bins, grid)``: each bin (right-closed)
    holds a run of the values and is as wide as their share, so a density over these bins
    is 1 in every bin for exactly uniform p-values. Without ``grid``: ``n_bins`` equal bins.

    Raises:
        ValueError: ``grid`` or ``n_bins`` below 1.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1; got {n_bins}.")
    if grid is None:
        return np.linspace(0.0, 1.0, n_bins + 1)
    if grid < 1:
        raise ValueError(f"grid must be >= 1 (the p-values' denominator n + 1); got {grid}.")
    bins = min(n_bins, int(grid))
    cuts = (2 * np.arange(bins + 1) * int(grid) + bins) // (2 * bins)
    return cuts / float(grid)


@dataclass(frozen=True)
class UnseenAlarms:
    """A held-out client's alarms before and after ``calibrate`` (:func:`unseen_alarms`).

    Attributes:
        n_calibration: its rows given to ``calibrate``; n_normal: its other normal rows,
            on which the rates are measured; n_novel: the novel rows it is evaluated with.
        alpha: the detector's ``alpha``.
        threshold_before: the federation's ``threshold_``; threshold_after: the client's
            after ``calibrate``.
        false_alarm_before, false_alarm_after: share of the ``n_normal`` rows flagged.
        detected_before, detected_after: share of the novel rows flagged (NaN without).
    """

    n_calibration: int
    n_normal: int
    n_novel: int
    alpha: float
    threshold_before: float
    threshold_after: float
    false_alarm_before: float
    false_alarm_after: float
    detected_before: float
    detected_after: float


def unseen_alarms(detector, bundle, client_id, n_rows: int) -> UnseenAlarms:
    """Calibrate a held-out client on its first ``n_rows`` normal rows (its adaptation rows,
    then its other normal rows) and measure on the rest: the federation's threshold
    (``predict(X)``) before, its own (``predict(X, client=client_id)``) after. ``calibrate``
    runs on a shallow copy of ``detector`` (it replaces the copy's threshold dicts): the
    detector given is not changed.

    Raises:
        ValueError: not a conformal detector, an unknown client, or ``n_rows`` outside
            ``[1, n_normal - 1]`` (some rows must be left to measure on).
    """
    if not is_conformal(detector):
        raise ValueError(
            f"{type(detector).__name__} was not fitted with calibration='conformal'; "
            "choose 'conformal' alarms on the Train page."
        )
    client = bundle.unseen_client(client_id)
    normal = np.vstack([client.X_adapt, client.X_eval[client.novel_eval == 0]])
    if not 1 <= n_rows < normal.shape[0]:
        raise ValueError(
            f"n_rows must be in [1, {normal.shape[0] - 1}] (client {client_id!r} has "
            f"{normal.shape[0]} normal rows, some left to measure on); got {n_rows}."
        )
    novel = bundle.frame(client.X_eval[client.novel_eval == 1])
    rest = bundle.frame(normal[n_rows:])
    calibrated = copy.copy(detector).calibrate(bundle.frame(normal[:n_rows]), client_id)
    key = threshold_key(calibrated, client_id)

    def share(flags) -> float:
        flags = np.asarray(flags)
        return float(flags.mean()) if flags.size else float("nan")

    has_novel, nan = len(novel) > 0, float("nan")
    return UnseenAlarms(
        n_calibration=int(n_rows),
        n_normal=len(rest),
        n_novel=len(novel),
        alpha=float(detector.alpha),
        threshold_before=float(detector.threshold_),
        threshold_after=float(calibrated.client_thresholds_[key]),
        false_alarm_before=share(detector.predict(rest)),
        false_alarm_after=share(calibrated.predict(rest, client=key)),
        detected_before=share(detector.predict(novel)) if has_novel else nan,
        detected_after=share(calibrated.predict(novel, client=key)) if has_novel else nan,
    )


def row_alarms(detector, X, clients=None) -> tuple[pd.DataFrame, list[str]]:
    """``p_value`` and ``alarm`` (1 = novel) of new rows, each row by its client's threshold
    and histogram (``p_values`` / ``predict`` with ``client=``) where the detector holds
    one for it, else by the federation's.

    Args:
        X: (n_samples, n_features) rows, a DataFrame with the model's names or an array.
        clients: optional (n_samples,) client id of each row.

    Returns:
        ``(table, notes)``: table (n_samples, 2); notes name clients without a threshold.
    """
    n = len(X)
    keys = [None] * n if clients is None else [threshold_key(detector, c) for c in clients]
    positions: dict = {}
    for row, key in enumerate(keys):
        positions.setdefault(key, []).append(row)
    p_values = np.empty(n, dtype=np.float64)
    alarms = np.empty(n, dtype=np.int64)
    for key, rows in positions.items():
        part = _take(X, np.asarray(rows))
        p_values[rows] = detector.p_values(part, client=key)
        alarms[rows] = detector.predict(part, client=key)
    notes = []
    if clients is not None:
        unknown = sorted({str(c) for c, k in zip(clients, keys, strict=True) if k is None})
        if unknown:
            notes.append(
                f"client(s) {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''} "
                "have no conformal threshold of their own; their rows' p-values and alarms "
                "use the federation's."
            )
    return pd.DataFrame({"p_value": p_values, "alarm": alarms}), notes
