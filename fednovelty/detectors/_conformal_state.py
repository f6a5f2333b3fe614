"""What a conformal calibration (``calibration="conformal"``,
:mod:`fednovelty.detectors._conformal`) saves, and its checks on load.

``save`` writes the bin edges (``calibration.edges``, (B + 1,)), the federation's histogram
(``calibration.counts``, (B + 2,)), every client's threshold (``calibration.thresholds``)
and the histograms of the clients that have their own (``calibration.client_counts``, one row
each), with the clients' ids, held-out rows and the source of each threshold as JSON
(``calibration_clients``, ``calibration_rows_``, ``calibration_sources_``); never a score.
``threshold_`` is not saved: it is recomputed from the federation's histogram.

A loaded calibration is checked for meaning (``ModelFormatError`` naming the tensor or
attribute): the edges are the public grid (their first edge plus the fixed offsets); counts
are finite and non-negative, whole and at most the clients' held-out rows without
differential privacy; a threshold agrees with its source (:data:`SOURCES`): the federation's
is ``threshold_`` itself, a client's own lies in the bin of its histogram that holds its
order statistic (a histogram of whole rows adding up to its ``calibration_rows_``), a
private one is a grid point, a calibrated client's histogram adds up to its rows plus the
federation's pseudo-rows, and a client with a threshold of its own has the rows ``alpha``
needs for one.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fednovelty.detectors.persistence import check_items, check_positive, get_attr, get_tensor
from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.core.conformal import (
    calibration_edges,
    histogram_threshold,
    min_calibration_rows,
)

__all__ = ["FITTED", "SOURCES", "calibration_state", "client_key", "restore_calibration"]

#: where a client's threshold comes from (``calibration_sources_``): its own held-out rows
#: (``"own"``), their private quantile (``"private"``), the federation's (``"federation"``:
#: too few rows of its own) or ``calibrate`` (``"calibrated"``).
SOURCES = ("own", "private", "federation", "calibrated")
#: the fitted attributes of a conformal calibration (removed by a contamination fit).
FITTED = (
    "client_thresholds_",
    "calibration_rows_",
    "calibration_sources_",
    "calibration_edges_",
    "calibration_counts_",
    "client_calibration_counts_",
    "calibration_index_",
)
_THRESHOLDS = "the tensor 'calibration.thresholds'"


def client_key(client):
    """A client id as the calibration's dictionaries hold it (a Python number or string).

    Raises:
        ValueError: anything else (e.g. an ``adapt`` handle), saying what to pass.
    """
    if isinstance(client, np.generic):
        client = client.item()
    if isinstance(client, bool) or not isinstance(client, int | float | str):
        raise ValueError(
            f"client must be a client id (a number or a string, as in groups); got "
            f"{type(client).__name__} {client!r}."
        )
    return client


def calibration_state(detector) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and JSON attributes ``save`` writes for ``detector``'s calibration (the
    module doc); none with ``calibration="contamination"``.

    Raises:
        ValueError: ``calibration`` changed (``set_params``) since the fit.
    """
    fitted = hasattr(detector, "client_thresholds_")
    if fitted != (getattr(detector, "calibration", "contamination") == "conformal"):
        raise ValueError("calibration was changed after fit (set_params); fit again before saving.")
    if not fitted:
        return {}, {}
    clients = list(detector.client_thresholds_)
    thresholds = [detector.client_thresholds_[c] for c in clients]
    tensors = {
        "calibration.edges": torch.as_tensor(detector.calibration_edges_, dtype=torch.float64),
        "calibration.counts": torch.as_tensor(detector.calibration_counts_, dtype=torch.float64),
        "calibration.thresholds": torch.as_tensor(thresholds, dtype=torch.float64),
    }
    own = [c for c in clients if c in detector.client_calibration_counts_]
    if own:
        stacked = np.stack([detector.client_calibration_counts_[c] for c in own])
        tensors["calibration.client_counts"] = torch.as_tensor(stacked, dtype=torch.float64)
    attrs = {
        "calibration_clients": clients,
        "calibration_rows_": [detector.calibration_rows_[c] for c in clients],
        "calibration_sources_": [detector.calibration_sources_[c] for c in clients],
    }
    return tensors, attrs


def restore_calibration(tensors, attrs, alpha: float, fitted: list, private: bool) -> dict:
    """The fitted calibration attributes (``threshold_`` among them) from a saved file's
    ``calibration.*`` tensors and attributes, for the clients ``fitted`` (``client_ids_``)
    at ``alpha``; ``private``: a differentially private fit.

    Raises:
        ModelFormatError: naming what is missing, damaged or inconsistent (the module doc).
    """
    edges = _edges(tensors)
    width = edges.size + 1
    federation = get_tensor(tensors, "calibration.counts", (width,)).double()
    check_positive(
        federation, "the tensor 'calibration.counts'", "counts are rows", allow_zero=True
    )
    clients, rows, sources = _clients(attrs, fitted)
    thresholds = get_tensor(tensors, "calibration.thresholds", (len(clients),), allow_inf=True)
    own = [c for c, s in zip(clients, sources, strict=True) if s in ("own", "calibrated")]
    counts = {}
    if own or "calibration.client_counts" in tensors:
        stacked = get_tensor(tensors, "calibration.client_counts", (len(own), width)).double()
        check_positive(
            stacked, "the tensor 'calibration.client_counts'", "counts are rows", allow_zero=True
        )
        counts = {c: stacked[i].numpy() for i, c in enumerate(own)}
    counted = federation.numpy()
    whole = bool((federation == federation.round()).all())
    if not private and (not whole or counted.sum() > sum(rows[: len(fitted)])):
        raise ModelFormatError(
            "the tensor 'calibration.counts' must count at most the clients' "
            "'calibration_rows_' in whole rows."
        )
    threshold = float(histogram_threshold(counted, edges, alpha))
    need = min_calibration_rows(alpha)
    values = [float(t) for t in thresholds.double().tolist()]
    for client, value, source, n_rows in zip(clients, values, sources, rows, strict=True):
        _check_source(value, source, n_rows, need, threshold, edges, counts.get(client), private)
        if source == "own":
            _check_own(value, n_rows, edges, counts[client], alpha)
        if source == "calibrated":  # its own rows and the federation's as `need` pseudo-rows
            _check_calibrated(counts[client], n_rows + (need if counted.sum() > 0 else 0))
    return {
        "calibration_edges_": edges,
        "calibration_counts_": counted,
        "client_thresholds_": dict(zip(clients, values, strict=True)),
        "calibration_rows_": dict(zip(clients, rows, strict=True)),
        "calibration_sources_": dict(zip(clients, sources, strict=True)),
        "client_calibration_counts_": counts,
        "threshold_": threshold,
    }


