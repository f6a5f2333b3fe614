"""``Detector.from_model``: a detector from a run made elsewhere (Flower, or any engine).

The reference is the detector's own ``fit``: its ``run_simulation`` call is spied on, and
the captured ``SimulationResult`` handed to ``from_model`` with the same rows must give the
very same detector (parameters, scores, threshold, record of rounds), bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

import fednovelty.detectors.base as detector_base
from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector, load
from fednovelty.federated.joint_models.joint import JointState
from fednovelty.runtime import run_simulation
from fednovelty.runtime.flower.results import FlowerResult, algorithm_config

CENTERS = np.array([[-5.0, 0.0, 0.0], [5.0, 0.0, 1.0], [0.0, 6.0, -1.0]])


def make_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """180 rows of three blobs in 3-D; client ids 0, 1, 2 (60 rows each, non-iid mix)."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + rng.normal(size=(60, 3)) for c in CENTERS])
    groups = np.repeat([0, 1, 2], 60)
    groups[::7] = 1  # some rows of every blob on client 1
    return X, groups


def fit_and_capture(detector, X, groups, monkeypatch):
    """Fit ``detector`` and return ``(algorithm, SimulationResult)`` of its run."""
    runs = []

    def spy(algorithm, clients, **kwargs):
        result = run_simulation(algorithm, clients, **kwargs)
        runs.append((algorithm, result))
        return result

    monkeypatch.setattr(detector_base, "run_simulation", spy)
    detector.fit(X, groups=groups)
    monkeypatch.undo()
    assert len(runs) == 1
    return runs[0]


FITTED_ATTRIBUTES = {
    FedGMMDetector: ("weights_", "means_", "covariances_", "n_iter_", "lower_bounds_"),
    FedGenGMMDetector: ("weights_", "means_", "covariances_", "n_synthetic_", "bic_"),
    LocalGMMDetector: ("client_n_components_", "skipped_clients_"),
}
CASES = [
    (FedGMMDetector, {"n_components": 3, "mixture_weights": "personal", "max_iter": 5}),
    (FedGMMDetector, {"n_components": 3, "mixture_weights": "global", "covariance_type": "diag"}),
    (FedGenGMMDetector, {"n_components": 3, "k_range": (1, 4)}),
    (FedGenGMMDetector, {"n_components": 3, "k_range": (1, 4), "copula": True}),
    (LocalGMMDetector, {"client_components": 2}),
]


def assert_same_detector(made, fitted, X_new) -> None:
    for name in (*FITTED_ATTRIBUTES[type(fitted)], "decision_scores_", "threshold_", "labels_"):
        expected, actual = getattr(fitted, name), getattr(made, name)
        if isinstance(expected, np.ndarray):
            np.testing.assert_array_equal(actual, expected, err_msg=name)
        else:
            assert actual == expected, name
    np.testing.assert_array_equal(made.client_ids_, fitted.client_ids_)
    assert made.history_ == fitted.history_
    assert (made.bytes_up_, made.bytes_down_) == (fitted.bytes_up_, fitted.bytes_down_)
    np.testing.assert_array_equal(made.decision_function(X_new), fitted.decision_function(X_new))
    np.testing.assert_array_equal(made.predict(X_new), fitted.predict(X_new))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(("cls", "params"), CASES, ids=lambda p: getattr(p, "__name__", ""))
