"""Fed-CAM's Eq. 6 (``cluster_average="global"``): the server moves cluster model k to
``(1 - sum_{i in C_k} n_i / n) Theta_k + sum_{i in C_k} (n_i / n) theta_i``, with ``n`` the
rows of every client of the round, computed here by hand (numpy) on replies written by hand
and on one IFCA-CAM round whose client models are trained by hand (softmax regression, full
batches, heavy-ball momentum)."""

from __future__ import annotations

import numpy as np
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated import Message
from fednovelty.federated.clustered.ifca_cam import IFCACAM
from fednovelty.runtime import run_simulation

D, C = 3, 2  # features, classes


def make(cluster_average: str, **settings) -> IFCACAM:
    options = {
        "n_clusters": 3,
        "learner_factory": "linear",
        "dtype": torch.float64,
        "random_state": 0,
        "cluster_average": cluster_average,
        **settings,
    }
    return IFCACAM(D, C, **options)


def as_np(params: dict) -> tuple[np.ndarray, np.ndarray]:
    return params["weight"].numpy().copy(), params["bias"].numpy().copy()


def weighted(models, weights) -> tuple[np.ndarray, np.ndarray]:
    """sum_j weights[j] * models[j], weights used as given (not normalised)."""
    return (
        sum(w * m[0] for w, m in zip(weights, models, strict=True)),
        sum(w * m[1] for w, m in zip(weights, models, strict=True)),
    )


def assert_model(actual: dict, expected, rtol: float = 1e-12) -> None:
    assert_close_scaled(actual["weight"], expected[0], rtol=rtol, err_msg="weight")
    assert_close_scaled(actual["bias"], expected[1], rtol=rtol, err_msg="bias")


# ----------------------------------------------------------------------------- server step
def hand_replies(seed: int = 0):
    """Four replies of an IFCA-CAM round: clients of 3, 5, 7 and 11 rows in clusters 0, 0,
    2, 0 (cluster 1 empty); random cluster and global copies."""
    rng = np.random.default_rng(seed)
    rows, chosen = [3.0, 5.0, 7.0, 11.0], [0, 0, 2, 0]
    copies, globals_, replies = [], [], {}
    for cid, (n, k) in enumerate(zip(rows, chosen, strict=True)):
        theta = (rng.normal(size=(C, D)), rng.normal(size=C))
        theta0 = (rng.normal(size=(C, D)), rng.normal(size=C))
        copies.append(theta)
        globals_.append(theta0)
        tensors = {
            "cluster.weight": torch.tensor(theta[0]),
            "cluster.bias": torch.tensor(theta[1]),
            "global.weight": torch.tensor(theta0[0]),
            "global.bias": torch.tensor(theta0[1]),
            "n_samples": torch.tensor(n, dtype=torch.float64),
            "loss": torch.tensor(0.5, dtype=torch.float64),
        }
        replies[cid] = Message("cam_cluster", tensors, {"cluster": k})
    return rows, chosen, copies, globals_, replies


def test_the_server_step_is_eq6_with_the_rounds_rows_as_n() -> None:
    algorithm = make("global", rounds=1, warmup_rounds=0)
    state = algorithm.start()
    assert state.phase == "cam_cluster"
    start = [as_np(m) for m in state.cluster_models]
    rows, chosen, copies, globals_, replies = hand_replies()
    n = sum(rows)  # 26
    state, _ = algorithm.server_step(state, replies)
    for k in range(3):
        members = [i for i, c in enumerate(chosen) if c == k]
        share = sum(rows[i] for i in members) / n  # cluster 0: 19/26, 1: 0, 2: 7/26
        expected = weighted(
            [start[k]] + [copies[i] for i in members],
            [1.0 - share] + [rows[i] / n for i in members],
        )
        assert_model(state.cluster_models[k], expected)
    assert_model(state.global_model, weighted(globals_, [r / n for r in rows]))  # Eq. 9
    assert state.client_clusters == dict(enumerate(chosen))


