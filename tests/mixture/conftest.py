"""Shared fixed-seed data for the mixture-layer tests.

Fixtures return fresh NumPy arrays (float64); tests convert them with
``torch.as_tensor(..., dtype=torch.float64)``. Helper functions that several modules need
are exposed as fixtures so that no test module imports another one (the test folders have
no ``__init__.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")

BLOB_CENTERS = np.array([[-6.0, 0.0, 0.0], [0.0, 6.0, 0.0], [6.0, 0.0, 3.0]])


def _random_spd(rng: np.random.Generator, d: int, low: float = 0.3, high: float = 3.0):
    """Random symmetric positive definite matrix with eigenvalues in [low, high]."""
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    cov = (q * rng.uniform(low, high, size=d)) @ q.T
    return 0.5 * (cov + cov.T)


def _make_blobs(seed: int = 0, n_per: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Three well separated isotropic blobs in 3-D (std 0.7, centres >= 6 apart)."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + 0.7 * rng.normal(size=(n_per, 3)) for c in BLOB_CENTERS])
    labels = np.repeat(np.arange(3), n_per)
    return X, labels


def _make_aniso(seed: int = 1, n_per: int = 200) -> np.ndarray:
    """Three overlapping anisotropic Gaussians in 3-D with different covariances."""
    rng = np.random.default_rng(seed)
    means = np.array([[0.0, 0.0, 0.0], [1.5, 1.0, 0.0], [-1.0, 2.0, 1.0]])
    parts = []
    for mean in means:
        factor = rng.normal(size=(3, 3)) * np.array([1.5, 0.6, 0.2])
        parts.append(mean + rng.normal(size=(n_per, 3)) @ factor)
    return np.concatenate(parts)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Run these small-tensor tests on one intra-op thread, restored after each module.

    The kernels here work on a few hundred rows; with more than one thread, torch's
    parallel sections cost more than they save, and on a shared 2-core runner (``pytest -n 2``)
    a batched ``torch.linalg.cholesky_ex`` of three 3x3 matrices was measured at ~6 ms
    instead of ~2 us. Results do not depend on this; only the wall time does.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def blobs() -> tuple[np.ndarray, np.ndarray]:
    """``(X, labels)``: 600 rows, 3 features, 3 well separated blobs at ``BLOB_CENTERS``."""
    return _make_blobs()


@pytest.fixture
def blob_centers() -> np.ndarray:
    return BLOB_CENTERS.copy()


@pytest.fixture
def aniso() -> np.ndarray:
    """600 rows, 3 features, 3 overlapping anisotropic components."""
    return _make_aniso()


@pytest.fixture(params=["blobs", "aniso"])
def dataset(request) -> np.ndarray:
    """Each of the two datasets in turn (rows only)."""
    return _make_blobs()[0] if request.param == "blobs" else _make_aniso()


@pytest.fixture(scope="session")
def sklearn_fit():
    """``sklearn_fit(X, covariance_type)`` -> ``GaussianMixture(3, random_state=0)`` fitted on
    ``X``, cached for the session (tests only read it)."""
    from sklearn.mixture import GaussianMixture

    cache: dict[tuple[bytes, str], GaussianMixture] = {}

    def fit(X: np.ndarray, covariance_type: str) -> GaussianMixture:
        key = (np.ascontiguousarray(X).tobytes(), covariance_type)
        if key not in cache:
            gm = GaussianMixture(3, covariance_type=covariance_type, random_state=0)
            cache[key] = gm.fit(X)
        return cache[key]

    return fit


@pytest.fixture
def random_spd():
    """``random_spd(rng, d, low=0.3, high=3.0)`` -> SPD matrix with eigenvalues in range."""
    return _random_spd


@pytest.fixture
def random_covariances():
    """``random_covariances(rng, covariance_type, n_components, n_features)`` -> ndarray of
    the covariance shape for that type, well conditioned (eigenvalues in [0.3, 3])."""

    def make(rng: np.random.Generator, covariance_type: str, k: int, d: int) -> np.ndarray:
        if covariance_type == "full":
            return np.stack([_random_spd(rng, d) for _ in range(k)])
        if covariance_type == "tied":
            return _random_spd(rng, d)
        if covariance_type == "diag":
            return rng.uniform(0.3, 3.0, size=(k, d))
        return rng.uniform(0.3, 3.0, size=k)

    return make
