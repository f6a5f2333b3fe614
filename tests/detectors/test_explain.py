"""The per-component API of the mixture detectors (fednovelty/detectors/explain.py): against
scikit-learn's GaussianMixture set to the same parameters, against a direct NumPy Mahalanobis
computation, for every detector's definition of its components, and on bad input."""

import copy
import re

import numpy as np
import pandas as pd
import pytest
from _tolerance import assert_close_scaled
from scipy.special import logsumexp
from sklearn.mixture import GaussianMixture

from fednovelty import FedGenGMMDetector, FedGMMDetector, LocalGMMDetector
from fednovelty.detectors.options import Training
from fednovelty.exceptions import NotFittedError

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")


def blobs(seed=0, n=120):
    """Three correlated 3-D clusters, rows in cluster order, and 3 clients."""
    rng = np.random.default_rng(seed)
    mix = np.array([[1.0, 0.8, 0.0], [0.0, 0.6, 0.3], [0.0, 0.0, 0.5]])
    X = np.vstack([rng.normal(size=(n, 3)) @ mix + c for c in ([0, 0, 0], [5, 5, 0], [0, 6, 4])])
    groups = np.tile(np.arange(3), X.shape[0] // 3 + 1)[: X.shape[0]]
    return X, groups


@pytest.fixture(scope="module")
def data():
    return blobs()


def sklearn_twin(det, weights=None) -> GaussianMixture:
    """scikit-learn's GaussianMixture holding the detector's fitted parameters."""
    gm = GaussianMixture(det.n_components_, covariance_type=det.covariance_type)
    gm.weights_ = det.weights_ if weights is None else weights
    gm.means_, gm.covariances_ = det.means_, det.covariances_
    gm.precisions_cholesky_ = det.precisions_cholesky_
    return gm


def precision_matrices(det) -> np.ndarray:
    """(n_components, d, d) inverse covariances, by NumPy from ``covariances_``."""
    k, d = det.means_.shape
    cov = det.covariances_
    full = {
        "full": cov,
        "tied": np.broadcast_to(cov, (k, d, d)),
        "diag": np.stack([np.diag(c) for c in np.atleast_2d(cov)]),
        "spherical": np.stack([v * np.eye(d) for v in np.atleast_1d(cov)]),
    }[det.covariance_type]
    return np.linalg.inv(full)


def direct_shares(X, centers, precisions):
    """Mahalanobis split by NumPy: delta_j (P delta)_j / d^2 and d^2, per row."""
    delta = X - centers
    weighted = np.einsum("nij,nj->ni", precisions, delta)
    d2 = np.einsum("ni,ni->n", delta, weighted)
    return delta * weighted / d2[:, None], d2


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_components_match_scikit_learn_and_numpy(data, covariance_type):
    X, groups = data
    det = FedGMMDetector(3, covariance_type=covariance_type, random_state=0).fit(X, groups=groups)
    gm = sklearn_twin(det)
    log_n = det.component_log_densities(X)
    assert log_n.shape == (X.shape[0], 3) and log_n.dtype == np.float64
    assert_close_scaled(log_n, gm._estimate_log_prob(X), rtol=1e-10)
    assert_close_scaled(det.responsibilities(X), gm.predict_proba(X), rtol=1e-10)
    np.testing.assert_array_equal(det.predict_components(X), gm.predict(X))
    assert_close_scaled(det.component_weights(), det.weights_, rtol=0)
    # the weighted log-densities normalise to the detector's own score
    assert_close_scaled(
        logsumexp(log_n + np.log(det.weights_), axis=1), det.score_samples(X), rtol=1e-10
    )

    table = det.explain(X)
    summary = ["component", "responsibility", "mahalanobis_sq"]
    assert list(table.columns) == [*summary, "x0", "x1", "x2"]
    labels = table.component.to_numpy()
    np.testing.assert_array_equal(labels, gm.predict(X))
    assert_close_scaled(table.responsibility, gm.predict_proba(X).max(1), rtol=1e-10)
    shares, d2 = direct_shares(X, det.means_[labels], precision_matrices(det)[labels])
    assert_close_scaled(table.mahalanobis_sq, d2, rtol=1e-9)
    assert_close_scaled(table[["x0", "x1", "x2"]].to_numpy(), shares, rtol=1e-8)
    assert_close_scaled(table[["x0", "x1", "x2"]].sum(axis=1), np.ones(len(X)), rtol=1e-9)
    if covariance_type in ("diag", "spherical"):
        assert (table[["x0", "x1", "x2"]].to_numpy() >= 0).all()


def test_correlated_features_can_have_a_negative_share(data):
    X, groups = data
    det = FedGMMDetector(3, random_state=0).fit(X, groups=groups)
    shares = det.explain(X)[["x0", "x1", "x2"]].to_numpy()
    assert (shares < 0).any() and (shares > 1).any()


def test_the_feature_that_was_moved_gets_the_largest_share(data):
    X, groups = data
    frame = pd.DataFrame(X, columns=["age", "dose", "weight"], index=np.arange(len(X)) + 100)
    det = FedGMMDetector(1, covariance_type="diag", random_state=0).fit(frame, groups=groups)
    rows = frame.iloc[:5].copy()
    rows["weight"] += 30.0  # far out along one feature only
    table = det.explain(rows)
    assert list(table.index) == list(rows.index)  # the DataFrame's index and names are kept
    assert list(table.columns[3:]) == ["age", "dose", "weight"]
    assert (table[["age", "dose", "weight"]].idxmax(axis=1) == "weight").all()
    assert (table.mahalanobis_sq > det.explain(frame.iloc[:5]).mahalanobis_sq).all()


def test_personal_weights_and_adapted_clients(data):
    X, groups = data
    det = FedGMMDetector(3, random_state=0).fit(X, groups=groups)
    for index, client in enumerate(det.client_ids_):
        own = det.client_weights_[index]
        assert_close_scaled(det.component_weights(client=client), own, rtol=1e-12)
        gm = sklearn_twin(det, weights=own)
        assert_close_scaled(det.responsibilities(X, client=client), gm.predict_proba(X), 1e-10)
        assert_close_scaled(
            logsumexp(det.component_log_densities(X) + np.log(own), axis=1),
            det.score_samples_client(X, client),
            rtol=1e-10,
        )
    adapted = det.adapt(X[:60])
    gm = sklearn_twin(det, weights=adapted.weights)
    np.testing.assert_array_equal(det.predict_components(X, client=adapted), gm.predict(X))
    assert_close_scaled(det.component_weights(client=np.int64(1)), det.client_weights_[1], 0)
    with pytest.raises(ValueError, match="client 7 was not seen in fit"):
        det.responsibilities(X, client=7)
    with pytest.raises(TypeError, match="client must be a client id"):
        det.explain(X, client=[0])
    dem = FedGMMDetector(3, mixture_weights="global", random_state=0).fit(X, groups=groups)
    with pytest.raises(ValueError, match="no per-client mixture weights"):
        dem.responsibilities(X, client=0)


def test_pca_components_are_explained_in_the_input_features(data):
    X, groups = data
    det = FedGMMDetector(2, pca_components=2, random_state=0).fit(X, groups=groups)
    W = det.pca_.components.cpu().numpy()
    mean = det.pca_.mean.cpu().numpy()
    Z = (X - mean) @ W.T
    gm = sklearn_twin(det)
    assert_close_scaled(det.component_log_densities(X), gm._estimate_log_prob(Z), rtol=1e-10)
    assert_close_scaled(det.responsibilities(X), gm.predict_proba(Z), rtol=1e-10)
    table = det.explain(X)
    labels = table.component.to_numpy()
    precisions = precision_matrices(det)[labels]  # (n, 2, 2) in the projection
    _, d2_z = direct_shares(Z, det.means_[labels], precisions)
    assert_close_scaled(table.mahalanobis_sq, d2_z, rtol=1e-9)
    lifted = np.einsum("ji,njk,kl->nil", W, precisions, W)  # W^T P W, (n, 3, 3)
    shares, d2_x = direct_shares(X, mean + det.means_[labels] @ W, lifted)
    assert_close_scaled(d2_x, d2_z, rtol=1e-9)
    assert_close_scaled(table[["x0", "x1", "x2"]].to_numpy(), shares, rtol=1e-8)


def test_fedgengmm_components_are_its_global_mixture_also_with_a_copula(data):
    X, groups = data
    options = {"n_components": 3, "client_components": 3, "random_state": 0}
    plain = FedGenGMMDetector(**options).fit(X, groups=groups)
    gm = sklearn_twin(plain)
    assert_close_scaled(plain.component_log_densities(X), gm._estimate_log_prob(X), rtol=1e-10)
    assert_close_scaled(
        logsumexp(plain.component_log_densities(X) + np.log(plain.weights_), axis=1),
        plain.score_samples(X),
        rtol=1e-10,
    )
    copula = FedGenGMMDetector(**options, copula=True).fit(X, groups=groups)
    gm = sklearn_twin(copula)
    assert_close_scaled(copula.responsibilities(X), gm.predict_proba(X), rtol=1e-10)
    mixture = logsumexp(copula.component_log_densities(X) + np.log(copula.weights_), axis=1)
    assert not np.allclose(mixture, copula.score_samples(X))  # the copula scores, not the mixture


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag"])
def test_local_components_are_the_union_of_the_client_mixtures(data, covariance_type):
    X, groups = data
    det = LocalGMMDetector(2, covariance_type=covariance_type, random_state=0)
    det.fit(X, groups=groups)
    models = det.client_models_
    log_n = det.component_log_densities(X)
    assert log_n.shape == (X.shape[0], sum(m.n_components for m in models))
    expected_weights = np.concatenate(
        [s * m.weights.cpu().numpy() for s, m in zip(det.client_shares_, models, strict=True)]
    )
    assert_close_scaled(det.component_weights(), expected_weights, rtol=1e-12)
    columns = []
    for model in models:
        twin = GaussianMixture(model.n_components, covariance_type=covariance_type)
        twin.precisions_cholesky_ = model.precisions_cholesky.cpu().numpy()
        twin.means_ = model.means.cpu().numpy()
        columns.append(twin._estimate_log_prob(X))
    assert_close_scaled(log_n, np.hstack(columns), rtol=1e-10)
    # combine="mixture" scores with exactly this mixture
    mixture = logsumexp(log_n + np.log(expected_weights), axis=1)
    assert_close_scaled(mixture, det.score_samples(X), rtol=1e-10)
    shares = det.explain(X)[["x0", "x1", "x2"]].sum(axis=1)
    assert_close_scaled(shares, np.ones(len(X)), rtol=1e-9)
    mean = copy.deepcopy(det).set_params(combine="mean")
    assert_close_scaled(mean.component_log_densities(X), log_n, rtol=0)
    assert not np.allclose(mixture, mean.score_samples(X))  # mean of logs, not the mixture


def test_bad_input_gets_a_clear_error(data):
    X, groups = data
    det = FedGMMDetector(2, random_state=0)
    for method in ("component_log_densities", "responsibilities", "explain"):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            getattr(det, method)(X)
    with pytest.raises(NotFittedError):
        det.component_weights()
    det.fit(X, groups=groups)
    with pytest.raises(ValueError, match="X has 2 features, but FedGMMDetector was fitted with 3"):
        det.explain(X[:, :2])
    bad = X[:4].copy()
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or inf in column 1"):
        det.responsibilities(bad)
    with pytest.raises(ValueError, match="must be 2-D"):
        det.component_log_densities(X[0])
    named = FedGMMDetector(2, random_state=0).fit(
        pd.DataFrame(X, columns=["a", "b", "c"]), groups=groups
    )
    with pytest.raises(ValueError, match="feature names of X differ"):
        named.explain(pd.DataFrame(X, columns=["c", "b", "a"]))
    clash = FedGMMDetector(2, random_state=0).fit(
        pd.DataFrame(X, columns=["a", "component", "c"]), groups=groups
    )
    with pytest.raises(ValueError, match=r"feature\(s\) \['component'\] are named like"):
        clash.explain(pd.DataFrame(X, columns=["a", "component", "c"]))


def test_scoring_components_never_changes_the_detector(data):
    X, groups = data
    det = FedGMMDetector(3, random_state=0).fit(X, groups=groups)
    before = copy.deepcopy(det.__dict__)
    det.component_log_densities(X)
    det.responsibilities(X, client=1)
    det.predict_components(X)
    det.explain(X, client=det.adapt(X[:40]))
    det.component_weights(client=2)
    assert det.__dict__.keys() == before.keys()
    for name, value in before.items():
        after = det.__dict__[name]
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(after, value, err_msg=name)
        elif name == "model_":
            for key, tensor in value.tensors().items():
                assert bool((after.tensors()[key] == tensor).all()), key
        else:
            assert type(after) is type(value), name


def test_the_docs_example_prints_its_table(capsys):
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "explain.md").read_text()
    code, table = re.findall(r"```(?:python)?\n(.*?)```", text, flags=re.S)[:2]
    exec(compile(code, "docs/explain.md", "exec"), {})
    assert capsys.readouterr().out.split() == table.split()


def test_joint_model_components_are_the_gaussians_of_p_x(data):
    from fednovelty.detectors import JointFedGMMDetector

    X, groups = data
    y = (X[:, 0] + X[:, 1] > 2).astype(int)
    det = JointFedGMMDetector(
        3, n_learners=2, max_iter=5, random_state=0, training=Training(local_epochs=1)
    )
    det.fit(X, y, groups)
    log_n = det.component_log_densities(X)
    assert_close_scaled(log_n, sklearn_twin(det)._estimate_log_prob(X), rtol=1e-10)
    adapted = det.adapt(X[:40], y[:40])  # (M1, M2) joint weights: summed over the learners
    assert_close_scaled(det.component_weights(client=adapted), adapted.weights.sum(1), 1e-12)
    for client in [None, *det.client_ids_, adapted]:
        with np.errstate(divide="ignore"):  # a weight may be 0
            log_pi = np.log(det.component_weights(client=client))
        assert_close_scaled(
            logsumexp(log_n + log_pi, axis=1), det.log_px(X, client=client), rtol=1e-10
        )
    shares = det.explain(X, client=det.client_ids_[0])[["x0", "x1", "x2"]].sum(axis=1)
    assert_close_scaled(shares, np.ones(len(X)), rtol=1e-9)
