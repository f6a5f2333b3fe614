"""FederatedPCA against scikit-learn's PCA on the pooled rows."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from sklearn.decomposition import PCA

from fednovelty.federated import PrivacyPolicy
from fednovelty.federated.core.base import Message, skipped_reply
from fednovelty.federated.mixtures.pca import FederatedPCA, PCAProjection, PCAState
from fednovelty.federated.trust import gate
from fednovelty.runtime import run_simulation

N_FEATURES = 6
SIZES = (3, 0, 41, 17, 139)  # uneven, with an empty client
#: the no-floor configuration: the 3-row client takes part, so the result is that of all
#: pooled rows (the default floor of 5 rows would leave it out).
NO_FLOOR = PrivacyPolicy(min_rows=1)
#: bytes of the empty client's skipped reply in each round.
SKIPPED_BYTES = skipped_reply(
    "moments_mean", gate.client_context(0, policy=NO_FLOOR).terms.below_floor
).nbytes()


@pytest.fixture(scope="module")
def pooled() -> np.ndarray:
    """Anisotropic rows far from the origin (a large mean stresses the centring)."""
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(N_FEATURES, N_FEATURES)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1])
    return rng.normal(size=(sum(SIZES), N_FEATURES)) @ mixing.T + 100.0


def split(rows: np.ndarray, sizes=SIZES, dtype=torch.float64) -> list[torch.Tensor]:
    bounds = np.cumsum((0, *sizes))
    return [torch.as_tensor(rows[a:b], dtype=dtype) for a, b in itertools.pairwise(bounds)]


@pytest.fixture(scope="module")
def fitted(pooled):
    result = run_simulation(FederatedPCA(4), split(pooled), privacy=NO_FLOOR)
    return result, PCA(n_components=4).fit(pooled)


def test_matches_sklearn(fitted, pooled):
    result, reference = fitted
    projection = result.state.projection
    assert result.state.round == 2 and len(result.history) == 2
    assert projection.n_samples == len(pooled)
    np.testing.assert_allclose(projection.mean.numpy(), reference.mean_, rtol=1e-12)
    np.testing.assert_allclose(
        projection.explained_variance.numpy(), reference.explained_variance_, rtol=1e-10
    )
    dots = np.abs(np.sum(projection.components.numpy() * reference.components_, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-10)
    assert projection.noise_variance == pytest.approx(reference.noise_variance_, rel=1e-10)
    ours = projection.transform(torch.as_tensor(pooled)).numpy()
    theirs = reference.transform(pooled)
    signs = np.sign(np.sum(ours * theirs, axis=0))
    np.testing.assert_allclose(ours * signs, theirs, atol=1e-8)


def test_sign_convention_is_deterministic(fitted, pooled):
    components = fitted[0].state.projection.components
    rows = torch.arange(components.shape[0])
    assert bool((components[rows, components.abs().argmax(dim=1)] > 0).all())
    other = run_simulation(FederatedPCA(4), split(pooled[::-1].copy(), sizes=(100, 100)))
    np.testing.assert_allclose(
        other.state.projection.components.numpy(), components.numpy(), rtol=0, atol=1e-10
    )


#: bytes of the wire description of a reply whose scatter travels as its upper triangle
#: (the compact JSON ``fednovelty.federated.core.wire.pack`` writes).
SYMMETRIC_SCATTER = len(json.dumps({"symmetric": ["scatter"]}, separators=(",", ":")))


def test_bytes_on_the_wire(fitted):
    result = fitted[0]
    n_clients, d, itemsize = len(SIZES), N_FEATURES, 8
    n_data = n_clients - 1  # the empty client replies "skipped" (no statistics)
    triangle = d * (d + 1) // 2  # the symmetric scatter travels as its upper triangle
    scatter = (triangle + 1) * itemsize + SYMMETRIC_SCATTER
    assert [r.kind for r in result.history] == ["moments_mean", "moments_scatter"]
    assert result.history[0].bytes_up == n_data * (d + 1) * itemsize + SKIPPED_BYTES
    assert result.history[1].bytes_up == n_data * scatter + SKIPPED_BYTES
    assert result.bytes_up == n_data * ((d + 1) * itemsize + scatter) + 2 * SKIPPED_BYTES
    assert result.bytes_down == n_clients * d * itemsize  # round 1 broadcasts nothing


def test_float32(pooled):
    reference = PCA(n_components=3).fit(pooled)
    clients = split(pooled, dtype=torch.float32)
    result = run_simulation(FederatedPCA(3), clients, privacy=NO_FLOOR)
    n_data = len(SIZES) - 1  # the empty client replies "skipped"
    triangle = N_FEATURES * (N_FEATURES + 1) // 2  # the scatter's upper triangle
    statistics = n_data * ((N_FEATURES + 1 + triangle + 1) * 4 + SYMMETRIC_SCATTER)
    assert result.bytes_up == statistics + 2 * SKIPPED_BYTES
    projection = result.state.projection
    assert projection.components.dtype == torch.float64  # the server aggregates in float64
    np.testing.assert_allclose(
        projection.explained_variance.numpy(), reference.explained_variance_, rtol=1e-4
    )
    server32 = run_simulation(
        FederatedPCA(3, dtype=torch.float32), clients, privacy=NO_FLOOR
    ).state.projection
    assert server32.components.dtype == torch.float32
    assert server32.transform(clients[2]).dtype == torch.float32
    dots = np.abs(np.sum(server32.components.numpy() * reference.components_, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-4)


def test_tensors_round_trip(fitted, pooled):
    projection = fitted[0].state.projection
    again = PCAProjection.from_tensors(projection.tensors())
    assert again.n_samples == projection.n_samples and again.n_components == 4
    X = torch.as_tensor(pooled[:5])
    assert torch.equal(again.transform(X), projection.transform(X))
    with pytest.raises(ValueError, match="missing"):
        PCAProjection.from_tensors({"mean": projection.mean})
    with pytest.raises(ValueError, match="n_features"):
        projection.transform(torch.zeros(2, N_FEATURES + 1, dtype=torch.float64))


def test_bad_arguments(pooled):
    with pytest.raises(ValueError, match="n_components"):
        FederatedPCA(0)
    with pytest.raises(ValueError, match=r"n_components=7.*n_features"):
        run_simulation(FederatedPCA(N_FEATURES + 1), split(pooled))
    with pytest.raises(ValueError, match="at least 2 rows"):
        run_simulation(FederatedPCA(1), split(pooled, sizes=(1, 0)), privacy=NO_FLOOR)


def test_bad_replies():
    algorithm = FederatedPCA(1)
    n = torch.tensor(3.0, dtype=torch.float64)
    good = Message("moments_mean", {"n": n, "sum": torch.ones(2, dtype=torch.float64)})
    cases = {
        "NaN": Message("moments_mean", {"n": n, "sum": torch.tensor([1.0, float("nan")])}),
        "shape": Message("moments_mean", {"n": n, "sum": torch.ones(2, 2)}),
        "lacks": Message("moments_mean", {"n": n}),
        "non-negative integer": Message("moments_mean", {"n": torch.tensor(2.5), "sum": n[None]}),
        "expected a 'moments_mean'": Message("moments_scatter", good.tensors),
        "different n_features": Message("moments_mean", {"n": n, "sum": torch.ones(3)}),
    }
    for match, bad in cases.items():
        with pytest.raises(ValueError, match=match):
            algorithm.server_step(PCAState(), {0: good, 1: bad})
    state, _ = algorithm.server_step(PCAState(), {0: good, 1: good})
    scatter = Message("moments_scatter", {"n": n, "scatter": torch.eye(2, dtype=torch.float64)})
    with pytest.raises(ValueError, match="same clients"):
        algorithm.server_step(state, {0: scatter})
    with pytest.raises(ValueError, match="kind"):
        algorithm.client_step(torch.ones(2, 2), Message("em"), gate.client_context(0))
