"""Federated EM for mixtures of factor analysers (``FederatedFactorEM``) against centralized EM.

Reference: the start's sketch and every E-step's statistics add over clients, so any split of
the rows (uneven, with an empty client) must reproduce, to float64 round-off, the centralized
start of the same partition (``factor_init``) and the centralized EM path from it
(``fit_factor_em``, the loop ``fit_mfa`` runs), also behind the standardising moments round
with the noise prior (the centralized fit on z-scores, mapped back).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fednovelty.federated import PrivacyPolicy
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.mixtures.factor_em import (
    FactorEMConfig,
    FederatedFactorEM,
    check_factor_stats,
    sketch_for,
)
from fednovelty.federated.trust import gate
from fednovelty.mixture import CovariancePrior, feature_moments, prior_target, standardization
from fednovelty.mixture.factor import FactorParams, affine_factor_params, factor_score_samples
from fednovelty.mixture.factor_fit import factor_init, fit_factor_em
from fednovelty.mixture.kmeans import assign, one_hot
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)
DT = torch.float64


def mfa_rows(n: int = 500, d: int = 6, q: int = 2, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    means = 4 * torch.randn(3, d, generator=gen, dtype=DT) + 10.0  # an offset from 0
    loadings = torch.randn(3, d, q, generator=gen, dtype=DT)
    z = torch.randint(0, 3, (n,), generator=gen)
    latent = torch.randn(n, q, generator=gen, dtype=DT)
    noise = 0.5 * torch.randn(n, d, generator=gen, dtype=DT)
    return means[z] + torch.einsum("ndq,nq->nd", loadings[z], latent) + noise


def uneven_split(X: torch.Tensor) -> list[torch.Tensor]:
    order = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(1))
    cuts = [0, 7, 7, 290, 330, X.shape[0]]  # 7 rows, an empty client, 283, 40, 170
    return [X[order[a:b]] for a, b in itertools.pairwise(cuts)]


def assert_same_mixture(a: FactorParams, b: FactorParams, rtol: float = 1e-8) -> None:
    for name, value in b.tensors().items():
        scale = float(value.abs().max())
        torch.testing.assert_close(getattr(a, name), value, rtol=0, atol=rtol * scale)


def test_federated_fit_equals_centralized_em_from_the_same_partition():
    X = mfa_rows()
    means_init = X[[0, 1, 2]].clone()
    settings = {"means_init": means_init, "tol": 1e-7, "max_iter": 60, "reg_covar": 1e-6}
    algorithm = FederatedFactorEM(3, 2, random_state=4, **settings)
    state = run_simulation(algorithm, uneven_split(X), privacy=NO_FLOOR).state

    labels, _ = assign(X, means_init)
    omega = sketch_for(algorithm.config, X.shape[1], X)
    start = factor_init(X, one_hot(labels, 3, X), 2, omega, reg_covar=1e-6)
    assert_same_mixture(state.start, start)
    reference = fit_factor_em(X, start, reg_covar=1e-6, tol=1e-7, max_iter=60)
    assert reference.n_iter >= 10  # a real EM path
    assert state.n_iter == reference.n_iter and state.converged == reference.converged
    np.testing.assert_allclose(state.lower_bounds, reference.lower_bounds, rtol=1e-10)
    assert_same_mixture(state.factors, reference.params, rtol=1e-7)


def test_standardised_fit_with_the_noise_prior_equals_the_centralized_fit_mapped_back():
    X = mfa_rows(seed=2) * torch.tensor([1.0, 10.0, 0.1, 1.0, 5.0, 1.0], dtype=DT)
    means_init = X[[3, 4, 5]].clone()
    algorithm = FederatedFactorEM(
        3, 2, standardize=True, prior_strength=8.0, prior_scale=4.0, means_init=means_init,
        tol=1e-6, max_iter=40, random_state=0,
    )  # fmt: skip
    state = run_simulation(algorithm, uneven_split(X), privacy=NO_FLOOR).state

    moments = feature_moments(X)
    offset, scale = standardization(moments, "diag")
    Z = (X - offset) / scale
    prior = CovariancePrior(8.0, prior_target(moments.variance, scale, 4.0))
    labels, _ = assign(Z, (means_init - offset) / scale)
    omega = sketch_for(algorithm.config, X.shape[1], X)
    start = factor_init(Z, one_hot(labels, 3, Z), 2, omega, reg_covar=1e-6, prior=prior)
    reference = fit_factor_em(Z, start, reg_covar=1e-6, tol=1e-6, max_iter=40, prior=prior)
    assert state.n_iter == reference.n_iter
    jacobian = float(scale.log().sum())
    np.testing.assert_allclose(
        state.lower_bounds, [lb - jacobian for lb in reference.lower_bounds], rtol=1e-9
    )
    assert_same_mixture(state.factors, affine_factor_params(reference.params, offset, scale), 1e-6)
    # the result scores rows in the user's units
    np.testing.assert_allclose(
        factor_score_samples(X, state.factors).numpy(),
        factor_score_samples(Z, reference.params).numpy() - jacobian,
        rtol=1e-6,
    )


def test_the_default_start_runs_under_the_default_floor():
    X = mfa_rows(n=400, seed=5)
    clients = uneven_split(X)
    clients[0] = clients[0][:3]  # below the floor: it skips every round
    state = run_simulation(
        FederatedFactorEM(3, 2, max_iter=15, random_state=0), clients
    ).state  # k-FED centroids, Lloyd rounds, the sketch, the EM rounds
    assert state.phase == "done" and state.n_iter >= 2
    lb = np.asarray(state.lower_bounds)
    assert np.isfinite(lb).all() and np.diff(lb).min() >= -1e-9 * np.abs(lb).max()


def test_the_client_gate_zeroes_components_below_the_floor_and_small_clients_skip():
    algorithm = FederatedFactorEM(2, 1, max_iter=3)
    gen = torch.Generator().manual_seed(0)
    params = FactorParams(
        torch.tensor([0.5, 0.5], dtype=DT),
        torch.tensor([[0.0, 0.0, 0.0], [50.0, 50.0, 50.0]], dtype=DT),
        0.5 * torch.ones(2, 3, 1, dtype=DT),
        torch.ones(2, 3, dtype=DT),
    )
    message = Message("factor_em", {**params.tensors(), "shift": torch.zeros(3, dtype=DT)})
    near_first = torch.randn(20, 3, generator=gen, dtype=DT)
    policy = PrivacyPolicy(min_rows=5)
    reply = gate.answer(algorithm, near_first, message, gate.client_context(0, policy=policy))
    assert not reply.scalars.get("skipped")
    assert reply.tensors["counts"][0].item() == pytest.approx(20.0, rel=1e-9)
    for name in ("counts", "sums", "second", "xz", "sum_z", "zz"):
        assert bool((reply.tensors[name][1] == 0).all()), name
    small = gate.answer(algorithm, near_first[:3], message, gate.client_context(1, policy=policy))
    assert small.scalars.get("skipped") and not small.tensors


def test_a_reply_whose_latent_moments_no_rows_have_is_refused():
    zz = torch.eye(2, dtype=DT).unsqueeze(0).repeat(2, 1, 1)
    zz[1] = torch.tensor([[1.0, 3.0], [3.0, 1.0]], dtype=DT)  # not PSD
    with pytest.raises(InvalidReplyError, match="'zz' is not positive semi-definite"):
        check_factor_stats(Message("factor_em", {"zz": zz}), Message("factor_em"))


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"n_factors": 0}, "n_factors must be >= 1"),
        ({"n_factors": 2, "init_params": "subset"}, "init_params must be one of"),
        ({"n_factors": 2, "precisions_init": np.ones((2, 3))}, "not precisions_init"),
        ({"n_factors": 2, "aggregation": "median"}, "aggregation"),
        ({"n_factors": 2, "covariance_type": "full"}, "covariance_type must be one of"),
    ],
)
def test_bad_settings_are_named(settings, match):
    with pytest.raises(ValueError, match=match):
        FactorEMConfig(n_components=2, **settings)


def test_too_many_factors_for_the_rows_is_named_when_the_width_is_known():
    X = mfa_rows(n=60, d=4)
    with pytest.raises(ValueError, match="n_factors <= n_features - 1 = 3"):
        run_simulation(FederatedFactorEM(2, 4, max_iter=2), [X[:30], X[30:]], privacy=NO_FLOOR)
