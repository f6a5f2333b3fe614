"""Federated EM (``fednovelty.federated.mixtures.em.FederatedEM``) against scikit-learn and itself.

Reference: with ``mixture_weights="global"`` and user-given initial parameters, summing the
clients' sufficient statistics is exactly centralized EM, so any split of the rows into
clients must follow ``sklearn.mixture.GaussianMixture`` from the same initial parameters
to float64 round-off (DESIGN.md, "One idea underneath everything").
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.mixture import GaussianMixture

from fednovelty.federated import FederatedEM, PrivacyPolicy
from fednovelty.mixture import score_samples
from fednovelty.runtime import run_simulation

#: the no-floor configuration (every client releases its exact statistics, however few rows
#: back them): the exactness tests below split rows into clients of 0-2 rows.
NO_FLOOR = PrivacyPolicy(min_rows=1)

COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
CENTERS = np.array([[-5.0, 0.0, 0.0], [5.0, 0.0, 1.0], [0.0, 6.0, -1.0]])


def make_blobs(seed: int = 0, n_per: int = 60, scale: float = 1.0) -> np.ndarray:
    """Three blobs in 3-D, ``3 * n_per`` rows (blob ``c`` in rows ``c*n_per:(c+1)*n_per``)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([c + scale * rng.normal(size=(n_per, 3)) for c in CENTERS])


def make_overlapping(seed: int = 0, n: int = 150) -> np.ndarray:
    """Overlapping anisotropic data: EM needs several iterations on it."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, 3)) @ np.array([[2.0, 0.3, 0.0], [0.0, 1.0, 0.5], [0.0, 0.0, 0.4]])
    b = rng.normal(size=(n, 3)) * 0.8 + np.array([1.5, 1.0, 0.0])
    return np.concatenate([a, b])


def sklearn_inits(X: np.ndarray, n_components: int, covariance_type: str, seed: int = 0) -> dict:
    """weights/means/precisions after one sklearn EM iteration (a non-trivial start)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = GaussianMixture(
            n_components, covariance_type=covariance_type, max_iter=1, random_state=seed
        ).fit(X)
    return {
        "weights_init": gm.weights_.copy(),
        "means_init": gm.means_.copy(),
        "precisions_init": gm.precisions_.copy(),
    }


