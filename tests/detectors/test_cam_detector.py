"""ClusteredFLClassifier (fednovelty/detectors/cam.py): the Fed-CAM paper's methods
as an estimator. CAM classifies clients with opposite labelling rules far better than FedAvg,
finds their clusters, records the cluster sizes, saves and loads to the same predictions,
and names every bad input."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close_scaled
from sklearn.metrics import adjusted_rand_score

import fednovelty
from fednovelty import ClusteredFLClassifier
from fednovelty.detectors.options import Privacy, Training
from fednovelty.exceptions import ModelFormatError, NotFittedError
from fednovelty.methods import get_method, method_names

RULES = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
SETTINGS = {
    "learner": "linear",
    "rounds": 20,
    "training": Training(learning_rate=0.2),
    "random_state": 0,
}


def rule_data(n_clients=9, n_rows=80, seed=0):
    """Client ``c`` (ids ``"c0"``, ``"c1"``, ...) labels its rows by rule ``c % 3``: ``x0 > 0``,
    ``x0 < 0`` (the opposite) or ``x1 > 0``. Returns (X, y, groups, truth)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_clients * n_rows, 3))
    groups = np.repeat([f"c{c}" for c in range(n_clients)], n_rows)
    cluster = np.repeat(np.arange(n_clients) % 3, n_rows)
    y = np.where((X * RULES[cluster]).sum(1) > 0, "yes", "no")
    return X, y, groups, np.arange(n_clients) % 3


@pytest.fixture(scope="module")
def data():
    return rule_data(), rule_data(seed=1)


@pytest.fixture(scope="module")
def fitted(data):
    (X, y, groups, _), _ = data
    return {
        method: ClusteredFLClassifier(method, n_clusters=3, **SETTINGS).fit(X, y, groups)
        for method in ("IFCA-CAM", "FeSEM-CAM", "FedAvg+")
    }


def client_accuracy(clf, X, y, groups) -> float:
    per_client = [
        np.mean(clf.predict_y(X[groups == c], client=c) == y[groups == c])
        for c in np.unique(groups)
    ]
    return float(np.mean(per_client))


def test_cam_beats_fedavg_by_a_clear_margin(data, fitted) -> None:
    (X, y, groups, _), (X_test, y_test, groups_test, _) = data
    fedavg = ClusteredFLClassifier("FedAvg+", n_clusters=1, **SETTINGS).fit(X, y, groups)
    baseline = client_accuracy(fedavg, X_test, y_test, groups_test)
    for method in ("IFCA-CAM", "FeSEM-CAM"):
        accuracy = client_accuracy(fitted[method], X_test, y_test, groups_test)
        assert accuracy > 0.9 and accuracy > baseline + 0.2, (method, accuracy, baseline)
    assert baseline < 0.75  # one model cannot follow opposite rules


def test_the_clusters_and_their_history_are_recorded(data, fitted) -> None:
    (_, _, _, truth), _ = data
    cam = fitted["IFCA-CAM"]
    assert adjusted_rand_score(truth, cam.client_clusters_) == pytest.approx(1.0)
    assert cam.client_ids_.tolist() == [f"c{c}" for c in range(9)]
    assert cam.cluster_sizes_.tolist() == [3, 3, 3]
    history = cam.cluster_sizes_history_
    assert history.shape == (20, 3) and cam.warmup_rounds_ == 6 == cam.n_rounds_ - 14
    assert (history[:6] == 0).all() and (history[6:].sum(1) == 9).all()
    assert [r["phase"] for r in cam.history_][5:7] == ["cam_warmup_global", "cam_cluster"]
    assert {"loss", "n_empty", "reseeded"} <= set(cam.history_[-1])
    fesem = fitted["FeSEM-CAM"]
    assert adjusted_rand_score(truth, fesem.client_clusters_) == pytest.approx(1.0)
    assert (fesem.cluster_sizes_history_.sum(1) == 9).all()  # k-means from the warm-up on
    ensemble = fitted["FedAvg+"]
    assert (ensemble.client_clusters_ == -1).all() and (ensemble.cluster_sizes_history_ == 0).all()


def test_probabilities_and_the_no_client_prediction(data, fitted) -> None:
    (X, *_), _ = data
    cam = fitted["IFCA-CAM"]
    proba = cam.predict_proba_y(X[:50])
    assert proba.shape == (50, 2) and np.allclose(proba.sum(1), 1.0, atol=1e-6)
    assert cam.classes_.tolist() == ["no", "yes"]
    by_cluster = [cam.predict_proba_y(X[:50], cluster=k) for k in range(3)]
    assert_close_scaled(proba, np.mean(by_cluster, axis=0), rtol=1e-6)  # equal sizes
    client = cam.client_ids_[4]
    assert_close_scaled(
        cam.predict_proba(X[:50], client), by_cluster[cam.client_clusters_[4]], rtol=1e-12
    )
    assert (cam.predict(X[:5], client) == cam.predict_y(X[:5], client=client)).all()


def test_an_unseen_client_is_assigned_the_cluster_of_its_rule(data, fitted) -> None:
    _, (X_test, y_test, groups_test, _) = data
    cam = fitted["FeSEM-CAM"]
    for c in (0, 1, 2):
        rows = groups_test == f"c{c}"
        assert cam.assign_cluster(X_test[rows], y_test[rows]) == cam.client_clusters_[c]


