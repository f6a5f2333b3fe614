"""Lloyd rounds from public centres (fednovelty.federated.init.assign): an empty centre is
moved beside the centre with most rows and splits them in the next round."""

import math

import pytest
import torch

from fednovelty.federated.init.assign import relocate_empty, split_axis
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture import stats_from_resp
from fednovelty.runtime import run_simulation

F64 = torch.float64


def two_populations(n: int, seed: int) -> torch.Tensor:
    """Rows (n, 2): half around (-4, 0), half around (4, 0), unit variance."""
    g = torch.Generator().manual_seed(seed)
    side = torch.arange(n) % 2
    centres = torch.tensor([[-4.0, 0.0], [4.0, 0.0]], dtype=F64)
    return centres[side] + torch.randn(n, 2, generator=g, dtype=F64)


def all_in_first(X: torch.Tensor, covariance_type: str, k: int = 2):
    """Statistics of every row of ``X`` in centre 0 of ``k`` (the others empty)."""
    resp = torch.zeros(X.shape[0], k, dtype=F64)
    resp[:, 0] = 1.0
    return stats_from_resp(X, resp, covariance_type, X.mean(0))


@pytest.mark.parametrize("covariance_type", ["full", "diag", "tied"])
def test_the_empty_centre_goes_beside_the_full_one_along_its_widest_feature(covariance_type):
    X = two_populations(400, 0)  # feature 0 holds the spread (variance ~17), feature 1 ~1
    stats = all_in_first(X, covariance_type)
    assert split_axis(stats, 0, torch.Generator().manual_seed(0)).tolist() == [1.0, 0.0]
    centres = torch.tensor([[0.1, 0.2], [0.9, 0.9]], dtype=F64)
    moved, n = relocate_empty(centres, stats, torch.Generator().manual_seed(0), step=0.01)
    assert n == 1
    assert moved.flatten().tolist() == pytest.approx([0.09, 0.2, 0.11, 0.2], rel=1e-12)
    assert centres.tolist() == [[0.1, 0.2], [0.9, 0.9]]  # the input is not changed


def test_spherical_statistics_split_along_a_drawn_direction():
    stats = all_in_first(two_populations(400, 0), "spherical")
    axis = split_axis(stats, 0, torch.Generator().manual_seed(3))
    assert math.isclose(float(axis.norm()), 1.0, rel_tol=1e-12)
    again = split_axis(stats, 0, torch.Generator().manual_seed(3))
    torch.testing.assert_close(axis, again, rtol=1e-12, atol=0)  # the generator decides


def test_several_empty_centres_split_the_fullest_in_turn_and_none_or_all_empty_move_nothing():
    X = two_populations(400, 0)
    stats = all_in_first(X, "full", k=3)
    centres = torch.tensor([[0.0, 0.0], [5.0, 5.0], [-5.0, 5.0]], dtype=F64)
    moved, n = relocate_empty(centres, stats, torch.Generator().manual_seed(0), step=0.01)
    assert n == 2
    assert moved[:, 1].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)  # on the rows' axis
    assert len({round(v, 12) for v in moved[:, 0].tolist()}) == 3  # three distinct centres
    full = stats_from_resp(X, torch.ones(400, 1, dtype=F64), "full", X.mean(0))
    one = torch.zeros(1, 2, dtype=F64)
    assert relocate_empty(one, full, torch.Generator())[1] == 0
    none = all_in_first(X[:0], "full")
    assert relocate_empty(centres[:2], none, torch.Generator())[1] == 0


def test_a_private_fit_from_the_public_centres_finds_both_populations():
    """The public start's first centre is the box centre, half-way between the populations,
    and its second a corner no row is nearest to: its count after the first Lloyd round is
    the noise floor, so it moves beside the full one, the second round splits the rows, and
    both Gaussians end on a population."""
    clients = [two_populations(400, s) for s in range(3)]
    z, clip = 1.0, math.sqrt(2)
    algorithm = FederatedEM(
        2,
        bounds=([-8.0, -8.0], [8.0, 8.0]),
        dp_mode="local",
        dp_noise_multiplier=z,
        dp_clip=clip,
        kmeans_rounds=3,
        max_iter=2,
        random_state=0,
    )
    policy = PrivacyPolicy(dp=DPPolicy(z, clip, "local", n_clients=3, insecure_seed=0))
    result = run_simulation(algorithm, clients, privacy=policy)
    assign = [h for h in result.history if h.kind == "assign"]
    assert assign[0].metrics["relocated_centres"] == 1
    assert all("relocated_centres" not in h.metrics for h in assign[1:])
    means = sorted(result.state.params.means[:, 0].tolist())
    assert means == pytest.approx([-4.0, 4.0], abs=0.4)
    assert result.state.params.weights.tolist() == pytest.approx([0.5, 0.5], abs=0.05)
