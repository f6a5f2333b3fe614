"""scikit-learn's ``GaussianMixture`` surface on every mixture detector
(``fednovelty.detectors._mixture_surface``): ``score``, ``bic``, ``aic``, ``sample``,
``lower_bound_`` and ``fit_predict(X, y, groups)``.

Every ``MixtureDetector`` of ``_every_estimator`` is fitted once (small, fast settings). The
references are independent of fednovelty's code: scikit-learn's ``GaussianMixture`` given the
detector's ``weights_``, ``means_`` and ``covariances_`` (or the union of a LocalGMM's client
mixtures, or the factor analysers' ``W W^T + diag(psi)``) scores the same rows; the sample's
moments are checked against the fitted Gaussians with statistical tolerances.
"""

from __future__ import annotations

import warnings

import _every_estimator as every
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.mixture import GaussianMixture
from sklearn.mixture._gaussian_mixture import _compute_precision_cholesky

from fednovelty import FedGMMDetector, LocalGMMDetector
from fednovelty.detectors.base import MixtureDetector
from fednovelty.exceptions import NotFittedError

#: every mixture detector of the shared list.
MIXTURES = [n for n in every.NAMES if isinstance(every.build(n), MixtureDetector)]
#: detectors whose ``score_samples`` is the Gaussian mixture of ``weights_``, ``means_`` and
#: ``covariances_``, fitted by (penalised) maximum likelihood: scikit-learn's count applies.
GAUSSIAN = [
    "FedGenGMM",
    "FedGMM",
    "DEM-kmeans",
    "DEM-separated",
    "DEM-subset",
    "DEM-oneshot",
    "ClusteredGMM-IFCA",
    "ClusteredGMM-FeSEM",
    "CentralGMM",
    "streaming",
    "StreamingFedGMM",
    "PFL-FedGMM",
    "PFL-FedEM",
    "PFL-FedAvg",
    "PFL-FedProx",
    "PFL-Local",
    "PFL-pFedEM",
]
#: bic/aic refused, and a word the reason must name.
NO_CRITERION = {
    "FedGenGMM-copula": "copula",
    "FedVB": "variational Bayes",
    "FedVB-oneshot-natural": "variational Bayes",
    "FedVB-oneshot-moment": "variational Bayes",
    "FedMFA-starts": "members' log-densities",
}
#: sample refused, and a word the reason must name.
NO_SAMPLE = {"FedGenGMM-copula": "copula", "FedMFA-starts": "members' log-densities"}
#: the rest, each with its own reference.
OWN_COUNT = ["Local", "FedMFA"]


@pytest.fixture(scope="module")
def data():
    return every.data()


@pytest.fixture(scope="module")
def fitted(data):
    """Each mixture detector fitted on ``data`` (shared: do not modify)."""
    cache = {}

    def get(name):
        if name not in cache:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[name] = every.fit(every.build(name), name, *data)
        return cache[name]

    return get


def twin(weights, means, covariances, covariance_type, X) -> GaussianMixture:
    """scikit-learn's mixture fitted on ``X``, then given these parameters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = GaussianMixture(len(weights), covariance_type=covariance_type, random_state=0)
        gm.fit(np.asarray(X))
    gm.weights_ = np.asarray(weights, dtype=np.float64)
    gm.means_ = np.asarray(means, dtype=np.float64)
    gm.covariances_ = np.asarray(covariances, dtype=np.float64)
    gm.precisions_cholesky_ = _compute_precision_cholesky(gm.covariances_, covariance_type)
    return gm


def sklearn_log_px(gm: GaussianMixture, X) -> np.ndarray:
    with np.errstate(divide="ignore"):  # a component emptied to weight 0: log 0 = -inf
        return gm.score_samples(np.asarray(X))


def union_of_clients(det):
    """A LocalGMM's clients' mixtures as one: weights scaled by the clients' shares."""
    models, shares = det.client_models_, det.client_shares_
    weights = np.concatenate([s * m.weights.numpy() for s, m in zip(shares, models, strict=True)])
    means = np.concatenate([m.means.numpy() for m in models])
    covariances = np.concatenate([m.covariances.numpy() for m in models])
    return weights, means, covariances


def factor_covariances(det) -> np.ndarray:
    """The factor analysers' covariances ``W W^T + diag(psi)``, (K, d, d)."""
    W, psi = det.model_.factors.numpy(), det.model_.psi.numpy()
    return W @ W.transpose(0, 2, 1) + np.stack([np.diag(p) for p in psi])


def fitted_gaussians(det):
    """The Gaussians a detector's sample should follow: ``(weights, means, covariances)``."""
    if hasattr(det, "client_models_"):
        return union_of_clients(det)
    if hasattr(det.model_, "factors"):
        return det.model_.weights.numpy(), det.model_.means.numpy(), factor_covariances(det)
    covariances = det.covariances_
    if det.covariance_type == "diag":
        covariances = np.stack([np.diag(c) for c in covariances])
    return det.weights_, det.means_, covariances


