"""The one-round federated calibration (``federated.calibration.quantile``) through the
runtime: the summed counts against NumPy's histogram of the pooled scores; the privacy floor;
lying clients dropped by name or capped; differential privacy's noise (its spread against a
chi-square interval) and its charge against the ledger's cost computed here by hand."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from _liars import Forging
from scipy.stats import chi2

from fednovelty.exceptions import FederationError
from fednovelty.federated.calibration.quantile import (
    CALIBRATION_KIND,
    CalibrationConfig,
    FederatedCalibration,
)
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.conformal import calibration_edges, histogram_threshold
from fednovelty.federated.registry import algorithm_settings, build_algorithm
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime import run_simulation

EDGES = calibration_edges(0.5)
SIZES = (60, 80, 100, 120)
LIAR = 3


def scores(sizes=SIZES, seed: int = 0) -> list[np.ndarray]:
    """Each client's scores: log-normal, some below the grid, and client 0 with two above."""
    rng = np.random.default_rng(seed)
    out = [rng.lognormal(0.3 * c, 1.0, n) for c, n in enumerate(sizes)]
    out[0][:2] = [3e6, 5e6]
    return out


def as_clients(parts: list[np.ndarray]) -> list[torch.Tensor]:
    return [torch.as_tensor(s).reshape(-1, 1) for s in parts]


