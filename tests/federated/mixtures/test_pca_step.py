"""Federated PCA as a chained step of federated EM (``pca_components``): one run gives what
running ``FederatedPCA`` and then ``FederatedEM`` on the projected rows gives, with the same
round seeds; the projection travels once and stays with the clients."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated import FederatedEM, FederatedPCA, Message
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.mixtures.pca import PROJECTION_COMPONENTS, PROJECTION_MEAN
from fednovelty.federated.trust import gate
from fednovelty.runtime import run_simulation

N_FEATURES, N_AXES = 6, 3


def make_clients(n_clients: int = 4, seed: int = 0) -> list[torch.Tensor]:
    """Correlated rows from two clusters in 6 features, split unevenly over the clients."""
    rng = np.random.default_rng(seed)
    mixing = rng.normal(size=(N_FEATURES, N_FEATURES))
    rows = np.r_[rng.normal(0, 1, (180, N_FEATURES)), rng.normal(3, 1, (120, N_FEATURES))]
    rows = rows @ mixing + 10.0
    order = rng.permutation(rows.shape[0])
    return [torch.as_tensor(part) for part in np.array_split(rows[order], [40, 110, 200])]


def pca_then_em(clients, **settings):
    """The old path: a FederatedPCA run, then FederatedEM on the projected rows."""
    pca = run_simulation(FederatedPCA(N_AXES), clients, random_state=0)
    projection = pca.state.projection
    projected = [projection.transform(c) for c in clients]
    return pca, run_simulation(FederatedEM(2, **settings), projected, random_state=0)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"covariance_type": "diag", "mixture_weights": "personal"},
        {"standardize": True, "prior_strength": 5.0},
        {"init_params": "separated", "covariance_type": "tied"},
    ],
)
def test_the_pca_step_gives_what_pca_then_em_give(settings) -> None:
    clients = make_clients()
    pca, em = pca_then_em(clients, **settings)
    one = run_simulation(FederatedEM(2, pca_components=N_AXES, **settings), clients)
    state, old = one.state, em.state
    expected = pca.state.projection
    for name in ("mean", "components", "explained_variance"):
        assert_close_scaled(getattr(state.projection, name), getattr(expected, name), err_msg=name)
    for name, value in old.params.tensors().items():
        assert_close_scaled(state.params.tensors()[name], value, rtol=1e-10, err_msg=name)
    assert_close_scaled(state.lower_bounds, old.lower_bounds, rtol=1e-10)
    assert (state.n_iter, state.converged) == (old.n_iter, old.converged)
    assert state.rounds == old.rounds  # the round seeds' counter leaves the PCA rounds out
    assert all(not r.dropped for r in one.history)  # replies checked in the projection's width
    kinds = [r.kind for r in one.history]
    assert kinds == ["moments_mean", "moments_scatter"] + [r.kind for r in em.history]
    # the projection goes down once: with the first round after the PCA rounds
    sizes = (N_FEATURES * (N_AXES + 1)) * 8 * len(clients)
    downs = [r.bytes_down for r in one.history[2:]]
    assert downs[0] == em.history[0].bytes_down + sizes
    assert downs[1:] == [r.bytes_down for r in em.history[1:]]
    assert [r.bytes_up for r in one.history] == [r.bytes_up for r in pca.history + em.history]


def test_each_client_keeps_the_projection_and_projects_its_rows() -> None:
    clients = make_clients()
    result = run_simulation(FederatedEM(2, pca_components=N_AXES, max_iter=3), clients)
    projection = result.state.projection
    for state in result.client_states.values():
        assert torch.equal(state[PROJECTION_MEAN], projection.mean)
        assert torch.equal(state[PROJECTION_COMPONENTS], projection.components)
    assert result.state.params.n_features == N_AXES


def test_a_client_without_the_projection_skips_later_rounds() -> None:
    algorithm = FederatedEM(2, pca_components=N_AXES)
    X = make_clients()[0]
    reply = algorithm.client_step(
        X, Message("centroids", scalars={"seed": 0}), gate.client_context(0)
    )
    assert reply.scalars["skipped"] and "no PCA projection" in reply.scalars["reason"]
    assert reply.tensors == {}


def test_the_joint_model_fits_its_gaussians_on_the_projection() -> None:
    """Gaussians on the projection, learners on the raw rows: as PCA then the joint model
    on ``(projected X, y, X)`` triples."""
    clients = make_clients()
    labels = [(X[:, 0] > X[:, 0].median()).long() for X in clients]
    settings = {"max_iter": 4, "random_state": 1}
    pca = run_simulation(FederatedPCA(N_AXES), clients).state.projection
    triples = [(pca.transform(X), y, X) for X, y in zip(clients, labels, strict=True)]
    old = JointFedGMM(2, 2, 2, n_learner_features=N_FEATURES, **settings)
    old = run_simulation(old, triples).state
    pairs = list(zip(clients, labels, strict=True))
    new = run_simulation(JointFedGMM(2, 2, 2, pca_components=N_AXES, **settings), pairs).state
    assert new.params.n_features == N_AXES and new.learners[0]["weight"].shape == (2, N_FEATURES)
    for name, value in old.params.tensors().items():
        assert_close_scaled(new.params.tensors()[name], value, rtol=1e-10, err_msg=name)
    for m2, learner in enumerate(old.learners):
        for name, value in learner.items():
            assert_close_scaled(new.learners[m2][name], value, rtol=1e-10, err_msg=name)
    assert_close_scaled(new.lower_bounds, old.lower_bounds, rtol=1e-10)