def test_the_tables_cover_every_mixture_detector():
    """A new mixture detector must be put in one of the tables above."""
    assert sorted(GAUSSIAN + list(NO_CRITERION) + OWN_COUNT) == sorted(MIXTURES)


# ------------------------------------------------------------------------------ score
@pytest.mark.parametrize("name", MIXTURES)
def test_score_is_the_mean_log_likelihood(name, fitted, data):
    det = fitted(name)
    X = data[0]
    assert det.score(X) == pytest.approx(np.mean(det.score_samples(X)), rel=1e-12)
    assert det.score(X, y=np.zeros(len(X))) == det.score(X)  # y ignored
    assert isinstance(det.score(X), float)


# ------------------------------------------------------------------------------ bic, aic
@pytest.mark.parametrize("name", GAUSSIAN)
def test_bic_and_aic_equal_scikit_learn_on_the_same_mixture(name, fitted, data):
    det, X = fitted(name), data[0]
    gm = twin(det.weights_, det.means_, det.covariances_, det.covariance_type, X)
    log_px = sklearn_log_px(gm, X)
    np.testing.assert_allclose(det.score_samples(X), log_px, rtol=1e-9, atol=1e-9)
    with np.errstate(divide="ignore"):
        expected_bic, expected_aic, expected_score = (
            gm.bic(X.values),
            gm.aic(X.values),
            gm.score(X.values),
        )
    assert det._n_parameters() == gm._n_parameters()
    assert det.bic(X) == pytest.approx(expected_bic, rel=1e-10)
    assert det.aic(X) == pytest.approx(expected_aic, rel=1e-10)
    assert det.score(X) == pytest.approx(expected_score, rel=1e-10)


def test_local_counts_every_client_mixture_and_the_shares(fitted, data):
    """LocalGMM (``combine="mixture"``): the clients' mixtures weighted by their shares are
    one Gaussian mixture; its parameters are every client's plus ``n_clients - 1`` shares."""
    det, X = fitted("Local"), data[0]
    gm = twin(*union_of_clients(det), det.covariance_type, X)
    np.testing.assert_allclose(det.score_samples(X), sklearn_log_px(gm, X), rtol=1e-9)
    per_client = [
        twin(m.weights.numpy(), m.means.numpy(), m.covariances.numpy(), "full", X)._n_parameters()
        for m in det.client_models_
    ]
    p = sum(per_client) + len(per_client) - 1
    n = len(X)
    log_lik = sklearn_log_px(gm, X).sum()
    assert det.bic(X) == pytest.approx(-2 * log_lik + p * np.log(n), rel=1e-10)
    assert det.aic(X) == pytest.approx(-2 * log_lik + 2 * p, rel=1e-10)


