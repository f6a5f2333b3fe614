"""The main job on the embedded engine: federated novelty detection on a real dataset.

``fednovelty demo`` (``make demo``) loads an ADBench dataset from ``../shared/data``
(Forest Covertype, ``10_cover``, by default), keeps the anomalies out of training (the
FedGenGMM paper's *novelty* protocol), splits the training inliers among heterogeneous
clients (Dirichlet(alpha) over k-means clusters: feature-distribution skew), scales
features with a min-max range merged from the clients' own minima and maxima, trains
every method, and prints AUROC / AUC-PR / rounds / bytes against centralized EM on the
pooled rows (the papers' "ideal"; from the same initial parameters it follows
scikit-learn's ``GaussianMixture`` to round-off) and PyOD's IForest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyod.models.iforest import IForest
from tqdm.auto import tqdm

from fednovelty.datasets import (
    MinMaxScaling,
    dirichlet_partition,
    groups_from_partition,
    kmeans_groups,
    load_adbench,
)
from fednovelty.detectors import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector
from fednovelty.evaluation import aupr_out, auroc


@dataclass(frozen=True)
class DemoData:
    """A novelty split: scaled training rows with their client ids, and a labelled test set."""

    X_train: np.ndarray
    groups: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def novelty_split(
    name: str,
    *,
    n_clients: int,
    alpha: float,
    test_share: float = 0.3,
    max_train: int | None = None,
    random_state: int = 0,
    data_dir=None,
) -> DemoData:
    """Train on inliers only (split among clients); test on held-out inliers + all anomalies."""
    X, y = load_adbench(name, data_dir)
    rng = np.random.default_rng(random_state)
    inliers = rng.permutation(np.flatnonzero(y == 0))
    n_test = round(test_share * inliers.size)
    test_idx = np.concatenate([inliers[:n_test], np.flatnonzero(y == 1)])
    train_idx = inliers[n_test:]
    if max_train is not None:
        train_idx = train_idx[:max_train]
    X_train = X[train_idx]
    clusters = kmeans_groups(X_train, 10, random_state=random_state)
    parts = dirichlet_partition(clusters, n_clients, alpha, random_state=random_state, min_size=10)
    groups = groups_from_partition(parts, X_train.shape[0])
    scaling = MinMaxScaling.from_clients([X_train[p] for p in parts])
    return DemoData(scaling.transform(X_train), groups, scaling.transform(X[test_idx]), y[test_idx])


def run_demo(
    dataset: str = "10_cover",
    *,
    n_clients: int = 20,
    alpha: float = 0.5,
    n_components: int = 15,
    random_state: int = 0,
    data_dir=None,
    max_train: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Train every method on one novelty split and return the results table.

    Columns: method, AUROC, AUC-PR (novel = positive class), rounds, MB up (clients ->
    server, all rounds), MB down, fit seconds. Centralized rows have no rounds or bytes.
    """
    data = novelty_split(
        dataset,
        n_clients=n_clients,
        alpha=alpha,
        random_state=random_state,
        data_dir=data_dir,
        max_train=max_train,
    )
    common = {"random_state": random_state, "progress": progress}
    # (name, detector, federated?): a centralized detector is fitted with groups=None, one
    # client holding every row, i.e. plain EM on the pooled data (it follows scikit-learn's
    # GaussianMixture to round-off from the same initial parameters).
    methods = [
        ("FedGenGMM", FedGenGMMDetector(n_components=n_components, **common), True),
        (
            "DEM-kmeans (global weights)",
            FedGMMDetector(n_components, mixture_weights="global", **common),
            True,
        ),
        ("FedGMM (personal weights)", FedGMMDetector(n_components, **common), True),
        ("Local (mixture of client GMMs)", LocalGMMDetector(**common), True),
        (
            "CentralGMM (pooled data)",
            FedGMMDetector(n_components, mixture_weights="global", privacy_min_rows=1, **common),
            False,
        ),
        ("IForest (pooled data, PyOD)", IForest(random_state=random_state), False),
    ]
    rows = []
    bar = tqdm(total=len(methods), desc="demo", unit="method", disable=not progress)
    for name, detector, federated in methods:
        bar.set_postfix_str(name)
        started = time.perf_counter()
        if federated:
            detector.fit(data.X_train, groups=data.groups)
        else:
            detector.fit(data.X_train)
        seconds = time.perf_counter() - started
        scores = detector.decision_function(data.X_test)
        traffic = (
            (detector.n_rounds_, detector.bytes_up_, detector.bytes_down_)
            if federated
            else (0, 0, 0)
        )
        rows.append(_row(name, data.y_test, scores, *traffic, seconds))
        bar.update(1)
    bar.close()
    return pd.DataFrame(rows)


def _row(name, y, scores, rounds, up, down, seconds) -> dict:
    return {
        "method": name,
        "AUROC": auroc(y, scores),
        "AUC-PR": aupr_out(y, scores),
        "rounds": rounds,
        "MB up": up / 1e6,
        "MB down": down / 1e6,
        "fit s": seconds,
    }


def format_table(table: pd.DataFrame) -> str:
    """Plain-text table with fixed decimals."""
    return table.to_string(
        index=False,
        formatters={
            "AUROC": "{:.4f}".format,
            "AUC-PR": "{:.4f}".format,
            "MB up": "{:.3f}".format,
            "MB down": "{:.3f}".format,
            "fit s": "{:.1f}".format,
        },
    )
