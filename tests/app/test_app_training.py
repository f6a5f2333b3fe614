"""Dashboard training helpers (app/fednovelty_app/training.py)."""

import threading

import numpy as np
import pytest
from _tolerance import assert_close_scaled
from fednovelty_app.data import synthetic_bundle
from fednovelty_app.training import (
    DataSettings,
    MethodSettings,
    ModelFileError,
    Progress,
    build_detector,
    centralized_choices,
    counts_rounds,
    federated_choices,
    fit_with_progress,
    fits_locally,
    max_rounds,
    method_description,
    model_from_bytes,
    model_to_bytes,
    registry_name,
    run_key,
    train,
    uploaded_run,
)

from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector
from fednovelty.detectors import JointFedGMMDetector
from fednovelty.detectors.options import Initialisation, Training
from fednovelty.methods import get_method, method_names

FEDERATED = federated_choices()
CENTRALIZED = centralized_choices()


def test_run_key_is_stable_and_tells_settings_apart():
    a = run_key(DataSettings(), MethodSettings())
    assert a == run_key(DataSettings(), MethodSettings())
    assert a != run_key(DataSettings(seed=1), MethodSettings())
    assert a != run_key(DataSettings(), MethodSettings(n_components=4))


def test_the_page_choices_are_the_registry_methods():
    assert list(FEDERATED) == [
        "FedGenGMM",
        "FedGMM",
        "DEM",
        "ClusteredGMM-IFCA",
        "ClusteredGMM-FeSEM",
        "Local",
        "FedMFA",
        "FedVB",
        "KNN-markers",
    ]
    assert CENTRALIZED == ("CentralGMM", "IForest", "ECOD", "COPOD", "KNN", "LOF", "HBOS", "PCA")
    assert FEDERATED["DEM"] == get_method("DEM-kmeans").description
    # every novelty method of the registry is one page choice with its settings away
    reached = {registry_name(MethodSettings(method=m)) for m in [*FEDERATED, *CENTRALIZED]}
    reached |= {registry_name(MethodSettings(method="DEM", init_params=i))
                for i in ("separated", "subset", "oneshot")}  # fmt: skip
    reached.add(registry_name(MethodSettings(method="FedGenGMM", copula=True)))
    assert reached == set(method_names())
    assert registry_name(MethodSettings(), joint=True) == "PFL-FedGMM"
    with pytest.raises(ValueError, match="joint=True fits FedGMM's joint model"):
        registry_name(MethodSettings(method="DEM"), joint=True)
    with pytest.raises(ValueError, match="init_params must be one of"):
        registry_name(MethodSettings(method="DEM", init_params="random"))
    assert "global weight vector" in method_description(MethodSettings(method="DEM"))


@pytest.mark.parametrize("method", [*FEDERATED, *CENTRALIZED])
def test_every_method_builds_a_detector(method):
    settings = MethodSettings(method=method, n_components=2, covariance_type="diag", max_iter=7)
    detector = build_detector(settings, seed=3)
    assert hasattr(detector, "fit") and hasattr(detector, "decision_function")
    expected = {
        "FedGMM": FedGMMDetector,
        "DEM": FedGMMDetector,
        "CentralGMM": FedGMMDetector,
        "FedGenGMM": FedGenGMMDetector,
        "Local": LocalGMMDetector,
    }
    if method in expected:
        assert isinstance(detector, expected[method]) and not detector.progress  # no tqdm
        assert detector.covariance_type == "diag" and detector.random_state == 3
    if method in ("FedGMM", "DEM", "CentralGMM"):  # the page's EM rounds
        assert (detector.n_components, detector.max_iter, detector.tol) == (2, 7, 1e-3)
        assert detector.mixture_weights == ("personal" if method == "FedGMM" else "global")
        assert detector._option("privacy").min_rows == (1 if method == "CentralGMM" else 5)
    if method in ("FedGenGMM", "Local"):  # EM within each client: at least 100 iterations
        assert detector.max_iter == 100
    assert fits_locally(method) == (method in ("FedGenGMM", "Local"))
    # the page's "rounds at most" reaches every detector whose max_iter counts rounds
    if counts_rounds(method):
        assert detector.max_iter == 7
    if method in ("IForest", "PCA"):
        assert detector.random_state == 3
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        build_detector(MethodSettings(method="nope"), seed=0)


def test_dem_initialisation_and_the_joint_model_are_registry_methods():
    subset = build_detector(MethodSettings(method="DEM", init_params="subset"), seed=0)
    assert (subset.mixture_weights, subset.init_params) == ("global", "subset")
    settings = MethodSettings(n_components=2, max_iter=9, n_learners=4, local_epochs=2)
    joint = build_detector(settings, seed=1, joint=True)
    assert isinstance(joint, JointFedGMMDetector)
    assert (joint.n_components, joint.max_iter, joint.tol) == (2, 9, 1e-6)
    assert (joint.n_learners, joint.training.local_epochs, joint.random_state) == (4, 2, 1)


def test_fedgengmm_copula_is_a_setting_that_reaches_the_scores():
    plain = MethodSettings(method="FedGenGMM", n_components=2)
    copula = MethodSettings(method="FedGenGMM", n_components=2, copula=True)
    assert run_key(DataSettings(), plain) != run_key(DataSettings(), copula)
    assert not build_detector(plain, seed=0).copula and build_detector(copula, seed=0).copula
    bundle = synthetic_bundle(n_clients=3, n_unseen=0, n_features=2, seed=0)
    runs = [train(DataSettings(), m, bundle) for m in (plain, copula)]
    assert runs[0].detector.copula_joint_ is None
    assert runs[1].detector.copula_joint_ is not None
    np.testing.assert_array_equal(runs[0].detector.means_, runs[1].detector.means_)
    X = bundle.frame(bundle.X_train)
    assert not np.allclose(runs[0].detector.score_samples(X), runs[1].detector.score_samples(X))


