"""The federated PCA front end of the mixture detectors (``pca_components``), against
scikit-learn's PCA and densities written by hand with scipy."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.decomposition import PCA

from fednovelty import (
    FedGenGMMDetector,
    FedGMMDetector,
    FedVBDetector,
    LocalGMMDetector,
    load,
)
from fednovelty.detectors._params import AUTO_PCA_FEATURES
from fednovelty.mixture.ppca import choose_n_components


def _rows(n=240, d=10, seed=0):
    rng = np.random.default_rng(seed)
    scales = np.linspace(4.0, 0.3, d)
    mixing = np.linalg.qr(rng.normal(size=(d, d)))[0]
    return (rng.normal(size=(n, d)) * scales) @ mixing + 3.0


def _plain_gaussian(**params):
    """One Gaussian by plain maximum likelihood (no standardisation, no prior, no ridge)."""
    return FedGMMDetector(
        n_components=1,
        mixture_weights="global",
        standardize=False,
        prior_strength=None,
        reg_covar=0.0,
        random_state=0,
        **params,
    )


def _hand_density(X, q):
    """A Gaussian fitted by ML on the rows' scores on q principal axes (scikit-learn's PCA)
    plus the isotropic Gaussian of the discarded directions (variance: their mean
    eigenvalue, scikit-learn's ``noise_variance_``), with scipy."""
    pca = PCA(n_components=q).fit(X)
    Z = pca.transform(X)
    kept = multivariate_normal(Z.mean(0), np.cov(Z, rowvar=False, bias=True).reshape(q, q))
    rest = PCA(n_components=X.shape[1]).fit(X).components_[q:]
    residual = multivariate_normal(
        np.zeros(X.shape[1] - q), pca.noise_variance_ * np.eye(X.shape[1] - q)
    )
    return lambda Y: kept.logpdf(pca.transform(Y)) + residual.logpdf((Y - pca.mean_) @ rest.T)


@pytest.mark.parametrize("groups", [np.zeros(240), np.arange(240) % 3, np.repeat([0, 1, 2, 3], 60)])
def test_front_end_density_equals_the_centralized_ppca_model_for_any_split(groups):
    X, q = _rows(), 3
    det = _plain_gaussian(pca_components=q).fit(X, groups=groups)
    reference = PCA(n_components=q).fit(X)
    np.testing.assert_allclose(det.pca_.mean.numpy(), reference.mean_, atol=1e-10)
    np.testing.assert_allclose(det.pca_.components.numpy(), reference.components_, atol=1e-8)
    assert det.pca_.noise_variance == pytest.approx(reference.noise_variance_, rel=1e-9)
    Y = _rows(n=50, seed=1)
    expected = _hand_density(X, q)(Y)
    np.testing.assert_allclose(det.score_samples(Y), expected, rtol=1e-6)


def test_the_projection_is_sent_and_clients_project_their_own_rows():
    """A fit through the front end equals the same family fitted on rows projected by
    scikit-learn (the clients' projection in the wrapped algorithm matches the server's)."""
    X = _rows(n=300, d=12)
    groups = np.arange(300) % 4
    det = FedGMMDetector(n_components=2, pca_components=4, random_state=3).fit(X, groups=groups)
    projected = PCA(n_components=4).fit(X).transform(X)
    plain = FedGMMDetector(n_components=2, pca_components=None, random_state=3)
    plain.fit(projected, groups=groups)
    scale = np.abs(plain.means_).max()
    np.testing.assert_allclose(det.means_, plain.means_, atol=1e-6 * scale)
    kinds = [r["kind"] for r in det.history_]
    assert kinds[:2] == ["moments_mean", "moments_scatter"]
    assert [r["round"] for r in det.history_] == list(range(1, det.n_rounds_ + 1))
    assert det.n_rounds_ == plain.n_rounds_ + 2
    assert det.bytes_down_ > plain.bytes_down_ + 4 * 12 * 8  # the axes went out


def test_client_sampling_sends_the_projection_with_every_broadcast():
    X = _rows(n=300, d=12)
    det = FedGMMDetector(n_components=2, pca_components=3, fraction=0.5, random_state=0)
    det.fit(X, groups=np.arange(300) % 6)
    assert np.isfinite(det.score_samples(X)).all()
    assert det.means_.shape == (2, 3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: FedGMMDetector(n_components=2, random_state=0),
        lambda: FedVBDetector(n_components=3, random_state=0),
        lambda: FedGenGMMDetector(random_state=0),
        lambda: LocalGMMDetector(random_state=0),
    ],
)
def test_auto_engages_above_the_width_threshold_and_round_trips(make, tmp_path):
    d = AUTO_PCA_FEATURES + 20
    rng = np.random.default_rng(0)
    latent = rng.normal(size=(400, 5)) * [5, 4, 3, 2, 1]
    X = latent @ rng.normal(size=(5, d)) + 0.1 * rng.normal(size=(400, d))
    groups = np.arange(400) % 4
    det = make().fit(X, groups=groups)
    eigenvalues = PCA().fit(X).explained_variance_
    import torch

    expected_q = choose_n_components(torch.as_tensor(eigenvalues), 400)
    assert det.pca_.n_components == expected_q
    Y = X[:20] + rng.normal(size=(20, d))
    scores = det.score_samples(Y)
    assert np.isfinite(scores).all()
    det.save(tmp_path / "model.safetensors")
    again = load(tmp_path / "model.safetensors")
    np.testing.assert_allclose(again.score_samples(Y), scores, rtol=1e-10)
    np.testing.assert_allclose(again.pca_.components.numpy(), det.pca_.components.numpy())


def test_auto_leaves_narrow_rows_alone():
    X = _rows()
    groups = np.arange(240) % 3
    auto = FedGMMDetector(n_components=2, random_state=0).fit(X, groups=groups)
    off = FedGMMDetector(n_components=2, pca_components=None, random_state=0)
    off.fit(X, groups=groups)
    assert not hasattr(auto, "pca_")
    np.testing.assert_array_equal(auto.score_samples(X), off.score_samples(X))
    vb = FedVBDetector(n_components=2, random_state=0).fit(X, groups=groups)
    assert not hasattr(vb, "pca_")


@pytest.mark.parametrize("value", [0, -1, 1.5, "all", True])
def test_bad_pca_components_is_refused_by_name(value):
    with pytest.raises(ValueError, match="pca_components"):
        FedVBDetector(pca_components=value).fit(_rows())


def test_more_axes_than_features_and_privacy_are_refused():
    X = _rows()
    with pytest.raises(ValueError, match="pca_components=11 must be <= n_features=10"):
        LocalGMMDetector(pca_components=11).fit(X)
    with pytest.raises(ValueError, match="private form"):
        FedGMMDetector(pca_components=3, dp_epsilon=1.0, dp_bounds=[[-50] * 10, [50] * 10]).fit(
            X, groups=np.arange(240) % 3
        )
