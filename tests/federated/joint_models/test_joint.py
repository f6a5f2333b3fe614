"""FedGMM's joint model (algorithm layer): exactness of its Gaussian half,
score identities, and that modelling p(x) per client beats one shared classifier."""

import numpy as np
import pytest
import torch

from fednovelty.federated import FederatedEM
from fednovelty.federated.joint_models.joint import (
    PFL_METHODS,
    JointFedGMM,
    adapt_joint_weights,
    joint_log_scores,
    mlp_learner,
    pfl_algorithm,
    unpack_client_data,
)
from fednovelty.runtime import run_simulation


def opposite_labels(n_clients=8, n_per=200, seed=0):
    """The FedGMM paper's Figure 1 in 2-D: two blobs whose labelling functions disagree."""
    rng = np.random.default_rng(seed)
    clients = []
    for _ in range(n_clients):
        z = rng.choice(2, n_per, p=rng.dirichlet([0.4, 0.4]))
        x = rng.normal(0, 1, (n_per, 2)) + np.where(z[:, None] == 0, -3.0, 3.0)
        y = np.where(z == 0, x[:, 0] < -3, x[:, 0] < 3).astype(np.int64)
        clients.append((torch.tensor(x), torch.tensor(y)))
    return clients


def pooled(clients):
    return torch.cat([c[0] for c in clients]), torch.cat([c[1] for c in clients])


def accuracy(state, algorithm, X, y):
    scores = joint_log_scores(state, algorithm._template(X.shape[1]), X)
    return float((scores["proba_y"].argmax(1) == y).double().mean())


def test_gaussian_half_with_one_learner_is_personal_federated_em():
    """With M2 = 1, P(y|x) cancels from q(m1): the Gaussians follow x-only FedGMM exactly."""
    clients = opposite_labels()
    init = FederatedEM(2, max_iter=1, random_state=0)
    start = run_simulation(init, [c[0] for c in clients]).state.params
    common = {
        "weights_init": start.weights.numpy(),
        "means_init": start.means.numpy(),
        "precisions_init": (start.precisions_cholesky @ start.precisions_cholesky.mT).numpy(),
        "max_iter": 5,
        "tol": 0.0,
    }
    joint = run_simulation(JointFedGMM(2, 1, 2, **common), clients).state
    plain = run_simulation(
        FederatedEM(2, mixture_weights="personal", **common), [c[0] for c in clients]
    ).state
    torch.testing.assert_close(joint.params.means, plain.params.means, rtol=0, atol=1e-10)
    torch.testing.assert_close(
        joint.params.covariances, plain.params.covariances, rtol=0, atol=1e-10
    )
    for cid, weights in plain.client_weights.items():
        torch.testing.assert_close(joint.client_weights[cid], weights, rtol=0, atol=1e-10)


def test_scores_are_consistent():
    clients = opposite_labels(n_clients=4)
    algorithm = JointFedGMM(2, 2, 2, max_iter=5, random_state=1)
    state = run_simulation(algorithm, clients).state
    X, y = pooled(clients)
    scores = joint_log_scores(state, algorithm._template(2), X, y)
    torch.testing.assert_close(scores["proba_y"].sum(1), torch.ones(len(X), dtype=X.dtype))
    torch.testing.assert_close(scores["log_pxy"], scores["log_px"] + scores["log_py_given_x"])
    picked = scores["proba_y"].gather(1, y.view(-1, 1)).squeeze(1)
    torch.testing.assert_close(scores["log_py_given_x"].exp(), picked)
    assert float(state.joint_counts.sum()) == pytest.approx(len(X))
    for weights in state.client_joint_weights.values():
        assert float(weights.sum()) == pytest.approx(1.0)


def test_joint_model_beats_fedavg_when_labelling_differs_by_component():
    clients = opposite_labels()
    X, y = pooled(clients)
    settings = {"max_iter": 30, "learning_rate": 0.5, "local_epochs": 2, "random_state": 0}
    fedgmm = JointFedGMM(2, 2, 2, **settings)
    fedavg = JointFedGMM(1, 1, 2, **settings)  # M1 = M2 = 1 is FedAvg
    acc_gmm = accuracy(run_simulation(fedgmm, clients).state, fedgmm, X, y)
    acc_avg = accuracy(run_simulation(fedavg, clients).state, fedavg, X, y)
    assert acc_gmm > acc_avg + 0.05, (acc_gmm, acc_avg)


def test_same_seed_same_model_and_mlp_learners_run():
    clients = opposite_labels(n_clients=3)
    make = lambda: JointFedGMM(  # noqa: E731
        2, 2, 2, learner_factory=mlp_learner, max_iter=3, random_state=7, mu_prox=0.01
    )
    a = run_simulation(make(), clients).state
    b = run_simulation(make(), clients).state
    for la, lb in zip(a.learners, b.learners, strict=True):
        for name in la:
            assert torch.equal(la[name], lb[name])