def test_progress_text():
    step = Progress(12, 40, "em", -3.2, 2.0)
    assert step.fraction == pytest.approx(0.3)
    assert step.text() == "round 12 / 40 (em, log-lik -3.2000), 2.0 s"
    assert Progress(0, None, None, None, 5.0, done=True).fraction == 1.0


def test_fit_reports_every_round_from_the_detector_hook():
    bundle = synthetic_bundle(n_clients=3, n_unseen=0, n_features=2, seed=0)
    detector = FedGMMDetector(2, max_iter=40, tol=0.0, random_state=0)
    X = bundle.frame(bundle.X_train)
    reports = []
    threads = []

    def on_progress(progress):  # in the caller's (Streamlit's script) thread
        threads.append(threading.get_ident())
        reports.append(progress)

    fitted, caught = fit_with_progress(
        lambda hook: detector.fit(X, groups=bundle.groups_train, callbacks=[hook]),
        on_progress,
        total=max_rounds(detector),
    )
    assert fitted is detector and reports[-1].done and len(reports) == detector.n_rounds_ + 1
    assert set(threads) == {threading.get_ident()}
    rounds = reports[:-1]
    assert [r.round for r in rounds] == list(range(1, detector.n_rounds_ + 1))
    assert [r.phase for r in rounds] == [h["kind"] for h in detector.history_]
    assert {r.total for r in rounds} == {max_rounds(detector)} and max_rounds(detector) == 51
    em = [r for r in rounds if r.phase == "em"]
    assert [r.loglik for r in em] == pytest.approx(detector.lower_bounds_)
    assert all(r.loglik is None for r in rounds if r.phase != "em")
    assert any("did not converge" in message for message in caught)


def test_max_rounds_of_each_detector():
    assert (
        max_rounds(FedGMMDetector(2, max_iter=30, initialisation=Initialisation(kmeans_rounds=10)))
        == 41
    )
    assert max_rounds(FedGMMDetector(2, max_iter=30, init_params="subset")) == 32
    assert max_rounds(FedGMMDetector(2, max_iter=30, pca_components=2)) == 43
    assert max_rounds(FedGenGMMDetector()) == max_rounds(LocalGMMDetector()) == 1
    assert max_rounds(build_detector(MethodSettings(method="ECOD"), seed=0)) is None


def test_fit_errors_reach_the_caller():
    def fail(hook):
        raise ValueError("n_components=50 must be <= n_samples=3")

    with pytest.raises(ValueError, match="n_components=50"):
        fit_with_progress(fail)


def test_train_fits_the_joint_model_on_labelled_data(joint_run):
    assert joint_run.joint and joint_run.fednovelty and joint_run.fit_seconds > 0
    assert joint_run.detector.n_clients_ == 4
    assert joint_run.label.startswith("FedGMM (joint) on synthetic")
    bundle, method = joint_run.bundle, joint_run.method
    direct = JointFedGMMDetector(
        method.n_components,
        max_iter=method.max_iter,
        tol=1e-6,
        n_learners=method.n_learners,
        random_state=joint_run.data.seed,
        training=Training(local_epochs=method.local_epochs),
    ).fit(bundle.frame(bundle.X_train), bundle.y_train, bundle.groups_train)
    np.testing.assert_array_equal(direct.classes_, joint_run.detector.classes_)
    X = bundle.frame(bundle.X_test)
    assert_close_scaled(
        joint_run.detector.log_pxy(X, bundle.y_test), direct.log_pxy(X, bundle.y_test)
    )


def test_fedgmm_without_joint_fits_x_only_on_labelled_data():
    data = DataSettings(n_clients=3, n_unseen=0, n_features=2)
    bundle = synthetic_bundle(3, n_unseen=0, n_features=2)
    assert bundle.labelled
    run = train(data, MethodSettings(n_components=2, max_iter=5, joint=False), bundle)
    assert not run.joint and isinstance(run.detector, FedGMMDetector)
    assert run.label.startswith("FedGMM on synthetic")


def test_train_reports_the_rounds_of_pooled_and_federated_mixtures():
    data = DataSettings(n_clients=3, n_unseen=0, n_features=2)
    bundle = synthetic_bundle(3, n_unseen=0, n_features=2)
    for name in ("CentralGMM", "FedGenGMM"):
        reports = []
        run = train(
            data, MethodSettings(method=name, n_components=2, max_iter=5), bundle, reports.append
        )
        rounds = [r.round for r in reports if not r.done]
        assert rounds == list(range(1, run.detector.n_rounds_ + 1)) and reports[-1].done
        assert reports[0].total == max_rounds(run.detector)


def test_train_a_pooled_baseline():
    data = DataSettings(n_clients=3, n_unseen=0, n_features=2)
    bundle = synthetic_bundle(3, n_unseen=0, n_features=2)
    reports = []
    run = train(data, MethodSettings(method="ECOD"), bundle, reports.append)
    assert not run.fednovelty and not run.joint
    assert [r.done for r in reports] == [True]  # no rounds, no callbacks= passed to PyOD
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
