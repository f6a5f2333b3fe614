"""FedGMMDetector's supervised path: fit(X, y, groups) trains FedGMM's joint model."""

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty import FedGMMDetector, load
from fednovelty.datasets import make_fedgmm_synthetic


@pytest.fixture(scope="module")
def split():
    return make_fedgmm_synthetic(6, random_state=1)


@pytest.fixture(scope="module")
def fitted(split):
    labels = np.array(["neg", "pos"])[split.y_train]  # string labels are mapped and kept
    detector = FedGMMDetector(3, n_learners=3, max_iter=8, tol=0.0, random_state=0)
    return detector.fit(split.X_train, labels, groups=split.groups_train)


def test_labels_and_weights(fitted, split):
    assert fitted.classes_.tolist() == ["neg", "pos"]
    assert fitted.client_joint_weights_.shape == (6, 3, 3)
    np.testing.assert_allclose(fitted.client_joint_weights_.sum((1, 2)), 1.0)
    np.testing.assert_allclose(fitted.client_weights_, fitted.client_joint_weights_.sum(2))
    assert set(fitted.predict_y(split.X_test)) <= {"neg", "pos"}


def test_scores_fit_together(fitted, split):
    X, y = split.X_test, np.array(["neg", "pos"])[split.y_test]
    log_px, log_py = fitted.log_px(X), fitted.log_py_given_x(X, y)
    np.testing.assert_allclose(fitted.log_pxy(X, y), log_px + log_py, atol=1e-10)
    np.testing.assert_allclose(fitted.predict_proba_y(X).sum(1), 1.0)
    np.testing.assert_allclose(fitted.score_samples(X), log_px, atol=1e-8)
    np.testing.assert_allclose(fitted.decision_function(X), -fitted.score_samples(X))
    assert not np.allclose(fitted.log_px(X, client=0), log_px)  # personal weights differ
    # permuting labels makes them less likely under the learned p(y|x)
    flipped = np.where(y == "neg", "pos", "neg")
    assert fitted.log_py_given_x(X, flipped).mean() < log_py.mean()


def test_bad_input_is_named(fitted, split):
    X = split.X_test[:4]
    with pytest.raises(ValueError, match=r"label\(s\) \['other'\] not seen in fit"):
        fitted.log_py_given_x(X, ["neg", "pos", "other", "neg"])
    with pytest.raises(ValueError, match="client 42 was not seen in fit"):
        fitted.log_px(X, client=42)
    with pytest.raises(ValueError, match="y has 3 labels but X has 4 rows"):
        fitted.log_pxy(X, ["neg", "pos", "neg"])
    with pytest.raises(ValueError, match="single class"):
        FedGMMDetector(2).fit(
            split.X_train, np.zeros(len(split.X_train)), groups=split.groups_train
        )
    with pytest.raises(ValueError, match="one label per row"):
        FedGMMDetector(2).fit(split.X_train, split.y_train[:-1], groups=split.groups_train)


def test_refit_without_y_is_plain(split):
    plain = FedGMMDetector(3, max_iter=5, random_state=0).fit(
        split.X_train, groups=split.groups_train
    )
    assert not hasattr(plain, "classes_")
    with pytest.raises(ValueError, match="fitted without y"):
        plain.log_px(split.X_test)


def test_score_choices(fitted, split):
    X, y = split.X_test, np.array(["neg", "pos"])[split.y_test]
    np.testing.assert_allclose(
        fitted.decision_function(X, score="py|x", y=y), -fitted.log_py_given_x(X, y)
    )
    np.testing.assert_allclose(fitted.decision_function(X, y, score="pxy"), -fitted.log_pxy(X, y))
    np.testing.assert_allclose(
        fitted.decision_function(X, score="px", client=2), -fitted.log_px(X, client=2)
    )
    msp = fitted.decision_function(X, score="msp")
    np.testing.assert_allclose(msp, -fitted.predict_proba_y(X).max(1))
    assert np.all((msp >= -1.0) & (msp <= -0.5))  # two classes: max prob in [0.5, 1]
    with pytest.raises(ValueError, match="needs the labels"):
        fitted.decision_function(X, score="py|x")
    with pytest.raises(ValueError, match="score must be one of"):
        fitted.decision_function(X, score="p(x)")


