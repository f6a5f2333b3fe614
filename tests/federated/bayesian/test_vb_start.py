"""Federated VB from the one-shot start (``init_params="oneshot"``): the start, the exact
rounds after it against scikit-learn's ``BayesianGaussianMixture`` from the same posterior,
the stopping rule, the server's grouped refinement and the settings it refuses."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import BayesianGaussianMixture

from fednovelty.detectors import variational as vb_detector
from fednovelty.detectors.options import Privacy
from fednovelty.federated import PrivacyPolicy
from fednovelty.federated.bayesian.variational import FederatedVB, VBConfig
from fednovelty.federated.bayesian.vb_oneshot import FederatedVBOneShot, VBOneShotConfig
from fednovelty.federated.core.base import client_generator, derived_seed
from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.stats import stats_from_resp
from fednovelty.mixture.variational import (
    VBPosterior,
    fit_vb,
    resp_entropy,
    vb_log_resp,
    vb_lower_bound,
    vb_m_step,
)
from fednovelty.mixture.vb_groups import fit_vb_groups
from fednovelty.mixture.vb_prior import VBPrior, default_prior
from fednovelty.runtime import run_simulation

torch.set_num_threads(1)

NO_FLOOR = PrivacyPolicy(min_rows=1)
K = 6
CENTERS = np.array(
    [[0.0, 0.0, 0.0], [6.0, 0.0, 0.0], [0.0, 6.0, 0.0], [0.0, 0.0, 6.0], [6.0, 6.0, 6.0]]
)


def five_blobs(seed: int = 0, n_per: int = 40) -> tuple[np.ndarray, list[torch.Tensor]]:
    """Five unit-variance blobs in 3-d and three clients that each hold mostly two or
    three of them (80 % of a blob's rows go to client ``blob % 3``)."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + rng.normal(size=(n_per, 3)) for c in CENTERS])
    blob = np.repeat(np.arange(5), n_per)
    client = np.where(rng.random(len(X)) < 0.8, blob % 3, rng.integers(0, 3, len(X)))
    return X, [torch.as_tensor(X[client == c]) for c in range(3)]


def sklearn_prior(X: np.ndarray, k: int) -> VBPrior:
    """scikit-learn's default priors for ``X`` (its own ``_check_parameters``)."""
    bgm = BayesianGaussianMixture(n_components=k)
    bgm._check_parameters(X)
    return VBPrior(
        "dirichlet_process",
        float(bgm.weight_concentration_prior_),
        float(bgm.mean_precision_prior_),
        torch.as_tensor(bgm.mean_prior_),
        float(bgm.degrees_of_freedom_prior_),
        torch.as_tensor(bgm.covariance_prior_),
        "full",
    )


def sklearn_from_posterior(X: np.ndarray, start: VBPosterior, **kwargs) -> BayesianGaussianMixture:
    """``BayesianGaussianMixture.fit`` continuing from the posterior ``start`` (warm start:
    scikit-learn's own loop, priors from its ``_check_parameters``)."""
    bgm = BayesianGaussianMixture(n_components=start.n_components, warm_start=True, **kwargs)
    wc = start.weight_concentration.numpy()
    bgm.weight_concentration_ = (wc[0], wc[1])
    bgm.mean_precision_ = start.mean_precision.numpy()
    bgm.means_ = start.means.numpy()
    bgm.degrees_of_freedom_ = start.degrees_of_freedom.numpy()
    bgm.covariances_ = start.covariances.numpy()
    bgm.precisions_cholesky_ = start.precisions_cholesky.numpy()
    bgm.converged_, bgm.lower_bound_ = False, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return bgm.fit(X)


def oneshot_start(clients, **settings) -> VBPosterior:
    """The one-shot start alone: the same step as ``FederatedVB``'s ``vb_local`` round
    (with the start's defaults: natural-parameter averaging, 100 refining iterations)."""
    algorithm = FederatedVBOneShot(
        K, random_state=0, posterior_aggregation="natural", refine_iter=100, **settings
    )
    return run_simulation(algorithm, clients, privacy=NO_FLOOR).state.posterior


# ------------------------------------------------------------------------------ the start
def test_the_start_is_a_valid_posterior_fitted_under_the_shared_prior():
    X, clients = five_blobs()
    result = run_simulation(
        FederatedVB(K, init_params="oneshot", max_iter=3, local_max_iter=100, random_state=0),
        clients,
        privacy=NO_FLOOR,
    )
    state = result.state
    assert [r.kind for r in result.history[:3]] == ["vb_prior", "vb_local", "vb"]
    assert state.n_iter == 3 and len(state.lower_bounds) == 3
    # one prior for the local fits and the rounds: scikit-learn's default prior of the rows
    prior = sklearn_prior(X, K)
    for name in ("mean", "covariance"):
        assert_close_scaled(getattr(state.vb_prior, name), getattr(prior, name), 1e-10, name)
    assert state.vb_prior.degrees_of_freedom == prior.degrees_of_freedom
    # client 1's local posterior is its own VB fit under that prior, by hand
    rows = clients[1]
    _, labels = kmeans(rows, K, generator=client_generator(derived_seed(0, 0), 1))
    init = vb_m_step(stats_from_resp(rows, one_hot(labels, K, rows), "full", prior.mean), prior)
    fitted = fit_vb(rows, init, prior).posterior
    resp = vb_log_resp(rows, fitted)[1].exp()
    local = vb_m_step(stats_from_resp(rows, resp, "full", prior.mean), prior)
    for name, value in local.tensors().items():
        assert_close_scaled(state.client_posteriors[1].tensors()[name], value, 1e-7, name)
    # the start: a proper posterior of K components
    start = oneshot_start(clients)
    d = X.shape[1]
    assert start.n_components == K
    assert bool((start.weight_concentration > 0).all())
    assert bool((start.mean_precision >= prior.mean_precision).all())
    assert bool((start.degrees_of_freedom >= prior.degrees_of_freedom).all())
    assert int(torch.linalg.cholesky_ex(start.covariances).info.abs().sum()) == 0
    assert_close_scaled(start.covariances, start.covariances.transpose(-1, -2), 1e-12)
    assert bool(torch.isfinite(start.means).all()) and start.weights.sum() == pytest.approx(1.0)
    assert start.degrees_of_freedom.min() > d - 1
    # the blobs are found: every centre has a component mean within one unit of it
    distance = torch.cdist(torch.as_tensor(CENTERS), start.means).min(1).values
    assert float(distance.max()) < 1.0


def test_the_exact_rounds_after_the_start_follow_sklearn_from_that_posterior():
    X, clients = five_blobs()
    settings = {"tol": 1e-6, "max_iter": 40}
    start = oneshot_start(clients, **settings)
    reference = sklearn_from_posterior(X, start, **settings)
    algorithm = FederatedVB(K, init_params="oneshot", random_state=0, **settings)
    result = run_simulation(algorithm, clients, privacy=NO_FLOOR)
    state = result.state
    assert state.n_iter == reference.n_iter_ and state.converged == reference.converged_
    expected = [float(np.ravel(b)[0]) for b in reference.lower_bounds_]
    assert_close_scaled(state.lower_bounds, expected, 1e-8, "lower_bounds")
    posterior = state.posterior
    assert_close_scaled(posterior.weights, reference.weights_, 1e-8, "weights")
    assert_close_scaled(posterior.means, reference.means_, 1e-8, "means")
    assert_close_scaled(posterior.covariances, reference.covariances_, 1e-8, "covariances")
    # the ELBO never decreases over the rounds, and starts above the refinement's bound
    scale = max(abs(b) for b in state.lower_bounds)
    assert min(np.diff(state.lower_bounds), default=0.0) >= -1e-9 * scale
    refined = next(r for r in result.history if r.kind == "vb_local").metrics["refine_bound"]
    assert state.lower_bounds[0] >= refined - 1e-9 * scale


@pytest.mark.parametrize("seed", [0, 1])
def test_the_start_and_five_rounds_reach_the_kmeans_runs_converged_elbo(seed):
    """Five blobs, three non-IID clients: the k-means-started run to convergence (tol 1e-6)
    against the one-shot start and at most 5 exact rounds, ELBO per row (both
    scikit-learn's bound under one prior and K, so their constants agree)."""
    X, clients = five_blobs(seed)
    n = X.shape[0]
    converged = run_simulation(
        FederatedVB(K, tol=1e-6, max_iter=500, random_state=seed), clients, privacy=NO_FLOOR
    ).state
    assert converged.converged
    few = run_simulation(
        FederatedVB(K, init_params="oneshot", max_iter=5, local_max_iter=100, random_state=seed),
        clients,
        privacy=NO_FLOOR,
    ).state
    assert few.n_iter <= 5
    assert few.lower_bounds[-1] / n >= converged.lower_bounds[-1] / n - 0.01


def test_the_elbo_stopping_rule_stops_once_a_round_changes_it_by_less_than_tol():
    _, clients = five_blobs()
    tol = 0.05  # nats, summed over the rows (scikit-learn's rule)
    state = run_simulation(
        FederatedVB(K, init_params="oneshot", tol=tol, max_iter=200, random_state=0),
        clients,
        privacy=NO_FLOOR,
    ).state
    changes = np.abs(np.diff(state.lower_bounds))
    assert state.converged and state.n_iter < 200
    assert changes[-1] < tol and bool((changes[:-1] >= tol).all())
    # without a tolerance it runs max_iter rounds and says so
    state = run_simulation(
        FederatedVB(K, init_params="oneshot", tol=0.0, max_iter=4, random_state=0),
        clients,
        privacy=NO_FLOOR,
    ).state
    assert state.n_iter == 4 and not state.converged


# ------------------------------------------------------------------------------ refinement
def test_grouped_vb_with_one_row_per_group_is_sklearns_path():
    """Every row its own group: the restriction is void, so the iterations are
    scikit-learn's from the same initial responsibilities."""
    X, _ = five_blobs(n_per=20)
    Xt = torch.as_tensor(X)
    _, labels = kmeans(Xt, K, generator=torch.Generator().manual_seed(0))
    resp = one_hot(labels, K, Xt)
    prior = sklearn_prior(X, K)
    reference = BayesianGaussianMixture(n_components=K, warm_start=True, tol=0.0, max_iter=15)
    reference._check_parameters(X)
    reference._initialize(X, resp.numpy())
    reference.converged_, reference.lower_bound_ = False, -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reference.fit(X)
    init = vb_m_step(stats_from_resp(Xt, resp, "full", prior.mean), prior)
    rows = stats_from_resp(Xt, torch.eye(len(X), dtype=Xt.dtype), "full", prior.mean)
    result = fit_vb_groups(rows, init, prior, tol=0.0, max_iter=15)
    expected = [float(np.ravel(b)[0]) for b in reference.lower_bounds_]
    assert_close_scaled(result.lower_bounds, expected, 1e-8, "lower_bounds")
    assert_close_scaled(result.posterior.means, reference.means_, 1e-8, "means")


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_grouped_vb_never_lowers_its_bound_which_bounds_the_rows_elbo(covariance_type):
    X, _ = five_blobs(n_per=30)
    Xt = torch.as_tensor(X)
    prior = default_prior(Xt, K, covariance_type)
    _, labels = kmeans(Xt, 12, generator=torch.Generator().manual_seed(1))  # 12 groups
    groups = stats_from_resp(Xt, one_hot(labels, 12, Xt), covariance_type, prior.mean)
    start = vb_m_step(
        stats_from_resp(Xt, one_hot(labels % K, K, Xt), covariance_type, prior.mean), prior
    )
    result = fit_vb_groups(groups, start, prior, tol=0.0, max_iter=20)
    bounds = np.array(result.lower_bounds)
    assert (np.diff(bounds) >= -1e-9 * np.abs(bounds).max()).all()
    # one unrestricted VB step on the rows from the result: its bound is at least as high
    log_resp = vb_log_resp(Xt, result.posterior)[1]
    after = vb_m_step(stats_from_resp(Xt, log_resp.exp(), covariance_type, prior.mean), prior)
    assert float(vb_lower_bound(after, resp_entropy(log_resp))) >= bounds[-1] - 1e-9 * abs(
        bounds[-1]
    )


# ------------------------------------------------------------------------------ settings
@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"covariance_type": "tied"}, r'"oneshot" takes covariance_type "full", "diag"'),
        ({"means_init": [[0.0, 0.0]] * K}, r"leave means_init unset"),
        (
            {"dp_mode": "local", "bounds": ([-1.0, -1.0], [1.0, 1.0]), "dp_noise_multiplier": 1.0},
            "no private form",
        ),
        ({"posterior_aggregation": "average"}, "posterior_aggregation must be one of"),
        ({"refine_iter": -1}, "refine_iter must be an integer >= 0"),
        ({"local_max_iter": 0}, "local_max_iter must be >= 1"),
        ({"match_threshold": 0.0}, "match_threshold must be a finite number > 0"),
    ],
)
def test_bad_settings_of_the_start_are_refused_by_name(settings, match):
    with pytest.raises(ValueError, match=match):
        VBConfig(n_components=K, init_params="oneshot", **settings)


