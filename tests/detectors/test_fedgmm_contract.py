"""``FedGMMDetector`` models x alone and honours PyOD's contract: ``y`` is ignored, the joint
model's names belong to ``JointFedGMMDetector`` only, old files still load."""

import warnings
from pathlib import Path

import numpy as np
import pytest
from _saved_files import rewrite, with_flat_options
from _tolerance import assert_close_scaled
from pyod.models.iforest import IForest
from safetensors import safe_open
from sklearn.base import clone

from fednovelty import FedGMMDetector, JointFedGMMDetector, load
from fednovelty.detectors.options import ClientSampling, Prior
from fednovelty.detectors.persistence import _METADATA_KEY
from fednovelty.exceptions import ModelFormatError

JOINT_ONLY_PARAMS = ("n_learners", "learner", "training", "aggregate_learners")
JOINT_ONLY_METHODS = ("log_px", "log_py_given_x", "log_pxy", "predict_y", "pfl_baseline")

DATA = Path(__file__).parent / "data"
RNG = np.random.default_rng(0)
X = np.vstack([RNG.normal(0, 1, (120, 3)), RNG.normal(5, 1, (120, 3))])
Y = (X[:, 0] > 2.5).astype(int)
GROUPS = np.tile(np.arange(4), 60)


@pytest.fixture(scope="module")
def fitted():
    return FedGMMDetector(2, max_iter=20, random_state=0).fit(X, groups=GROUPS)


@pytest.mark.filterwarnings("ignore:y should not be presented:UserWarning")  # IForest's
def test_pyod_fit_predict_with_y_equals_fit_without(fitted):
    """PyOD's ``fit_predict(X, y)`` passes y on to ``fit``: same scores and labels as
    ``fit(X)`` (one client each), as for PyOD's own ``IForest``."""
    anomaly = (RNG.random(len(X)) < 0.1).astype(int)
    for detector_class in (
        lambda: FedGMMDetector(2, max_iter=20, random_state=0),
        lambda: IForest(random_state=0),
    ):
        with warnings.catch_warnings():  # PyOD's own fit_predict is deprecated (FutureWarning)
            warnings.simplefilter("ignore", FutureWarning)
            labels = (with_y := detector_class()).fit_predict(X, anomaly)
        without_y = detector_class().fit(X)
        np.testing.assert_array_equal(labels, without_y.labels_)
        np.testing.assert_array_equal(with_y.decision_scores_, without_y.decision_scores_)
        assert with_y.threshold_ == without_y.threshold_
        assert not hasattr(with_y, "classes_")


def test_y_is_ignored_with_groups(fitted):
    with_y = FedGMMDetector(2, max_iter=20, random_state=0).fit(X, Y, groups=GROUPS)
    np.testing.assert_array_equal(with_y.decision_scores_, fitted.decision_scores_)
    np.testing.assert_array_equal(with_y.means_, fitted.means_)
    untimed = [{k: v for k, v in r.items() if k != "seconds"} for r in fitted.history_]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in with_y.history_] == untimed


def test_clone_and_get_params(fitted):
    params = fitted.get_params()
    assert not set(JOINT_ONLY_PARAMS) & set(params)
    fresh = clone(fitted)
    assert fresh.get_params() == params and not hasattr(fresh, "history_")
    again = fresh.fit(X, groups=GROUPS)
    np.testing.assert_array_equal(again.decision_scores_, fitted.decision_scores_)
    with pytest.raises(ValueError, match="Invalid parameter n_learners"):
        fresh.set_params(n_learners=2)


def test_the_joint_models_names_are_not_the_plain_models():
    for name in JOINT_ONLY_METHODS:
        assert not hasattr(FedGMMDetector, name) and callable(getattr(JointFedGMMDetector, name))
    for name in JOINT_ONLY_PARAMS:
        value = JointFedGMMDetector().get_params()[name]
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            FedGMMDetector(2, **{name: value})
        JointFedGMMDetector(2, **{name: value})  # where it belongs
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        FedGMMDetector(2, colour="red")
    with pytest.raises(TypeError):
        FedGMMDetector(2, 3)  # only n_components is positional


