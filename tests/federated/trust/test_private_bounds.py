"""Private feature bounds: the round's histograms, their noise and cost, the quantiles read
from them, and a private fit without ``dp_bounds`` end to end."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fednovelty import FedGMMDetector
from fednovelty.detectors._dp import BOUNDS_ROUNDS, MAX_BOUNDS_VALUES, PENDING_BOUNDS, bounds_copies
from fednovelty.detectors.options import Initialisation, Privacy
from fednovelty.evaluation import auroc
from fednovelty.federated import FederatedEM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise, epsilon_spent
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, release_blocks
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.private_bounds import (
    BOUNDS_KIND,
    PrivateBounds,
    bin_ends,
    feature_histogram,
    histogram_noise,
    linear_grid,
    log_ends,
    log_grid,
    quantile_bounds,
)
from fednovelty.runtime import run_simulation

QUANTILE = 0.01


def policy(
    z: float, mode: str, n_clients: int = 10, epsilon: float = 1.0, seed: int | None = None
) -> PrivacyPolicy:
    dp = DPPolicy(z, 1.0, mode, n_clients, epsilon=epsilon, delta=1e-5, insecure_seed=seed)
    return PrivacyPolicy(dp=dp)


def bin_of(values: np.ndarray, edges: torch.Tensor) -> np.ndarray:
    return np.searchsorted(edges.numpy(), values, side="right")


def test_the_grid_is_public_symmetric_and_logarithmic() -> None:
    edges = log_grid(1e6, 12, 4)
    assert edges.shape == (2 * (12 * 4 + 1) + 1,)
    assert float(edges[-1]) == 1e6 and float(edges[0]) == -1e6
    assert torch.equal(edges, -edges.flip(0)) and float(edges[edges.shape[0] // 2]) == 0.0
    positive = edges[edges > 0]
    assert torch.allclose(positive[1:] / positive[:-1], torch.tensor(10**0.25, dtype=torch.float64))
    grid = edges.unsqueeze(0)
    low, high = bin_ends(grid, *log_ends(grid, 4))
    assert low.shape == high.shape == (1, edges.shape[0] + 1) and bool((low < high).all())
    assert float(high[0, -1]) == pytest.approx(1e6 * 10**0.25)
    with pytest.raises(ValueError, match="max_abs"):
        log_grid(-1.0)


def test_the_histogram_counts_each_row_once_per_feature() -> None:
    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(0, 3, 500), rng.exponential(2, 500)]
    edges = log_grid()
    counts = feature_histogram(torch.tensor(X), edges)
    assert counts.shape == (2, edges.shape[0] + 1)
    for j in range(2):
        expected = np.bincount(bin_of(X[:, j], edges), minlength=edges.shape[0] + 1)
        np.testing.assert_array_equal(counts[j].numpy(), expected)


def test_quantiles_without_noise_are_the_bins_of_the_true_quantiles() -> None:
    rng = np.random.default_rng(1)
    X = np.c_[rng.normal(50, 5, 20_000), rng.uniform(-300, 20, 20_000)]
    edges = log_grid()
    counts = feature_histogram(torch.tensor(X), edges)
    grid = edges.expand(2, -1)
    ends = bin_ends(grid, *log_ends(grid, 4))
    low, high, kept = quantile_bounds(counts, 0.0, ends, QUANTILE)
    true_low, true_high = np.quantile(X, [QUANTILE, 1 - QUANTILE], axis=0)
    np.testing.assert_array_equal(low.numpy(), ends[0][0, bin_of(true_low, edges)].numpy())
    np.testing.assert_array_equal(high.numpy(), ends[1][0, bin_of(true_high, edges)].numpy())
    assert torch.equal(kept, torch.ones(2, dtype=torch.float64))


def test_a_linear_grid_refines_the_first_bounds_per_feature() -> None:
    X = torch.tensor([[0.0, 10.0], [1.0, 20.0], [0.5, 14.9]], dtype=torch.float64)
    edges, below, above = linear_grid(torch.tensor([0.0, 10.0]), torch.tensor([1.0, 20.0]), 4)
    assert torch.allclose(
        edges[1], torch.tensor([10.0, 12.5, 15.0, 17.5, 20.0], dtype=torch.float64)
    )
    assert torch.allclose(below, torch.tensor([-0.25, 7.5], dtype=torch.float64))
    assert torch.allclose(above, torch.tensor([1.25, 22.5], dtype=torch.float64))
    counts = feature_histogram(X, edges)
    assert counts.tolist() == [[0, 1, 0, 1, 0, 1], [0, 1, 1, 0, 0, 1]]


@pytest.mark.parametrize("mode", ["central", "local"])
def test_estimated_bounds_cover_the_true_quantiles_within_the_grids_resolution(mode) -> None:
    rng = np.random.default_rng(2)
    n = 200_000
    X = np.c_[rng.normal(50, 5, n), rng.exponential(0.01, n), rng.uniform(-300, 20, n)]
    clients = [torch.tensor(part) for part in np.array_split(X, 10)]
    blocks = release_blocks(14)  # a fit of 14 releases beside the bounds round
    copies = bounds_copies(blocks, X.shape[1])
    z = calibrate_noise(1.0, 1e-5, 1, blocks + copies / HISTOGRAM_SHARE**2)
    algorithm = PrivateBounds(
        dp_mode=mode, dp_noise_multiplier=z, copies=copies, dp_insecure_seed=2
    )  # seeded noise: a reproducible test (no guarantee)
    privacy = policy(z, mode, seed=2)
    result = run_simulation(algorithm, clients, privacy=privacy, progress=False)
    assert [r.kind for r in result.history] == [BOUNDS_KIND, BOUNDS_KIND]
    low, high = (t.numpy() for t in result.state.bounds)
    true_low, true_high = np.quantile(X, [QUANTILE, 1 - QUANTILE], axis=0)
    edges = log_grid()
    # the first round's box is the log bins of the true quantiles (within one bin); the
    # second round's linear bins (a 32nd of that box) put the bounds within three of them
    # (the noise threshold cuts a thin tail's last bins)
    ends = bin_ends(edges.expand(3, -1), *log_ends(edges.expand(3, -1), 4))
    first = ends[1][0, bin_of(true_high, edges)] - ends[0][0, bin_of(true_low, edges)]
    resolution = 3 * first.numpy() / 32
    assert np.all(np.abs(low - true_low) <= resolution)
    assert np.all(np.abs(high - true_high) <= resolution)


@pytest.mark.parametrize("mode", ["central", "local"])
def test_the_summed_histogram_carries_the_calibrated_noise(mode) -> None:
    d, m, z, copies = 20, 4, 3.0, 9
    clients = [torch.full((50, d), 0.5, dtype=torch.float64) for _ in range(m)]
    algorithm = PrivateBounds(dp_mode=mode, dp_noise_multiplier=z, copies=copies, refine_bins=0)
    result = run_simulation(algorithm, clients, privacy=policy(z, mode, m), progress=False)
    assert len(result.history) == 1
    state = result.state
    occupied = bin_of(np.array([0.5]), log_grid())[0]
    empty = torch.cat([state.counts[:, :occupied], state.counts[:, occupied + 1 :]], 1)
    spread = math.sqrt(m) if mode == "local" else 1.0
    calibrated = HISTOGRAM_SHARE * z * math.sqrt(d / copies) * spread
    assert state.noise == pytest.approx(calibrated)
    assert float(empty.std()) / calibrated == pytest.approx(1.0, abs=0.08)
    assert float(state.counts[:, occupied].mean()) == pytest.approx(m * 50, abs=4 * calibrated)


def test_the_gate_noises_each_copy_and_charges_each_as_a_histogram() -> None:
    d, z, copies = 10, 2.0, 5
    X = torch.full((40, d), 3.0, dtype=torch.float64)
    algorithm = PrivateBounds(dp_mode="local", dp_noise_multiplier=z, copies=copies)
    context = gate.client_context(0, policy=policy(z, "local", 1, epsilon=50.0))
    reply = gate.answer(algorithm, X, algorithm.configure(algorithm.start()), context)
    assert sorted(reply.tensors) == sorted(f"histogram.{j}" for j in range(copies))
    exact = feature_histogram(X, log_grid()) / math.sqrt(d)
    noise = torch.stack([reply.tensors[f"histogram.{j}"] - exact for j in range(copies)])
    assert float(noise.std()) / (HISTOGRAM_SHARE * z) == pytest.approx(1.0, abs=0.05)
    assert not torch.equal(noise[0], noise[1])  # independent draws per copy
    assert context.terms.ledger.gaussian == pytest.approx(copies / HISTOGRAM_SHARE**2 / z**2)
    assert context.terms.ledger.releases == 1


def test_a_client_without_a_private_policy_releases_no_histogram() -> None:
    algorithm = PrivateBounds(dp_mode="central", dp_noise_multiplier=1.0, copies=1)
    X = torch.zeros(30, 2, dtype=torch.float64)
    reply = gate.answer(
        algorithm, X, algorithm.configure(algorithm.start()), gate.client_context(0)
    )
    assert reply.scalars.get("skipped") and not reply.tensors
    assert histogram_noise(1.0, 4, "local", 9) == pytest.approx(HISTOGRAM_SHARE * 1.5)


def test_the_plan_buys_a_share_of_the_budget_within_the_reply_size() -> None:
    assert BOUNDS_ROUNDS == 2
    assert bounds_copies(30.0, 5) == round(HISTOGRAM_SHARE**2 * 0.1 / 0.9 * 30.0 / 2)
    bins = log_grid().shape[0] + 1
    assert bounds_copies(1e6, 166) * 166 * bins <= MAX_BOUNDS_VALUES
    assert bounds_copies(0.0, 3) == 1
    with pytest.raises(ValueError, match="bounds"):
        FederatedEM(n_components=2, dp_mode="central", bounds=PENDING_BOUNDS)


def two_clusters(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Training rows of two clusters in units far from [-1, 1] (no public box), their client
    ids, and test rows with their labels (1: novel, far from both clusters)."""
    rng = np.random.default_rng(seed)
    scale, shift = np.array([1.0, 100.0]), np.array([0.0, 2000.0])
    X = np.vstack([rng.normal(0, 1, (6000, 2)), rng.normal(5, 1, (6000, 2))]) * scale + shift
    inliers = np.vstack([rng.normal(0, 1, (200, 2)), rng.normal(5, 1, (200, 2))])
    novel = rng.normal(2.5, 0.3, (100, 2)) + rng.choice([-8.0, 8.0], (100, 1))
    test = np.vstack([inliers, novel]) * scale + shift
    labels = np.r_[np.zeros(400), np.ones(100)]
    return X, rng.integers(0, 4, len(X)), test, labels