def test_from_model_equals_fit(cls, params, monkeypatch) -> None:
    X, groups = make_data()
    fitted = cls(random_state=0, **params)
    _, result = fit_and_capture(fitted, X, groups, monkeypatch)
    made = cls.from_model(result, X, **fitted.get_params())
    X_new = make_data(seed=1)[0] * 1.5
    assert_same_detector(made, fitted, X_new)
    if params.get("mixture_weights") == "personal":
        np.testing.assert_array_equal(made.client_weights_, fitted.client_weights_)
        np.testing.assert_array_equal(
            made.score_samples_client(X_new, 2), fitted.score_samples_client(X_new, 2)
        )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_from_model_takes_settings_from_the_run_and_saves(monkeypatch, tmp_path) -> None:
    X, groups = make_data()
    fitted = FedGMMDetector(
        n_components=2, covariance_type="spherical", mixture_weights="global", random_state=0
    )
    algorithm, result = fit_and_capture(fitted, X, groups, monkeypatch)
    flower_like = FlowerResult(
        result.state,
        result.history,
        {},
        algorithm="FederatedEM",
        config=algorithm_config(algorithm),
    )
    made = FedGMMDetector.from_model(flower_like, X)  # no constructor arguments at all
    assert made.covariance_type == "spherical"
    assert made.mixture_weights == "global"
    assert made.n_components == 2
    assert not hasattr(made, "client_weights_")
    np.testing.assert_array_equal(made.decision_scores_, fitted.decision_scores_)
    made.save(tmp_path / "made.safetensors")
    loaded = load(tmp_path / "made.safetensors")
    assert isinstance(loaded, FedGMMDetector)
    # scored again from the loaded tensors (another memory layout): round-off apart
    assert_close_scaled(loaded.decision_function(X), fitted.decision_function(X))


def test_from_model_keeps_dataframe_feature_names(monkeypatch) -> None:
    pd = pytest.importorskip("pandas")
    X, groups = make_data()
    frame = pd.DataFrame(X, columns=["a", "b", "c"])
    fitted = FedGenGMMDetector(n_components=3, k_range=(1, 3), random_state=0)
    _, result = fit_and_capture(fitted, frame, groups, monkeypatch)
    made = FedGenGMMDetector.from_model(result, frame, **fitted.get_params())
    assert made.feature_names_in_.tolist() == ["a", "b", "c"]
    with pytest.raises(ValueError, match="feature names"):
        made.decision_function(frame[["c", "b", "a"]].set_axis(["c", "b", "x"], axis=1))


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("cls", [FedGMMDetector, FedGenGMMDetector])
def test_from_model_rejects_rows_of_another_width(cls, monkeypatch) -> None:
    X, groups = make_data()
    fitted = cls(n_components=2, random_state=0, max_iter=3)
    _, result = fit_and_capture(fitted, X, groups, monkeypatch)
    with pytest.raises(ValueError, match="X has 2 features but the model was trained on"):
        cls.from_model(result, X[:, :2], **fitted.get_params())


def test_from_model_copula_needs_a_run_that_fitted_one(monkeypatch) -> None:
    X, groups = make_data()
    plain = FedGenGMMDetector(n_components=3, k_range=(1, 3), random_state=0)
    _, result = fit_and_capture(plain, X, groups, monkeypatch)
    settings = {**plain.get_params(), "copula": True}
    with pytest.raises(ValueError, match="trained without a copula"):
        FedGenGMMDetector.from_model(result, X, **settings)
    # the other way round the copula is simply not used: the detector scores with the mixture
    with_copula = FedGenGMMDetector(n_components=3, k_range=(1, 3), random_state=0, copula=True)
    _, result = fit_and_capture(with_copula, X, groups, monkeypatch)
    made = FedGenGMMDetector.from_model(result, X, **plain.get_params())
    assert made.copula_joint_ is None
    np.testing.assert_array_equal(
        made.decision_scores_, plain.fit(X, groups=groups).decision_scores_
    )


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_from_model_refuses_joint_models() -> None:
    X, _ = make_data()
    mixture = FedGMMDetector(n_components=1, max_iter=2, random_state=0).fit(X)
    state = JointState(phase="done", params=mixture.model_, learners=[{"w": torch.zeros(2)}])
    result = FlowerResult(state, [], {}, algorithm="JointFedGMM")
    with pytest.raises(ValueError, match="joint models"):
        FedGMMDetector.from_model(result, X)