def numpy_histogram(pooled: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """(B + 2,): at or below edges[0], NumPy's histogram over the edges, above edges[-1]
    (scores drawn from a continuous law: none sits on an edge, where the conventions
    differ)."""
    inner, _ = np.histogram(pooled, bins=edges)
    return np.concatenate([[(pooled <= edges[0]).sum()], inner, [(pooled > edges[-1]).sum()]])


def test_the_summed_counts_are_numpys_histogram_of_the_pooled_scores() -> None:
    parts = scores()
    state = run_simulation(FederatedCalibration(edges=EDGES), as_clients(parts)).state
    pooled = np.concatenate(parts)
    expected = numpy_histogram(pooled, EDGES)
    assert expected[0] > 0 and expected[-1] == 2  # both outer bins in use
    np.testing.assert_array_equal(state.counts.numpy(), expected)
    assert state.n_rows == len(pooled) and state.n_clients == len(SIZES)
    assert state.noise == 0.0 and state.phase == "done"
    np.testing.assert_array_equal(state.edges.numpy(), EDGES)
    # the state's torch tensors feed the conformal functions as they are
    hand = histogram_threshold(numpy_histogram(pooled, EDGES), EDGES, 0.05)
    assert histogram_threshold(state.counts, state.edges, 0.05) == hand


def test_the_settings_travel_as_json_and_the_broadcast_carries_nothing() -> None:
    algorithm = FederatedCalibration(edges=EDGES, random_state=3)
    rebuilt = build_algorithm("FederatedCalibration", algorithm_settings(algorithm))
    assert rebuilt.config == algorithm.config
    from_tensor = CalibrationConfig(edges=torch.as_tensor(EDGES))
    assert from_tensor == algorithm.config.__class__(edges=EDGES.tolist())
    assert from_tensor.edges.dtype == torch.float64 and from_tensor.n_bins == len(EDGES) + 1
    message = algorithm.configure(algorithm.start())
    assert message.kind == CALIBRATION_KIND and not message.tensors and not message.scalars
    assert message.expect == {"n_bins": len(EDGES) + 1}  # the server's, never sent


@pytest.mark.parametrize(
    ("edges", "match"),
    [
        (None, "edges is required"),
        ([1.0], "at least 2 bin edges"),
        ([0.0, 2.0, 1.0], "strictly increasing"),
        ([0.0, math.inf], "finite"),
    ],
)
def test_bad_edges_are_named(edges, match) -> None:
    with pytest.raises(ValueError, match=match):
        CalibrationConfig(edges=edges)


def test_a_client_below_the_floor_withholds_by_name_and_the_rest_give_the_result() -> None:
    parts = scores((60, 80, 3, 120))
    result = run_simulation(FederatedCalibration(edges=EDGES), as_clients(parts))
    (record,) = result.history
    assert record.skipped == ((2, "fewer rows than the client's privacy floor (min_rows=5)"),)
    kept = np.concatenate([parts[c] for c in (0, 1, 3)])
    np.testing.assert_array_equal(result.state.counts.numpy(), numpy_histogram(kept, EDGES))
    assert result.state.n_clients == 3


def test_a_federation_all_below_the_floor_stops_saying_why() -> None:
    with pytest.raises(FederationError, match=r"privacy floor \(min_rows=5\)"):
        run_simulation(FederatedCalibration(edges=EDGES), as_clients(scores((3, 4))))


def test_wider_rows_are_refused_by_the_client_with_its_reason() -> None:
    algorithm = FederatedCalibration(edges=EDGES)
    wide = torch.ones(10, 2, dtype=torch.float64)
    reply = gate.answer(
        algorithm, wide, algorithm.configure(algorithm.start()), gate.client_context(0)
    )
    assert reply.scalars["skipped"] and "one column of scores" in reply.scalars["reason"]


def _with(reply: Message, **tensors) -> Message:
    return Message(reply.kind, {**reply.tensors, **tensors}, dict(reply.scalars))


def negative(reply, message, number):
    counts = reply.tensors["counts"].clone()
    counts[1] = -1.0
    return _with(reply, counts=counts)


def more_than_its_rows(reply, message, number):
    return _with(reply, counts=reply.tensors["counts"] + 1.0)


def wrong_shape(reply, message, number):
    return _with(reply, counts=reply.tensors["counts"][:-1])


def fractions(reply, message, number):
    t = reply.tensors
    return _with(reply, counts=t["counts"] * 0.37, n_samples=t["n_samples"] * 0.37)


def too_many_rows(reply, message, number):
    return _with(reply, n_samples=torch.tensor(1e300, dtype=torch.float64))


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (negative, "tensor 'counts' has negative values"),
        (more_than_its_rows, "tensor 'counts' adds up to"),
        (wrong_shape, r"tensor 'counts' has shape \(4097,\); expected \(4098,\)"),
        (fractions, "tensor 'counts' holds fractions"),
        (too_many_rows, "'n_samples' claims more than"),
    ],
)
def test_a_lying_client_is_dropped_by_name_and_the_run_goes_on(forge, reason) -> None:
    parts = scores()
    algorithm = Forging(FederatedCalibration(edges=EDGES), LIAR, forge)
    result = run_simulation(algorithm, as_clients(parts))
    (record,) = result.history
    assert [c for c, _ in record.dropped] == [LIAR]
    assert re.search(reason, record.dropped[0][1]), record.dropped
    honest = np.concatenate(parts[:LIAR])
    np.testing.assert_array_equal(result.state.counts.numpy(), numpy_histogram(honest, EDGES))


def test_a_consistent_liar_passes_the_checks_and_the_weight_cap_bounds_it() -> None:
    """A liar claiming 1000 times its rows (counts and row count scaled alike, whole) passes
    the server gate; with client_weight_cap=2 it counts as twice the median client's rows:
    (80 + 100) / 2 * 2 = 180 (the liar's claim is the largest, sizes 60, 80, 100, 120000)."""

    def claim(reply, message, number):
        return _with(reply, **{n: t * 1000 for n, t in reply.tensors.items()})

    parts = scores()
    plain = run_simulation(
        Forging(FederatedCalibration(edges=EDGES), LIAR, claim), as_clients(parts)
    )
    assert plain.history[0].dropped == () and plain.state.n_rows == 60 + 80 + 100 + 120000
    capped = run_simulation(
        Forging(FederatedCalibration(edges=EDGES, client_weight_cap=2.0), LIAR, claim),
        as_clients(parts),
    )
    assert capped.state.n_rows == pytest.approx(60 + 80 + 100 + 180, rel=1e-12)
    liar_share = numpy_histogram(parts[LIAR], EDGES) * 180 / 120
    honest = numpy_histogram(np.concatenate(parts[:LIAR]), EDGES)
    np.testing.assert_allclose(capped.state.counts.numpy(), honest + liar_share, rtol=1e-12)