@pytest.mark.parametrize("mode", ["central", "local"])
def test_a_private_fit_without_bounds_works_end_to_end(mode) -> None:
    X, groups, test, labels = two_clusters()
    det = FedGMMDetector(
        2,
        mixture_weights="global",
        max_iter=5,
        random_state=0,
        initialisation=Initialisation(kmeans_rounds=2),
        privacy=Privacy(epsilon=1.0, mode=mode),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        det.fit(X, groups=groups)
    spent = det.privacy_spent_
    assert [r["kind"] for r in det.history_[:3]] == [BOUNDS_KIND, BOUNDS_KIND, "moments"]
    assert [r["round"] for r in det.history_] == list(range(1, det.n_rounds_ + 1))
    assert spent["bounds"] == "private" and spent["bounds_histograms"] >= 1
    assert spent["releases"] == spent["planned_releases"]  # no planned release refused
    assert spent["epsilon"] <= 1.0 + 1e-9
    rounds = spent["epsilon"] - spent.get("threshold_epsilon", 0.0)
    blocks = release_blocks(spent["releases"], spent["bounds_histograms"])
    z = spent["noise_multiplier"]
    assert rounds == pytest.approx(epsilon_spent(z, 1, 1e-5, blocks), rel=1e-6)
    without = epsilon_spent(z, 1, 1e-5, release_blocks(spent["releases"]))
    assert rounds > without  # the bounds round's cost is counted
    low, high = np.array(spent["bounds_low"]), np.array(spent["bounds_high"])
    assert np.all(low < np.quantile(X, 0.05, axis=0)) and np.all(high > np.quantile(X, 0.95, 0))
    assert auroc(labels, det.decision_function(test)) > 0.95
