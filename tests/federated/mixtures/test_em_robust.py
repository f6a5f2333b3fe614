"""Federated EM with standardisation and the covariance prior: exact over any split, results in
the user's units, and the plain algorithm unchanged when both are off."""

import numpy as np
import pytest
import torch

from fednovelty.federated import FederatedEM, FedGenGMM, PrivacyPolicy
from fednovelty.federated.core.base import Message
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.mixture import score_samples
from fednovelty.runtime import run_simulation
from fednovelty.runtime.flower.validation import check_reply

ROBUST = {"standardize": True, "prior_strength": 5.0, "prior_scale": 4.0}


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = np.r_[rng.normal(0, 1, (240, 3)), rng.normal(4, 1, (160, 3))]
    X = X * [1.0, 1e3, 1e-3] + [0.0, 5e3, 1.0]
    X[:100, 2] = 1.0  # a repeated value
    return torch.as_tensor(X)


def _run(parts, privacy=None, **kwargs):
    means_init = np.array([[0.0, 5e3, 1.0], [4.0, 9e3, 1.004]])  # fixed start: no k-means
    algorithm = FederatedEM(2, means_init=means_init, **kwargs)
    return run_simulation(algorithm, parts, random_state=0, privacy=privacy).state


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical", "tied"])
def test_robust_em_is_the_same_for_any_split(covariance_type):
    X = _data()
    one = _run([X], covariance_type=covariance_type, **ROBUST)
    # a 1-row client: exactness holds without the privacy floor (min_rows=1, no protection)
    three = _run(
        list(torch.tensor_split(X, [50, 51])),
        privacy=PrivacyPolicy(min_rows=1),
        covariance_type=covariance_type,
        **ROBUST,
    )
    np.testing.assert_allclose(three.params.means, one.params.means, rtol=1e-9)
    np.testing.assert_allclose(
        three.params.precisions_cholesky, one.params.precisions_cholesky, rtol=1e-8
    )
    np.testing.assert_allclose(three.lower_bounds, one.lower_bounds, rtol=1e-10)


def test_robust_em_result_is_in_the_users_units():
    X = _data()
    state = _run([X[:200], X[200:]], **ROBUST)
    # the means are those of the rows, not of z-scores; the log-likelihoods those of x
    assert 4e3 < float(state.params.means[:, 1].min()) < float(state.params.means[:, 1].max()) < 1e4
    final = float(score_samples(state.params, X).mean())
    assert abs(final - state.lower_bounds[-1]) < 0.05


def test_every_covariance_is_held_above_the_priors_floor():
    """MAP: Sigma_k >= strength / (n_k + strength) * prior_scale * var (per feature, x units),
    so no component, however few rows it holds, becomes a spike."""
    X = _data()
    state = run_simulation(
        FederatedEM(4, covariance_type="diag", **ROBUST), [X[:200], X[200:]], random_state=0
    ).state
    n_k = state.params.weights * X.shape[0]
    share = ROBUST["prior_strength"] / (n_k + ROBUST["prior_strength"])
    floor = share.unsqueeze(1) * ROBUST["prior_scale"] * X.var(0, unbiased=False)
    assert bool(torch.all(state.params.covariances >= floor * (1 - 1e-6)))
    plain = run_simulation(
        FederatedEM(4, covariance_type="diag"), [X[:200], X[200:]], random_state=0
    )
    assert not bool(torch.all(plain.state.params.covariances >= floor * (1 - 1e-6)))


def test_moments_round_is_first_and_counted():
    X = _data()
    algorithm = FederatedEM(2, **ROBUST)
    result = run_simulation(algorithm, [X[:200], X[200:]], random_state=0)
    assert result.history[0].kind == "moments"
    assert result.history[1].kind == "centroids"
    plain = run_simulation(FederatedEM(2), [X[:200], X[200:]], random_state=0)
    assert (
        len(result.history) == len(plain.history) + 1 or result.state.n_iter != plain.state.n_iter
    )


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="prior_strength"):
        FederatedEM(2, prior_strength=0.0)
    with pytest.raises(ValueError, match="prior_scale"):
        FedGenGMM(prior_scale=-1.0)
    with pytest.raises(ValueError, match="prior_strength"):
        JointFedGMM(2, 2, 3, prior_strength=-1.0)


def test_flower_validation_knows_the_moments_reply():
    broadcast = Message("moments")
    good = Message(
        "moments",
        {"n_samples": torch.tensor(3.0), "mean": torch.zeros(4), "m2": torch.ones(4)},
    )
    check_reply(good, broadcast, 4)
    bad = Message(
        "moments",
        {"n_samples": torch.tensor(3.0), "mean": torch.zeros(4), "m2": -torch.ones(4)},
    )
    with pytest.raises(ValueError, match="negative"):
        check_reply(bad, broadcast, 4)


def test_fedgengmm_robust_is_unit_equivariant_and_one_round():
    X = _data()[:, :2]
    parts = [X[:150], X[150:300], X[300:]]
    unit = torch.tensor([4.0, 1 / 256], dtype=torch.float64)  # powers of two: exact
    a = run_simulation(FedGenGMM(n_components=2, **ROBUST), parts, random_state=0)
    b = run_simulation(
        FedGenGMM(n_components=2, **ROBUST), [p * unit for p in parts], random_state=0
    )
    assert len(a.history) == 1
    np.testing.assert_allclose(b.state.params.means, a.state.params.means * unit, rtol=1e-9)
    for cid, model in a.state.client_models.items():
        np.testing.assert_allclose(b.state.client_models[cid].means, model.means * unit, rtol=1e-9)


def test_robust_seeding_keeps_every_centroid_when_too_few_would_remain():
    """Ten small clients each send one k-means centroid (9 rows, floor 5); three hold rows
    far from the rest. The robust seeding would leave those three out and keep 7 centroids
    for 8 components: it keeps them all instead of ending the fit."""
    rng = np.random.default_rng(0)
    places = [0.0] * 7 + [20.0, 40.0, 60.0]
    clients = [torch.as_tensor(rng.normal(p, 1.0, (9, 2))) for p in places]
    state = run_simulation(
        FederatedEM(8, aggregation="trimmed", trim=0.1, max_iter=3, random_state=0),
        clients,
        random_state=0,
    ).state
    assert state.params.means.shape == (8, 2)
    assert bool(torch.isfinite(state.params.means).all())
