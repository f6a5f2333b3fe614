"""pFedEM's paper settings (``PAPER_ALGORITHM``) against the paper's equations by hand:
Algorithm 1 line 5 (``estep_start="broadcast"``: the E-step reads the broadcast weights,
not the client's kept ones), Eq. 5 (``submodel_weights="clients"``: sub-models averaged with
``p_i = |D_i| / sum_j |D_j|``, also through the robust path), and the defaults unchanged."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.stats import trim_mean

from fednovelty import PFedEMDetector
from fednovelty.federated import PFedEM, PrivacyPolicy
from fednovelty.federated.joint_models.pfedem import PAPER_ALGORITHM, PFedEMConfig, learner_weights
from fednovelty.federated.registry import algorithm_settings, build_algorithm
from fednovelty.federated.trust import gate
from fednovelty.runtime import run_simulation

NO_FLOOR = PrivacyPolicy(min_rows=1)
MEANS0 = np.array([[-1.0, 0.0], [1.0, 0.0]])


def clients_of(shares: list[float], sizes: list[int], seed: int, gap: float = 1.5):
    """Clients in 2-D, each a share ``shares[i]`` of population A at (-gap, 0) (label
    ``x2 > 0``) and the rest of B at (gap, 0) (label ``x2 < 0``), ``sizes[i]`` rows."""
    rng = np.random.default_rng(seed)
    clients = []
    for share, n in zip(shares, sizes, strict=True):
        a = np.arange(n) < round(share * n)
        X = np.where(a[:, None], [-gap, 0.0], [gap, 0.0]) + rng.normal(size=(n, 2))
        y = np.where(a, X[:, 1] > 0, X[:, 1] < 0).astype(np.int64)
        clients.append((torch.tensor(X), torch.tensor(y)))
    return clients


def start(max_iter: int = 1, **kw) -> PFedEM:
    init = {
        "weights_init": [0.5, 0.5],
        "means_init": MEANS0.tolist(),
        "precisions_init": [[1.0, 1.0], [1.0, 1.0]],
    }
    return PFedEM(2, 2, max_iter=max_iter, tol=0.0, local_epochs=2, learning_rate=0.5, **init, **kw)


def posteriors(X: np.ndarray, weights, means, precisions_cholesky) -> np.ndarray:
    """Eq. 8 by hand for diagonal Gaussians: (n, K) ``pi_k N(x; mu_k, sigma_k) / sum``,
    with ``precisions_cholesky`` (K, d) the inverse standard deviations."""
    weights, means, prec = (
        np.asarray(a, dtype=np.float64) for a in (weights, means, precisions_cholesky)
    )
    d = X.shape[1]
    diff = (X[:, None, :] - means[None]) * prec[None]  # (n, K, d)
    log_n = np.log(prec).sum(1)[None] - 0.5 * d * math.log(2 * math.pi) - 0.5 * (diff**2).sum(2)
    joint = log_n + np.log(weights)[None]
    joint -= joint.max(1, keepdims=True)
    gamma = np.exp(joint)
    return gamma / gamma.sum(1, keepdims=True)


def eq9(X: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """Eq. 9: the client's means (K, d)."""
    return gamma.T @ X / gamma.sum(0)[:, None]


def tensors_of(message) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in message.tensors.items()}


# ---------------------------------------------------------------- Algorithm 1 line 5
def two_rounds(**settings):
    """Round 1 and the clients' round-2 replies, stepped by hand: the clients (their kept
    state in their contexts), the round-2 broadcast and replies."""
    clients = clients_of([0.9, 0.15], [60, 40], seed=0)
    algorithm = start(max_iter=2, **settings)
    state = algorithm.start()
    contexts = {c: gate.client_context(c, policy=NO_FLOOR) for c in range(len(clients))}
    first = algorithm.configure(state)
    replies = {
        c: gate.answer(algorithm, data, first, contexts[c]) for c, data in enumerate(clients)
    }
    algorithm.server_step(state, replies)
    second = algorithm.configure(state)
    answers = {
        c: gate.answer(algorithm, data, second, contexts[c]) for c, data in enumerate(clients)
    }
    return clients, tensors_of(first), replies, tensors_of(second), answers