def test_paper_synthetic_ordering_fedgmm_over_fedem_over_fedavg():
    """Reduced Table 2 setting (10 clients, 15 rounds): FedGMM's test accuracy above FedEM's
    above FedAvg's."""
    from fednovelty.datasets import make_fedgmm_synthetic

    split = make_fedgmm_synthetic(10, random_state=0)
    clients = [
        (torch.tensor(split.X_train[split.groups_train == c]),
         torch.tensor(split.y_train[split.groups_train == c]))
        for c in range(10)
    ]  # fmt: skip
    settings = {"max_iter": 15, "tol": 0.0, "learning_rate": 0.5, "local_epochs": 5}
    accuracy_of = {}
    for name, (m1, m2) in {"FedGMM": (3, 3), "FedEM": (1, 3), "FedAvg": (1, 1)}.items():
        algorithm = JointFedGMM(m1, m2, 2, batch_size=32, random_state=0, **settings)
        state = run_simulation(algorithm, clients).state
        correct = 0
        for c in range(10):
            X = torch.tensor(split.X_test[split.groups_test == c])
            y = torch.tensor(split.y_test[split.groups_test == c])
            log_pi = state.client_joint_weights[c].log()
            scores = joint_log_scores(state, algorithm._template(32), X, log_joint_weights=log_pi)
            correct += int((scores["proba_y"].argmax(1) == y).sum())
        accuracy_of[name] = correct / len(split.y_test)
    assert accuracy_of["FedGMM"] >= 0.72, accuracy_of
    assert accuracy_of["FedGMM"] > accuracy_of["FedEM"] + 0.03 > accuracy_of["FedAvg"] + 0.06, (
        accuracy_of
    )


# ---------------------------------------------------------------- adaptation, baselines, Z


def test_adaptation_freezes_shared_parameters_and_finds_the_new_mix():
    clients = opposite_labels(n_clients=6)
    algorithm = JointFedGMM(2, 2, 2, max_iter=10, random_state=0)
    state = run_simulation(algorithm, clients).state
    before = {k: v.clone() for k, v in state.learners[0].items()}
    means = state.params.means.clone()
    # a new client drawn (almost) only from the blob at +3
    rng = np.random.default_rng(5)
    x = torch.tensor(rng.normal(3.0, 1.0, (300, 2)))
    y = (x[:, 0] < 3).long()
    template = algorithm._template(2)
    labelled = adapt_joint_weights(state, template, x, y)
    unlabelled = adapt_joint_weights(state, template, x)
    assert torch.equal(state.params.means, means)  # bit-identical
    assert all(torch.equal(state.learners[0][k], v) for k, v in before.items())
    blob = int(state.params.means[:, 0].argmax())  # the Gaussian at +3
    for fit in (labelled, unlabelled):
        weights = fit.log_weights.exp()
        assert float(weights.sum()) == pytest.approx(1.0)
        assert float(weights[blob].sum()) > 0.95
        assert np.all(np.diff(fit.mean_log_likelihoods.numpy()) > -1e-12)  # EM never descends
    # x-only EM keeps the global learner split within each Gaussian
    global_pi = state.joint_counts / state.joint_counts.sum()
    x_only = unlabelled.log_weights.exp()
    torch.testing.assert_close(
        x_only / x_only.sum(1, keepdim=True), global_pi / global_pi.sum(1, keepdim=True)
    )
    # the adapted weights predict the new client better than the global ones
    scores = joint_log_scores(state, template, x, y, log_joint_weights=labelled.log_weights)
    default = joint_log_scores(state, template, x, y)
    assert float(scores["log_pxy"].mean()) > float(default["log_pxy"].mean())


def test_local_keeps_learners_on_clients_and_sends_none():
    clients = opposite_labels(n_clients=3)
    local = pfl_algorithm("Local", n_classes=2, max_iter=4, tol=0.0, random_state=0)
    fedavg = pfl_algorithm("FedAvg", n_classes=2, max_iter=4, tol=0.0, random_state=0)
    res_local = run_simulation(local, clients)
    res_avg = run_simulation(fedavg, clients)
    assert res_local.bytes_up < res_avg.bytes_up  # no learner weights go up
    own = [res_local.client_states[c]["learner.0.weight"] for c in range(3)]
    assert not torch.equal(own[0], own[1])  # every client trained its own
    start = pfl_algorithm("Local", n_classes=2, random_state=0)._initial_learners(2)[0]
    assert torch.equal(res_local.state.learners[0]["weight"], start["weight"])  # server untouched


def test_named_methods_are_configurations_of_one_algorithm():
    assert (pfl_algorithm("FedEM", 2).n_components, pfl_algorithm("FedEM", 2).n_learners) == (1, 3)
    assert (pfl_algorithm("FedAvg", 2).n_components, pfl_algorithm("FedAvg", 2).n_learners) == (
        1,
        1,
    )
    assert pfl_algorithm("FedProx", 2).mu_prox > 0
    assert pfl_algorithm("FedGMM", 2, n_components=4).n_components == 4
    assert set(PFL_METHODS) == {"FedGMM", "FedEM", "FedAvg", "FedProx", "Local"}
    with pytest.raises(ValueError, match="unknown method 'FedFoo'"):
        pfl_algorithm("FedFoo", 2)
    with pytest.raises(ValueError, match="n_classes >= 2"):
        JointFedGMM(2, 2, 1)


