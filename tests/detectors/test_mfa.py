"""FedMFADetector: a mixture of factor analysers by federated EM, checked against
scikit-learn's factor analysis and probabilistic PCA, scipy's Gaussian density, and its own
fit on one client (federated EM is exact)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.decomposition import PCA, FactorAnalysis
from sklearn.metrics import roc_auc_score

from fednovelty import FedGMMDetector, FedMFADetector
from fednovelty.detectors.options import Initialisation, Prior, Privacy
from fednovelty.exceptions import ModelFormatError
from fednovelty.methods import get_method

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _subspace_rows(n: int, d: int, q: int, seed: int, noise: float = 0.3) -> np.ndarray:
    """Rows near a q-dimensional subspace of R^d: ``z W^T + noise``."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(d, q))
    return rng.normal(size=(n, q)) @ W.T + noise * rng.normal(size=(n, d)) + 2.0


def test_one_component_is_factor_analysis_at_its_maximum_likelihood():
    """K = 1 without standardisation or prior is maximum-likelihood factor analysis: its mean
    log-likelihood reaches scikit-learn's ``FactorAnalysis`` (whose loadings are unique up to
    rotation, so the optimum's value is what both find)."""
    X = _subspace_rows(600, 8, 2, seed=0)
    det = FedMFADetector(
        1,
        2,
        isotropic=False,
        tol=1e-9,
        max_iter=2000,
        random_state=0,
        prior=Prior(standardize=False),
        privacy=Privacy(min_rows=1),
    ).fit(X, groups=np.arange(600) % 3)
    fa = FactorAnalysis(n_components=2, tol=1e-10, max_iter=5000).fit(X)
    ours, theirs = det.score_samples(X).mean(), fa.score(X)
    assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    np.testing.assert_allclose(det.means_[0], X.mean(0), rtol=1e-6, atol=1e-6)


def test_isotropic_noise_is_probabilistic_pca_at_its_closed_form():
    """K = 1 with ``isotropic=True`` is probabilistic PCA, whose maximum likelihood is closed
    form (Tipping & Bishop): scikit-learn's ``PCA.score`` gives it."""
    X = _subspace_rows(500, 10, 3, seed=1)
    det = FedMFADetector(
        1, 3, isotropic=True, tol=1e-10, max_iter=3000, random_state=0,
        prior=Prior(standardize=False), privacy=Privacy(min_rows=1),
    ).fit(X, groups=np.arange(500) % 4)  # fmt: skip
    reference = PCA(n_components=3).fit(X).score(X)
    assert abs(det.score_samples(X).mean() - reference) <= 1e-5 * abs(reference)
    psi = det.noise_variances_[0]
    np.testing.assert_allclose(psi, psi[0], rtol=1e-12)


def test_scores_are_the_gaussian_mixture_density_of_the_fitted_parameters():
    X = np.vstack([_subspace_rows(300, 6, 2, seed=2), _subspace_rows(300, 6, 2, seed=3) + 6])
    det = FedMFADetector(2, 2, random_state=0).fit(X, groups=np.arange(600) % 5)
    rows = np.vstack([X[:20], X[:5] + 10.0])
    per_component = [
        np.log(w) + multivariate_normal(m, W @ W.T + np.diag(p)).logpdf(rows)
        for w, m, W, p in zip(
            det.weights_, det.means_, det.factors_, det.noise_variances_, strict=True
        )
    ]
    reference = logsumexp(np.stack(per_component), axis=0)
    np.testing.assert_allclose(det.score_samples(rows), reference, rtol=1e-9)
    np.testing.assert_allclose(det.decision_function(rows), -reference, rtol=1e-9)


def test_any_split_of_the_rows_gives_the_one_client_fit():
    """From the same centres (``means_init``) the Lloyd rounds, the sketch start and every
    EM round sum the clients' statistics: the fit is the one-client fit, whatever the split
    (no privacy floor: the floor withholds a component a client backs by few rows)."""
    X = np.vstack([_subspace_rows(240, 7, 2, seed=4), _subspace_rows(160, 7, 2, seed=5) - 5])
    centres = X[[0, 100, 300]]
    options = {
        "initialisation": Initialisation(means_init=centres),
        "privacy": Privacy(min_rows=1),
        "random_state": 1,
    }
    one = FedMFADetector(3, 2, **options).fit(X)
    groups = np.r_[np.zeros(50), np.ones(200), np.full(150, 2)].astype(int)
    split = FedMFADetector(3, 2, **options).fit(X, groups=groups)
    scale = np.abs(one.score_samples(X)).max()
    np.testing.assert_allclose(split.score_samples(X), one.score_samples(X), atol=1e-8 * scale)
    assert split.n_iter_ == one.n_iter_