@pytest.mark.parametrize("estep_start", ["kept", "broadcast"])
def test_line_5_the_e_step_starts_from_the_broadcast_weights(estep_start):
    clients, first, _, second, answers = two_rounds(estep_start=estep_start)
    # Eq. 14 by hand: the round-2 broadcast weights are the pooled hard-count shares
    hard1 = [
        np.bincount(posteriors(X.numpy(), first["weights"], MEANS0, np.ones((2, 2))).argmax(1),
                    minlength=2)
        for X, _ in clients
    ]  # fmt: skip
    total = np.sum(hard1, axis=0)
    assert_close_scaled(second["weights"], total / total.sum(), rtol=1e-12)
    gap = 0.0
    for c, (X, _) in enumerate(clients):
        X = X.numpy()
        gamma1 = posteriors(X, first["weights"], first["means"], first["precisions_cholesky"])
        kept = gamma1.mean(0)  # Eq. 11 of round 1, what "kept" carries into round 2
        args = (second["means"], second["precisions_cholesky"])
        by_broadcast = posteriors(X, second["weights"], *args)
        by_kept = posteriors(X, kept, *args)
        gamma = by_broadcast if estep_start == "broadcast" else by_kept
        reply = tensors_of(answers[c])
        assert_close_scaled(reply["client_means"], eq9(X, gamma), rtol=1e-10, err_msg=f"{c}")
        assert reply["hard_counts"].tolist() == np.bincount(gamma.argmax(1), minlength=2).tolist()
        gap = max(gap, float(np.abs(eq9(X, by_broadcast) - eq9(X, by_kept)).max()))
    # the case tells the two apart: the kept and the broadcast weights move Eq. 9 visibly
    assert gap > 1e-2


def test_the_first_round_is_the_same_under_both_starts():
    # no client holds kept weights yet: both read the broadcast (the existing behaviour)
    kept = two_rounds(estep_start="kept")[2]
    broadcast = two_rounds(estep_start="broadcast")[2]
    for c in kept:
        for name, value in kept[c].tensors.items():
            assert torch.equal(value, broadcast[c].tensors[name]), name


# ---------------------------------------------------------------- Eq. 5
def one_round(clients, **settings):
    """One round under ``run_simulation``; the replies the server's pFedEM step folded
    (after the gate and the server's validation) and the result."""
    algorithm = start(**settings)
    step = algorithm.steps[-1]
    seen: dict[int, dict[str, np.ndarray]] = {}
    server_step = step.server_step

    def spy(state, replies):
        seen.update({cid: tensors_of(r) for cid, r in replies.items()})
        return server_step(state, replies)

    step.server_step = spy
    broadcast = {
        k: v.numpy().copy() for k, v in algorithm.configure(algorithm.start()).tensors.items()
    }
    result = run_simulation(algorithm, clients, privacy=NO_FLOOR)
    return seen, broadcast, result


EQ5_CLIENTS = {"shares": [0.7, 0.4, 0.0], "sizes": [30, 60, 90]}  # client 2: no rows of A


def learner_arrays(learners) -> list[dict[str, np.ndarray]]:
    return [{name: v.numpy() for name, v in p.items()} for p in learners]