def split_rows(X: np.ndarray, assignment: np.ndarray, n_clients: int) -> list[torch.Tensor]:
    """Client tensors (empty ones have shape (0, n_features))."""
    return [torch.as_tensor(X[assignment == c]) for c in range(n_clients)]


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_global_em_follows_sklearn_exactly(covariance_type):
    X = make_overlapping()
    inits = sklearn_inits(X, 3, covariance_type)
    tol, max_iter = 1e-4, 300
    reference = GaussianMixture(
        3, covariance_type=covariance_type, tol=tol, max_iter=max_iter, **inits
    ).fit(X)
    assert reference.converged_ and reference.n_iter_ >= 10  # a real EM path, not one step

    rng = np.random.default_rng(42)
    clients = split_rows(X, rng.integers(0, 5, size=X.shape[0]), 5)
    algorithm = FederatedEM(
        3,
        covariance_type=covariance_type,
        mixture_weights="global",
        tol=tol,
        max_iter=max_iter,
        **inits,
    )
    state = run_simulation(algorithm, clients).state

    assert state.n_iter == reference.n_iter_
    assert state.converged
    np.testing.assert_allclose(state.lower_bounds, reference.lower_bounds_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(state.params.weights.numpy(), reference.weights_, atol=1e-8)
    np.testing.assert_allclose(state.params.means.numpy(), reference.means_, atol=1e-8)
    np.testing.assert_allclose(
        state.params.covariances.numpy(), reference.covariances_, rtol=0, atol=1e-8
    )
    assert state.params.covariances.shape == reference.covariances_.shape


_PARTITION_X = make_overlapping(seed=3, n=40)


@functools.cache
def _partition_inits(covariance_type: str) -> dict:
    return sklearn_inits(_PARTITION_X, 2, covariance_type)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n_clients=st.integers(1, 8),
    covariance_type=st.sampled_from(COVARIANCE_TYPES),
)
def test_any_partition_with_empty_clients_gives_same_parameters(data, n_clients, covariance_type):
    X = _PARTITION_X
    assignment = np.asarray(
        data.draw(
            st.lists(st.integers(0, n_clients - 1), min_size=X.shape[0], max_size=X.shape[0]),
            label="assignment",
        )
    )
    # Always at least one explicitly empty client when there is room for one.
    if n_clients > 1:
        empty = data.draw(st.integers(0, n_clients - 1), label="empty_client")
        assignment = np.where(assignment == empty, (empty + 1) % n_clients, assignment)
    clients = split_rows(X, assignment, n_clients)
    assert sum(c.shape[0] for c in clients) == X.shape[0]
    if n_clients > 1:
        assert any(c.shape == (0, X.shape[1]) for c in clients)

    inits = _partition_inits(covariance_type)
    options = {"covariance_type": covariance_type, "tol": 1e-4, "max_iter": 40, **inits}
    split = run_simulation(FederatedEM(2, **options), clients, privacy=NO_FLOOR).state
    pooled = run_simulation(FederatedEM(2, **options), [torch.as_tensor(X)]).state

    assert split.n_iter == pooled.n_iter
    for name in ("weights", "means", "precisions_cholesky"):
        np.testing.assert_allclose(
            getattr(split.params, name).numpy(),
            getattr(pooled.params, name).numpy(),
            rtol=0,
            atol=1e-9,
            err_msg=name,
        )
    np.testing.assert_allclose(split.lower_bounds, pooled.lower_bounds, rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    ("init_params", "first_kind"),
    [("kmeans", "centroids"), ("separated", "range"), ("subset", "count")],
)
def test_init_params_converge_on_blobs(init_params, first_kind):
    X = make_blobs()
    rng = np.random.default_rng(0)
    clients = split_rows(X, rng.integers(0, 4, size=X.shape[0]), 4)
    algorithm = FederatedEM(3, init_params=init_params, random_state=0)
    if init_params == "subset":  # the clients must allow raw rows to answer it
        with pytest.warns(UserWarning, match="raw rows"):
            result = run_simulation(algorithm, clients, privacy=PrivacyPolicy(allow_raw_rows=True))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            result = run_simulation(algorithm, clients)
    state = result.state
    assert result.history[0].kind == first_kind
    assert result.history[-1].kind == "em"
    assert state.phase == "done"
    assert state.converged
    assert 1 <= state.n_iter < algorithm.max_iter
    assert len(state.lower_bounds) == state.n_iter
    assert np.isfinite(state.lower_bounds).all()
    np.testing.assert_allclose(float(state.params.weights.sum()), 1.0, atol=1e-12)
    if init_params == "kmeans":
        reference = GaussianMixture(3, random_state=0).fit(X)
        mean_ll = float(score_samples(state.params, torch.as_tensor(X)).mean())
        assert abs(mean_ll - reference.score(X)) < 0.05, (mean_ll, reference.score(X))


@pytest.mark.parametrize("init_params", ["kmeans", "separated"])
@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_init_rounds_tolerate_empty_clients(init_params, covariance_type):
    # An empty client (e.g. a Flower node with no rows yet) contributes zero statistics.
    X = make_blobs()
    clients = [torch.as_tensor(X[:90]), torch.zeros(0, 3, dtype=torch.float64)]
    clients.append(torch.as_tensor(X[90:]))
    algorithm = FederatedEM(
        3, covariance_type=covariance_type, init_params=init_params, random_state=1
    )
    state = run_simulation(algorithm, clients).state
    assert state.converged
    assert np.isfinite(state.params.means.numpy()).all()


def _separated_clients(seed: int = 0) -> tuple[np.ndarray, list[torch.Tensor]]:
    """Client ``c`` holds only blob ``c`` (the personal-weights setting)."""
    X = make_blobs(seed=seed, n_per=80)
    return X, [torch.as_tensor(X[80 * c : 80 * (c + 1)]) for c in range(3)]