def test_the_refinement_is_off_for_one_shot_vb_and_on_for_the_start():
    assert VBOneShotConfig(n_components=K).refine_iter == 0
    assert VBConfig(n_components=K).refine_iter == 100
    assert VBOneShotConfig(n_components=K).posterior_aggregation == "moment"
    assert VBConfig(n_components=K).posterior_aggregation == "natural"
    rebuilt = VBConfig.from_json(VBConfig(n_components=K, init_params="oneshot").to_json())
    assert rebuilt.init_params == "oneshot" and rebuilt.refine_iter == 100
    rows = torch.as_tensor(five_blobs(n_per=4)[0])
    tied = stats_from_resp(rows, torch.eye(len(rows), dtype=rows.dtype), "tied", rows[0])
    with pytest.raises(ValueError, match="grouped rows need second moments per group"):
        fit_vb_groups(tied, None, None)


def test_the_detector_passes_the_start_and_its_matching_threshold(monkeypatch):
    built = []

    def spy(**settings) -> FederatedVB:  # a function: a subclass would join the registry
        algorithm = FederatedVB(**settings)
        built.append(algorithm.config)
        return algorithm

    monkeypatch.setattr(vb_detector, "FederatedVB", spy)
    _, clients = five_blobs()
    groups = np.concatenate([np.full(len(c), i) for i, c in enumerate(clients)])
    rows = np.concatenate([c.numpy() for c in clients])
    det = vb_detector.FedVBDetector(
        K, init_params="oneshot", match_threshold=0.8, random_state=0, privacy=Privacy(min_rows=1)
    ).fit(rows, groups=groups)
    config = built[-1]
    assert config.init_params == "oneshot" and config.match_threshold == 0.8
    assert [h["kind"] for h in det.history_[:4]] == ["moments", "vb_prior", "vb_local", "vb"]
    assert det.n_iter_ == len(det.lower_bounds_) and det.converged_
