"""ClusteredFedGMMDetector: clusters of clients, per-client and per-cluster
scores, the client-level anomaly score, adapt, persistence and named errors."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close_scaled
from safetensors import safe_open
from safetensors.torch import save_file
from sklearn.metrics import adjusted_rand_score

from fednovelty import ClusteredFedGMMDetector, load
from fednovelty.detectors.persistence import _CHECKSUM_KEY, _METADATA_KEY, checksum
from fednovelty.exceptions import ModelFormatError

PLACES = ([6.0, 0.0], [0.0, 6.0], [-6.0, -6.0])


def client_rows(rng, place, n=100):
    return np.r_[rng.normal(0, 1, (n // 2, 2)), rng.normal(place, 1, (n // 2, 2))]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = np.vstack([client_rows(rng, PLACES[c % 3]) for c in range(12)])
    names = np.array([f"site-{c:02d}" for c in range(12)])
    return X, np.repeat(names, 100), np.arange(12) % 3


@pytest.fixture(scope="module")
def fitted(data):
    X, groups, _ = data
    det = ClusteredFedGMMDetector(3, n_clusters=3, cluster_components=1, random_state=0)
    return det.fit(X, groups=groups)


def test_clusters_in_client_id_order_and_their_history(fitted, data) -> None:
    _, _, truth = data
    assert list(fitted.client_ids_) == [f"site-{c:02d}" for c in range(12)]
    assert adjusted_rand_score(truth, fitted.client_clusters_) == 1.0
    assert fitted.cluster_sizes_history_[-1] == [4, 4, 4]
    assert all(sum(sizes) == 12 for sizes in fitted.cluster_sizes_history_)
    assert fitted.means_.shape == (6, 2) and fitted.component_clusters_.tolist().count(-1) == 3
    assert fitted.cluster_events_ == []
    # a cluster's weights sit on the global components and its own only
    for j in range(3):
        outside = (fitted.component_clusters_ != -1) & (fitted.component_clusters_ != j)
        assert np.all(fitted.cluster_weights_[j][outside] == 0)
        assert fitted.cluster_weights_[j].sum() == pytest.approx(1.0)


def test_scores_by_client_and_cluster_rank_far_rows_higher(fitted) -> None:
    near, far = [[0.0, 0.0]], [[20.0, -20.0]]
    for kwargs in ({}, {"client": "site-01"}, {"cluster": 0}):
        assert (
            fitted.decision_function(far, **kwargs)[0] > fitted.decision_function(near, **kwargs)[0]
        )
    j = int(fitted.client_clusters_[0])
    place = [PLACES[0]]  # site-00's own blob: likely under its cluster, not under another
    other = (j + 1) % 3
    assert (
        fitted.decision_function(place, cluster=j)[0]
        < fitted.decision_function(place, cluster=other)[0]
    )
    assert (
        fitted.decision_function(place, client="site-00")[0]
        < fitted.decision_function(place, client="site-01")[0]
    )


def test_a_client_whose_rows_fit_no_cluster_scores_far_above_the_others(fitted) -> None:
    rng = np.random.default_rng(5)
    fitted_scores = fitted.client_scores_
    assert np.all(np.isfinite(fitted_scores)) and np.median(fitted_scores) == pytest.approx(
        0, abs=1e-9
    )
    normal = [fitted.client_score(client_rows(rng, PLACES[c % 3])) for c in range(6)]
    rogue = [fitted.client_score(client_rows(rng, [6.0, 6.0])) for _ in range(3)]
    assert max(normal) < 5 < min(rogue)


def test_adapt_places_an_unseen_client_in_its_cluster(fitted) -> None:
    rng = np.random.default_rng(7)
    handle = fitted.adapt(client_rows(rng, PLACES[1]))
    assert handle.cluster == fitted.client_clusters_[1]
    outside = (fitted.component_clusters_ != -1) & (fitted.component_clusters_ != handle.cluster)
    assert np.all(handle.weights[outside] == 0) and handle.weights.sum() == pytest.approx(1.0)
    assert handle.cluster_log_likelihoods.argmax() == handle.cluster
    scores = fitted.decision_function([[0.0, 6.0], [6.0, 0.0]], client=handle)
    assert scores[0] < scores[1]


def test_save_and_load_give_the_same_scores_and_clusters(fitted, tmp_path) -> None:
    fitted.save(tmp_path / "clustered")
    again = load(tmp_path / "clustered")
    X = np.random.default_rng(1).normal(0, 3, (50, 2))
    assert_close_scaled(again.decision_function(X), fitted.decision_function(X), rtol=1e-12)
    assert_close_scaled(
        again.decision_function(X, client="site-03"),
        fitted.decision_function(X, client="site-03"),
        rtol=1e-12,
    )
    assert again.client_clusters_.tolist() == fitted.client_clusters_.tolist()
    assert again.cluster_sizes_history_ == fitted.cluster_sizes_history_
    assert_close_scaled(again.client_scores_, fitted.client_scores_, rtol=1e-12)


def test_a_saved_model_with_weight_outside_a_cluster_is_refused(fitted, tmp_path) -> None:
    fitted.save(tmp_path / "good")
    with safe_open(tmp_path / "good", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        text = f.metadata()[_METADATA_KEY]

    def tampered(name, change):
        changed = {**tensors, name: change(tensors[name].clone())}
        path = tmp_path / name
        meta = {_METADATA_KEY: text, _CHECKSUM_KEY: checksum(text, changed)}
        save_file(changed, path, metadata=meta)
        return path

    owners = fitted.component_clusters_
    foreign = int(np.flatnonzero(owners == 1)[0])

    def leak(w):
        w[0, foreign] = 0.1
        return w

    def half(c):
        c[0] = 0.5
        return c

    with pytest.raises(ModelFormatError, match="outside a cluster's components"):
        load(tampered("cluster_weights", leak))
    with pytest.raises(ModelFormatError, match="must hold integers"):
        load(tampered("client_clusters", half))


def test_named_errors(data, fitted) -> None:
    X, groups, _ = data
    with pytest.raises(ValueError, match="n_clusters=13 exceeds the 12 client"):
        ClusteredFedGMMDetector(2, n_clusters=13, cluster_components=1).fit(X, groups=groups)
    with pytest.raises(ValueError, match="client= or cluster=, not both"):
        fitted.decision_function(X[:2], client="site-00", cluster=0)
    with pytest.raises(ValueError, match=r"cluster must be an integer in \[0, 3\)"):
        fitted.decision_function(X[:2], cluster=3)
    with pytest.raises(
        ValueError, match="X has 3 features, but ClusteredFedGMMDetector was fitted with 2"
    ):
        fitted.client_score(np.zeros((5, 3)))


def test_labels_are_ignored_pyod_contract(data) -> None:
    X, groups, _ = data
    a = ClusteredFedGMMDetector(3, n_clusters=3, cluster_components=1, random_state=0)
    b = ClusteredFedGMMDetector(3, n_clusters=3, cluster_components=1, random_state=0)
    a.fit(X, groups=groups)
    b.fit(X, np.ones(len(X)), groups=groups)
    assert_close_scaled(a.decision_scores_, b.decision_scores_, rtol=1e-12)