def test_a_file_saved_with_the_older_prior_name_loads(fitted, tmp_path):
    """Files written when ``Prior.strength`` was the setting ``prior_strength`` and, before,
    ``covariance_prior`` still load."""
    path = tmp_path / "old.safetensors"
    fitted.set_params(prior=Prior(strength=7.0)).save(path)
    fitted.set_params(prior=None)
    rewrite(
        path,
        lambda text: with_flat_options(text).replace('"prior_strength"', '"covariance_prior"'),
    )
    with safe_open(str(path), framework="pt") as handle:
        assert '"covariance_prior": 7.0' in handle.metadata()[_METADATA_KEY]
    assert load(path).prior.strength == 7.0


def test_plain_model_adapts_its_gaussian_weights(fitted):
    rows = X[GROUPS == 1]
    handle = fitted.adapt(rows)
    assert handle.weights.shape == (2,) and not handle.joint and not handle.labelled
    personal = fitted.score_samples_client(rows, handle)
    assert personal.mean() >= fitted.score_samples(rows).mean()
    np.testing.assert_allclose(fitted.decision_function(rows, client=handle), -personal)
    np.testing.assert_allclose(
        fitted.decision_function(rows, client=1), -fitted.score_samples_client(rows, 1)
    )
    with pytest.raises(ValueError, match="at least 2 rows"):
        fitted.adapt(rows[:1])


# ------------------------------------------------------------------ files of the old class
@pytest.fixture(scope="module")
def old():
    return np.load(DATA / "fedgmm_v0.1_scores.npz")


def test_an_old_joint_file_loads_as_the_joint_estimator(old):
    path = DATA / "fedgmm_joint_v0.1.safetensors"
    for detector in (load(path), JointFedGMMDetector.load(path)):
        assert type(detector) is JointFedGMMDetector
        assert detector.n_learners == 2 and detector.classes_.tolist() == [0, 1]
        assert "mixture_weights" not in detector.get_params()
        # scores recomputed from the file's tensors, as by the code that wrote it
        assert_close_scaled(detector.log_pxy(old["X"], old["y"]), old["joint_pxy"])
        assert_close_scaled(detector.decision_function(old["X"]), old["joint_px"])
    with pytest.raises(ModelFormatError, match="holds a JointFedGMMDetector, not a FedGMMDetector"):
        FedGMMDetector.load(path)


def test_an_old_plain_file_loads_without_the_joint_settings(old, tmp_path):
    path = DATA / "fedgmm_plain_v0.1.safetensors"
    detector = FedGMMDetector.load(path)
    assert type(detector) is FedGMMDetector
    assert_close_scaled(detector.decision_function(old["X"]), old["plain"])
    detector.save(tmp_path / "again.safetensors")  # written in the current layout
    again = load(tmp_path / "again.safetensors")
    assert again.get_params() == detector.get_params()
    with pytest.raises(ModelFormatError, match="holds a FedGMMDetector"):
        JointFedGMMDetector.load(path)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("engine", [{"fraction": 0.5}, {"dropout": 0.3}])
def test_pca_with_sampled_clients_runs_pca_on_every_client(engine):
    """Federated PCA's two rounds need the same clients: with sampling or dropout they ask
    every client (a run of their own), then EM samples; rounds are numbered on."""
    sampling = ClientSampling(**engine)
    detector = FedGMMDetector(2, pca_components=2, max_iter=4, random_state=0, sampling=sampling)
    detector.fit(X, groups=GROUPS)
    kinds = [r["kind"] for r in detector.history_]
    assert kinds[:2] == ["moments_mean", "moments_scatter"] and "em" in kinds
    assert [r["n_replied"] for r in detector.history_[:2]] == [4, 4]
    assert [r["round"] for r in detector.history_] == list(range(1, detector.n_rounds_ + 1))
    assert detector.bytes_up_ == sum(r["bytes_up"] for r in detector.history_)
    assert detector.pca_.components.shape == (2, 3)
