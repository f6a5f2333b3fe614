"""FedKNNMarkerDetector and FederatedKNNMarkers: the Dir-NIG markers of
kNN distances as a calibrated federated novelty score.

Reference tests: the feature is the leave-one-out k-th neighbour distance (brute force);
federated VB on it equals FederatedVB on the pooled feature; the tail probability is the
integral of the Student-t predictive density. Behaviour: calibration on held-out normal rows,
what crosses the wire, personalisation, degenerate clients, bad input, save/load.
"""

from __future__ import annotations

import copy
import json
import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.integrate import quad
from scipy.spatial.distance import cdist
from sklearn.utils._param_validation import InvalidParameterError

from fednovelty.detectors.knn_markers import FedKNNMarkerDetector
from fednovelty.detectors.persistence import load
from fednovelty.exceptions import ClientDataError, ModelFormatError, NotFittedError
from fednovelty.federated.bayesian.knn_markers import (
    FederatedKNNMarkers,
    knn_log_distances,
    kth_neighbor_distances,
    personal_posterior,
    predictive_log_tail,
)
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.registry import algorithm_name, algorithm_settings, build_algorithm
from fednovelty.mixture.vb_predictive import vb_predictive_log_prob
from fednovelty.runtime import run_simulation


def blobs(seed: int, n: int = 300) -> np.ndarray:
    """Two Gaussian blobs in 3-D, ``n`` rows each."""
    rng = np.random.default_rng(seed)
    return np.vstack([rng.normal(0, 1, (n, 3)), rng.normal(5, 0.5, (n, 3))])


def fit(X, groups=None, **params) -> FedKNNMarkerDetector:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConvergenceWarning on small data is not the point
        return FedKNNMarkerDetector(random_state=0, **params).fit(X, groups=groups)


@pytest.fixture(scope="module")
def fitted():
    X = blobs(0)
    groups = np.r_[np.zeros(300), np.ones(100), np.full(200, 2)]  # a size-skewed split
    return X, groups, fit(X, groups)


# ----------------------------------------------------------------------------- the feature
def test_feature_is_the_leave_one_out_kth_neighbour_distance() -> None:
    X = np.random.default_rng(1).normal(size=(40, 2))
    X[5] = X[6]  # a duplicate pair: each is the other's nearest row, at distance 0
    D = cdist(X, X)
    np.fill_diagonal(D, np.inf)
    for k in (1, 3):
        np.testing.assert_allclose(kth_neighbor_distances(X, None, k), np.sort(D, 1)[:, k - 1])
    queries = np.random.default_rng(2).normal(size=(7, 2))
    np.testing.assert_allclose(
        kth_neighbor_distances(X, queries, 3), np.sort(cdist(queries, X), 1)[:, 2]
    )
    log_d = knn_log_distances(torch.as_tensor(X), 1, 1e-6)
    assert log_d.shape == (40, 1)
    assert float(log_d[5, 0]) == pytest.approx(np.log(1e-6))  # finite for a duplicate


def test_federated_posterior_equals_vb_on_the_pooled_feature() -> None:
    """Exact federated VB: the clients' one-column features through FederatedVB give the
    same posterior and ELBOs as FederatedKNNMarkers on the rows."""
    X = blobs(3, 150)
    parts = [torch.as_tensor(X[i::3]) for i in range(3)]
    settings = {"n_components": 4, "max_iter": 5, "tol": 0.0, "random_state": 0}
    ours = run_simulation(FederatedKNNMarkers(n_neighbors=4, **settings), parts).state
    features = [knn_log_distances(p, 4, 1e-6) for p in parts]
    reference = run_simulation(FederatedVB(**settings), features).state
    for name, tensor in reference.posterior.tensors().items():
        assert_close_scaled(ours.posterior.tensors()[name], tensor, rtol=1e-12, err_msg=name)
    assert_close_scaled(ours.lower_bounds, reference.lower_bounds, rtol=1e-12)


def test_only_one_dimensional_statistics_cross_the_wire() -> None:
    """Every round's upload has the same size whatever the number of rows and features:
    summaries of one column, never rows."""
    rng = np.random.default_rng(4)
    settings = {"n_components": 3, "max_iter": 3, "tol": 0.0, "random_state": 0}

    def uploads(n_rows: int, n_features: int) -> list[int]:
        parts = [torch.as_tensor(rng.normal(size=(n_rows, n_features))) for _ in range(2)]
        result = run_simulation(FederatedKNNMarkers(**settings), parts)
        assert all(not record.dropped for record in result.history)
        return [record.bytes_up for record in result.history]

    assert uploads(40, 2) == uploads(120, 7)


def test_algorithm_is_registered_and_its_settings_round_trip() -> None:
    algorithm = FederatedKNNMarkers(5, n_neighbors=3, distance_floor=1e-4, random_state=2)
    name, settings = algorithm_name(algorithm), algorithm_settings(algorithm)
    assert name == "FederatedKNNMarkers"
    rebuilt = build_algorithm(name, json.loads(json.dumps(settings)))
    assert rebuilt.config == algorithm.config
    with pytest.raises(ValueError, match="n_neighbors"):
        FederatedKNNMarkers(5, n_neighbors=0)
    with pytest.raises(ValueError, match="distance_floor"):
        FederatedKNNMarkers(5, distance_floor=0.0)
    with pytest.raises(ValueError, match="covariance_type"):
        FederatedKNNMarkers(5, covariance_type="diag")


