"""The detectors' robust aggregation options reach the federation and survive save/load."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty import (
    ClusteredFedGMMDetector,
    ClusteredFLClassifier,
    FedGenGMMDetector,
    FedGMMDetector,
    FedKNNMarkerDetector,
    load,
)
from fednovelty.detectors.options import Robustness, Training
from fednovelty.detectors.vgm2 import VGM2Classifier
from fednovelty.federated.bayesian.knn_markers import FederatedKNNMarkers
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus


def lone_far_client() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nine clients of one cluster and a tenth holding a far cluster on its own."""
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (900, 3)), rng.normal(15, 0.5, (300, 3))])
    groups = np.r_[np.arange(900) % 9, np.full(300, 9)]
    return X, groups, rng.normal(15, 0.5, (50, 3))


def test_trimmed_aggregation_gives_one_clients_cluster_no_weight() -> None:
    X, groups, far = lone_far_client()
    plain = FedGMMDetector(2, random_state=0).fit(X, groups=groups)
    trimmed = FedGMMDetector(2, random_state=0, robustness=Robustness(aggregation="trimmed")).fit(
        X, groups=groups
    )
    # with the sum, the far cluster is a component of weight 0.25; trimmed, no weight sits
    # there (the robust k-means round seeds no component at it, and the trimmed shares
    # would give one none)
    near_far = np.linalg.norm(plain.means_ - 15.0, axis=1) < 3
    assert plain.weights_[near_far].sum() == pytest.approx(0.25, abs=0.01)
    assert trimmed.weights_[np.linalg.norm(trimmed.means_ - 15.0, axis=1) < 3].sum() < 0.01
    assert (trimmed.decision_function(far) > plain.decision_function(far) + 3).all()


def test_fedgengmm_screening_leaves_out_the_lone_client(tmp_path) -> None:
    X, groups, far = lone_far_client()
    det = FedGenGMMDetector(
        n_components=2, random_state=0, robustness=Robustness(aggregation="median")
    )
    det.fit(X, groups=groups)
    plain = FedGenGMMDetector(n_components=2, random_state=0).fit(X, groups=groups)
    assert (det.decision_function(far) > plain.decision_function(far) + 3).all()
    det.save(tmp_path / "m.safetensors")
    again = load(tmp_path / "m.safetensors")
    assert again.robustness.aggregation == "median"
    np.testing.assert_allclose(again.decision_function(far), det.decision_function(far), rtol=1e-12)


def test_capped_weight_and_bad_options_are_named() -> None:
    X, groups, _ = lone_far_client()
    capped = FedGMMDetector(2, random_state=0, robustness=Robustness(client_weight_cap=1.0)).fit(
        X, groups=groups
    )
    # the far client (300 rows) counts as the median client's 100: 100 / 1000
    assert np.sort(capped.weights_)[0] == pytest.approx(0.1, abs=0.01)
    with pytest.raises(ValueError, match="aggregation"):
        FedGMMDetector(2, robustness=Robustness(aggregation="median")).fit(X, groups=groups)
    with pytest.raises(ValueError, match="client_weight_cap"):
        FedGenGMMDetector(robustness=Robustness(client_weight_cap=0.5)).fit(X, groups=groups)


def test_robust_options_ignore_labels() -> None:
    X, groups, far = lone_far_client()
    labels = (X[:, 0] > 5).astype(int)
    # FedGMMDetector ignores y (PyOD's contract): the same fit with or without it
    with_y = FedGMMDetector(2, random_state=0, robustness=Robustness(aggregation="trimmed")).fit(
        X, labels, groups=groups
    )
    without = FedGMMDetector(2, random_state=0, robustness=Robustness(aggregation="trimmed")).fit(
        X, groups=groups
    )
    np.testing.assert_allclose(with_y.score_samples(far), without.score_samples(far), rtol=1e-12)


def configs_of(monkeypatch, algorithm: type) -> list:
    """Every config an ``algorithm`` is set up with while the test runs."""
    seen, original = [], algorithm._setup

    def recording(self, config) -> None:
        seen.append(config)
        original(self, config)

    monkeypatch.setattr(algorithm, "_setup", recording)
    return seen


ROBUST_DETECTORS = {
    "ClusteredFedGMMDetector": (
        lambda: ClusteredFedGMMDetector(
            2, n_clusters=2, cluster_components=1, warmup=2, max_iter=2, random_state=0,
            robustness=Robustness(aggregation="trimmed", trim=0.2, client_weight_cap=2.0),
        ),
        ClusteredEM,
        "aggregation",
    ),
    "ClusteredFLClassifier": (
        lambda: ClusteredFLClassifier(
            "FedAvg+", 2, learner="linear", rounds=2, training=Training(local_steps=2),
            random_state=0,
            robustness=Robustness(aggregation="median", trim=0.2, client_weight_cap=2.0),
        ),
        FedAvgPlus,
        "aggregation",
    ),
    "VGM2Classifier": (
        lambda: VGM2Classifier(
            "fedavg", rounds=2, training=Training(local_epochs=1), hidden=8, embedding_dim=2,
            random_state=0,
            robustness=Robustness(aggregation="trimmed", trim=0.2, client_weight_cap=2.0),
        ),
        VGM2FedAvg,
        "robust_aggregation",  # the VGM2 family's name: VGM2's aggregation is the markers' rule
    ),
    "FedKNNMarkerDetector": (
        lambda: FedKNNMarkerDetector(
            3, 3, max_iter=5, random_state=0,
            robustness=Robustness(aggregation="trimmed", trim=0.2, client_weight_cap=2.0),
        ),
        FederatedKNNMarkers,
        "aggregation",
    ),
}  # fmt: skip
#: the detectors that ignore labels (their fit takes rows and groups; scored by
#: decision_function), by their algorithm.
UNSUPERVISED = (ClusteredEM, FederatedKNNMarkers)


@pytest.mark.parametrize("name", list(ROBUST_DETECTORS))
def test_robust_options_reach_the_algorithm_and_survive_save_load(
    name, monkeypatch, tmp_path
) -> None:
    make, algorithm, setting = ROBUST_DETECTORS[name]
    X, groups, far = lone_far_client()
    y = (X[:, 1] > 0).astype(int)
    configs = configs_of(monkeypatch, algorithm)
    det = make()
    det.fit(X, groups=groups) if algorithm in UNSUPERVISED else det.fit(X, y, groups)
    wanted = {"aggregation": det.robustness.aggregation, "trim": 0.2, "client_weight_cap": 2.0}
    assert wanted["aggregation"] != "sum" and configs
    names = {"aggregation": setting, "trim": "trim", "client_weight_cap": "client_weight_cap"}
    for config in configs:  # the fit's algorithm (and any rebuilt for prediction)
        assert {k: getattr(config, names[k]) for k in wanted} == wanted
    det.save(tmp_path / "m.safetensors")
    again = load(tmp_path / "m.safetensors")
    assert {k: getattr(again.robustness, k) for k in wanted} == wanted
    score = "decision_function" if algorithm in UNSUPERVISED else "predict_proba_y"
    np.testing.assert_allclose(getattr(again, score)(far), getattr(det, score)(far), rtol=1e-12)