def _edges(tensors) -> np.ndarray:
    """The saved bin edges, checked to be the public grid."""
    width = calibration_edges(0.0).size
    edges = get_tensor(tensors, "calibration.edges", (width,)).double().numpy()
    try:
        expected = calibration_edges(float(edges[0]))
    except ValueError:  # a first edge too large for the grid's offsets
        expected = None
    if expected is None or not np.allclose(edges, expected, rtol=1e-12, atol=0.0):
        raise ModelFormatError(
            "the tensor 'calibration.edges' is not the public grid of bin edges (its first "
            "edge plus the fixed offsets)."
        )
    return edges


def _clients(attrs: dict, fitted: list) -> tuple[list, list[int], list[str]]:
    """The saved calibration's clients, their held-out rows and threshold sources."""
    clients = check_items(
        get_attr(attrs, "calibration_clients", list), "calibration_clients", (str, int, float)
    )
    rows = check_items(get_attr(attrs, "calibration_rows_", list), "calibration_rows_", int)
    sources = check_items(
        get_attr(attrs, "calibration_sources_", list), "calibration_sources_", str
    )
    if clients[: len(fitted)] != fitted or len(set(clients)) != len(clients):
        raise ModelFormatError(
            "'calibration_clients' must start with client_ids_ and hold each id once."
        )
    if len(rows) != len(clients) or len(sources) != len(clients) or any(r < 0 for r in rows):
        raise ModelFormatError(
            "'calibration_rows_' and 'calibration_sources_' must hold one entry per client "
            f"of 'calibration_clients' ({len(clients)}), rows >= 0."
        )
    if any(source not in SOURCES for source in sources):
        raise ModelFormatError(f"'calibration_sources_' holds a source outside {SOURCES}.")
    return clients, rows, sources


def _check_source(value, source, n_rows, need, threshold, edges, counts, private) -> None:
    """A client's saved threshold ``value`` agrees with its ``source`` (the module doc)."""
    if source == "federation":
        if value != threshold or (n_rows >= need and not private):
            raise ModelFormatError(
                f"{_THRESHOLDS}: a client that takes the federation's threshold holds another "
                "value, or has the 'calibration_rows_' for one of its own."
            )
        return
    if source == "calibrated":
        if counts is None or value == -math.inf:
            raise ModelFormatError(f"{_THRESHOLDS}: a calibrated client needs its histogram.")
        return
    if n_rows < need or (source == "private") != private:
        raise ModelFormatError(
            f"{_THRESHOLDS}: a client with a threshold of its own ({source}) needs >= {need} "
            "'calibration_rows_' (and a 'private' one a private fit)."
        )
    if source == "private" and not bool(np.isin(value, edges)):
        raise ModelFormatError(f"{_THRESHOLDS}: a private threshold is one of the bin edges.")


def _check_calibrated(counts: np.ndarray, total: float) -> None:
    """A calibrated client's histogram (its rows plus the federation's pseudo-rows) adds up
    to ``total``."""
    if abs(float(counts.sum()) - total) > 1e-9 * max(total, 1.0):
        raise ModelFormatError(
            "the tensor 'calibration.client_counts': a calibrated client's histogram adds up "
            f"to {float(counts.sum()):.6g}, not its 'calibration_rows_' plus the federation's "
            f"pseudo-rows ({total:g})."
        )


def _check_own(value: float, n_rows: int, edges: np.ndarray, counts: np.ndarray, alpha) -> None:
    """A client's own threshold lies in the bin of its histogram (whole rows adding up to
    ``n_rows``) that holds its conformal order statistic."""
    if bool((counts != np.round(counts)).any()) or counts.sum() != n_rows:
        raise ModelFormatError(
            "the tensor 'calibration.client_counts': a client's histogram counts its "
            "'calibration_rows_' in whole rows."
        )
    upper = float(histogram_threshold(counts, edges, alpha))
    if math.isinf(upper):
        lower = float(edges[-1])
    else:
        position = int(np.searchsorted(edges, upper))
        lower = -math.inf if position == 0 else float(edges[position - 1])
    if not lower <= value <= upper:
        raise ModelFormatError(
            f"{_THRESHOLDS}: a client's threshold ({value:.6g}) lies outside the bin "
            f"[{lower:.6g}, {upper:.6g}] its histogram 'calibration.client_counts' puts its "
            "conformal order statistic in."
        )