# ----------------------------------------------------------------------------- the score
def test_tail_probability_integrates_the_predictive_density(fitted) -> None:
    _, _, det = fitted
    posterior = det.client_posteriors_[0]
    density = lambda v: float(  # noqa: E731
        torch.exp(vb_predictive_log_prob(torch.tensor([[v]], dtype=torch.float64), posterior))
    )
    values = np.array([-3.0, -1.0, 0.0, 1.5])
    tails = np.exp(predictive_log_tail(values, posterior))
    for v, tail in zip(values, tails, strict=True):
        assert tail == pytest.approx(quad(density, v, np.inf, limit=200)[0], rel=1e-5)
    far = predictive_log_tail(np.array([5.0, 50.0, 500.0, 5e4]), posterior)
    assert np.isfinite(far).all() and (np.diff(far) < 0).all()  # no underflow to -inf


def test_tail_probability_is_calibrated_on_held_out_normal_rows(fitted) -> None:
    """Per client, on rows drawn like that client's rows, the predictive p-value is about
    uniform; the max over clients is at most about uniform (conservative)."""
    X, _, det = fitted
    rng = np.random.default_rng(10)
    held_out = np.vstack([rng.normal(0, 1, (3000, 3)), rng.normal(5, 0.5, (3000, 3))])
    per_client = det.tail_probability(held_out, per_client=True)
    assert per_client.shape == (6000, 3)
    # client 0 holds the first blob's rows, clients 1 and 2 the second blob's
    for column, rows in ((0, slice(0, 3000)), (1, slice(3000, None)), (2, slice(3000, None))):
        share = (per_client[rows, column] < 0.1).mean()
        assert abs(share - 0.1) < 0.03, (column, share)
    combined = det.tail_probability(held_out)
    assert 0.05 < (combined < 0.1).mean() <= 0.12
    np.testing.assert_allclose(combined, per_client.max(1))
    single = fit(X[:300])  # one client: exactly the per-client p-value
    share = (single.tail_probability(held_out[:3000]) < 0.1).mean()
    assert abs(share - 0.1) < 0.03


def test_scores_follow_the_pyod_contract(fitted) -> None:
    X, groups, det = fitted
    far = np.array([[20.0, -20.0, 20.0], [0.0, 0.0, 0.0]])
    scores = det.decision_function(far)
    assert scores[0] > det.threshold_ > scores[1] >= 0
    np.testing.assert_allclose(det.score_samples(far), -scores)
    np.testing.assert_allclose(det.tail_probability(far), np.exp(-scores))
    assert det.predict(far).tolist() == [1, 0]
    proba = det.predict_proba(far)
    assert proba.shape == (2, 2) and proba[0, 1] > proba[1, 1]
    assert det.labels_.mean() == pytest.approx(0.1, abs=0.01)
    # y is ignored
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        again = FedKNNMarkerDetector(random_state=0).fit(X, np.ones(len(X)), groups=groups)
    assert_close_scaled(again.decision_scores_, det.decision_scores_, rtol=1e-12)


def test_mixture_combination_weights_the_clients_by_their_rows(fitted) -> None:
    X, _, det = fitted
    mixture = copy.deepcopy(det).set_params(combine="mixture")
    np.testing.assert_allclose(mixture.client_weights_, [0.5, 1 / 6, 1 / 3])
    per_client = det.tail_probability(X[::7], per_client=True)
    np.testing.assert_allclose(
        mixture.tail_probability(X[::7]), per_client @ det.client_weights_, rtol=1e-12
    )
    assert (mixture.tail_probability(X[::7]) <= det.tail_probability(X[::7]) + 1e-12).all()


def test_training_scores_use_leave_one_out_distances(fitted) -> None:
    """A training row is not its own neighbour: its score for its own client uses the
    distance the model was fitted on, so training and fresh rows score alike."""
    X, groups, det = fitted
    own = predictive_log_tail(
        knn_log_distances(torch.as_tensor(X[groups == 0]), 5, 1e-6)[:, 0].numpy(),
        det.client_posteriors_[0],
    )
    others = np.log(det.tail_probability(X[groups == 0], per_client=True)[:, 1:])
    expected = -np.maximum(own, others.max(1))
    np.testing.assert_allclose(det.decision_scores_[groups == 0], expected, rtol=1e-12)