def test_learners_may_see_other_features_than_the_gaussians():
    clients = opposite_labels(n_clients=4)
    # Gaussians on the first coordinate only, learners on both
    triples = [(x[:, :1].clone(), y, x) for x, y in clients]
    algorithm = JointFedGMM(2, 2, 2, n_learner_features=2, max_iter=5, random_state=0)
    state = run_simulation(algorithm, triples).state
    assert state.params.n_features == 1 and state.learners[0]["weight"].shape == (2, 2)
    X, y = pooled(clients)
    scores = joint_log_scores(state, algorithm._template(2), X[:, :1], y, Z=X)
    torch.testing.assert_close(scores["proba_y"].sum(1), torch.ones(len(X), dtype=X.dtype))
    with pytest.raises(ValueError, match=r"\(X, y\) or \(X, y, Z\)"):
        unpack_client_data(X)


def test_adam_learners_train_and_bad_optimizer_is_named():
    clients = opposite_labels(n_clients=3)
    X, y = pooled(clients)
    settings = {"local_epochs": 2, "max_iter": 30, "random_state": 0}
    adam = JointFedGMM(2, 2, 2, optimizer="adam", learning_rate=0.05, **settings)
    sgd = JointFedGMM(2, 2, 2, learning_rate=0.5, **settings)
    # measured: Adam 0.88, SGD 0.77 on these 3 clients
    acc_adam = accuracy(run_simulation(adam, clients).state, adam, X, y)
    assert acc_adam > 0.83 and acc_adam > accuracy(run_simulation(sgd, clients).state, sgd, X, y)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        JointFedGMM(2, 2, 2, optimizer="lbfgs")


# ---------------------------------------------------------------- composition
def test_standardised_joint_model_is_in_the_users_units():
    """``standardize`` composes with the joint model: rescaling the Gaussians' features by
    powers of two (exact in floating point) rescales the fitted means and nothing else;
    the learners, which see ``Z``, come out the same."""
    clients = opposite_labels(n_clients=4)
    unit = torch.tensor([8.0, 1 / 64], dtype=torch.float64)
    settings = {"standardize": True, "prior_strength": 4.0, "max_iter": 4, "random_state": 0}
    a = run_simulation(JointFedGMM(2, 2, 2, **settings), [(x, y, x) for x, y in clients]).state
    scaled = [(x * unit, y, x) for x, y in clients]
    b = run_simulation(JointFedGMM(2, 2, 2, n_learner_features=2, **settings), scaled).state
    assert a.scale is not None and a.prior is not None
    torch.testing.assert_close(b.params.means, a.params.means * unit, rtol=1e-9, atol=0)
    torch.testing.assert_close(b.params.weights, a.params.weights, rtol=1e-9, atol=0)
    for la, lb in zip(a.learners, b.learners, strict=True):
        for name in la:
            torch.testing.assert_close(lb[name], la[name], rtol=1e-9, atol=1e-12)
    shift = float(unit.log().sum())  # log p(x * unit) = log p(x) - sum log unit
    np.testing.assert_allclose(b.lower_bounds, np.array(a.lower_bounds) - shift, rtol=1e-9)
    X = pooled(clients)[0]
    assert 2.0 < float(a.params.means[:, 0].abs().max()) < 4.0  # rows' units, not z-scores
    assert float(a.params.means.abs().max()) < float(X.abs().max())


def test_robust_aggregation_bounds_a_lone_clients_gaussian() -> None:
    """Trimming and a client weight cap act on the joint model's Gaussian statistics and
    joint counts as they do in federated EM: a tenth client holding a far cluster alone."""
    rng = np.random.default_rng(0)
    parts = [
        (torch.tensor(rng.normal(0, 1, (100, 3))), torch.tensor(rng.integers(0, 2, 100)))
        for _ in range(9)
    ]
    parts.append(
        (torch.tensor(rng.normal(15, 0.5, (300, 3))), torch.tensor(rng.integers(0, 2, 300)))
    )

    def fitted(**options):
        algorithm = JointFedGMM(2, 1, 2, max_iter=10, random_state=0, **options)
        return run_simulation(algorithm, parts).state.params

    def weights(**options):
        return np.sort(fitted(**options).weights.numpy())

    assert weights()[0] == pytest.approx(0.25, abs=1e-6)  # 300 of 1,200 rows
    # trimmed: the lone client's centroids seed no centre and its statistics are trimmed,
    # so no component sits at the far cluster (both share the nine clients' rows)
    trimmed = fitted(aggregation="trimmed", trim=0.1)
    assert float(trimmed.means.abs().max()) < 1.0
    assert weights(client_weight_cap=1.0)[0] == pytest.approx(0.1, abs=1e-6)  # 100 of 1,000
