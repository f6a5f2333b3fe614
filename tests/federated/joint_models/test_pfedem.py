"""pFedEM (``fednovelty.federated.joint_models.pfedem``): one round against Eq. 8-14 by hand,
sub-models trained on their partitions only, Eq. 15, the exact variant, a run that beats
FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated import PFedEM, PrivacyPolicy, pfl_algorithm
from fednovelty.federated.joint_models.pfedem import paper_gaussians, pfedem_predict_proba
from fednovelty.federated.registry import algorithm_settings, build_algorithm
from fednovelty.federated.trust import gate
from fednovelty.mixture import log_gaussian_prob
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)


def two_populations(seed: int, n_clients: int = 4, n: int = 200):
    """Two Gaussian populations in 2-D with opposite labelling rules; each client mixes
    them in its own share."""
    rng = np.random.default_rng(seed)
    clients = []
    for share in np.linspace(0.2, 0.8, n_clients):
        a = rng.random(n) < share
        X = np.where(a[:, None], [-4.0, 0.0], [4.0, 0.0]) + rng.normal(size=(n, 2))
        y = np.where(a, X[:, 1] > 0, X[:, 1] < 0).astype(np.int64)
        clients.append((torch.tensor(X), torch.tensor(y)))
    return clients


def start(**kw):
    init = {
        "weights_init": [0.5, 0.5],
        "means_init": [[-3.0, 0.0], [3.0, 0.0]],
        "precisions_init": [[1.0, 1.0], [1.0, 1.0]],
    }
    return PFedEM(2, 2, max_iter=1, tol=0.0, local_epochs=1, learning_rate=0.5, **init, **kw)


def test_one_round_is_eq_8_to_14():
    clients = two_populations(0)
    result = run_simulation(start(), clients, privacy=NO_FLOOR)
    means0 = torch.tensor([[-3.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    prec0 = torch.ones(2, 2, dtype=torch.float64)
    hard, mus, variances = [], [], []
    for X, _ in clients:
        log_n = log_gaussian_prob(X, means0, prec0, "diag") + torch.tensor([0.5, 0.5]).log()
        gamma = torch.softmax(log_n, dim=1)
        mu = gamma.T @ X / gamma.sum(0).unsqueeze(1)
        var = gamma.T @ X.square() / gamma.sum(0).unsqueeze(1) - mu.square()
        hard.append(torch.bincount(gamma.argmax(1), minlength=2).double())
        mus.append(mu)
        variances.append(var)
    expected = paper_gaussians(torch.stack(hard), torch.stack(mus), torch.stack(variances), 1e-6)
    for name, tensor in expected.tensors().items():
        assert_close_scaled(result.state.params.tensors()[name], tensor, rtol=1e-10, err_msg=name)


def test_sub_models_learn_their_own_partition_and_eq_15_mixes_them():
    clients = two_populations(1)
    algorithm = PFedEM(
        2, 2, max_iter=15, tol=0.0, local_epochs=3, learning_rate=0.5, random_state=0
    )
    result = run_simulation(algorithm, clients)
    state = result.state
    left = int(torch.argmin(state.params.means[:, 0]))  # the component at (-4, 0)
    template = algorithm._template(2)
    Z = torch.tensor([[-4.0, 1.0], [-4.0, -1.0], [4.0, 1.0], [4.0, -1.0]])
    one_hot = torch.zeros(2, dtype=torch.float64)
    one_hot[left] = 1.0
    proba = pfedem_predict_proba(template, state.learners, Z.double(), one_hot)
    assert proba[:2].argmax(1).tolist() == [1, 0]  # population A's rule: y = x2 > 0
    X = torch.cat([c[0] for c in clients])
    y = torch.cat([c[1] for c in clients])
    # Eq. 15 with each client's weights beats one averaged model (FedAvg) on this data
    fedavg = run_simulation(
        pfl_algorithm(
            "FedAvg", 2, max_iter=15, tol=0.0, local_epochs=3, learning_rate=0.5, random_state=0
        ),
        clients,
    )
    mixed = pfedem_predict_proba(template, state.learners, X, state.params.weights)
    routed_right = 0
    for Xc, yc in clients:
        pick = torch.softmax(
            log_gaussian_prob(Xc, state.params.means, state.params.precisions_cholesky, "diag"), 1
        )
        per_row = (
            pick.unsqueeze(2)
            * torch.stack(
                [
                    pfedem_predict_proba(
                        template, state.learners, Xc, torch.eye(2, dtype=torch.float64)[k]
                    )
                    for k in range(2)
                ],
                1,
            )
        ).sum(1)
        routed_right += int((per_row.argmax(1) == yc).sum())
    avg = fedavg.state.learners
    acc_avg = float(
        (pfedem_predict_proba(template, avg, X, torch.ones(1, dtype=torch.float64)).argmax(1) == y)
        .double()
        .mean()
    )
    assert routed_right / len(y) > acc_avg + 0.2
    assert mixed.shape == (len(y), 2)


def test_exact_aggregation_is_the_pooled_soft_m_step():
    clients = two_populations(2)
    exact = run_simulation(start(gaussian_aggregation="exact"), clients, privacy=NO_FLOOR)
    pooled = run_simulation(
        start(gaussian_aggregation="exact"),
        [(torch.cat([c[0] for c in clients]), torch.cat([c[1] for c in clients]))],
        privacy=NO_FLOOR,
    )
    # with the global weights as every client's first-round pi, summed soft statistics equal
    # the pooled rows' statistics: the same M-step
    for name, tensor in pooled.state.params.tensors().items():
        assert_close_scaled(exact.state.params.tensors()[name], tensor, rtol=1e-10, err_msg=name)
    paper = run_simulation(start(), clients, privacy=NO_FLOOR)
    # the paper's Eq. 13 drops the between-client spread of each component's mean
    assert not torch.allclose(paper.state.params.covariances, exact.state.params.covariances)


def test_a_partition_below_the_floor_is_not_released():
    X = torch.cat(
        [
            torch.randn(30, 2, dtype=torch.float64) - 4.0,
            torch.randn(2, 2, dtype=torch.float64) + 4.0,
        ]
    )
    y = torch.zeros(32, dtype=torch.long)
    algorithm = start()
    state = algorithm.start()
    reply = algorithm.client_step((X, y), algorithm.configure(state), gate.client_context(0))
    assert reply.tensors["hard_counts"].tolist() == [30.0, 0.0]
    assert torch.equal(reply.tensors["client_means"][1], torch.zeros(2, dtype=torch.float64))
    broadcast = algorithm.configure(state)
    assert torch.equal(reply.tensors["learner.1.weight"], broadcast.tensors["learner.1.weight"])


def test_settings_round_trip_and_errors_are_named():
    algorithm = PFedEM(3, 4, gaussian_aggregation="exact", covariance_type="full")
    again = build_algorithm("PFedEM", algorithm_settings(algorithm))
    assert again.config == algorithm.config and again.config.n_learners == 3
    with pytest.raises(ValueError, match="n_learners must equal n_components"):
        PFedEM(3, 4, n_learners=2)
    with pytest.raises(ValueError, match="covariance_type='diag'"):
        PFedEM(3, 4, covariance_type="full")
    with pytest.raises(ValueError, match="gaussian_aggregation must be one of"):
        PFedEM(3, 4, gaussian_aggregation="mean")


def test_float32_clients_holding_one_population_send_finite_values():
    rng = np.random.default_rng(3)
    centers = np.array([[-20.0, 0.0], [20.0, 0.0]])  # responsibilities underflow to 0
    clients = [
        (
            torch.tensor(rng.normal(size=(50, 2)) + centers[c], dtype=torch.float32),
            torch.tensor(rng.integers(0, 2, 50)),
        )
        for c in range(2)
    ]
    result = run_simulation(start(dtype="float32"), clients)
    assert all(not r.dropped for r in result.history)
    assert bool(torch.isfinite(result.state.params.means).all())