def test_adapt_freezes_the_model_and_returns_a_client_handle(fitted, split):
    shared = {
        "means": fitted.means_.copy(),
        "counts": fitted.joint_state_.joint_counts.clone(),
        "learner": {k: v.clone() for k, v in fitted.joint_state_.learners[1].items()},
        "client_weights": fitted.client_joint_weights_.copy(),
    }
    rows = split.groups_test == 3
    X, y = split.X_test[rows], np.array(["neg", "pos"])[split.y_test[rows]]
    handle = fitted.adapt(X, y, max_iter=50)
    x_only = fitted.adapt(X)
    np.testing.assert_array_equal(fitted.means_, shared["means"])
    assert torch.equal(fitted.joint_state_.joint_counts, shared["counts"])
    for k, v in shared["learner"].items():
        assert torch.equal(fitted.joint_state_.learners[1][k], v)
    np.testing.assert_array_equal(fitted.client_joint_weights_, shared["client_weights"])
    assert handle.weights.shape == (3, 3) and handle.labelled and not x_only.labelled
    assert handle.trace.shape == (handle.n_iter + 1, 3, 3)
    np.testing.assert_allclose(
        handle.trace[0],
        fitted.joint_state_.joint_counts.numpy() / fitted.joint_state_.joint_counts.sum().item(),
    )
    # the handle works wherever client= does, and fits this client better than global weights
    assert fitted.log_pxy(X, y, client=handle).mean() > fitted.log_pxy(X, y).mean()
    assert fitted.log_px(X, client=x_only).mean() > fitted.log_px(X).mean()
    assert fitted.predict_y(X, client=handle).shape == (len(X),)


