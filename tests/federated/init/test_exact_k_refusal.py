"""Where K is exact (an algorithm without ``FEWER_CENTROIDS_OK``; every algorithm of the
package takes K as an upper bound, so here federated mixtures of factor analysers with the
flag off), a k-FED start the clients' centroids cannot seed is refused with the numbers: the
K asked, the centroids sent, the rows, and the K that would fit; with the flag on (the
package's setting) the same clients fit fewer components."""

from typing import ClassVar

import numpy as np
import pytest
import torch

from fednovelty.federated.core.config import settings_dataclass
from fednovelty.federated.init.centroids import too_few_centroids
from fednovelty.federated.mixtures.factor_em import FactorEMConfig, FederatedFactorEM
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation


@settings_dataclass
class ExactKConfig(FactorEMConfig):
    FEWER_CENTROIDS_OK: ClassVar[bool] = False


def _small_clients() -> list[torch.Tensor]:
    """Ten clients of 8 rows: under a floor of 5 each sends one centroid (8 // 5 = 1)."""
    rng = np.random.default_rng(0)
    return [torch.as_tensor(rng.normal(size=(8, 3))) for _ in range(10)]


def test_an_exact_k_above_the_centroids_is_refused_with_the_numbers():
    clients = _small_clients()
    algorithm = FederatedFactorEM(20, 1, random_state=0)
    algorithm._setup(ExactKConfig(**vars(algorithm.config)))
    assert not algorithm.config.FEWER_CENTROIDS_OK
    with pytest.raises(ValueError) as caught:
        run_simulation(algorithm, clients, privacy=PrivacyPolicy(min_rows=5))
    message = str(caught.value)
    assert "n_components=20 needs 20 k-means centroids" in message
    assert "they sent 10 from the 80 row(s) they reported" in message
    assert "Pass n_components=10 or fewer" in message
    assert "Privacy(min_rows=...)" in message


def test_with_k_an_upper_bound_the_same_clients_fit_fewer_components():
    """10 centroids for K = 20: half as many centres, (10 + 1) // 2 = 5 at most (the Lloyd
    rounds merge centres no client's floor backs)."""
    algorithm = FederatedFactorEM(20, 1, random_state=0)
    assert algorithm.config.FEWER_CENTROIDS_OK
    state = run_simulation(algorithm, _small_clients(), privacy=PrivacyPolicy(min_rows=5)).state
    assert 1 <= state.factors.n_components <= 5


def test_no_centroid_at_all_names_no_k():
    message = too_few_centroids(4, 0, 0)
    assert "they sent 0 from the 0 row(s)" in message and "n_components=0" not in message
