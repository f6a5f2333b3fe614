"""Federated VB's robust defaults: federated standardisation and a Wishart prior of
``n_features + 2`` pseudo-rows at ``prior_scale`` x each feature's pooled variance.

References are independent of the code under test: the prior by hand in NumPy, scikit-learn's
``BayesianGaussianMixture`` on rows standardised by NumPy with that prior given explicitly,
the same detector switched off on pre-standardised rows (scores shifted by the Jacobian), and
scikit-learn's own defaults for the switched-off detector."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

from fednovelty import FedVBDetector
from fednovelty.detectors.options import Initialisation, Prior, Privacy
from fednovelty.detectors.variational import VB_PRIOR_SCALE
from fednovelty.mixture import MixtureParams, predict_proba
from fednovelty.mixture.covariance import precisions_cholesky_from_covariances
from fednovelty.mixture.stats import stats_from_resp
from fednovelty.mixture.vb_prior import prior_from_moments, wishart_pseudo_rows

RTOL = 1e-7
UNITS = np.array([1.0, 1e3, 1e-3])


def blobs(n_per: int = 120, seed: int = 0) -> np.ndarray:
    """Three 3-d blobs on very different feature scales (``UNITS``)."""
    rng = np.random.default_rng(seed)
    centers = np.array([[0.0, 0.0, 0.0], [6.0, 0.0, 0.0], [0.0, 6.0, 3.0]])
    rows = np.concatenate([c + rng.normal(size=(n_per, 3)) * [1.0, 0.7, 0.9] for c in centers])
    return rows * UNITS


X = blobs()
GROUPS = np.random.default_rng(3).integers(0, 4, size=len(X))
MEAN, SD = X.mean(0), X.std(0)  # population sd, as the federated moments round
Z = (X - MEAN) / SD


def rough_start(k: int = 5) -> MixtureParams:
    """Rows as means, the data covariance everywhere (full), in X's units."""
    rng = np.random.default_rng(1)
    means = torch.as_tensor(X[rng.choice(len(X), k, replace=False)])
    cov = torch.as_tensor(np.cov(X.T)).expand(k, 3, 3).clone()
    factors = precisions_cholesky_from_covariances(cov, "full")
    return MixtureParams(torch.full((k,), 1.0 / k, dtype=torch.float64), means, factors, "full")


def given(params: MixtureParams) -> dict:
    U = params.precisions_cholesky
    return {
        "weights_init": params.weights.numpy(),
        "means_init": params.means.numpy(),
        "precisions_init": (U @ U.transpose(-1, -2)).numpy(),
    }


def sklearn_on(rows: np.ndarray, resp: np.ndarray, **priors) -> BayesianGaussianMixture:
    """scikit-learn's VB on ``rows`` from the posterior of ``resp`` (the ``vb_init`` round)."""
    bgm = BayesianGaussianMixture(
        n_components=resp.shape[1], tol=1e-6, max_iter=200, warm_start=True, **priors
    )
    bgm._check_parameters(rows)
    bgm._initialize(rows, resp)
    bgm.converged_, bgm.lower_bound_ = False, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bgm.fit(rows)


def detector(**kwargs) -> FedVBDetector:
    settings = {"tol": 1e-6, "max_iter": 200, "privacy": Privacy(min_rows=1), "random_state": 0}
    start = {"initialisation": Initialisation(**given(rough_start()))}
    return FedVBDetector(5, **{**settings, **start, **kwargs})


# ----------------------------------------------------------------------------- the prior
@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_pseudo_row_prior_matches_a_hand_computation(covariance_type):
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(50, 4)) * [1.0, 3.0, 0.1, 1.0]
    rows[:, 3] = 2.5  # a constant feature: it gets the mean target of the others
    variance = rows.var(0, ddof=1)
    target = 4.0 * variance
    target[3] = target[:3].mean()
    nu = 4 + 2.0
    expected = {
        "full": np.diag(nu * target),
        "tied": np.diag(nu * target),
        "diag": nu * target,
        "spherical": np.array(nu * target.mean()),
    }[covariance_type]
    t = torch.as_tensor(rows)
    moments = stats_from_resp(t, torch.ones(50, 1, dtype=t.dtype), "full", t.mean(0))
    prior = prior_from_moments(moments, 7, covariance_type, prior_strength=nu, prior_scale=4.0)
    assert prior.degrees_of_freedom == nu
    assert_close_scaled(prior.covariance, expected, 1e-12, "covariance")
    assert_close_scaled(prior.mean, rows.mean(0), 1e-12, "mean")
    assert prior.weight_concentration == pytest.approx(1 / 7)
    dof, cov = wishart_pseudo_rows(torch.as_tensor(variance), nu, 4.0, covariance_type)
    assert dof == nu
    assert_close_scaled(cov, expected, 1e-12, "wishart_pseudo_rows")
    # A given degrees of freedom or covariance prior still wins.
    given_prior = prior_from_moments(
        moments, 7, "diag", prior_strength=nu, degrees_of_freedom_prior=9.0
    )
    assert given_prior.degrees_of_freedom == 9.0
    assert_close_scaled(given_prior.covariance, nu * target / 4.0, 1e-12, "scale 1")


