"""FedGenGMM (one-shot), LocalGMMs and ``Message.nbytes``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.mixture import GaussianMixture

from fednovelty.exceptions import FederationError
from fednovelty.federated import FedGenGMM, LocalGMMs, Message, PrivacyPolicy
from fednovelty.mixture import score_samples
from fednovelty.mixture.copula import copula_score_samples
from fednovelty.runtime import run_simulation

CENTERS = np.array([[-6.0, 0.0], [6.0, 0.0], [0.0, 7.0]])


def blob(rng: np.random.Generator, index: int, n: int) -> np.ndarray:
    return CENTERS[index] + rng.normal(size=(n, 2))


@pytest.fixture(scope="module")
def nested_clients() -> dict[int, np.ndarray]:
    """Client 0 holds one blob, client 1 two blobs, client 2 three blobs (150 rows each)."""
    rng = np.random.default_rng(0)
    return {
        0: blob(rng, 0, 150),
        1: np.vstack([blob(rng, 0, 75), blob(rng, 1, 75)]),
        2: np.vstack([blob(rng, 0, 50), blob(rng, 1, 50), blob(rng, 2, 50)]),
    }


@pytest.fixture(scope="module")
def fedgen_run(nested_clients):
    algorithm = FedGenGMM(n_components=3, k_range=(1, 4), samples_per_component=80, random_state=0)
    clients = {cid: torch.as_tensor(rows) for cid, rows in nested_clients.items()}
    return algorithm, run_simulation(algorithm, clients)


def test_fedgengmm_is_one_round(fedgen_run):
    algorithm, result = fedgen_run
    assert len(result.history) == 1
    assert result.history[0].kind == "local_fit"
    assert result.history[0].round == 1
    assert result.state.phase == "done"
    assert result.state.rounds == 1
    assert algorithm.max_rounds == 1


def test_client_components_chosen_by_bic(fedgen_run):
    _, result = fedgen_run
    chosen = {cid: m.n_components for cid, m in result.state.client_models.items()}
    # Each client holds 1, 2 and 3 well separated blobs; without a covariance prior the
    # clients search K by BIC over k in 1..4 (the FedGenGMM paper's round) and find them.
    assert chosen == {0: 1, 1: 2, 2: 3}
    assert result.state.client_sizes == {0: 150.0, 1: 150.0, 2: 150.0}
    assert result.state.skipped == []


def test_clients_fit_the_global_k_by_maximum_likelihood(nested_clients):
    """With a covariance prior and ``n_components`` every client fits that K, by maximum
    likelihood (150 rows are more than the prior's 4 pseudo-rows): its log-likelihood on its
    own rows is that of scikit-learn's 3-component fit, above the one-blob client's single
    Gaussian. (With the prior in the client fits it is 0.8-1.1 nats lower on clients 1-2.)"""
    algorithm = FedGenGMM(
        n_components=3, standardize=True, prior_strength=4.0, prior_scale=4.0, random_state=0
    )
    clients = {cid: torch.as_tensor(rows) for cid, rows in nested_clients.items()}
    policy = PrivacyPolicy(min_rows=1)  # no floor: the gate drops no small component
    models = run_simulation(algorithm, clients, privacy=policy).state.client_models
    assert {cid: m.n_components for cid, m in models.items()} == {0: 3, 1: 3, 2: 3}
    for cid, rows in nested_clients.items():
        ours = float(score_samples(models[cid], torch.as_tensor(rows)).mean())
        sklearn = GaussianMixture(3, n_init=5, random_state=0).fit(rows).score(rows)
        assert abs(ours - sklearn) < 0.02 * abs(sklearn), (cid, ours, sklearn)
    one = GaussianMixture(1).fit(nested_clients[0]).score(nested_clients[0])
    assert float(score_samples(models[0], torch.as_tensor(nested_clients[0])).mean()) > one


def test_client_prior_only_below_its_pseudo_rows():
    """A client of a fixed K applies the prior only with fewer rows than its pseudo-rows; a
    BIC search always applies it; no prior configured, none anywhere."""
    fixed = FedGenGMM(n_components=3, prior_strength=10.0).config
    assert fixed.shares_global_k() and fixed.client_k() == 3
    assert [fixed.client_prior(n) for n in (5, 9, 10, 500)] == [10.0, 10.0, None, None]
    by_bic = FedGenGMM(prior_strength=10.0).config
    assert by_bic.client_k() is None
    assert [by_bic.client_prior(n) for n in (5, 500)] == [10.0, 10.0]
    plain = FedGenGMM(n_components=3, prior_strength=None).config
    assert plain.client_k() is None and plain.client_prior(5) is None  # the paper's BIC


def test_global_k_is_bounded_by_the_privacy_floor():
    """A client fits at most ``n_rows // min_rows`` of the global K; a fixed
    ``client_components`` above that leaves the client out."""
    config = FedGenGMM(n_components=10, prior_strength=4.0).config
    assert config.rows_needed() == 2
    assert [config.client_candidates(n, min_rows=5) for n in (4, 12, 49, 50, 400)] == [
        [],
        [2],
        [9],
        [10],
        [10],
    ]
    fixed = FedGenGMM(n_components=10, client_components=4, prior_strength=4.0).config
    assert fixed.client_candidates(12, min_rows=5) == []
    assert fixed.client_candidates(20, min_rows=5) == [4]


def test_synthetic_rows_are_h_times_sum_of_client_components(fedgen_run):
    algorithm, result = fedgen_run
    total_k = sum(m.n_components for m in result.state.client_models.values())
    assert result.state.n_synthetic == algorithm.samples_per_component * total_k == 80 * 6
    assert result.history[0].metrics["n_synthetic"] == 480


def test_global_model_close_to_centralized_sklearn(fedgen_run, nested_clients):
    _, result = fedgen_run
    X = np.vstack(list(nested_clients.values()))
    assert result.state.params.n_components == 3
    federated = float(score_samples(result.state.params, torch.as_tensor(X)).mean())
    centralized = GaussianMixture(3, random_state=0).fit(X).score(X)
    assert abs(federated - centralized) < 0.1, (federated, centralized)


def test_global_k_by_bic(nested_clients):
    clients = {cid: torch.as_tensor(rows) for cid, rows in nested_clients.items()}
    algorithm = FedGenGMM(k_range=(1, 4), samples_per_component=60, random_state=0)
    state = run_simulation(algorithm, clients).state
    assert sorted(state.bics) == [1, 2, 3, 4]
    assert state.params.n_components == min(state.bics, key=state.bics.get) == 3


def test_small_clients_are_skipped_and_listed(nested_clients):
    """The algorithm records skipped clients; the detector warns with the user's ids."""
    rng = np.random.default_rng(1)
    clients = {cid: torch.as_tensor(rows) for cid, rows in nested_clients.items()}
    clients[7] = torch.as_tensor(blob(rng, 2, 3))  # 3 rows < min_client_samples=5
    algorithm = FedGenGMM(
        n_components=3, client_components=2, min_client_samples=5, samples_per_component=30
    )
    assert algorithm.rows_needed() == 5
    state = run_simulation(algorithm, clients).state
    assert state.skipped == [7]
    assert sorted(state.client_models) == [0, 1, 2]
    assert 7 not in state.client_sizes


def test_all_clients_too_small_raises():
    """Every client skips: no round has statistics, each is asked again, and the error
    names why the clients skipped."""
    rng = np.random.default_rng(2)
    clients = [torch.as_tensor(blob(rng, 0, 1)), torch.as_tensor(blob(rng, 1, 1))]
    algorithm = FedGenGMM(n_components=1, client_components=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(FederationError, match=r"skipped: client 0: .*fewer rows than"):
            run_simulation(algorithm, clients, privacy=PrivacyPolicy(min_rows=1))


def test_local_gmms_keeps_one_model_per_client(nested_clients):
    clients = {cid: torch.as_tensor(rows) for cid, rows in nested_clients.items()}
    result = run_simulation(LocalGMMs(k_range=(1, 4), random_state=0), clients)
    state = result.state
    assert len(result.history) == 1
    assert state.params is None
    assert sorted(state.client_models) == [0, 1, 2]
    assert {c: m.n_components for c, m in state.client_models.items()} == {0: 1, 1: 2, 2: 3}
    assert result.history[0].metrics["n_models"] == 3
    # Each local model fits its own client's rows better than the other clients' models.
    own = float(score_samples(state.client_models[0], clients[0]).mean())
    other = float(score_samples(state.client_models[2], clients[0]).mean())
    assert own > other


def test_message_nbytes_counts_tensors_and_scalars():
    message = Message(
        "em",
        tensors={
            "a": torch.zeros(3, dtype=torch.float64),  # 24 bytes
            "b": torch.zeros(2, 2, dtype=torch.float32),  # 16 bytes
            "c": torch.zeros(5, dtype=torch.int8),  # 5 bytes
        },
        scalars={"n": 3, "x": 0.5, "flag": True, "name": "héllo"},  # 8 + 8 + 8 + 6 (UTF-8)
    )
    assert message.nbytes() == 24 + 16 + 5 + 8 + 8 + 8 + 6
    assert Message("empty").nbytes() == 0


def test_copula_is_fitted_on_the_same_round_and_leaves_the_mixture_alone(
    fedgen_run, nested_clients
):
    _, plain = fedgen_run
    algorithm = FedGenGMM(
        n_components=3, k_range=(1, 4), samples_per_component=80, random_state=0, copula=True
    )
    clients = {cid: torch.as_tensor(rows) for cid, rows in nested_clients.items()}
    result = run_simulation(algorithm, clients)
    assert len(result.history) == 1 and result.state.rounds == 1
    assert result.history[0].bytes_up == plain.history[0].bytes_up  # no extra communication
    for name, tensor in result.state.params.tensors().items():
        torch.testing.assert_close(tensor, plain.state.params.tensors()[name], rtol=0, atol=0)
    assert plain.state.marginals == [] and plain.state.copula is None
    assert [m.n_features for m in result.state.marginals] == [1, 1]
    assert result.state.copula.n_components == 3
    # a density of x that fits fresh rows of the blobs far better than one Gaussian, if
    # not as well as the mixture (the right model for Gaussian blobs)
    rng = np.random.default_rng(5)
    fresh = np.vstack([blob(rng, i, 200) for i in range(3)])
    mixture = float(score_samples(result.state.params, torch.as_tensor(fresh)).mean())
    copula = float(
        copula_score_samples(
            result.state.marginals, result.state.copula, torch.as_tensor(fresh)
        ).mean()
    )
    pooled = np.vstack(list(nested_clients.values()))
    one_gaussian = GaussianMixture(1).fit(pooled).score(fresh)
    assert one_gaussian + 0.5 < copula < mixture + 0.05
    assert copula > mixture - 0.5
