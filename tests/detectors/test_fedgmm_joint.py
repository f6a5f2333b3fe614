"""FedGMMDetector's supervised path: fit(X, y, groups) trains FedGMM's joint model."""

import numpy as np
import pytest

from fednovelty import FedGMMDetector
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


def test_joint_model_save_is_refused_and_refit_without_y_is_plain(fitted, split, tmp_path):
    with pytest.raises(NotImplementedError, match="joint model"):
        fitted.save(tmp_path / "joint.safetensors")
    plain = FedGMMDetector(3, max_iter=5, random_state=0).fit(
        split.X_train, groups=split.groups_train
    )
    assert not hasattr(plain, "classes_")
    with pytest.raises(ValueError, match="fitted without y"):
        plain.log_px(split.X_test)
