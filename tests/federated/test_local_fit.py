"""The local-fit round and the one-shot start of federated EM
(``fednovelty.federated.local_fit``, ``init_params="oneshot"``).

References: the blobs' true means; scikit-learn's ``GaussianMixture`` on the pooled rows
(the EM fixed point the exact rounds after the start reach); FedGenGMM's own global mixture
(the start is its round).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.mixture import GaussianMixture

from fednovelty.federated import FederatedEM, FedGenGMM, PrivacyPolicy
from fednovelty.federated.local_fit import reduce_union
from fednovelty.mixture import (
    MixtureParams,
    covariances_from_precisions_cholesky,
    precisions_cholesky_from_covariances,
)
from fednovelty.runtime import run_simulation

CENTERS = np.array([[-6.0, 0.0, 0.0], [6.0, 0.0, 1.0], [0.0, 7.0, -1.0]])


def blob_clients(n_clients: int = 4, n_per: int = 150, seed: int = 0) -> tuple:
    """Rows of three blobs, client ``c`` holding mostly blob ``c % 3`` (skewed clients)."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + rng.normal(size=(n_per, 3)) for c in CENTERS])
    blob = np.repeat(np.arange(3), n_per)
    owner = np.where(
        rng.random(blob.size) < 0.8, blob % n_clients, rng.integers(0, n_clients, blob.size)
    )
    return X, [torch.as_tensor(X[owner == c]) for c in range(n_clients)]


def sorted_means(means) -> np.ndarray:
    means = np.asarray(means)
    return means[np.lexsort(means.T[::-1])]


def test_the_one_shot_start_recovers_skewed_clients_blobs_in_one_round():
    _, clients = blob_clients()
    result = run_simulation(
        FederatedEM(3, init_params="oneshot", max_iter=1, random_state=0), clients
    )
    kinds = [record.kind for record in result.history]
    assert kinds == ["oneshot", "em"]
    start = result.history[0]
    assert start.metrics["n_union"] <= 3 * len(clients)
    np.testing.assert_allclose(
        sorted_means(result.state.params.means), sorted_means(CENTERS), atol=0.3
    )


def test_exact_rounds_after_the_start_reach_sklearns_fixed_point():
    X, clients = blob_clients(seed=1)
    result = run_simulation(
        FederatedEM(3, init_params="oneshot", tol=1e-10, max_iter=500, random_state=0),
        clients,
        privacy=PrivacyPolicy(min_rows=1),
    )
    reference = GaussianMixture(3, tol=1e-10, max_iter=500, random_state=0).fit(X)
    np.testing.assert_allclose(
        sorted_means(result.state.params.means), sorted_means(reference.means_), atol=1e-6
    )
    assert result.state.lower_bounds[-1] == pytest.approx(reference.score(X), abs=1e-8)


def test_the_start_is_fedgengmms_round_in_the_rounds_units():
    # without standardisation the rounds work in the user's units: the start's union and
    # reduction are FedGenGMM's with client K = global K and its default H
    _, clients = blob_clients(seed=2)
    start = run_simulation(
        FederatedEM(3, init_params="oneshot", max_iter=1, random_state=0), clients
    ).history[0]
    fedgen = run_simulation(
        FedGenGMM(n_components=3, client_components=3, random_state=0), clients
    ).state
    assert start.metrics["n_synthetic"] == fedgen.n_synthetic


def test_reduce_union_fits_the_union_it_samples():
    # two client mixtures of one component each, sizes 3:1; the reduction to one
    # component has the union's moments (mean 0.75 * a + 0.25 * b)
    a, b = torch.tensor([[0.0, 0.0]]), torch.tensor([[4.0, 0.0]])
    cov = precisions_cholesky_from_covariances(torch.eye(2).unsqueeze(0), "full")
    models = [MixtureParams(torch.ones(1), m.double(), cov.double(), "full") for m in (a, b)]
    settings = {
        "covariance_type": "full",
        "reg_covar": 1e-6,
        "tol": 1e-6,
        "max_iter": 200,
        "generator": torch.Generator().manual_seed(0),
        "standardize": False,
        "prior_strength": None,
    }
    result, _, synthetic = reduce_union(models, [3.0, 1.0], [1], 5000, settings)
    assert synthetic.shape == (10000, 2)
    # the union's moments: mean 0.75 * a + 0.25 * b, variance along x 1 + 0.75 * 0.25 * 16
    np.testing.assert_allclose(result.params.means[0].numpy(), [1.0, 0.0], atol=0.08)
    covariance = covariances_from_precisions_cholesky(result.params.precisions_cholesky, "full")
    np.testing.assert_allclose(covariance[0].numpy(), [[4.0, 0.0], [0.0, 1.0]], atol=0.15)


def test_clients_under_the_floor_skip_and_too_few_components_is_a_named_error():
    _, clients = blob_clients(n_per=40)
    tiny = [part[:4] for part in clients]  # under the default floor of 5 rows: all skip
    with pytest.raises(Exception, match=r"min_clients|privacy floor|skip"):
        run_simulation(FederatedEM(3, init_params="oneshot", random_state=0), tiny)
    # one client may fit at most n_rows // min_rows components: 10 rows, floor 5 -> 2
    few = [clients[0][:10]]
    with pytest.raises(ValueError, match="local component"):
        run_simulation(FederatedEM(3, init_params="oneshot", random_state=0), few)


def test_the_one_shot_start_has_no_private_form():
    with pytest.raises(ValueError, match="oneshot"):
        FederatedEM(3, init_params="oneshot", dp_mode="central")