def test_personal_weights_rows_sum_to_one_and_concentrate():
    X, clients = _separated_clients()
    inits = sklearn_inits(X, 3, "full")
    result = run_simulation(
        FederatedEM(3, mixture_weights="personal", tol=1e-6, random_state=0, **inits), clients
    )
    weights = result.state.client_weights
    assert sorted(weights) == [0, 1, 2]
    matrix = torch.stack([weights[c] for c in range(3)]).numpy()
    assert matrix.shape == (3, 3)
    np.testing.assert_allclose(matrix.sum(1), 1.0, atol=1e-12)
    assert (matrix >= 0).all()
    # Each client's weight sits on the component whose mean is its own blob's centre.
    means = result.state.params.means.numpy()
    for c in range(3):
        own = int(np.argmin(((means - CENTERS[c]) ** 2).sum(1)))
        assert matrix[c, own] > 0.9, (c, matrix[c])
    # Distinct clients favour distinct components.
    assert len(set(matrix.argmax(1).tolist())) == 3


def test_personal_weights_lower_bound_at_least_global():
    X, clients = _separated_clients(seed=1)
    inits = sklearn_inits(X, 3, "full")
    bounds = {}
    for mixture_weights in ("global", "personal"):
        state = run_simulation(
            FederatedEM(3, mixture_weights=mixture_weights, tol=1e-8, max_iter=300, **inits),
            clients,
        ).state
        bounds[mixture_weights] = state.lower_bounds[-1]
    # Personal weights add per-client freedom: the likelihood can only go up here, and by
    # about log(3) per row since each client holds one of three equal blobs.
    assert bounds["personal"] >= bounds["global"] - 1e-10
    assert bounds["personal"] - bounds["global"] > 0.5


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), covariance_type=st.sampled_from(COVARIANCE_TYPES))
def test_log_likelihood_never_decreases(seed, covariance_type):
    rng = np.random.default_rng(seed)
    X = make_overlapping(seed=seed % 1000, n=60)
    clients = split_rows(X, rng.integers(0, 3, size=X.shape[0]), 3)
    algorithm = FederatedEM(
        3,
        covariance_type=covariance_type,
        mixture_weights="global",
        init_params="separated",
        tol=0.0,
        max_iter=25,
        random_state=seed,
    )
    # No floor: EM's monotonicity is that of the exact statistics (a suppressed component is
    # not an EM step), and components of 1-2 rows occur on these 60 rows.
    bounds = np.asarray(run_simulation(algorithm, clients, privacy=NO_FLOOR).state.lower_bounds)
    assert len(bounds) == 25
    assert np.isfinite(bounds).all()
    # EM never lowers the likelihood; reg_covar (added after the M-step, as in sklearn) makes
    # the step inexact, which shows as dips of ~1e-8 nats/sample when a component holds a
    # single row (scikit-learn's GaussianMixture dips the same from the same start).
    assert np.diff(bounds).min() >= -1e-6, bounds


@pytest.mark.parametrize("init_params", ["separated", "subset"])
def test_more_components_than_rows_raises(init_params):
    X = make_blobs(n_per=2)  # 6 rows
    clients = [torch.as_tensor(X[:4]), torch.as_tensor(X[4:])]
    algorithm = FederatedEM(10, init_params=init_params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the subset init's privacy warning
        with pytest.raises(ValueError, match=r"n_components=10") as info:
            run_simulation(algorithm, clients, privacy=NO_FLOOR)  # clients of 4 and 2 rows
    assert "6 sample" in str(info.value)


def test_more_components_than_rows_with_kmeans_fits_fewer():
    """The k-means start makes K an upper bound: 6 rows send 6 centroids for K = 10, and
    the fit seeds half as many centres (the detectors warn; tests/detectors)."""
    X = make_blobs(n_per=2)  # 6 rows
    clients = [torch.as_tensor(X[:4]), torch.as_tensor(X[4:])]
    result = run_simulation(FederatedEM(10, random_state=0), clients, privacy=NO_FLOOR)
    assert result.state.params.n_components == 3
