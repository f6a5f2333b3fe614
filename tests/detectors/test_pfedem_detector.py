"""PFedEMDetector: fits, predicts by Eq. 15, saves and loads, is registered."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty import PFedEMDetector, load
from fednovelty.methods import METHODS


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.normal(0, 1, (600, 2)) + np.repeat([[-4.0, 0.0], [4.0, 0.0], [-4.0, 0.0]], 200, 0)
    a = X[:, 0] < 0
    y = np.where(a, X[:, 1] > 0, X[:, 1] < 0).astype(int)  # opposite rules in A and B
    groups = np.repeat([0, 1, 2], 200)  # clients 0 and 2 hold A, client 1 holds B
    return X, y, groups


def test_each_client_predicts_with_its_own_sub_model(data):
    X, y, groups = data
    det = PFedEMDetector(2, max_iter=10, random_state=0).fit(X, y, groups)
    for c in range(3):
        rows = groups == c
        assert np.mean(det.predict_y(X[rows], client=c) == y[rows]) > 0.9
    proba = det.predict_proba_y(X[:5])
    np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-12)
    # Eq. 15 with the global weights mixes both rules: worse than each client's own weights
    assert np.mean(det.predict_y(X) == y) < 0.8
    assert det.log_py_given_x(X[:4], y[:4], client=0).shape == (4,)
    assert det.client_joint_weights_.shape == (3, 2, 2)


def test_saves_loads_and_is_a_registered_method(data, tmp_path):
    X, y, groups = data
    det = PFedEMDetector(2, max_iter=3, gaussian_aggregation="exact", random_state=1)
    det.fit(X, y, groups)
    det.save(tmp_path / "pfedem.safetensors")
    again = load(tmp_path / "pfedem.safetensors")
    assert isinstance(again, PFedEMDetector) and again.gaussian_aggregation == "exact"
    np.testing.assert_allclose(
        again.predict_proba_y(X[:20], client=1), det.predict_proba_y(X[:20], client=1), rtol=1e-12
    )
    method = METHODS["PFL-pFedEM"]
    assert method.task == "pfl" and method.build(n_components=3, random_state=0)._n_learners == 3
    with pytest.raises(ValueError, match="covariance_type='diag'"):
        PFedEMDetector(2, covariance_type="full").fit(X, y, groups)


def moving_window(rng, share_a, n=200, clients=3):
    """Each client's rows: population A (left, rule y = x2 > 0) with share ``share_a``, else
    B (right, rule y = x2 < 0)."""
    a = rng.random(n * clients) < share_a
    X = rng.normal(0, 1, (n * clients, 2)) + np.where(a[:, None], [-4.0, 0.0], [4.0, 0.0])
    y = np.where(a, X[:, 1] > 0, X[:, 1] < 0).astype(int)
    return X, y, np.repeat(np.arange(clients), n)


@pytest.mark.parametrize("cls_name", ["PFedEMDetector", "JointFedGMMDetector"])
def test_partial_fit_carries_the_model_through_a_moving_stream(cls_name, tmp_path):
    import fednovelty

    cls = getattr(fednovelty, cls_name)
    rng = np.random.default_rng(2)
    det = cls(2, max_iter=5, random_state=0).fit(*moving_window(rng, 0.9))
    learners = [dict(p) for p in det.joint_state_.learners]
    before = det.client_joint_weights_.copy()
    for share in (0.7, 0.5, 0.3, 0.1):
        X, y, g = moving_window(rng, share)
        det.partial_fit(X, y, g, rounds=2)
    assert len(det.history_) == 2  # the last window's rounds
    assert any(
        not np.allclose(p[k].numpy(), det.joint_state_.learners[j][k].numpy())
        for j, p in enumerate(learners)
        for k in p
    )
    # every client's weight on the left Gaussian followed its share down from 0.9
    left = int(np.argmin(det.means_[:, 0]))
    assert (det.client_joint_weights_[:, left].sum(1) < 0.3).all()
    assert (before[:, left].sum(1) > 0.7).all()
    det.save(tmp_path / "m.safetensors")
    again = fednovelty.load(tmp_path / "m.safetensors")
    again.partial_fit(X, y, g)  # after a load the clients start from their saved weights
    with pytest.raises(ValueError, match="not seen in fit"):
        det.partial_fit(X, y, g + 10)
    with pytest.raises(ValueError, match="rounds must be"):
        det.partial_fit(X, y, g, rounds=0)
    with pytest.raises(ValueError, match="labels"):
        det.partial_fit(X, None, g)


def test_pfedem_predicts_the_window_it_moved_to():
    rng = np.random.default_rng(2)
    det = PFedEMDetector(2, max_iter=5, random_state=0).fit(*moving_window(rng, 0.9))
    for share in (0.7, 0.5, 0.3, 0.1):
        X, y, g = moving_window(rng, share)
        det.partial_fit(X, y, g, rounds=2)
    X, y, g = moving_window(rng, 0.1)
    own = np.concatenate([det.predict_y(X[g == c], client=c) for c in range(3)])
    assert np.mean(own == np.concatenate([y[g == c] for c in range(3)])) > 0.85  # B's rule


def test_fit_declares_the_classes_later_windows_may_bring(data):
    import fednovelty

    X, y, groups = data
    det = fednovelty.JointFedGMMDetector(2, n_learners=1, max_iter=2, random_state=0)
    det.fit(X, y, groups, classes=[0, 1, 2])
    assert det.classes_.tolist() == [0, 1, 2] and det.predict_proba_y(X[:3]).shape == (3, 3)
    y2 = y.copy()
    y2[:10] = 2  # a class the first window did not hold
    det.partial_fit(X, y2, groups)
    with pytest.raises(ValueError, match="not in classes"):
        fednovelty.JointFedGMMDetector(2).fit(X, y, groups, classes=[0])
    with pytest.raises(ValueError, match="not seen in fit"):
        fednovelty.JointFedGMMDetector(2, max_iter=2).fit(X, y, groups).partial_fit(X, y2, groups)