def test_mixture_of_factor_analysers_counts_loadings_up_to_rotation(fitted, data):
    """FedMFA: Gaussians with covariance ``W W^T + diag(psi)``; per component ``d`` means,
    ``d`` noise variances and ``d q - q (q - 1) / 2`` loadings, plus ``K - 1`` weights."""
    det, X = fitted("FedMFA"), data[0]
    K, d, q = det.model_.factors.shape
    gm = twin(
        det.model_.weights.numpy(), det.model_.means.numpy(), factor_covariances(det), "full", X
    )
    log_lik = sklearn_log_px(gm, X)
    np.testing.assert_allclose(det.score_samples(X), log_lik, rtol=1e-9)
    p = K * (2 * d + d * q - q * (q - 1) // 2) + K - 1
    assert det.bic(X) == pytest.approx(-2 * log_lik.sum() + p * np.log(len(X)), rel=1e-10)
    assert det.aic(X) == pytest.approx(-2 * log_lik.sum() + 2 * p, rel=1e-10)


@pytest.mark.parametrize("name", sorted(NO_CRITERION))
def test_bic_and_aic_refused_where_the_score_is_not_a_mixture_likelihood(name, fitted, data):
    det, X = fitted(name), data[0]
    for method in (det.bic, det.aic):
        with pytest.raises(NotImplementedError, match=NO_CRITERION[name]):
            method(X)


def test_the_pca_front_end_refuses_bic_and_sample(data):
    X, _, groups = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det = FedGMMDetector(2, pca_components=2, max_iter=5, random_state=0)
        det.fit(X, groups=groups)
    assert det.pca_ is not None
    for call in (lambda: det.bic(X), lambda: det.aic(X), lambda: det.sample(10)):
        with pytest.raises(NotImplementedError, match="PCA front end"):
            call()
    assert np.isfinite(det.score(X))


def test_local_mean_of_log_densities_refuses_bic_and_sample(data):
    X, _, groups = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det = LocalGMMDetector(client_components=2, combine="mean", random_state=0)
        det.fit(X, groups=groups)
    for call in (lambda: det.bic(X), lambda: det.sample(10)):
        with pytest.raises(NotImplementedError, match="combine='mean'"):
            call()


# ------------------------------------------------------------------------------ sample
@pytest.mark.parametrize("name", [n for n in MIXTURES if n not in NO_SAMPLE])
def test_sample_follows_the_fitted_gaussians(name, fitted):
    det = fitted(name)
    weights, means, covariances = fitted_gaussians(det)
    n = 40_000
    rows, labels = det.sample(n, random_state=1)
    assert rows.shape == (n, det.n_features_in_) and rows.dtype == np.float64
    assert labels.shape == (n,) and labels.dtype == np.int64
    assert np.all(np.diff(labels) >= 0), "labels are sorted by component, as scikit-learn's"
    fractions = np.bincount(labels, minlength=len(weights)) / n
    spread = 5 * np.sqrt(weights * (1 - weights) / n) + 1e-12
    assert np.all(np.abs(fractions - weights) <= spread), (fractions, weights)
    for k in np.flatnonzero(fractions * n >= 1000):
        part = rows[labels == k]
        m = len(part)
        sd = np.sqrt(np.diag(covariances[k]))
        assert np.all(np.abs(part.mean(0) - means[k]) <= 5 * sd / np.sqrt(m)), k
        var = np.outer(np.diag(covariances[k]), np.diag(covariances[k])) + covariances[k] ** 2
        gap = np.abs(np.cov(part, rowvar=False) - covariances[k])
        assert np.all(gap <= 6 * np.sqrt(var / m)), (k, gap)


@pytest.mark.parametrize("name", sorted(NO_SAMPLE))
def test_sample_refused_where_the_score_is_not_the_mixture(name, fitted):
    with pytest.raises(NotImplementedError, match=NO_SAMPLE[name]):
        fitted(name).sample(10)


def test_sample_random_state(fitted):
    det = fitted("FedGMM")  # random_state=0
    first, _ = det.sample(50)
    np.testing.assert_array_equal(first, det.sample(50)[0])  # the detector's seed, as sklearn
    np.testing.assert_array_equal(first, det.sample(50, random_state=0)[0])
    assert not np.array_equal(first, det.sample(50, random_state=1)[0])
    assert not np.array_equal(first, det.sample(50, random_state=np.random.RandomState(3))[0])
    one, label = det.sample()
    assert one.shape == (1, 3) and label.shape == (1,)


@pytest.mark.parametrize("n_samples", [0, -3, 1.5, True, "10"])
def test_sample_refuses_a_bad_n_samples_by_name(fitted, n_samples):
    with pytest.raises(ValueError, match="n_samples"):
        fitted("FedGMM").sample(n_samples)


@pytest.mark.parametrize("method", ["score", "bic", "aic"])
def test_unfitted_detector_refuses(method, data):
    with pytest.raises(NotFittedError):
        getattr(FedGMMDetector(2), method)(data[0])
    with pytest.raises(NotFittedError):
        FedGMMDetector(2).sample(3)


# ------------------------------------------------------------------------------ lower_bound_
@pytest.mark.parametrize("name", MIXTURES)
def test_lower_bound_is_the_last_recorded_bound(name, fitted):
    det = fitted(name)
    bounds = getattr(det, "lower_bounds_", None)
    if bounds:
        assert det.lower_bound_ == bounds[-1]
        assert isinstance(det.n_iter_, int | np.integer) and det.n_iter_ >= 1
        assert isinstance(det.converged_, bool | np.bool_)
    else:  # FedGenGMM and LocalGMM fit the clients once: no per-round bound
        assert not hasattr(det, "lower_bound_")
        with pytest.raises(AttributeError, match="lower_bound_"):
            det.lower_bound_  # noqa: B018


def test_lower_bound_absent_before_fit_and_kept_by_save_load(fitted, tmp_path):
    assert not hasattr(FedGMMDetector(2), "lower_bound_")
    det = fitted("FedGMM")
    det.save(tmp_path / "m.safetensors")
    assert FedGMMDetector.load(tmp_path / "m.safetensors").lower_bound_ == det.lower_bound_


# ------------------------------------------------------------------------------ fit_predict
@pytest.mark.parametrize("name", ["FedGMM", "Local", "PFL-pFedEM", "StreamingFedGMM", "FedVB"])
def test_fit_predict_takes_groups_and_returns_pyod_labels(name, fitted, data):
    """PyOD's meaning (1 = outlier, 0 = inlier; ``labels_``), with the clients' ``groups``,
    ``y`` for a labelled fit and ``fit``'s keyword arguments."""
    X, y, groups = data
    rounds = []
    det = clone(fitted(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        labels = det.fit_predict(X, y, groups=groups, callbacks=[rounds.append])
    reference = fitted(name)
    np.testing.assert_array_equal(labels, reference.labels_)
    np.testing.assert_array_equal(labels, det.labels_)
    assert set(np.unique(labels)) <= {0, 1} and labels.shape == (len(X),)
    assert det.n_clients_ == 4 and len(rounds) == det.n_rounds_ >= 1
