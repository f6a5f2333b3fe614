"""The k-FED start (fednovelty.federated.init.centroids) where small clients cannot seed K:
federated EM's K is an upper bound, as variational Bayes' is."""

import numpy as np
import torch

from fednovelty.federated.init.centroids import CentroidsStep  # noqa: F401 - the step tested
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation


def clustered_clients(n_clients: int = 10, rows: int = 8) -> list[torch.Tensor]:
    """``n_clients`` clients of ``rows`` rows, each from one of three 3-D clusters."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0, 0.0], [6.0, 1.0, 0.0], [-3.0, 6.0, 1.0]])
    return [torch.as_tensor(centers[c % 3] + rng.normal(size=(rows, 3))) for c in range(n_clients)]


def test_federated_em_fits_the_centres_small_clients_can_seed():
    """Ten clients of 8 rows under a floor of 5 send one centroid each (8 // 5): K = 20
    cannot be seeded, so federated EM fits (10 + 1) // 2 = 5 components instead of refusing,
    and every row is still scored by a finite, normalised mixture."""
    clients = clustered_clients()
    result = run_simulation(
        FederatedEM(20, random_state=0), clients, privacy=PrivacyPolicy(min_rows=5)
    )
    centroids = next(h for h in result.history if h.kind == "centroids")
    assert centroids.metrics["n_centroids"] == 10
    params = result.state.params
    assert params.n_components == 5
    assert abs(float(params.weights.sum()) - 1.0) < 1e-12
    assert torch.isfinite(params.means).all()


def test_federated_em_keeps_k_when_the_clients_can_seed_it():
    """The upper bound binds only where it must: clients of 40 rows seed K = 6."""
    clients = clustered_clients(rows=40)
    result = run_simulation(
        FederatedEM(6, random_state=0), clients, privacy=PrivacyPolicy(min_rows=5)
    )
    assert result.state.params.n_components == 6


def test_a_lloyd_round_every_client_skipped_merges_the_centres_and_goes_on():
    """Ten clients of 6 rows (one centroid each under a floor of 5): after k-FED seeds 5
    centres, a client's rows split over them back none, so every client skips the Lloyd
    round; the server merges the centres into fewer (AssignStep.all_skipped) and asks
    again, and the loop does not count the round as failed."""
    rng = np.random.default_rng(0)
    clients = [torch.as_tensor(rng.normal(size=(6, 3))) for _ in range(10)]
    result = run_simulation(
        FederatedEM(10, random_state=0), clients, privacy=PrivacyPolicy(min_rows=5)
    )
    replanned = [h for h in result.history if h.metrics.get("replanned")]
    assert replanned and all(h.kind == "assign" and h.failed for h in replanned)
    assert all(len(h.skipped) == len(h.replied) == 10 for h in replanned)
    assert 1 <= result.state.params.n_components < 5


def test_all_skipped_never_merges_given_centres():
    """The separated start's (or given means') centres are the user's: an assign round
    every client skipped fails as before, named by the loop."""
    from fednovelty.exceptions import FederationError

    rng = np.random.default_rng(0)
    clients = [torch.as_tensor(rng.normal(size=(6, 3))) for _ in range(10)]
    algorithm = FederatedEM(10, init_params="separated", random_state=0)
    try:
        run_simulation(algorithm, clients, privacy=PrivacyPolicy(min_rows=5))
    except (FederationError, ValueError) as error:
        assert "n_components=10" in str(error) or "valid replies" in str(error)
    else:
        raise AssertionError("the separated start merged its centres")
