"""The federated PCA front end of the mixture detectors (``pca_components``), against
scikit-learn's PCA and densities written by hand with scipy."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal
from sklearn.base import clone
from sklearn.decomposition import PCA

from fednovelty import (
    ClusteredFedGMMDetector,
    FedGenGMMDetector,
    FedGMMDetector,
    FedVBDetector,
    LocalGMMDetector,
    StreamingFedGMMDetector,
    load,
)
from fednovelty.detectors._params import AUTO_PCA_FEATURES, declare, store
from fednovelty.detectors.base import MixtureDetector
from fednovelty.detectors.options import ClientSampling, Prior, Privacy
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
        reg_covar=0.0,
        random_state=0,
        **params,
        prior=Prior(standardize=False, strength=None),
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
    det = FedGMMDetector(
        n_components=2, pca_components=3, random_state=0, sampling=ClientSampling(fraction=0.5)
    )
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
    np.testing.assert_allclose(auto.score_samples(X), off.score_samples(X), rtol=1e-12, atol=0)
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
        FedGMMDetector(
            pca_components=3, privacy=Privacy(epsilon=1.0, bounds=[[-50] * 10, [50] * 10])
        ).fit(X, groups=np.arange(240) % 3)


# ------------------------------------------------------------------ every family declares it
def test_each_front_end_family_declares_pca_components_itself():
    for cls in (FedVBDetector, FedGenGMMDetector, LocalGMMDetector):
        assert cls.__dict__["_pca_front_end"] is True
        assert "pca_components" in cls.__dict__["_params"].names
        assert list(cls.__init__.__kwdefaults__).count("pca_components") == 1
        det = clone(cls(pca_components=7))
        assert det.get_params()["pca_components"] == 7
    assert "pca_components" not in StreamingFedGMMDetector().get_params()
    assert not StreamingFedGMMDetector._pca_front_end


def test_a_front_end_class_without_pca_components_is_refused_by_name():
    with pytest.raises(TypeError, match=r"NoAxes sets _pca_front_end = True .* pca_components"):

        class NoAxes(MixtureDetector):
            _pca_front_end = True
            _params = declare()

            def __init__(self, *, contamination=0.1, random_state=None):
                store(self, locals())


# ------------------------------------------------------------------ rounds a fit can run
@pytest.mark.parametrize(
    ("make", "family_rounds"),
    [
        (lambda **p: FedGenGMMDetector(random_state=0, **p), 1),
        (lambda **p: LocalGMMDetector(random_state=0, **p), 1),
        (lambda **p: FedVBDetector(n_components=2, max_iter=6, random_state=0, **p), None),
    ],
)
def test_max_fit_rounds_counts_the_two_pca_rounds_where_the_front_end_engages(make, family_rounds):
    wide = AUTO_PCA_FEATURES + 1
    base = make(pca_components=None).max_fit_rounds()
    if family_rounds is not None:
        assert base == family_rounds
    assert make(pca_components=3).max_fit_rounds() == base + 2
    assert make(pca_components=None).max_fit_rounds(wide) == base
    assert make().max_fit_rounds(wide) == base + 2  # "auto" on wide rows
    assert make().max_fit_rounds(AUTO_PCA_FEATURES) == base
    assert make().max_fit_rounds() == base  # "auto" on a width not known yet


@pytest.mark.parametrize(
    "make",
    [
        lambda: FedVBDetector(n_components=2, max_iter=4, random_state=0),
        lambda: FedGenGMMDetector(n_components=2, random_state=0),
        lambda: LocalGMMDetector(client_components=2, random_state=0),
    ],
)
def test_a_wide_fit_runs_no_more_rounds_than_max_fit_rounds_says(make):
    d = AUTO_PCA_FEATURES + 10
    rng = np.random.default_rng(1)
    X = (rng.normal(size=(300, 4)) * [4, 3, 2, 1]) @ rng.normal(size=(4, d))
    X = X + 0.1 * rng.normal(size=(300, d))
    det = make().fit(X, groups=np.arange(300) % 3)
    kinds = [r["kind"] for r in det.history_]
    assert kinds[:2] == ["moments_mean", "moments_scatter"]  # the PCA rounds ran
    assert det.n_rounds_ == len(det.history_) <= det.max_fit_rounds()
    assert det.max_fit_rounds() == make().max_fit_rounds(d)  # the fitted width is known
    assert det.max_fit_rounds() == make().max_fit_rounds() + 2


# ------------------------------------------------------------------ per-client densities of x
def _wide_clustered_rows(d=210, seed=0):
    """Three groups of two clients each, on a 4-axis subspace of ``d`` features plus noise."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(d, 4)))[0].T  # (4, d) orthonormal
    rows, groups = [], []
    for client in range(6):
        centre = np.array([6.0, 0, 0, 0]) * (client // 2) - 6.0
        latent = centre + rng.normal(size=(80, 4)) * [2.0, 1.5, 1.0, 0.8]
        rows.append(latent @ basis + 0.3 * rng.normal(size=(80, d)))
        groups.append(np.full(80, client))
    return np.vstack(rows), np.concatenate(groups)


def _hand_log_density(pca, means, covariances, weights, Y):
    """``log sum_k w_k N(z; mu_k, Sigma_k)`` of the projection ``z`` (scipy) plus the
    residual's isotropic Gaussian log-density (numpy), from a fitted projection ``pca_``
    and a mixture's means (K, q), covariances (K, q, q) and weights (K,)."""
    mean = pca.mean.numpy()
    axes = pca.components.numpy()
    sigma2 = float(pca.noise_variance)
    centred = Y - mean
    Z = centred @ axes.T
    terms = [
        np.log(w) + multivariate_normal(m, c).logpdf(Z)
        for w, m, c in zip(weights, means, covariances, strict=True)
        if w > 0
    ]
    mixture = np.logaddexp.reduce(np.vstack(terms), axis=0)
    rest = Y.shape[1] - axes.shape[0]
    off = centred - Z @ axes
    residual = -0.5 * (rest * np.log(2 * np.pi * sigma2) + (off**2).sum(1) / sigma2)
    return mixture + residual


def _hand(det, Y, weights):
    """:func:`_hand_log_density` of a fitted detector's ``pca_``, ``means_`` and
    ``covariances_`` with ``weights``."""
    return _hand_log_density(det.pca_, det.means_, det.covariances_, weights, Y)


@pytest.fixture(scope="module")
def wide_clustered():
    X, groups = _wide_clustered_rows()
    det = ClusteredFedGMMDetector(
        2, n_clusters=3, cluster_components=1, pca_components=4, random_state=0
    ).fit(X, groups=groups)
    return det, X, groups


def test_clustered_per_client_and_per_cluster_scores_are_log_densities_of_x(wide_clustered):
    det, X, _ = wide_clustered
    assert det.pca_.n_components == 4
    Y = X[::7]
    pooled = _hand(det, Y, det.weights_)
    np.testing.assert_allclose(det.score_samples(Y), pooled, rtol=1e-8)
    for cluster in range(det.n_clusters):
        expected = _hand(det, Y, det.cluster_weights_[cluster])
        got = -det.decision_function(Y, cluster=cluster)
        np.testing.assert_allclose(got, expected, rtol=1e-8)
    for client in (0, 3):
        expected = _hand(det, Y, det.client_weights_[client])
        got = -det.decision_function(Y, client=client)
        np.testing.assert_allclose(got, expected, rtol=1e-8)


def test_clustered_client_scores_use_the_mean_log_density_of_x(wide_clustered):
    det, X, groups = wide_clustered
    rows = X[groups == 5]
    best = max(_hand(det, rows, det.cluster_weights_[c]).mean() for c in range(det.n_clusters))
    center, scale = det._client_score_center, det._client_score_scale
    assert det.client_score(rows) == pytest.approx((-best - center) / scale, rel=1e-8)
    handle = det.adapt(rows)
    for c in range(det.n_clusters):
        expected = _hand(det, rows, det.cluster_weights_[c]).mean()
        assert handle.cluster_log_likelihoods[c] == pytest.approx(expected, rel=1e-8)
    # the fitted clients' mean log-likelihoods are of x too (the last round's model, within 1%
    # of the final one's): the residual term, about -44 of about -50 nats a row here, is in them
    for client in range(6):
        c = det.client_clusters_[client]
        expected = _hand(det, X[groups == client], det.cluster_weights_[c]).mean()
        assert det.client_log_likelihoods_[client, c] == pytest.approx(expected, rel=1e-2)


def test_local_client_scores_are_log_densities_of_x():
    X, groups = _wide_clustered_rows()
    det = LocalGMMDetector(client_components=1, pca_components=4, random_state=0)
    det.fit(X, groups=groups)
    Y = X[::9]
    model = det.client_models_[2]
    expected = _hand_log_density(
        det.pca_, model.means.numpy(), model.covariances.numpy(), model.weights.numpy(), Y
    )
    np.testing.assert_allclose(det.score_samples_client(Y, 2), expected, rtol=1e-8)
