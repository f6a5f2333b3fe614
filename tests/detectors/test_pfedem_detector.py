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
    assert method.task == "pfl" and method.build(n_components=3, random_state=0).n_learners == 3
    with pytest.raises(ValueError, match="covariance_type='diag'"):
        PFedEMDetector(2, covariance_type="full").fit(X, y, groups)
