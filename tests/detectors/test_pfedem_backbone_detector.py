"""PFedEMDetector(gaussian_features="backbone"): the Gaussians are the backbone's width and
every score maps rows through the final sub-model 0's backbone (checked against scipy's
Gaussian log-density of features computed by hand), after partial_fit and a save/load too;
what the setting refuses."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from fednovelty import PFedEMDetector, load
from fednovelty.detectors.options import Privacy


@pytest.fixture(scope="module")
def data():
    """Populations A (left, y = x2 > 0) and B (right, y = x2 < 0), each client holding both
    (shares 0.8, 0.5, 0.2 of A): every client's first-round features pass the federation's
    gross screen (a population one client alone held could look like an outlier there)."""
    rng = np.random.default_rng(0)
    groups = np.repeat([0, 1, 2], 200)
    a = rng.random(600) < np.array([0.8, 0.5, 0.2])[groups]
    X = rng.normal(0, 1, (600, 2)) + np.where(a[:, None], [-4.0, 0.0], [4.0, 0.0])
    y = np.where(a, X[:, 1] > 0, X[:, 1] < 0).astype(int)
    return X, y, groups


@pytest.fixture(scope="module")
def fitted(data):
    X, y, groups = data
    det = PFedEMDetector(
        2,
        learner="mlp",
        gaussian_features="backbone",
        max_iter=4,
        tol=0.0,
        reg_covar=1e-3,
        random_state=1,
    )
    return det.fit(X, y, groups)


def features(det, X) -> np.ndarray:
    """The final sub-model 0's hidden layer by hand: relu(X W^T + b), (n, 64)."""
    p = {k: v.numpy() for k, v in det.joint_state_.learners[0].items()}
    return np.maximum(X @ p["0.weight"].T + p["0.bias"], 0.0)


def log_components(det, Z) -> np.ndarray:
    """log N(z; mu_k, Sigma_k) (n, K) by scipy, from the fitted means and variances."""
    return np.stack(
        [
            multivariate_normal(det.means_[k], np.diag(det.covariances_[k])).logpdf(Z)
            for k in range(det.n_components_)
        ],
        axis=1,
    )


def check_scores(det, X, groups) -> None:
    log_n = log_components(det, features(det, X))
    expected = logsumexp(log_n + np.log(det.weights_), axis=1)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(det.log_px(X), expected, rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(det.score_samples(X), expected, rtol=1e-9, atol=1e-9 * scale)
    np.testing.assert_allclose(det.decision_function(X), -expected, rtol=1e-9, atol=1e-9 * scale)
    own = np.log(np.diagonal(det.client_joint_weights_[1]))
    np.testing.assert_allclose(
        det.log_px(X, client=1), logsumexp(log_n + own, axis=1), rtol=1e-9, atol=1e-9 * scale
    )
    weighted = log_n + np.log(det.weights_)
    decided = np.ptp(weighted, axis=1) > 1e-6 * scale  # rows not tied between components
    assert decided.mean() > 0.5
    np.testing.assert_array_equal(det.predict_components(X)[decided], weighted.argmax(1)[decided])
    # adapt's EM on one client's rows, features by the same map: the weights its rows choose
    rows = X[groups == 0]
    adapted = det.adapt(rows, prior_rows=0).weights
    shares = np.bincount(weighted[groups == 0].argmax(1), minlength=2) / len(rows)
    np.testing.assert_allclose(np.diagonal(adapted), shares, atol=0.05)


def test_the_gaussians_model_the_final_backbones_features(fitted, data):
    X, _, groups = data
    assert fitted.means_.shape == (2, 64) and fitted.covariances_.shape == (2, 64)
    assert fitted.n_features_in_ == 2 and not hasattr(fitted, "pca_")
    # training moved sub-model 0: scoring through its initial backbone would differ
    initial = fitted._algorithm(2, fitted._seed, None)._initial_learners(2)[0]
    final = fitted.joint_state_.learners[0]
    assert not np.allclose(initial["0.weight"], final["0.weight"], atol=1e-3)
    check_scores(fitted, X, groups)
    assert all(r["n_replied"] == 3 for r in fitted.history_)
    # the two Gaussians hold the two populations' features (A: x1 < 0)
    components = fitted.predict_components(X)
    assert sorted(np.mean(X[components == k, 0] < 0) for k in range(2)) == pytest.approx(
        [0.0, 1.0], abs=0.05
    )


def test_partial_fit_scores_through_the_moved_backbone(fitted, data, tmp_path):
    X, y, groups = data
    fitted.save(tmp_path / "m.safetensors")
    det = load(tmp_path / "m.safetensors")
    before = {k: v.clone() for k, v in det.joint_state_.learners[0].items()}
    order = np.random.default_rng(1).permutation(len(X))
    det.partial_fit(X[order], y[order], groups[order], rounds=2)
    assert any(not np.allclose(before[k], v) for k, v in det.joint_state_.learners[0].items())
    check_scores(det, X, groups)


def test_saves_and_loads_with_its_backbone(fitted, data, tmp_path):
    X = data[0]
    fitted.save(tmp_path / "backbone.safetensors")
    again = load(tmp_path / "backbone.safetensors")
    assert again.gaussian_features == "backbone" and again.means_.shape == (2, 64)
    np.testing.assert_allclose(again.log_px(X), fitted.log_px(X), rtol=1e-12)
    np.testing.assert_array_equal(again.predict_components(X), fitted.predict_components(X))
    np.testing.assert_allclose(
        again.predict_proba_y(X[:20], client=2), fitted.predict_proba_y(X[:20], client=2)
    )


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"learner": "linear"}, "pick learner='mlp' or 'cnn'"),
        ({"learner": "mlp", "pca_components": 1}, "pca_components=None"),
        (
            {
                "learner": "mlp",
                "gaussian_aggregation": "exact",
                "privacy": Privacy(epsilon=1.0, bounds=([-8.0, -4.0], [8.0, 4.0])),
            },
            "no private form",
        ),
    ],
)
def test_what_backbone_features_refuse(data, settings, match):
    X, y, groups = data
    det = PFedEMDetector(2, gaussian_features="backbone", max_iter=2, **settings)
    with pytest.raises(ValueError, match=match):
        det.fit(X, y, groups)


def test_methods_of_the_rows_own_space_are_refused(fitted, data):
    X = data[0]
    for call in (lambda: fitted.explain(X[:3]), lambda: fitted.sample(3), lambda: fitted.bic(X)):
        with pytest.raises(NotImplementedError, match="gaussian_features='backbone'"):
            call()