def test_save_and_load_give_the_same_predictions(data, fitted, tmp_path) -> None:
    (X, *_), _ = data
    for method, clf in fitted.items():
        path = tmp_path / f"{method}.safetensors"
        clf.save(path)
        loaded = fednovelty.load(path)
        assert type(loaded) is ClusteredFLClassifier and loaded.method == method
        for client in (None, "c4"):
            assert_close_scaled(
                loaded.predict_proba_y(X[:40], client), clf.predict_proba_y(X[:40], client)
            )
        assert (loaded.client_clusters_ == clf.client_clusters_).all()
        assert (loaded.cluster_sizes_history_ == clf.cluster_sizes_history_).all()
        assert loaded.history_ == clf.history_ and loaded.warmup_rounds_ == clf.warmup_rounds_
    with pytest.raises(ModelFormatError, match="holds a ClusteredFLClassifier, not a"):
        fednovelty.FedGMMDetector.load(tmp_path / "IFCA-CAM.safetensors")


def test_a_damaged_state_is_named(fitted) -> None:
    cam = fitted["IFCA-CAM"]
    tensors, attrs = cam._saved_state()
    fresh = ClusteredFLClassifier("IFCA-CAM", n_clusters=3, learner="linear")
    with pytest.raises(ModelFormatError, match="client_clusters_ must hold one cluster"):
        fresh._set_state(tensors, {**attrs, "client_clusters_": [5] * 9})
    with pytest.raises(ModelFormatError, match="cluster_sizes_history_ rows must hold 3"):
        fresh._set_state(tensors, {**attrs, "cluster_sizes_history_": [[1, 2]]})
    with pytest.raises(ModelFormatError, match=r"'global\.weight' is missing"):
        fresh._set_state({k: v for k, v in tensors.items() if k != "global.weight"}, attrs)


def test_a_client_below_its_privacy_floor_gets_no_cluster(data) -> None:
    (X, y, groups, _), _ = data
    keep = (groups != "c0") | (np.arange(len(X)) % 80 < 6)  # client c0 keeps 6 rows
    clf = ClusteredFLClassifier("IFCA", n_clusters=3, **SETTINGS, privacy=Privacy(min_rows=10))
    clf.fit(X[keep], y[keep], groups[keep])
    assert clf.client_clusters_[0] == -1 and clf.cluster_sizes_.sum() == 8
    assert_close_scaled(clf.predict_proba_y(X[:9], "c0"), clf.predict_proba_y(X[:9]), rtol=1e-12)


def test_bad_input_is_named(data, fitted) -> None:
    (X, y, groups, _), _ = data
    small = groups.astype(object) < "c2"  # clients c0 and c1
    with pytest.raises(ValueError, match="requires y to be passed"):
        ClusteredFLClassifier(**SETTINGS).fit(X, None, groups)
    with pytest.raises(ValueError, match="single class"):
        ClusteredFLClassifier(**SETTINGS).fit(X, np.zeros(len(X)), groups)
    with pytest.raises(ValueError, match="n_clusters=3 exceeds the 2 client"):
        ClusteredFLClassifier(n_clusters=3, **SETTINGS).fit(X[small], y[small], groups[small])
    with pytest.raises(ValueError, match="method"):
        ClusteredFLClassifier("CFL").fit(X, y, groups)
    with pytest.raises(ValueError, match="IFCA has no warm-up"):
        ClusteredFLClassifier("IFCA", warmup_rounds=3, **SETTINGS).fit(X, y, groups)
    with pytest.raises(NotFittedError, match=r"call fit\(X, y, groups=...\)"):
        ClusteredFLClassifier().predict_y(X)
    cam = fitted["IFCA-CAM"]
    with pytest.raises(ValueError, match="not both"):
        cam.predict_y(X[:3], "c0", cluster=0)
    with pytest.raises(ValueError, match="unknown client 'c99'"):
        cam.predict_y(X[:3], "c99")
    with pytest.raises(ValueError, match=r"cluster must be in \[0, 3\)"):
        cam.predict_y(X[:3], cluster=3)
    with pytest.raises(ValueError, match="X has 2 features"):
        cam.predict_y(X[:3, :2])
    with pytest.raises(ValueError, match="FedAvg\\+ has no clusters"):
        fitted["FedAvg+"].predict_y(X[:3], cluster=0)
    with pytest.raises(ValueError, match="FedAvg\\+ has no clusters to assign"):
        fitted["FedAvg+"].assign_cluster(X[:3], y[:3])
    custom = ClusteredFLClassifier(
        "IFCA", n_clusters=3, **{**SETTINGS, "rounds": 1, "learner": lambda d, k: _linear(d, k)}
    ).fit(X, y, groups)
    with pytest.raises(ValueError, match="custom learner factory cannot be saved"):
        custom.save("unused.safetensors")


def _linear(d, k):
    import torch

    return torch.nn.Linear(d, k)


def test_the_registry_names_the_papers_methods() -> None:
    names = [n for n in method_names(task="pfl") if n.startswith("PFL-") and "CAM" in n]
    assert names == ["PFL-IFCA-CAM", "PFL-FeSEM-CAM"]
    for method in ("FedAvg+", "IFCA", "FeSEM", "IFCA-CAM", "FeSEM-CAM"):
        entry = get_method(f"PFL-{method}")
        clf = entry.build(n_clusters=10, random_state=3)
        assert isinstance(clf, ClusteredFLClassifier) and clf.method == method
        training = clf._option("training")
        defaults = (clf.n_clusters, clf.rounds, training.local_steps, training.learning_rate)
        assert defaults == (10, 100, 10, 0.001)
        assert entry.task == "pfl" and entry.kind == "federated"
        assert "Fed-CAM" in entry.description or "Fed-CAM" in entry.paper
    with pytest.raises(ValueError, match="PFL-IFCA fixes method='IFCA'"):
        get_method("PFL-IFCA").build(method="FeSEM")
