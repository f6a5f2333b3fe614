"""Every fednovelty estimator, small and fast: each method of the registry
(``fednovelty.methods.METHODS``) but PyOD's baselines, and the detectors the registry does not
list (``StreamingFedGMMDetector``), with the data to fit them and one way to score them.

Shared by the tests that must hold for every estimator (atomic fits, finite inputs)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fednovelty.detectors.options import Initialisation
from fednovelty.methods import METHODS

#: settings that keep a fit short, applied where the estimator has them.
FAST = {
    "max_iter": 5,
    "rounds": 3,
    "hidden": 8,
    "embedding_dim": 2,
    "n_clusters": 2,
}
#: ... the local training's, where the estimator reads them (``Training``).
FAST_TRAINING = {"local_epochs": 1, "local_steps": 1}
#: ... and the k-means start's rounds, where the estimator takes an initialisation.
FAST_START = {"kmeans_rounds": 3}
COLUMNS = ["a", "b", "c"]
#: names of every estimator: the registry's (not PyOD's) and those it does not list.
NAMES = [name for name, m in METHODS.items() if m.kind != "pyod"] + ["StreamingFedGMM"]


def build(name: str, **params):
    """An unfitted estimator of ``name`` (a registry method or ``"StreamingFedGMM"``) with
    :data:`FAST` where it takes them and ``params`` (e.g. ``device=``, ``dtype=``)."""
    if name == "StreamingFedGMM":
        from fednovelty.detectors import StreamingFedGMMDetector

        detector = StreamingFedGMMDetector(2, random_state=0, **params)
    else:
        method = METHODS[name]
        shared = {"n_components": 2, "client_components": 2, "random_state": 0}
        detector = method.build(**method.shared_params(**shared), **params)
    names = detector.get_params(deep=False)
    fast = {k: v for k, v in FAST.items() if k in names}
    if names.get("n_members", 1) > 1:  # random starts: two keep the ensemble, at 2 fits' cost
        fast["n_members"] = 2
    training = {
        f.name for p in type(detector)._params.options if p.name == "training" for f in p.fields
    }
    fast.update({f"training__{k}": v for k, v in FAST_TRAINING.items() if k in training})
    if "initialisation" in names and "initialisation" not in params:
        fast["initialisation"] = Initialisation(**FAST_START)
    return detector.set_params(**fast)


def labelled(name: str) -> bool:
    """Whether ``name``'s estimator is fitted with labels (``fit(X, y, groups)``)."""
    return name in METHODS and METHODS[name].task == "pfl"


def data(seed: int = 0, shift: float = 0.0):
    """Four clients of 40 rows, 3 features as a DataFrame (``COLUMNS``), two separated
    populations, labels that differ within each client: ``(X, y, groups)``."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(4), 40)
    X = rng.normal(0, 1, (160, 3)) + np.where(groups[:, None] % 2 == 0, 0.0, 3.0) + shift
    y = np.where(np.arange(160) % 40 < 20, 0, 1)
    return pd.DataFrame(X, columns=COLUMNS), y, groups


def fit(detector, name: str, X, y, groups):
    """``detector.fit`` with labels where its method needs them."""
    return detector.fit(X, y, groups) if labelled(name) else detector.fit(X, groups=groups)


def scores(detector, name: str, X) -> np.ndarray:
    """The estimator's main output on ``X``: ``decision_function`` of a novelty detector, the
    first client's ``predict_proba_y`` of a classifier."""
    if labelled(name):
        client = getattr(detector, "client_ids_", [0])[0]  # unfitted: the fitted check raises
        return detector.predict_proba_y(X, client=client)
    return detector.decision_function(X)
