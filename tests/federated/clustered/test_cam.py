"""Clustered classification and Fed-CAM (fednovelty/federated/clustered/: one algorithm class
per method): clusters recovered on clients with opposite labelling rules, one round of each
method against a hand computation (numpy softmax-regression gradients), degenerate cases by
name, reply checks, each method registered and built by its class name with its settings
through JSON, and the Flower engine giving the simulation's numbers."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.metrics import adjusted_rand_score

from fednovelty.federated import PrivacyPolicy, build_algorithm
from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_cluster_step import KMeansClusterStep, MinLossClusterStep
from fednovelty.federated.clustered.cam_ensemble import EnsembleStep
from fednovelty.federated.clustered.cam_global_warmup import GlobalWarmupStep
from fednovelty.federated.clustered.cam_local_warmup import LocalWarmupStep
from fednovelty.federated.clustered.cam_methods import CLUSTERED_METHODS
from fednovelty.federated.clustered.cam_models import nearest_cluster
from fednovelty.federated.clustered.cam_settings import ClusteredConfig, ClusteredState
from fednovelty.federated.clustered.fedavg_plus import FedAvgPlus, FedAvgPlusConfig
from fednovelty.federated.clustered.fesem import FeSEM, FeSEMConfig
from fednovelty.federated.clustered.fesem_cam import FeSEMCAM
from fednovelty.federated.clustered.ifca import IFCA, IFCAConfig
from fednovelty.federated.clustered.ifca_cam import IFCACAM, IFCACAMConfig
from fednovelty.federated.registry import ALGORITHMS, algorithm_name, algorithm_settings
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import run_simulation

D = 3
RULES = np.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


def rule_clients(n_clients=9, n_clusters=3, n_rows=60, seed=0):
    """Client ``c`` belongs to cluster ``c % n_clusters``; its labels are ``x . w_k > 0``
    with the rules ``e0``, ``-e0``, ``e1`` (the first two opposite). Returns (clients, truth)."""
    gen = torch.Generator().manual_seed(seed)
    clients, truth = [], []
    for c in range(n_clients):
        X = torch.randn(n_rows + 5 * c, D, dtype=torch.float64, generator=gen)
        w = torch.as_tensor(RULES[c % n_clusters])
        clients.append((X, (X @ w > 0).long()))
        truth.append(c % n_clusters)
    return clients, truth


def make(method: type[ClusteredAlgorithm], **settings) -> ClusteredAlgorithm:
    options = {
        "n_clusters": 3,
        "learner_factory": "linear",
        "learning_rate": 0.2,
        "dtype": torch.float64,
        "random_state": 0,
        **settings,
    }
    return method(D, 2, **options)


# ----------------------------------------------------------------------------- clusters found
@pytest.mark.parametrize("method", [IFCA, FeSEM, IFCACAM, FeSEMCAM], ids=lambda m: m.method)
def test_every_clustered_method_recovers_the_true_clusters(method) -> None:
    clients, truth = rule_clients()
    result = run_simulation(make(method, rounds=20), clients)
    state = result.state
    found = [state.client_clusters[c] for c in range(len(clients))]
    assert adjusted_rand_score(truth, found) == pytest.approx(1.0)
    assert state.cluster_sizes[-1] == [3, 3, 3]
    assert len(state.cluster_sizes) == len(result.history) == 20
    assert state.losses[-1] < 0.5 * state.losses[0]


def test_fedavg_plus_members_all_train_on_every_client() -> None:
    clients, _ = rule_clients()
    result = run_simulation(make(FedAvgPlus, rounds=5), clients)
    state = result.state
    assert state.client_clusters == {} and state.cluster_sizes == [[0, 0, 0]] * 5
    assert [r.kind for r in result.history] == ["cam_ensemble"] * 5
    assert len({float(m["weight"].sum()) for m in state.cluster_models}) == 3  # distinct


# ----------------------------------------------------------------------------- one round by hand
def onehot(y, n_classes=2):
    return np.eye(n_classes)[np.asarray(y)]


def grads(W, b, X, y, offset=None):
    """Softmax regression: d/d(W, b) of the mean cross-entropy of logits X W^T + b + offset."""
    z = X @ W.T + b + (0.0 if offset is None else offset)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - onehot(y)) / len(y)
    return g.T @ X, g.sum(0)


def loss(W, b, X, y, offset=None):
    z = X @ W.T + b + (0.0 if offset is None else offset)
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), np.asarray(y)]))


def sgd(model, X, y, steps, lr, momentum=0.0, offset=None, prox=0.0):
    """Full-batch SGD with heavy-ball momentum (torch's: the first buffer is the gradient)
    and the proximal pull ``prox / 2 ||theta - start||^2``."""
    W0, b0 = model
    W, b = W0.copy(), b0.copy()
    buffers = None
    for _ in range(steps):
        gW, gb = grads(W, b, X, y, offset)
        gW, gb = gW + prox * (W - W0), gb + prox * (b - b0)
        buffers = (
            (gW, gb)
            if buffers is None
            else (momentum * buffers[0] + gW, momentum * buffers[1] + gb)
        )
        W, b = W - lr * buffers[0], b - lr * buffers[1]
    return W, b


def as_np(params):
    return params["weight"].numpy().copy(), params["bias"].numpy().copy()


def mean(models, weights):
    weights = np.asarray(weights, dtype=float) / np.sum(weights)
    return (
        sum(w * m[0] for w, m in zip(weights, models, strict=True)),
        sum(w * m[1] for w, m in zip(weights, models, strict=True)),
    )


def assert_model(actual, expected, rtol=1e-10):
    assert_close_scaled(actual["weight"], expected[0], rtol=rtol, err_msg="weight")
    assert_close_scaled(actual["bias"], expected[1], rtol=rtol, err_msg="bias")


def tiny_clients():
    """Three clients of 8 to 18 rows: 0 and 2 share a rule, 1 has the opposite one."""
    clients, _ = rule_clients(n_clients=3, n_clusters=2, n_rows=8, seed=0)
    return clients, [(c[0].numpy(), c[1].numpy()) for c in clients]


HAND = {"batch_size": 64, "learning_rate": 0.5}  # full batches: no order in the steps


@pytest.mark.parametrize("average", ["cluster", "global"])
def test_one_ifca_round_equals_the_hand_computation(average) -> None:
    clients, data = tiny_clients()
    algorithm = make(IFCA, n_clusters=2, rounds=1, local_steps=1, cluster_average=average, **HAND)
    start = [as_np(m) for m in algorithm.start().cluster_models]
    chosen, trained = [], []
    for X, y in data:
        losses = [loss(*m, X, y) for m in start]
        chosen.append(int(np.argmin(losses)))
        trained.append(sgd(start[chosen[-1]], X, y, 1, HAND["learning_rate"]))
    n = [len(y) for _, y in data]
    state = run_simulation(algorithm, clients).state
    assert state.client_clusters == dict(enumerate(chosen))
    for k in range(2):
        members = [i for i, c in enumerate(chosen) if c == k]
        if average == "cluster":
            expected = mean([trained[i] for i in members], [n[i] for i in members])
        else:  # Eq. 6: (1 - sum n_i / n) Theta_k + sum (n_i / n) theta_i
            rest = sum(n) - sum(n[i] for i in members)
            expected = mean(
                [start[k]] + [trained[i] for i in members], [rest] + [n[i] for i in members]
            )
        assert_model(state.cluster_models[k], expected)


def test_one_ifca_cam_round_equals_the_hand_computation() -> None:
    """A warm-up round (FedAvg of h), then a CAM round: each client picks the min-loss
    cluster of h + f_k and trains f on h's residual and h on f's, two momentum steps each."""
    clients, data = tiny_clients()
    lr, steps = HAND["learning_rate"], 2
    algorithm = make(IFCACAM, n_clusters=2, rounds=2, warmup_rounds=1, local_steps=steps, **HAND)
    state0 = algorithm.start()
    start = [as_np(m) for m in state0.cluster_models]
    n = [len(y) for _, y in data]
    glob = mean([sgd(as_np(state0.global_model), X, y, steps, lr, 0.9) for X, y in data], n)
    chosen, clusters, globals_ = [], [], []
    for X, y in data:
        h = X @ glob[0].T + glob[1]
        losses = [loss(*m, X, y, offset=h) for m in start]
        k = int(np.argmin(losses))
        f = X @ start[k][0].T + start[k][1]
        chosen.append(k)
        clusters.append(sgd(start[k], X, y, steps, lr, 0.9, offset=h))
        globals_.append(sgd(glob, X, y, steps, lr, 0.9, offset=f))
    result = run_simulation(algorithm, clients)
    state = result.state
    assert [r.kind for r in result.history] == ["cam_warmup_global", "cam_cluster"]
    assert state.cluster_sizes[0] == [0, 0]  # the warm-up assigns no cluster
    assert state.client_clusters == dict(enumerate(chosen))
    assert_model(state.global_model, mean(globals_, n))
    for k in set(chosen):
        members = [i for i, c in enumerate(chosen) if c == k]
        assert_model(
            state.cluster_models[k],
            mean([clusters[i] for i in members], [n[i] for i in members]),
        )


def test_one_fesem_round_equals_the_hand_computation() -> None:
    """A local warm-up round from the common start, k-means of the three client models
    ({0, 2} share a rule), then a FeSEM round with the proximal pull towards the centre."""
    clients, data = tiny_clients()
    lr, steps, pull = HAND["learning_rate"], 2, 0.5
    algorithm = make(
        FeSEM, n_clusters=2, rounds=2, local_steps=steps, kmeans_reg=pull, momentum=0.0, **HAND
    )
    start = as_np(algorithm.start().cluster_models[0])
    n = [len(y) for _, y in data]
    local = [sgd(start, X, y, steps, lr) for X, y in data]
    groups = [[0, 2], [1]]
    centres = [mean([local[i] for i in g], [n[i] for i in g]) for g in groups]
    trained = {
        i: sgd(centres[j], *data[i], steps, lr, prox=pull) for j, g in enumerate(groups) for i in g
    }
    expected = [mean([trained[i] for i in g], [n[i] for i in g]) for g in groups]
    state = run_simulation(algorithm, clients).state
    label = state.client_clusters
    assert label[0] == label[2] != label[1]
    assert_model(state.cluster_models[label[0]], expected[0])
    assert_model(state.cluster_models[label[1]], expected[1])


def test_one_fedavg_plus_round_equals_the_hand_computation() -> None:
    clients, data = tiny_clients()
    algorithm = make(FedAvgPlus, n_clusters=2, rounds=1, local_steps=1, **HAND)
    start = [as_np(m) for m in algorithm.start().cluster_models]
    n = [len(y) for _, y in data]
    state = run_simulation(algorithm, clients).state
    for m in range(2):
        members = [sgd(start[m], X, y, 1, HAND["learning_rate"]) for X, y in data]
        assert_model(state.cluster_models[m], mean(members, n))


def test_a_kmeans_client_joins_the_centre_the_server_assigned_it() -> None:
    """FeSEM's client rule (nearest centre to the model it sent) reproduces the server's
    k-means labels round after round."""
    clients, _ = rule_clients()
    algorithm = make(FeSEMCAM, rounds=6, warmup_rounds=2)
    contexts = {c: gate.client_context(c) for c in range(len(clients))}
    state = algorithm.start()
    while not algorithm.finished(state):
        message = algorithm.configure(state)
        replies = {c: algorithm.client_step(clients[c], message, contexts[c]) for c in contexts}
        if message.kind == "cam_cluster":
            assert {c: r.scalars["cluster"] for c, r in replies.items()} == state.client_clusters
        state, _ = algorithm.server_step(state, replies)


# ----------------------------------------------------------------------------- degenerate cases
def test_more_clusters_than_clients_leaves_clusters_empty_and_unchanged() -> None:
    clients, _ = rule_clients(n_clients=2, n_clusters=2)
    for method in (IFCA, FeSEM):
        algorithm = make(method, n_clusters=4, rounds=3)
        initial = algorithm.start().cluster_models
        state = run_simulation(algorithm, clients).state
        assert all(sum(sizes) == 2 for sizes in state.cluster_sizes)
        empty = [k for k, size in enumerate(state.cluster_sizes[-1]) if size == 0]
        assert len(empty) >= 2
        for k in empty:
            if method is IFCA or k >= 2:  # k-means seeds one centre per client model
                assert torch.equal(state.cluster_models[k]["weight"], initial[k]["weight"])


def test_an_empty_cluster_is_reseeded_with_the_farthest_client_model() -> None:
    clients, _ = rule_clients(n_clients=2, n_clusters=2)
    algorithm = make(IFCA, n_clusters=4, rounds=1, empty_clusters="reseed")
    state = algorithm.start()
    message = algorithm.configure(state)
    replies = {
        c: algorithm.client_step(clients[c], message, gate.client_context(c)) for c in range(2)
    }
    state, metrics = algorithm.server_step(state, replies)
    sizes = state.cluster_sizes[-1]
    empty = [k for k, size in enumerate(sizes) if size == 0]
    assert len(empty) >= 2 and metrics["n_empty"] == len(empty)
    assert metrics["reseeded"] == 2 == state.reseeded[-1]  # one client model each

    def vector(params):
        return torch.cat([params["weight"].reshape(-1), params["bias"]])

    sent = {
        c: {n: r.tensors[f"cluster.{n}"] for n in ("weight", "bias")} for c, r in replies.items()
    }
    far = {
        c: float(
            (vector(p) - vector(state.cluster_models[state.client_clusters[c]])).square().sum()
        )
        for c, p in sent.items()
    }
    farthest = sorted(far, key=lambda c: (-far[c], c))
    for k, c in zip(empty, farthest, strict=False):
        assert torch.equal(state.cluster_models[k]["weight"], sent[c]["weight"])
    kept = run_simulation(make(IFCA, n_clusters=4, rounds=1), clients).state
    assert kept.reseeded == [0]  # the default keeps empty clusters


def test_a_client_below_its_privacy_floor_releases_nothing_and_gets_no_cluster() -> None:
    clients, _ = rule_clients(n_clients=4, n_clusters=2)
    clients[2] = (clients[2][0][:6], clients[2][1][:6])
    policy = PrivacyPolicy(min_rows=10)
    for method in CLUSTERED_METHODS.values():
        algorithm = make(method, n_clusters=2, rounds=3)
        reply = algorithm.client_step(
            clients[2],
            algorithm.configure(algorithm.start()),
            gate.client_context(2, policy=policy),
        )
        assert reply.scalars["skipped"] and "privacy floor" in reply.scalars["reason"]
        assert reply.tensors == {}
        state = run_simulation(algorithm, clients, privacy=policy).state
        assert 2 not in state.client_clusters and sum(state.cluster_sizes[-1]) in (0, 3)


def test_ties_go_to_the_lowest_cluster_index() -> None:
    clients, _ = rule_clients(n_clients=1)
    algorithm = make(IFCA, n_clusters=3, rounds=1)
    state = algorithm.start()
    state.cluster_models = [dict(state.cluster_models[1]) for _ in range(3)]
    reply = algorithm.client_step(clients[0], algorithm.configure(state), gate.client_context(0))
    assert reply.scalars["cluster"] == 0
    centres = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    points = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])
    assert nearest_cluster(points, centres).tolist() == [0, 0, 1]


# ----------------------------------------------------------------------------- replies checked
def one_reply(method, kind):
    clients, _ = rule_clients(n_clients=2, n_clusters=2)
    algorithm = make(method, n_clusters=2, rounds=2, warmup_rounds=1 if method.additive else None)
    state = algorithm.start()
    while algorithm.configure(state).kind != kind:
        message = algorithm.configure(state)
        replies = {
            c: algorithm.client_step(clients[c], message, gate.client_context(c)) for c in (0, 1)
        }
        state, _ = algorithm.server_step(state, replies)
    broadcast = algorithm.configure(state)
    return broadcast, algorithm.client_step(clients[0], broadcast, gate.client_context(0))


REPLIES = {
    "cam_ensemble": (FedAvgPlus, "cam_ensemble"),
    "cam_warmup_global": (IFCACAM, "cam_warmup_global"),
    "cam_warmup_local": (FeSEMCAM, "cam_warmup_local"),
    "cam_cluster-ifca": (IFCA, "cam_cluster"),
    "cam_cluster-cam": (FeSEMCAM, "cam_cluster"),
}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_real_replies_pass_the_servers_checks(name) -> None:
    broadcast, reply = one_reply(*REPLIES[name])
    ReplyValidator(n_features=D).check(0, reply, broadcast)


def damaged(reply, tensors=None, scalars=None, drop=()):
    from fednovelty.federated import Message

    t = {k: v for k, v in reply.tensors.items() if k not in drop}
    return Message(reply.kind, {**t, **(tensors or {})}, {**reply.scalars, **(scalars or {})})


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda r: damaged(r, scalars={"cluster": 2}), r"'cluster' must be a cluster index"),
        (lambda r: damaged(r, scalars={"cluster": True}), r"'cluster' must be a cluster index"),
        (lambda r: damaged(r, scalars={"cluster": "0"}), r"'cluster' must be a cluster index"),
        (lambda r: damaged(r, drop=("loss",)), r"lacks tensor\(s\) \['loss'\]"),
        (lambda r: damaged(r, {"loss": torch.tensor(-1.0)}), "'loss' has negative values"),
        (lambda r: damaged(r, {"n_samples": torch.tensor(0.0)}), "at least one row"),
        (
            lambda r: damaged(r, {"cluster.weight": torch.full((2, D), float("nan"))}),
            "NaN or inf",
        ),
        (lambda r: damaged(r, {"cluster.bias": torch.zeros(3)}), r"'cluster.bias' has shape"),
        (lambda r: damaged(r, {"extra": torch.zeros(2)}), "unexpected tensor"),
        (lambda r: damaged(r, drop=("global.weight",)), r"lacks tensor\(s\) \['global.weight'\]"),
    ],
)
def test_broken_replies_are_named(damage, match) -> None:
    from fednovelty.federated.core.declarations import InvalidReplyError

    broadcast, reply = one_reply(IFCACAM, "cam_cluster")
    with pytest.raises(InvalidReplyError, match=match):
        ReplyValidator(n_features=D).check(0, damage(reply), broadcast)


# ----------------------------------------------------------------------------- settings
#: each method's class, as the paper names it, with its steps and whether it is additive.
CHAINS = {
    "FedAvg+": (FedAvgPlus, (EnsembleStep,), False),
    "IFCA": (IFCA, (MinLossClusterStep,), False),
    "FeSEM": (FeSEM, (LocalWarmupStep, KMeansClusterStep), False),
    "IFCA-CAM": (IFCACAM, (GlobalWarmupStep, MinLossClusterStep), True),
    "FeSEM-CAM": (FeSEMCAM, (LocalWarmupStep, KMeansClusterStep), True),
}


def test_each_method_is_its_own_registered_algorithm_composed_of_steps() -> None:
    assert list(CLUSTERED_METHODS) == list(CHAINS)  # the paper's Table 1 order
    for name, (cls, steps, additive) in CHAINS.items():
        assert CLUSTERED_METHODS[name] is cls and cls.method == name
        assert ALGORITHMS[cls.__name__] is cls and cls.additive is additive
        assert cls.config_class.__module__ == cls.__module__
        algorithm = cls(D, 2, n_clusters=2, rounds=4)
        assert tuple(type(step) for step in algorithm.steps) == steps
    assert "ClusteredAlgorithm" not in ALGORITHMS
    with pytest.raises(TypeError, match="the methods' base"):
        ClusteredAlgorithm(D, 2)


@pytest.mark.parametrize("method", list(CHAINS))
def test_settings_round_trip_through_json(method) -> None:
    cls = CLUSTERED_METHODS[method]
    algorithm = cls(
        6,
        4,
        n_clusters=2,
        rounds=20,
        learner_factory="mlp",
        momentum=0.5,
        empty_clusters="reseed",
        cluster_average="global",
        dtype=torch.float64,
    )
    assert algorithm_name(algorithm) == cls.__name__
    settings = algorithm_settings(algorithm)
    assert settings["learner"] == "mlp" and settings["dtype"] == "float64"
    assert "method" not in settings  # the class is the method
    rebuilt = build_algorithm(cls.__name__, json.loads(json.dumps(settings)))
    assert type(rebuilt) is cls and rebuilt.config == algorithm.config
    assert rebuilt.max_rounds == 20
    expected = {"FedAvg+": 0, "IFCA": 0, "FeSEM": 1, "IFCA-CAM": 6, "FeSEM-CAM": 6}[method]
    assert rebuilt.config.warmup_rounds == expected
    with pytest.raises(TypeError, match=f"{cls.__name__} takes a {cls.config_class.__name__}"):
        cls.from_config(ClusteredConfig(n_features=6, n_classes=4))  # the shared settings


def test_the_defaults_are_the_papers() -> None:
    config = IFCACAMConfig(n_features=784, n_classes=10)
    assert (config.rounds, config.warmup_rounds, config.local_steps) == (100, 30, 10)
    assert (config.learning_rate, config.momentum, config.batch_size) == (0.001, 0.9, 32)
    assert config.optimizer == "sgd" and config.n_clusters == 5
    assert FedAvgPlusConfig(n_features=784, n_classes=10).warmup_rounds == 0


@pytest.mark.parametrize(
    ("config", "settings", "match"),
    [
        (IFCAConfig, {"warmup_rounds": 3}, "IFCA has no warm-up"),
        (FedAvgPlusConfig, {"warmup_rounds": 1}, "FedAvgPlus has no warm-up"),
        (FeSEMConfig, {"warmup_rounds": 0}, "FeSEM clusters client models by k-means"),
        (IFCACAMConfig, {"rounds": 5, "warmup_rounds": 6}, "exceeds rounds=5"),
        (IFCAConfig, {"momentum": 1.0}, r"momentum must be in \[0, 1\)"),
        (IFCAConfig, {"n_classes": 1}, "n_classes must be >= 2"),
        (IFCAConfig, {"n_clusters": 2.5}, "n_clusters must be an integer"),
        (IFCAConfig, {"learner_factory": "rnn"}, "'learner' must be one of"),
        (IFCAConfig, {"empty_clusters": "drop"}, "empty_clusters must be one of"),
        (IFCAConfig, {"cluster_average": "median"}, "cluster_average must be one of"),
    ],
)
def test_bad_settings_are_named(config, settings, match) -> None:
    with pytest.raises(ValueError, match=match):
        config(**{"n_features": D, "n_classes": 2, **settings})


# ----------------------------------------------------------------------------- Flower
@pytest.fixture
def task_identity(monkeypatch):
    pytest.importorskip("flwr")
    from _flower_grid import set_task_identity

    set_task_identity(monkeypatch)


@pytest.mark.parametrize("method", [IFCACAM, FeSEMCAM, FedAvgPlus], ids=lambda m: m.method)
def test_flower_gives_the_simulations_numbers(method, task_identity) -> None:
    """Every node's ClientApp rebuilds the algorithm from the run config and keeps its
    k-means model in the node's state between rounds."""
    from _flower_grid import make_grid

    from fednovelty.runtime.flower.config import EngineConfig, algorithm_from_run_config
    from fednovelty.runtime.flower.results import decode_state, encode_state
    from fednovelty.runtime.flower.server import run_rounds

    clients, _ = rule_clients(n_clients=4, n_clusters=2, n_rows=30)
    params = {
        "n_features": D,
        "n_classes": 2,
        "n_clusters": 2,
        "rounds": 4,
        "learner": "linear",
        "learning_rate": 0.2,
        "dtype": "float64",
    }
    grid, run_config = make_grid(method.__name__, params, clients)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        on_flower = run_rounds(grid, algorithm_from_run_config(run_config), EngineConfig(seed=3))
    simulated = run_simulation(algorithm_from_run_config(run_config), clients, random_state=3)
    got, want = on_flower.state, simulated.state
    assert (got.client_clusters, got.cluster_sizes) == (want.client_clusters, want.cluster_sizes)
    for a, b in zip(
        [got.global_model, *got.cluster_models],
        [want.global_model, *want.cluster_models],
        strict=True,
    ):
        for name in b:
            assert_close_scaled(a[name], b[name], rtol=1e-12, err_msg=name)
    assert_close_scaled(got.losses, want.losses, rtol=1e-12)
    assert [(r.kind, r.replied, r.bytes_up) for r in on_flower.history] == [
        (r.kind, r.replied, r.bytes_up) for r in simulated.history
    ]
    tensors: dict = {}
    again = decode_state(encode_state(got, tensors), tensors)  # a result file's state
    assert isinstance(again, ClusteredState) and again.client_clusters == got.client_clusters
    assert torch.equal(again.cluster_models[1]["weight"], got.cluster_models[1]["weight"])