def test_the_damping_is_what_separates_eq6_from_the_cluster_mean() -> None:
    """The same replies under ``cluster_average="cluster"``: cluster 0 becomes its clients'
    row-weighted mean, which differs from Eq. 6's damped step by ``(1 - 19/26)`` of the way
    back to the broadcast model."""
    rows, chosen, copies, _, replies = hand_replies()
    members = [i for i, c in enumerate(chosen) if c == 0]
    in_cluster = sum(rows[i] for i in members)
    mean = weighted([copies[i] for i in members], [rows[i] / in_cluster for i in members])
    damped, plain = (
        make("global", rounds=1, warmup_rounds=0),
        make("cluster", rounds=1, warmup_rounds=0),
    )
    start = as_np(damped.start().cluster_models[0])
    got_damped = damped.server_step(damped.start(), replies)[0].cluster_models[0]
    got_plain = plain.server_step(plain.start(), replies)[0].cluster_models[0]
    assert_model(got_plain, mean)
    keep = 1.0 - in_cluster / sum(rows)
    assert_model(got_damped, weighted([start, mean], [keep, 1.0 - keep]))
    gap = np.abs(got_damped["weight"].numpy() - mean[0]).max()
    assert gap > 0.05 * np.abs(mean[0]).max()  # the two rules give different models


# ----------------------------------------------------------------------------- one whole round
def softmax_grads(W, b, X, y, offset):
    """d/d(W, b) of the mean cross-entropy of logits ``X W^T + b + offset``."""
    z = X @ W.T + b + offset
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - np.eye(C)[y]) / len(y)
    return g.T @ X, g.sum(0)


def mean_loss(W, b, X, y, offset) -> float:
    z = X @ W.T + b + offset
    z = z - z.max(1, keepdims=True)
    return float(np.mean(np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]))


def momentum_sgd(model, X, y, steps, lr, offset, momentum=0.9):
    """Full-batch SGD with torch's heavy-ball momentum (the first buffer is the gradient)."""
    W, b = model[0].copy(), model[1].copy()
    buffers = None
    for _ in range(steps):
        gW, gb = softmax_grads(W, b, X, y, offset)
        buffers = (
            (gW, gb)
            if buffers is None
            else (momentum * buffers[0] + gW, momentum * buffers[1] + gb)
        )
        W, b = W - lr * buffers[0], b - lr * buffers[1]
    return W, b


def test_one_ifca_cam_round_under_eq6_equals_the_hand_computation() -> None:
    """Three clients (two share a labelling rule, one has the opposite; the initial
    models of ``random_state=3`` split them 2 + 1), no warm-up, two local steps: each client
    picks the min-loss cluster of ``h + f_k``, trains ``f`` on ``h``'s residual and ``h`` on
    ``f``'s; the server applies Eq. 6 and Eq. 9."""
    gen = torch.Generator().manual_seed(0)
    clients, data = [], []
    for rule, n_rows in [(1.0, 8), (-1.0, 13), (1.0, 18)]:
        X = torch.randn(n_rows, D, dtype=torch.float64, generator=gen)
        y = (rule * X[:, 0] > 0).long()
        clients.append((X, y))
        data.append((X.numpy(), y.numpy()))
    lr, steps = 0.5, 2
    algorithm = make(
        "global", n_clusters=2, rounds=1, warmup_rounds=0, local_steps=steps,
        learning_rate=lr, batch_size=64, random_state=3,
    )  # fmt: skip
    state0 = algorithm.start()
    start = [as_np(m) for m in state0.cluster_models]
    glob = as_np(state0.global_model)
    rows = [len(y) for _, y in data]
    n = sum(rows)
    chosen, clusters, globals_ = [], [], []
    for X, y in data:
        h = X @ glob[0].T + glob[1]
        k = int(np.argmin([mean_loss(*m, X, y, h) for m in start]))
        f = X @ start[k][0].T + start[k][1]
        chosen.append(k)
        clusters.append(momentum_sgd(start[k], X, y, steps, lr, offset=h))
        globals_.append(momentum_sgd(glob, X, y, steps, lr, offset=f))
    assert chosen == [1, 0, 1]  # both clusters joined, neither by every client: Eq. 6 damps
    state = run_simulation(algorithm, clients).state
    assert state.client_clusters == dict(enumerate(chosen))
    assert_model(state.global_model, weighted(globals_, [r / n for r in rows]), rtol=1e-10)
    for k in range(2):
        members = [i for i, c in enumerate(chosen) if c == k]
        share = sum(rows[i] for i in members) / n
        expected = weighted(
            [start[k]] + [clusters[i] for i in members],
            [1.0 - share] + [rows[i] / n for i in members],
        )
        assert_model(state.cluster_models[k], expected, rtol=1e-10)