def test_detector_prior_is_d_plus_2_pseudo_rows_at_four_pooled_variances():
    det = FedVBDetector(5, max_iter=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        det.fit(X, groups=GROUPS)
    # the moments round gives the pooled variances: no separate prior round
    kinds = [r["kind"] for r in det.history_]
    assert kinds[0] == "moments" and "vb_prior" not in kinds
    # every component's degrees of freedom is nu_0 = d + 2 plus its expected count
    counts = det.posterior_.degrees_of_freedom.numpy() - (3 + 2.0)
    assert_close_scaled(counts.sum(), len(X), 1e-9, "counts")


# ----------------------------------------------------------------------------- exactness
def test_defaults_equal_sklearn_on_standardised_rows_for_any_split():
    """Federated VB with the defaults = scikit-learn's VB on NumPy z-scores under the
    hand-made prior, mapped back to X's units; one client and four give one posterior."""
    resp = predict_proba(rough_start(), torch.as_tensor(X)).numpy()
    d = X.shape[1]
    nu = d + 2.0
    reference = sklearn_on(
        Z,
        resp,
        mean_prior=np.zeros(d),  # the pooled mean of z-scores
        degrees_of_freedom_prior=nu,
        # the moments round's pooled variances (population, ddof=0): 1 in z-scores
        covariance_prior=np.diag(nu * VB_PRIOR_SCALE * Z.var(0)),
    )
    one = detector().fit(X)
    four = detector().fit(X, groups=GROUPS)
    assert one.n_iter_ == four.n_iter_ == reference.n_iter_
    assert_close_scaled(one.weights_, reference.weights_, RTOL, "weights_")
    assert_close_scaled(one.means_, MEAN + reference.means_ * SD, RTOL, "means_")
    covariances = reference.covariances_ * np.outer(SD, SD)
    assert_close_scaled(one.covariances_, covariances, RTOL, "covariances_")
    assert_close_scaled(
        one.posterior_.degrees_of_freedom, reference.degrees_of_freedom_, RTOL, "dof"
    )
    for name, value in one.posterior_.tensors().items():
        assert_close_scaled(getattr(four.posterior_, name), value, RTOL, name)
    assert_close_scaled(four.score_samples(X), one.score_samples(X), RTOL, "score_samples")


def test_standardised_scores_are_the_prestandardised_fit_plus_the_jacobian():
    """Standardising inside the fit = fitting NumPy z-scores with the same prior from the
    same start, scores shifted by ``-sum log sd``."""
    inside = detector().fit(X, groups=GROUPS)
    start = given(rough_start())
    D = np.diag(SD)
    z_start = {
        "weights_init": start["weights_init"],
        "means_init": (start["means_init"] - MEAN) / SD,
        "precisions_init": D @ start["precisions_init"] @ D,
    }
    nu = X.shape[1] + 2.0
    prior = Prior(  # the same prior, given by hand in z-scores
        standardize=False,
        strength=None,
        mean=np.zeros(3),
        degrees_of_freedom=nu,
        covariance=np.diag(nu * VB_PRIOR_SCALE * Z.var(0)),
    )
    outside = detector(initialisation=Initialisation(**z_start), prior=prior).fit(Z, groups=GROUPS)
    assert inside.history_[0]["kind"] == "moments"
    assert "moments" not in [r["kind"] for r in outside.history_]
    assert inside.n_iter_ == outside.n_iter_
    expected = outside.score_samples(Z) - np.log(SD).sum()
    assert_close_scaled(inside.score_samples(X), expected, RTOL, "score_samples")
    assert_close_scaled(inside.means_, MEAN + outside.means_ * SD, RTOL, "means_")


@pytest.mark.parametrize("merge", ["exact", "natural", "moment"])
def test_rescaled_features_give_the_rescaled_model(merge):
    """Units of the features do not change the fit (k-means start, exact and one-shot): the
    scores move by the Jacobian only."""
    options = {"posterior_merge": merge, "privacy": Privacy(min_rows=1), "random_state": 0}
    units = np.array([7.0, 1e-2, 1e4])
    base = FedVBDetector(6, **options).fit(X, groups=GROUPS)
    rescaled = FedVBDetector(6, **options).fit(X * units, groups=GROUPS)
    assert base.history_[0]["kind"] == "moments"
    assert base.effective_n_components_ == rescaled.effective_n_components_
    assert_close_scaled(
        rescaled.decision_function(X * units),
        base.decision_function(X) + np.log(units).sum(),
        1e-6,
        "decision_function",
    )
    assert_close_scaled(rescaled.means_, base.means_ * units, 1e-6, "means_")


# ----------------------------------------------------------------------------- switches
def test_switched_off_detector_is_sklearns_defaults_exactly():
    """On features of one scale (scikit-learn's default prior is lifted by a ridge where the
    scales differ by 1e6), each switch against scikit-learn."""
    rows = X / UNITS
    start = rough_start()
    start = MixtureParams(
        start.weights,
        start.means / torch.as_tensor(UNITS),
        precisions_cholesky_from_covariances(
            torch.as_tensor(np.cov(rows.T)).expand(5, 3, 3).clone(), "full"
        ),
        "full",
    )
    resp = predict_proba(start, torch.as_tensor(rows)).numpy()
    reference = sklearn_on(rows, resp)
    start_at = Initialisation(**given(start))
    plain = detector(prior=Prior(standardize=False, strength=None), initialisation=start_at)
    plain.fit(rows, groups=GROUPS)
    assert plain.history_[0]["kind"] == "vb_prior"
    assert plain.n_iter_ == reference.n_iter_
    for name in ("weights_", "means_", "covariances_"):
        assert_close_scaled(getattr(plain, name), getattr(reference, name), RTOL, name)
    assert_close_scaled(
        plain.posterior_.degrees_of_freedom, reference.degrees_of_freedom_, RTOL, "dof"
    )
    # standardisation alone: scikit-learn's defaults on the z-scores (nu_0 = d, the
    # z-scores' covariance), mapped back
    mean, sd = rows.mean(0), rows.std(0)
    std_only = detector(prior=Prior(strength=None), initialisation=start_at)
    std_only.fit(rows, groups=GROUPS)
    on_z = sklearn_on((rows - mean) / sd, resp)
    assert std_only.history_[0]["kind"] == "moments"
    assert_close_scaled(std_only.means_, mean + on_z.means_ * sd, RTOL, "means_")
    # prior alone: the pseudo-rows on the raw features, no moments round
    prior_only = detector(prior=Prior(standardize=False), initialisation=start_at)
    prior_only.fit(rows, groups=GROUPS)
    assert prior_only.history_[0]["kind"] == "vb_prior"
    nu = rows.shape[1] + 2.0
    raw = sklearn_on(
        rows,
        resp,
        mean_prior=mean,
        degrees_of_freedom_prior=nu,
        covariance_prior=np.diag(nu * VB_PRIOR_SCALE * rows.var(0, ddof=1)),
    )
    assert_close_scaled(prior_only.means_, raw.means_, RTOL, "means_")
    assert_close_scaled(prior_only.covariances_, raw.covariances_, RTOL, "covariances_")


def test_invalid_prior_strength_names_the_argument():
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        FedVBDetector(3, prior=Prior(strength=1.0)).fit(X, groups=GROUPS)


def test_a_feature_constant_on_each_client_keeps_every_client():
    """A feature that is constant on every client (one value per client) standardised: the
    prior comes from the moments round, so no prior round's moments are checked against
    round-off of order 1e-32 and every client takes part in every round."""
    rng = np.random.default_rng(2)
    rows = rng.normal(size=(400, 3))
    groups = np.repeat(np.arange(4), 100)
    rows[:, 2] = 0.3 * groups - 0.457
    det = FedVBDetector(4, max_iter=300, random_state=0, privacy=Privacy(min_rows=1))
    det.fit(rows, groups=groups)
    assert all(r["n_replied"] == 4 and not r["restarted"] for r in det.history_)
    assert np.isfinite(det.score_samples(rows)).all()