def test_eq_5_averages_sub_models_with_the_clients_row_shares():
    clients = clients_of(**EQ5_CLIENTS, seed=1, gap=3.0)
    seen, broadcast, result = one_round(clients, submodel_weights="clients")
    sizes = np.array(EQ5_CLIENTS["sizes"], dtype=np.float64)
    p = sizes / sizes.sum()  # Eq. 5's p_i = |D_i| / sum_j |D_j|
    hard = []
    for X, _ in clients:
        gamma = posteriors(X.numpy(), [0.5, 0.5], MEANS0, np.ones((2, 2)))
        hard.append(np.bincount(gamma.argmax(1), minlength=2))
    hard = np.array(hard)
    a = int(np.argmin(MEANS0[:, 0]))
    assert hard[2, a] == 0  # client 2's partition of A is empty: it does not train it
    for k, learner in enumerate(learner_arrays(result.state.learners)):
        for name, value in learner.items():
            start_value = broadcast[f"learner.{k}.{name}"]
            copies = [seen[c][f"learner.{k}.{name}"] for c in range(3)]
            if hard[2, k] == 0:  # sent as broadcast: a zero update in Eq. 5
                np.testing.assert_array_equal(copies[2], start_value)
            # Eq. 5 as written: w_k + sum_i p_i (w_ik - w_k)
            expected = start_value + sum(
                pi * (ci - start_value) for pi, ci in zip(p, copies, strict=True)
            )
            assert_close_scaled(value, expected, rtol=1e-10, err_msg=f"{k} {name}")
    # the default weights the copies by the hard counts |D_ik| instead: another model
    seen_c, _, counted = one_round(clients)
    for k, learner in enumerate(learner_arrays(counted.state.learners)):
        for name, value in learner.items():
            copies = [seen_c[c][f"learner.{k}.{name}"] for c in range(3)]
            expected = (
                sum(h * ci for h, ci in zip(hard[:, k], copies, strict=True)) / hard[:, k].sum()
            )
            assert_close_scaled(value, expected, rtol=1e-10, err_msg=f"counts {k} {name}")
    moved = learner_arrays(result.state.learners)[a]["weight"]
    assert np.abs(moved - learner_arrays(counted.state.learners)[a]["weight"]).max() > 1e-3


def test_a_robust_aggregation_admits_every_replying_clients_copy_under_eq_5():
    clients = clients_of(**EQ5_CLIENTS, seed=2, gap=3.0)
    a = int(np.argmin(MEANS0[:, 0]))
    name = f"learner.{a}.weight"
    for weights, admitted in (("clients", [0, 1, 2]), ("counts", [0, 1])):
        seen, broadcast, result = one_round(
            clients, submodel_weights=weights, aggregation="trimmed", trim=0.34
        )
        # floor(0.34 n) copies cut at each end: the median of 3, the mean of 2
        expected = trim_mean(np.stack([seen[c][name] for c in admitted]), 0.34, axis=0)
        actual = result.state.learners[a]["weight"].numpy()
        assert_close_scaled(actual, expected, rtol=1e-12, err_msg=weights)
    np.testing.assert_array_equal(seen[2][name], broadcast[name])  # client 2 did not train A


def test_learner_weights_by_hand_and_under_differential_privacy():
    hard = torch.tensor([[3.0, 0.0], [1.0, 5.0]], dtype=torch.float64)
    rows = torch.tensor([3.0, 6.0], dtype=torch.float64)
    assert learner_weights(hard, None).tolist() == [[3.0, 0.0], [1.0, 5.0]]
    assert learner_weights(hard, None, rows).tolist() == [[3.0, 3.0], [6.0, 6.0]]
    # central DP: exact counts leave no weight; local DP: the noisy row counts floored at 0
    assert learner_weights(hard, "central", rows).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    noisy = torch.tensor([-0.5, 6.2], dtype=torch.float64)
    assert learner_weights(hard, "local", noisy).tolist() == [[0.0, 0.0], [6.2, 6.2]]


# ---------------------------------------------------------------- settings
def test_defaults_unchanged_and_the_paper_settings_round_trip():
    config = PFedEMConfig(n_components=2, n_classes=3)
    assert (config.estep_start, config.submodel_weights) == ("kept", "counts")
    assert config.gaussian_aggregation == "paper"
    algorithm = PFedEM(2, 3, **PAPER_ALGORITHM)
    again = build_algorithm("PFedEM", algorithm_settings(algorithm))
    assert again.config == algorithm.config
    assert again.config.estep_start == "broadcast" and again.config.submodel_weights == "clients"
    with pytest.raises(ValueError, match="estep_start must be one of"):
        PFedEM(2, 3, estep_start="global")
    with pytest.raises(ValueError, match="submodel_weights must be one of"):
        PFedEM(2, 3, submodel_weights="rows")
    detector = PFedEMDetector(2, **PAPER_ALGORITHM)
    detector.classes_ = np.arange(2)
    passed = detector._algorithm(2, 0, None).config
    assert (passed.estep_start, passed.submodel_weights) == ("broadcast", "clients")