# ----------------------------------------------------------------------------- privacy
def _dp(mode: str, z: float, seed: int | None = 11) -> PrivacyPolicy:
    return PrivacyPolicy(dp=DPPolicy(z, 1.0, mode, insecure_seed=seed))


def _noise_interval(residual: np.ndarray, std: float) -> bool:
    """Whether ``sum(residual^2) / std^2`` lies in chi-square(len)'s two-sided 1e-6 interval."""
    statistic = float(np.square(residual).sum()) / std**2
    k = residual.size
    return chi2.ppf(0.5e-6, k) <= statistic <= chi2.isf(0.5e-6, k)


@pytest.mark.parametrize(("mode", "z"), [("local", 0.5), ("central", 2.0)])
def test_under_dp_the_counts_are_noised_and_each_client_is_charged(mode, z) -> None:
    parts = scores()
    algorithm = FederatedCalibration(
        edges=EDGES, dp_mode=mode, dp_noise_multiplier=z, dp_insecure_seed=5
    )
    result = run_simulation(algorithm, as_clients(parts), privacy=_dp(mode, z))
    exact = numpy_histogram(np.concatenate(parts), EDGES)
    residual = result.state.counts.numpy() - exact
    # each client's histogram gets HISTOGRAM_SHARE * z = 8 z per count ("local": four such
    # draws in the sum); "central": the server's one draw of 8 z on the sum
    std = 8.0 * z * (math.sqrt(len(SIZES)) if mode == "local" else 1.0)
    assert result.state.noise == pytest.approx(std, rel=1e-12)
    assert _noise_interval(residual, std) and not _noise_interval(residual, 1.1 * std)
    assert result.state.n_rows == pytest.approx(residual.sum() + exact.sum(), rel=1e-12)
    for c in range(len(SIZES)):
        ledger = result.ledgers[c]
        assert ledger.releases == 1
        assert ledger.gaussian == pytest.approx(1.0 / (8.0 * z) ** 2, rel=1e-12)  # mu^2


def test_under_dp_the_row_count_is_withheld_and_an_empty_client_sends_noise() -> None:
    algorithm = FederatedCalibration(edges=EDGES, dp_mode="local", dp_noise_multiplier=1.0)
    message = algorithm.configure(algorithm.start())
    for rows in (
        torch.as_tensor(scores()[1]).reshape(-1, 1),
        torch.zeros(0, 1, dtype=torch.float64),
    ):
        context = gate.client_context(0, policy=_dp("local", 1.0, seed=None))
        reply = gate.answer(algorithm, rows, message, context)
        assert not reply.scalars.get("skipped"), reply.scalars
        assert float(reply.tensors["n_samples"]) == 0.0
        exact = numpy_histogram(rows.numpy().ravel(), EDGES)
        assert _noise_interval(reply.tensors["counts"].numpy() - exact, 8.0)
        assert context.terms.ledger.releases == 1


def test_a_spent_budget_refuses_the_release() -> None:
    algorithm = FederatedCalibration(edges=EDGES, dp_mode="local", dp_noise_multiplier=1.0)
    policy = PrivacyPolicy(dp=DPPolicy(1.0, 1.0, "local", epsilon=1e-3))
    message = algorithm.configure(algorithm.start())
    rows = torch.as_tensor(scores()[1]).reshape(-1, 1)
    reply = gate.answer(algorithm, rows, message, gate.client_context(0, policy=policy))
    assert reply.scalars["skipped"] and "privacy budget is spent" in reply.scalars["reason"]
