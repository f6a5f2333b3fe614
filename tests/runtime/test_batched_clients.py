"""A round's clients run as one batched computation give the fit of one client at a time
(FedGMM's joint rounds, pFedEM's partitioned sub-models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fednovelty.federated.clustered.cam_methods import CLUSTERED_METHODS
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.joint_models.pfedem import PFedEM
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime.simulation import run_simulation


def labelled_clients(sizes, width=4, classes=3, seed=0):
    """Clients of unequal sizes whose label rule differs (a shifted share)."""
    rng = np.random.default_rng(seed)
    out = []
    for c, n in enumerate(sizes):
        X = rng.normal(size=(n, width)) + (c % 2)
        y = ((X[:, 0] + (c % 3) * X[:, 1]) > 0.5).astype(np.int64) + (X[:, 2] > 1)
        out.append((torch.as_tensor(X), torch.as_tensor(np.minimum(y, classes - 1))))
    return out


def fit(algorithm_options, clients, **run):
    options = dict(algorithm_options)
    if options.pop("pfedem", False):  # K Gaussians and K sub-models
        algorithm = PFedEM(2, 3, max_iter=3, tol=0.0, random_state=1, **options)
    else:
        algorithm = JointFedGMM(2, 2, 3, max_iter=3, tol=0.0, random_state=1, **options)
    return run_simulation(algorithm, clients, **run)


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(1.0, float(a.abs().max()))


@pytest.mark.parametrize(
    "options",
    [
        {"learner_factory": "mlp", "local_epochs": 2, "batch_size": 8, "learning_rate": 0.3},
        {"optimizer": "adam", "learning_rate": 0.05, "batch_size": 16, "mu_prox": 0.1},
        {"aggregate_learners": False, "local_epochs": 2, "batch_size": 8},
        {"pfedem": True, "local_epochs": 2, "batch_size": 8, "learning_rate": 0.3},
    ],
)
def test_batched_fit_equals_one_client_at_a_time(options):
    """Unequal clients (one below the privacy floor, so it skips): the learners, Gaussians
    and personal weights of the batched run equal the one-by-one run's to rounding, and the
    learners did move from their start."""
    clients = labelled_clients([60, 23, 4, 41, 35])
    policy = PrivacyPolicy(min_rows=5)
    one = fit(options, clients, batch_clients=False, privacy=policy)
    many = fit(options, clients, privacy=policy)
    assert [r.skipped for r in one.history] == [r.skipped for r in many.history]
    assert any(r.skipped for r in many.history)  # the 4-row client skipped
    a, b = one.state, many.state
    assert relative_gap(a.params.means, b.params.means) < 1e-9
    assert relative_gap(a.params.covariances, b.params.covariances) < 1e-9
    for la, lb in zip(a.learners, b.learners, strict=True):
        for k in la:
            assert relative_gap(la[k], lb[k]) < 1e-9
    for cid in a.client_joint_weights:
        assert relative_gap(a.client_joint_weights[cid], b.client_joint_weights[cid]) < 1e-9
    for cid, kept in one.client_states.items():  # Local keeps each client's own learners
        for k, v in kept.items():
            assert relative_gap(v, many.client_states[cid][k]) < 1e-9
    plain = {k: v for k, v in options.items() if k != "pfedem"}
    start = JointFedGMM(2, 2, 3, random_state=1, **plain)._initial_learners(4)[0]
    trained = b.learners[0] if options.get("aggregate_learners", True) else many.client_states[0]
    assert any(
        relative_gap(trained[f"learner.0.{k}" if k not in trained else k], v) > 1e-3
        for k, v in start.items()
    )


@pytest.mark.parametrize("method", ["FedAvg+", "IFCA", "FeSEM", "IFCA-CAM", "FeSEM-CAM"])
def test_clustered_fits_batched_equal_one_client_at_a_time(method):
    """Fed-CAM's family (warm-ups, the ensemble, cluster rounds with the global model's
    offsets and FeSEM's pull): the batched fit's models equal the one-by-one fit's."""
    rng = np.random.default_rng(3)
    rules = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    clients = []
    for c in range(6):
        X = rng.normal(size=(30 + 7 * c, 3))
        clients.append(
            (torch.as_tensor(X), torch.as_tensor((X @ rules[c % 3] > 0).astype(np.int64)))
        )

    def run(**engine):
        # 20 rounds, not the default 100: every phase still runs (the CAM warm-up takes 6
        # of them, and IFCA-CAM's clients change clusters in rounds 7-9 before settling,
        # as in the 100-round fit), at a fifth of the time
        algorithm = CLUSTERED_METHODS[method](
            3,
            2,
            n_clusters=3,
            rounds=20,
            learning_rate=0.2,
            dtype=torch.float64,
            random_state=0,
        )
        return run_simulation(algorithm, clients, **engine).state

    one, many = run(batch_clients=False), run()
    models = [*one.cluster_models, *([one.global_model] if one.global_model else [])]
    others = [*many.cluster_models, *([many.global_model] if many.global_model else [])]
    assert len(models) == len(others) >= 3
    for a, b in zip(models, others, strict=True):
        for k in a:
            assert relative_gap(a[k], b[k]) < 1e-9