def test_personal_posteriors_follow_each_clients_distances() -> None:
    """A small client's kNN distances are larger than a big one's; its personal posterior
    moves there, the more so the weaker the global prior."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(1100, 2))
    groups = np.r_[np.zeros(1000), np.ones(100)]
    det = fit(X, groups, personal_strength=5.0)
    small = knn_log_distances(torch.as_tensor(X[groups == 1]), 5, 1e-6)

    def mean(posterior) -> float:
        return float(posterior.weights @ posterior.means[:, 0])

    assert mean(det.client_posteriors_[1]) == pytest.approx(float(small.mean()), abs=0.1)
    assert mean(det.client_posteriors_[1]) > mean(det.posterior_) + 0.3
    strong = personal_posterior(small, det.posterior_, strength=1e7)
    assert mean(strong) == pytest.approx(mean(det.posterior_), abs=0.01)
    shared = fit(X, groups, personal_strength=None)
    assert all(p is shared.posterior_ for p in shared.client_posteriors_)


# ----------------------------------------------------------------------------- degenerate
def test_small_clients_are_skipped_with_the_reason(fitted) -> None:
    X = blobs(6, 100)
    groups = np.r_[np.zeros(100), np.ones(97), np.full(3, 2)]
    det = fit(X, groups)
    assert det.scoring_clients_.tolist() == [0, 1]
    assert "needs >= 6" in det.skipped_clients_[2]
    assert det.decision_scores_.shape == (200,) and np.isfinite(det.decision_scores_).all()
    with pytest.raises(ClientDataError, match="n_neighbors"):
        fit(X[:8], np.arange(8) % 2)


def test_duplicate_rows_give_finite_scores() -> None:
    rng = np.random.default_rng(7)
    X = np.repeat(rng.normal(size=(60, 2)), 4, axis=0)  # every row four times
    X = np.vstack([X, rng.normal(size=(100, 2))])
    det = fit(X, np.arange(len(X)) % 2, n_neighbors=3)
    assert np.isfinite(det.decision_scores_).all()
    scores = det.decision_function(np.vstack([X[:1], [[9.0, 9.0]]]))
    assert np.isfinite(scores).all() and scores[1] > scores[0]


@pytest.mark.parametrize(
    ("X", "message"),
    [
        (np.array([[0.0, np.nan, 0.0]]), "NaN or inf"),
        (np.array([[0.0, np.inf, 0.0]]), "NaN or inf"),
        (np.zeros((2, 4)), "4 features"),
        (np.zeros(3), "2-D"),
    ],
)
def test_bad_rows_are_refused_by_name(fitted, X, message) -> None:
    _, _, det = fitted
    for score in (det.decision_function, det.tail_probability, det.predict):
        with pytest.raises(ValueError, match=f"^X .*{message}"):
            score(X)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("n_neighbors", 0),
        ("personal_strength", -1.0),
        ("distance_floor", 0.0),
        ("n_components", 0),
        ("personal_iter", 0),
    ],
)
def test_bad_settings_are_refused_by_name(param, value) -> None:
    with pytest.raises(InvalidParameterError, match=param):
        FedKNNMarkerDetector(**{param: value}).fit(blobs(0, 20))


def test_scoring_before_fit_says_what_to_do() -> None:
    with pytest.raises(NotFittedError, match="fit"):
        FedKNNMarkerDetector().decision_function(np.zeros((1, 3)))


# ----------------------------------------------------------------------------- persistence
def test_save_load_round_trip_holds_the_client_rows(fitted, tmp_path) -> None:
    X, _, det = fitted
    path = tmp_path / "knn.safetensors"
    det.save(path)
    loaded = load(path)
    assert isinstance(loaded, FedKNNMarkerDetector)
    assert_close_scaled(loaded.decision_function(X), det.decision_function(X), rtol=1e-12)
    assert loaded.skipped_clients_ == det.skipped_clients_
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        names = set(handle.keys())
        np.testing.assert_array_equal(handle.get_tensor("client.0.rows").numpy(), X[:300])
    assert {"client.0.rows", "client.2.posterior.means", "posterior.means"} <= names


def test_a_damaged_file_is_refused(fitted, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from fednovelty.detectors.persistence import _CHECKSUM_KEY, _METADATA_KEY, checksum

    _, _, det = fitted
    path = tmp_path / "knn.safetensors"
    det.save(path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        text = handle.metadata()[_METADATA_KEY]
    tensors = load_file(str(path))
    tensors["client.1.rows"] = tensors["client.1.rows"][:, :2].contiguous()
    save_file(tensors, str(path), {_METADATA_KEY: text, _CHECKSUM_KEY: checksum(text, tensors)})
    with pytest.raises(ModelFormatError, match=r"client\.1\.rows"):
        load(path)


# ----------------------------------------------------------------------------- real data
def test_quality_floor_on_breastw() -> None:
    """4_breastw, novelty protocol, 3 clients (Dirichlet 0.5): measured AUROC 0.99."""
    from fednovelty.datasets.protocols import make_task
    from fednovelty.evaluation.metrics import evaluate

    task = make_task("4_breastw", "novelty", n_clients=3, alpha=0.5, seed=0)
    det = fit(task.X_train, task.groups_train)
    auroc = evaluate(task.y_test, det.decision_function(task.X_test))["auroc"]
    print(f"FedKNNMarkerDetector 4_breastw AUROC {auroc:.4f}")
    assert auroc >= 0.97