def test_adapt_and_client_bad_input(fitted, split):
    X = split.X_test[:5]
    with pytest.raises(ValueError, match="at least 2 rows"):
        fitted.adapt(X[:1])
    with pytest.raises(ValueError, match="max_iter must be"):
        fitted.adapt(X, max_iter=0)
    with pytest.raises(ValueError, match="not seen in fit"):
        fitted.adapt(X, ["neg", "pos", "neg", "maybe", "pos"])
    with pytest.raises(ValueError, match="client 6 was not seen in fit"):
        fitted.predict_proba_y(X, client=6)  # clients are 0..5
    with pytest.raises(TypeError, match="client must be a client id"):
        fitted.log_px(X, client=[0])
    plain = FedGMMDetector(3, max_iter=3, random_state=0).fit(
        split.X_train, groups=split.groups_train
    )
    with pytest.raises(ValueError, match="fitted without labels"):
        plain.adapt(X, [0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="another model"):
        fitted.log_px(X, client=plain.adapt(X))


def test_plain_model_adapts_its_gaussian_weights(split):
    plain = FedGMMDetector(3, max_iter=10, random_state=0).fit(
        split.X_train, groups=split.groups_train
    )
    rows = split.groups_test == 1
    handle = plain.adapt(split.X_test[rows])
    assert handle.weights.shape == (3,) and not handle.joint
    personal = plain.score_samples_client(split.X_test[rows], handle)
    assert personal.mean() > plain.score_samples(split.X_test[rows]).mean()
    np.testing.assert_allclose(
        plain.decision_function(split.X_test[rows], client=handle), -personal
    )


def test_baselines_by_name(split):
    for name, sizes in {
        "FedEM": (1, 3),
        "FedAvg": (1, 1),
        "FedProx": (1, 1),
        "Local": (1, 1),
    }.items():
        detector = FedGMMDetector.pfl_baseline(name, n_learners=3, max_iter=3, random_state=0)
        assert (detector.n_components, detector.n_learners) == sizes
    assert FedGMMDetector.pfl_baseline("FedProx", mu_prox=0.5).mu_prox == 0.5
    with pytest.raises(ValueError, match="unknown method"):
        FedGMMDetector.pfl_baseline("FedSGD")
    local = FedGMMDetector.pfl_baseline("Local", max_iter=3, random_state=0).fit(
        split.X_train, split.y_train, groups=split.groups_train
    )
    assert len(local.client_learners_) == 6
    p0, p1 = (
        local.predict_proba_y(split.X_test, client=0),
        local.predict_proba_y(split.X_test, client=1),
    )
    assert not np.allclose(p0, p1)  # each client its own classifier
    with pytest.raises(ValueError, match="has no shared learner"):
        local.predict_proba_y(split.X_test)
    local.log_px(split.X_test)  # p(x) needs no learner


@pytest.mark.parametrize(
    "options", [{}, {"aggregate_learners": False}, {"pca_components": 4}, {"learner": "mlp"}]
)
def test_joint_models_save_and_load_exactly(split, tmp_path, options):
    detector = FedGMMDetector(3, n_learners=2, max_iter=3, random_state=0, **options).fit(
        split.X_train, np.array(["neg", "pos"])[split.y_train], groups=split.groups_train
    )
    detector.save(tmp_path / "joint.safetensors")
    loaded = load(tmp_path / "joint.safetensors")
    X, y = split.X_test, np.array(["neg", "pos"])[split.y_test]
    assert loaded.classes_.tolist() == ["neg", "pos"]
    for name in ("weights_", "means_", "precisions_cholesky_", "client_joint_weights_"):
        # saved and read back: bit for bit
        np.testing.assert_array_equal(getattr(loaded, name), getattr(detector, name), name)
    # covariances_ are computed on load by inverting the precision factors: round-off apart
    assert_close_scaled(loaded.covariances_, detector.covariances_, rtol=1e-10)
    # Scores are computed again from the loaded tensors, whose memory layout may take another
    # BLAS path (measured 9e-15 apart with PCA): equal up to round-off relative to the scale.
    for client in (0, 4):
        assert_close_scaled(
            loaded.log_pxy(X, y, client=client), detector.log_pxy(X, y, client=client)
        )
    assert_close_scaled(loaded.decision_function(X), detector.decision_function(X))
    handle = detector.adapt(X[:40])
    # EM on those scores: round-off may grow over its iterations
    assert_close_scaled(loaded.adapt(X[:40]).weights, handle.weights, rtol=1e-10)


def test_custom_learner_factory_cannot_be_saved(split, tmp_path):
    detector = FedGMMDetector(
        2, n_learners=1, learner=lambda d, k: torch.nn.Linear(d, k), max_iter=2, random_state=0
    ).fit(split.X_train, split.y_train, groups=split.groups_train)
    assert detector.predict_y(split.X_test[:3]).shape == (3,)
    with pytest.raises(ValueError, match="custom learner factory cannot be saved"):
        detector.save(tmp_path / "custom.safetensors")


def test_pca_features_for_the_gaussians(split):
    detector = FedGMMDetector(3, n_learners=2, pca_components=5, max_iter=3, random_state=0)
    detector.fit(split.X_train, split.y_train, groups=split.groups_train)
    assert detector.means_.shape == (3, 5) and detector.pca_.components.shape == (5, 32)
    assert [r["kind"] for r in detector.history_[:2]] == ["moments_mean", "moments_scatter"]
    np.testing.assert_allclose(detector.score_samples(split.X_test), detector.log_px(split.X_test))
    with pytest.raises(ValueError, match="pca_components=40 must be <= n_features=32"):
        FedGMMDetector(2, pca_components=40).fit(split.X_train, groups=split.groups_train)
