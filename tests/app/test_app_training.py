"""Dashboard training helpers (app/fednovelty_app/training.py)."""

import numpy as np
import pytest
from fednovelty_app.data import synthetic_bundle
from fednovelty_app.training import (
    CENTRALIZED,
    FEDERATED,
    DataSettings,
    MethodSettings,
    ModelFileError,
    Progress,
    build_detector,
    fit_with_progress,
    model_from_bytes,
    model_to_bytes,
    parse_postfix,
    run_key,
    train,
    uploaded_run,
)

from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector


def test_run_key_is_stable_and_tells_settings_apart():
    a = run_key(DataSettings(), MethodSettings())
    assert a == run_key(DataSettings(), MethodSettings())
    assert a != run_key(DataSettings(seed=1), MethodSettings())
    assert a != run_key(DataSettings(), MethodSettings(n_components=4))


@pytest.mark.parametrize("method", [*FEDERATED, *CENTRALIZED])
def test_every_method_builds_a_detector(method):
    detector = build_detector(MethodSettings(method=method, n_components=2), seed=3)
    assert hasattr(detector, "fit") and hasattr(detector, "decision_function")
    expected = {
        "FedGMM": FedGMMDetector,
        "DEM": FedGMMDetector,
        "CentralGMM": FedGMMDetector,
        "FedGenGMM": FedGenGMMDetector,
        "Local": LocalGMMDetector,
    }
    if method in expected:
        assert isinstance(detector, expected[method]) and detector.progress
    if method == "DEM":
        assert detector.mixture_weights == "global"
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        build_detector(MethodSettings(method="nope"), seed=0)


def test_postfix_and_progress_text():
    assert parse_postfix("loglik=-3.1234, phase=em") == ("em", -3.1234)
    assert parse_postfix("phase=centroids") == ("centroids", None)
    assert parse_postfix(None) == (None, None)
    step = Progress(12, 40, "em", -3.2, 2.0)
    assert step.fraction == pytest.approx(0.3)
    assert step.text() == "round 12 / 40 (em, log-lik -3.2000), 2.0 s"
    assert Progress(0, None, None, None, 5.0, done=True).fraction == 1.0


def test_fit_reports_rounds_as_they_happen():
    bundle = synthetic_bundle(n_clients=3, n_unseen=0, n_features=2, seed=0)
    detector = FedGMMDetector(2, max_iter=40, tol=0.0, random_state=0, progress=True)
    X = bundle.frame(bundle.X_train)
    reports = []

    def slow_fit():  # the engine's bar is polled while this runs
        return detector.fit(X, groups=bundle.groups_train)

    fitted, caught = fit_with_progress(slow_fit, "FedGMMDetector", reports.append, poll=0.01)
    assert fitted is detector and reports[-1].done
    rounds = [r.round for r in reports if not r.done]
    assert len(rounds) >= 2 and rounds == sorted(rounds) and rounds[-1] <= detector.n_rounds_
    assert any(r.phase == "em" for r in reports)
    assert any("did not converge" in message for message in caught)


def test_fit_errors_reach_the_caller():
    def fail():
        raise ValueError("n_components=50 must be <= n_samples=3")

    with pytest.raises(ValueError, match="n_components=50"):
        fit_with_progress(fail, "FedGMMDetector")


def test_train_fits_the_joint_model_on_labelled_data(joint_run):
    assert joint_run.joint and joint_run.fednovelty and joint_run.fit_seconds > 0
    assert joint_run.detector.n_clients_ == 4
    assert joint_run.label.startswith("FedGMM (joint) on synthetic")


def test_train_a_pooled_baseline():
    data = DataSettings(n_clients=3, n_unseen=0, n_features=2)
    bundle = synthetic_bundle(3, n_unseen=0, n_features=2)
    run = train(data, MethodSettings(method="ECOD"), bundle)
    assert not run.fednovelty and not run.joint
    assert run.detector.decision_function(bundle.frame(bundle.X_test)).shape == (
        bundle.X_test.shape[0],
    )
    with pytest.raises(ModelFileError, match="no safe file format"):
        model_to_bytes(run.detector)


def test_model_file_round_trip_and_checks(joint_run):
    content = model_to_bytes(joint_run.detector)
    detector = model_from_bytes(content)
    X = joint_run.bundle.frame(joint_run.bundle.X_test)
    np.testing.assert_allclose(detector.log_px(X), joint_run.detector.log_px(X))
    run = uploaded_run(detector, joint_run.data, joint_run.bundle, "abc")
    assert run.origin == "uploaded" and run.joint and run.method.method == "uploaded FedGMM"
    with pytest.raises(ModelFileError, match="not a fednovelty model file"):
        model_from_bytes(b"definitely not safetensors")
    other = synthetic_bundle(3, n_unseen=0, n_features=3)
    with pytest.raises(ModelFileError, match="trained on 4 features but"):
        uploaded_run(detector, joint_run.data, other, "abc")
