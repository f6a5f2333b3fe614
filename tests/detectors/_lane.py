"""The CUDA lane's harness: fit one registry method on two devices and compare its scores.

Every function takes the devices as arguments, so the same code runs as ``("cpu", "cuda")``
in the lane (``tests/detectors/test_cuda_lane.py``, marked ``cuda``) and as ``("cpu", "cpu")`` in
the suite everywhere else. Both fits see the same rows, seed and float64; what they output on
the same rows must agree within :data:`RTOL` of the values' scale (:func:`mismatches`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from _every_estimator import NAMES, data
from _every_estimator import build as build_estimator
from _every_estimator import fit as fit_estimator
from sklearn.exceptions import ConvergenceWarning

#: the relative tolerance: ``|a - b| <= RTOL * max(1, max |a|)`` per output.
RTOL = 1e-8


def lane_names() -> list[str]:
    """Every registry method with a ``device`` (all but PyOD's baselines, which run in numpy),
    variants and classifiers included, in registry order."""
    return [name for name in NAMES if name != "StreamingFedGMM"]


def federation(seed: int = 0, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_every_estimator.data`'s four clients as arrays: ``(X (160, 3), y, groups)``."""
    X, y, groups = data(seed, shift)
    return X.to_numpy(copy=True), y, groups


def build(name: str, device: str):
    """An unfitted estimator of registry method ``name`` on ``device`` in float64."""
    return build_estimator(name, device=device, dtype="float64")


def fit(detector, name: str, X, y, groups):
    """``detector.fit`` (the few rounds of ``FAST`` end before convergence: its warning is
    silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fit_estimator(detector, name, X, y, groups)


def outputs(detector, X) -> dict[str, np.ndarray]:
    """What the fitted ``detector`` says about rows ``X``: ``decision_function`` and
    ``score_samples`` where it has them; for a classifier (``predict_proba_y``) the class
    probabilities of its first and last client, each (n_samples, n_classes)."""
    out: dict[str, np.ndarray] = {}
    for method in ("decision_function", "score_samples"):
        if hasattr(detector, method):
            out[method] = np.asarray(getattr(detector, method)(X), dtype=np.float64)
    if hasattr(detector, "predict_proba_y"):
        clients = list(detector.client_ids_)
        for client in dict.fromkeys([clients[0], clients[-1]]):
            values = detector.predict_proba_y(X, client=client)
            out[f"predict_proba_y[{client}]"] = np.asarray(values, dtype=np.float64)
    return out


def mismatches(
    reference: Mapping[str, Any], other: Mapping[str, Any], rtol: float = RTOL
) -> list[str]:
    """Where ``other`` departs from ``reference`` (name -> array), one line each: a missing
    or extra name, another shape, non-finite values in other places, or a finite entry with
    ``|a - b| > rtol * max(1, max |a|)`` (the largest such difference is named); ``[]`` when
    they agree."""
    problems = [f"{k}: only on the first device" for k in reference if k not in other]
    problems += [f"{k}: only on the second device" for k in other if k not in reference]
    for key in (k for k in reference if k in other):
        a = np.asarray(reference[key], dtype=np.float64)
        b = np.asarray(other[key], dtype=np.float64)
        if a.shape != b.shape:
            problems.append(f"{key}: shape {a.shape} against {b.shape}")
            continue
        finite = np.isfinite(a)
        if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite]):
            problems.append(f"{key}: non-finite values differ")
            continue
        if not finite.any():
            continue
        scale = max(1.0, float(np.abs(a[finite]).max()))
        gap = float(np.abs(a[finite] - b[finite]).max())
        if gap > rtol * scale:
            problems.append(f"{key}: max |a - b| = {gap:.3g} > {rtol:g} * {scale:.3g}")
    return problems


def tensor_devices(value: Any, depth: int = 4) -> set[str]:
    """The device types (``"cpu"``, ``"cuda"``) of the torch tensors and modules held by
    ``value``: its attributes, mappings, sequences and dataclass fields, ``depth`` levels down."""
    if isinstance(value, torch.Tensor):
        return {value.device.type}
    if isinstance(value, torch.nn.Module):
        return {p.device.type for p in value.parameters()}
    if depth == 0 or isinstance(value, str | bytes | np.ndarray):
        return set()
    if isinstance(value, Mapping):
        children = list(value.values())
    elif isinstance(value, list | tuple):
        children = list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        children = list(vars(value).values())
    else:
        return set()
    return set().union(*(tensor_devices(child, depth - 1) for child in children))


def fitted_on(detector, device: str) -> bool:
    """Whether any tensor of the fitted ``detector`` lives on ``device``'s type."""
    return torch.device(device).type in tensor_devices(detector)


def compare_method(name: str, devices: Sequence[str], rtol: float = RTOL) -> list[str]:
    """Fit method ``name`` on each of the two ``devices`` (the same rows and seed) and return
    :func:`mismatches` of their outputs on the fitted rows and on shifted rows, plus a line
    for a fit that holds no tensor on its device."""
    first, second = devices
    X, y, groups = federation()
    new, _, _ = federation(seed=1, shift=1.5)
    rows = np.concatenate([X[::8], new[::8]])
    found: list[dict[str, np.ndarray]] = []
    problems: list[str] = []
    for device in devices:
        detector = fit(build(name, device), name, X, y, groups)
        if not fitted_on(detector, device):
            problems.append(f"{name}: the fit on {device} holds no tensor on {device}")
        found.append(outputs(detector, rows))
    return problems + [f"{name} ({first} vs {second}) {p}" for p in mismatches(*found, rtol)]


def stream_windows(device: str, n_windows: int = 3) -> tuple[Any, list[dict[str, np.ndarray]]]:
    """``StreamingFedGMMDetector`` on ``device``: ``fit`` on the first window, ``partial_fit``
    on each later one (the second like the first, the third with a quarter of each client's
    rows moved far away, so that far rows re-bear a component).

    Returns:
        ``(detector, records)``, one record per window: the scores of fixed rows, the
        clients' weights (n_clients, K) and, after the first, the window's drift values
        (n_clients, 4: total variation, mean log-likelihood, surprise, CUSUM) and the
        components re-born in it.
    """
    from fednovelty.detectors import StreamingFedGMMDetector

    detector = StreamingFedGMMDetector(
        2, random_state=0, device=device, dtype="float64", max_iter=5
    )
    probe = np.concatenate([federation(seed=9)[0][::10], federation(seed=9, shift=8.0)[0][::10]])
    records = []
    for window in range(n_windows):
        X, _, groups = federation(seed=window)
        if window == 2:
            X[np.arange(X.shape[0]) % 4 == 0] += 8.0
        if window == 0:
            detector.fit(X, groups=groups)
        else:
            detector.partial_fit(X, groups=groups)
        record = {**outputs(detector, probe), "client_weights": detector.client_weights_}
        if window:
            drift = [r for r in detector.drift_history_ if r["window"] == detector.window_]
            keys = ("total_variation", "mean_log_likelihood", "surprise", "cusum")
            record["drift"] = np.array([[float(r[k]) for k in keys] for r in drift])
            record["births"] = np.array(drift[0]["births"], dtype=np.float64)
        records.append(record)
    return detector, records


def compare_streams(devices: Sequence[str], rtol: float = RTOL) -> list[str]:
    """:func:`mismatches` of :func:`stream_windows` on the two ``devices``, window by window,
    plus a line for a run that holds no tensor on its device."""
    problems: list[str] = []
    runs = []
    for device in devices:
        detector, records = stream_windows(device)
        if not fitted_on(detector, device):
            problems.append(f"the stream on {device} holds no tensor on {device}")
        runs.append(records)
    first, second = runs
    for window, (a, b) in enumerate(zip(first, second, strict=True)):
        problems += [f"window {window}: {p}" for p in mismatches(a, b, rtol)]
    return problems