def test_wide_rows_near_a_subspace_are_told_from_rows_off_it():
    """Anomalies off the normal rows' 4-d subspace (same per-feature variances): the low-rank
    covariance separates them; a diagonal Gaussian mixture cannot."""
    rng = np.random.default_rng(6)
    d, q = 60, 4
    W = rng.normal(size=(d, q))
    normal = rng.normal(size=(1200, q)) @ W.T + 0.2 * rng.normal(size=(1200, d))
    test_normal = rng.normal(size=(200, q)) @ W.T + 0.2 * rng.normal(size=(200, d))
    off = rng.normal(size=(200, d)) * normal.std(0)  # same spread, no subspace
    X_test, y = np.vstack([test_normal, off]), np.r_[np.zeros(200), np.ones(200)]
    groups = np.arange(1200) % 6
    mfa = FedMFADetector(2, random_state=0).fit(normal, groups=groups)
    diag = FedGMMDetector(2, covariance_type="diag", random_state=0).fit(normal, groups=groups)
    auc_mfa = roc_auc_score(y, mfa.decision_function(X_test))
    auc_diag = roc_auc_score(y, diag.decision_function(X_test))
    assert auc_mfa > 0.99 and auc_mfa > auc_diag + 0.1, (auc_mfa, auc_diag)
    assert mfa.n_factors_ == 10 and mfa.factors_.shape == (2, d, 10)


def test_bad_settings_are_refused_by_name():
    X = _subspace_rows(100, 4, 1, seed=7)
    with pytest.raises(ValueError, match=r"n_factors=4 needs n_factors <= n_features - 1 = 3"):
        FedMFADetector(n_factors=4).fit(X)
    with pytest.raises(ValueError, match="n_features=1"):
        FedMFADetector().fit(X[:, :1])
    with pytest.raises(ValueError, match="n_components=200 must be <= n_samples=100"):
        FedMFADetector(200).fit(X)
    with pytest.raises(ValueError, match="n_factors"):
        FedMFADetector(n_factors=0).fit(X)


def test_a_failed_fit_leaves_the_fitted_detector_as_it_was():
    X = _subspace_rows(200, 5, 2, seed=8)
    det = FedMFADetector(2, 2, random_state=0).fit(X)
    before = det.score_samples(X)
    det.set_params(n_factors=5)
    with pytest.raises(ValueError, match="n_factors=5"):
        det.fit(X)
    np.testing.assert_allclose(det.score_samples(X), before, rtol=1e-12)


def test_save_and_load_keep_the_scores_and_refuse_a_damaged_file(tmp_path):
    from safetensors.torch import load_file, save_file

    X = _subspace_rows(300, 6, 2, seed=9)
    det = FedMFADetector(2, 2, random_state=0).fit(X, groups=np.arange(300) % 3)
    path = tmp_path / "mfa.safetensors"
    det.save(path)
    loaded = FedMFADetector.load(path)
    np.testing.assert_allclose(loaded.score_samples(X), det.score_samples(X), rtol=1e-12)
    assert loaded.n_factors_ == 2 and loaded.threshold_ == det.threshold_
    tensors = load_file(path)
    from safetensors import safe_open

    with safe_open(str(path), "pt") as handle:
        metadata = handle.metadata()
    tensors["model.psi"] = -tensors["model.psi"]
    save_file(tensors, path, metadata=metadata)
    with pytest.raises(ModelFormatError, match="psi"):
        FedMFADetector.load(path)


def test_the_registry_method_fits_with_its_defaults():
    X = _subspace_rows(300, 12, 3, seed=10)
    det = get_method("FedMFA").build(random_state=0).fit(X, groups=np.arange(300) % 3)
    assert isinstance(det, FedMFADetector) and det.n_components_ == 5
    assert det.n_rounds_ <= det.max_fit_rounds()
    assert np.isfinite(det.decision_scores_).all()


def test_the_fit_runs_on_float32_and_scores_finite():
    X = _subspace_rows(300, 8, 2, seed=11)
    det = FedMFADetector(2, 2, dtype="float32", random_state=0).fit(X)
    assert det.model_.means.dtype == torch.float32
    assert np.isfinite(det.score_samples(X)).all()
