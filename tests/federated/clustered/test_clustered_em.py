"""ClusteredEM: global components plus each cluster's own, exact summed
statistics, IFCA- and FeSEM-style assignment, degenerate cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from sklearn.metrics import adjusted_rand_score

from fednovelty.federated import Message
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.clustered.mixture_clusters import (
    allowed_components,
    cluster_log_likelihoods,
    hellinger_kmeans,
    partition_components,
)
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.registry import algorithm_name, algorithm_settings, build_algorithm
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.reply_form import check_reply
from fednovelty.mixture import log_gaussian_prob, params_from_stats
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.stats import stats_from_resp
from fednovelty.runtime import run_simulation

PLACES = ([6.0, 0.0], [0.0, 6.0], [-6.0, -6.0])


def clustered_clients(per_cluster: int = 4, n: int = 120, seed: int = 0):
    """Clients of three true clusters: half their rows from a blob all share (at 0), half
    from their cluster's own blob. Returns (clients, true cluster per client)."""
    rng = np.random.default_rng(seed)
    clients, truth = [], []
    for j, place in enumerate(PLACES):
        for _ in range(per_cluster):
            rows = np.r_[rng.normal(0, 1, (n // 2, 2)), rng.normal(place, 1, (n // 2, 2))]
            clients.append(torch.as_tensor(rows))
            truth.append(j)
    return clients, truth


def run_until_clustered(algorithm, clients):
    """Drive the algorithm's rounds by hand until its first clustered round is due; returns
    (state, each client's context)."""
    contexts = {c: gate.client_context(c) for c in range(len(clients))}
    state = algorithm.start()
    while state.phase != "cluster_em":
        message = algorithm.configure(state)
        replies = {c: algorithm.client_step(X, message, contexts[c]) for c, X in enumerate(clients)}
        state, _ = algorithm.server_step(state, replies)
    return state, contexts


@pytest.mark.parametrize("assignment", ["likelihood", "summary"])
def test_clusters_are_recovered_and_components_placed(assignment) -> None:
    clients, truth = clustered_clients()
    algorithm = ClusteredEM(
        3, n_clusters=3, cluster_components=1, assignment=assignment, random_state=0
    )
    state = run_simulation(algorithm, clients).state
    found = [state.client_clusters[c] for c in range(len(clients))]
    assert adjusted_rand_score(truth, found) == 1.0
    assert state.cluster_sizes[-1] == [4, 4, 4]
    # each cluster's own component sits on its cluster's blob
    owners = state.component_clusters.tolist()
    for j in range(3):
        mean = state.params.means[owners.index(j)].numpy()
        members = [c for c in range(len(clients)) if found[c] == j]
        place = np.asarray(PLACES[truth[members[0]]])
        assert np.linalg.norm(mean - place) < 0.5


def test_one_clustered_round_equals_the_pooled_masked_m_step() -> None:
    """The round's M-step is the M-step of every client's E-step statistics under its
    masked weights, computed here row by row on the pooled data."""
    clients, _ = clustered_clients(per_cluster=2, n=60)
    algorithm = ClusteredEM(
        3, n_clusters=3, cluster_components=1, warmup=3, max_iter=1, tol=0.0, random_state=1
    )
    state, contexts = run_until_clustered(algorithm, clients)
    params = state.params
    message = algorithm.configure(state)
    shift = moment_shift(params)
    total = None
    for c, X in enumerate(clients):
        log_prob = log_gaussian_prob(X, params.means, params.precisions_cholesky, "full")
        scores = cluster_log_likelihoods(log_prob, state.cluster_log_weights)
        cluster = int(torch.argmax(scores))
        allowed = allowed_components(state.component_clusters, 3)[cluster]
        own = contexts[c].state["log_weights"].masked_fill(~allowed, -math.inf)
        log_w = own - torch.logsumexp(own, 0)  # its warm-up weights on its components
        resp = torch.softmax(log_prob + log_w, dim=1)
        stats = stats_from_resp(X, resp, "full", shift)
        total = stats if total is None else total + stats
    expected = params_from_stats(total, algorithm.config.reg_covar)
    replies = {c: algorithm.client_step(X, message, contexts[c]) for c, X in enumerate(clients)}
    for reply in replies.values():
        check_reply(reply, message, 2)  # the server's validator accepts every reply
    state, metrics = algorithm.server_step(state, replies)
    for name in ("means", "precisions_cholesky"):
        assert_close_scaled(state.params.tensors()[name], expected.tensors()[name], rtol=1e-10)
    assert metrics["phase"] == "cluster_em" and state.phase == "done"


def test_client_statistics_stay_inside_its_cluster() -> None:
    clients, _ = clustered_clients(per_cluster=2, n=60)
    algorithm = ClusteredEM(3, n_clusters=3, cluster_components=1, warmup=3, random_state=0)
    state, contexts = run_until_clustered(algorithm, clients)
    message = algorithm.configure(state)
    reply = algorithm.client_step(clients[0], message, contexts[0])
    cluster = reply.scalars["cluster"]
    allowed = allowed_components(state.component_clusters, 3)[cluster]
    assert bool((reply.tensors["counts"][~allowed] == 0).all())
    assert float(reply.tensors["counts"][allowed].sum()) == pytest.approx(60)
    kept = contexts[0].state["log_weights"]
    assert bool(torch.isneginf(kept[~allowed]).all())
    assert float(kept.exp().sum()) == pytest.approx(1.0)


def test_the_validator_refuses_statistics_on_another_cluster_and_unknown_clusters() -> None:
    clients, _ = clustered_clients(per_cluster=2, n=60)
    algorithm = ClusteredEM(3, n_clusters=3, cluster_components=1, warmup=3, random_state=0)
    state, contexts = run_until_clustered(algorithm, clients)
    message = algorithm.configure(state)
    reply = algorithm.client_step(clients[0], message, contexts[0])
    cluster = reply.scalars["cluster"]
    foreign = int(
        ((state.component_clusters != -1) & (state.component_clusters != cluster)).nonzero()[0]
    )
    counts = reply.tensors["counts"].clone()
    counts[foreign] = 1.0
    forged = Message(reply.kind, {**reply.tensors, "counts": counts}, reply.scalars)
    with pytest.raises(InvalidReplyError, match="another cluster"):
        check_reply(forged, message, 2)
    lost = Message(reply.kind, reply.tensors, {**reply.scalars, "cluster": 3})
    with pytest.raises(InvalidReplyError, match="not one of the 3 clusters"):
        check_reply(lost, message, 2)


def test_an_empty_cluster_keeps_its_components_and_is_recorded() -> None:
    clients, _ = clustered_clients(per_cluster=2, n=60)
    algorithm = ClusteredEM(
        3,
        n_clusters=3,
        cluster_components=1,
        assignment="summary",
        warmup=3,
        max_iter=1,
        random_state=0,
    )
    state, contexts = run_until_clustered(algorithm, clients)
    state.assignment = dict.fromkeys(range(len(clients)), 0)  # the server sends all to 0
    before = state.params.means.clone()
    message = algorithm.configure(state)
    replies = {c: algorithm.client_step(X, message, contexts[c]) for c, X in enumerate(clients)}
    state, metrics = algorithm.server_step(state, replies)
    assert state.cluster_sizes[-1] == [6, 0, 0]
    assert metrics["empty_clusters"] == 2
    assert [e["cluster"] for e in state.events] == [1, 2]
    owners = state.component_clusters
    unused = (owners == 1) | (owners == 2)
    assert torch.equal(state.params.means[unused], before[unused])  # copied, not recomputed


def test_a_client_below_its_floor_skips_and_has_no_cluster() -> None:
    clients, _ = clustered_clients(per_cluster=2, n=60)
    clients.append(torch.randn(3, 2, dtype=torch.float64))
    algorithm = ClusteredEM(3, n_clusters=3, cluster_components=1, random_state=0)
    state = run_simulation(algorithm, clients, privacy=PrivacyPolicy(min_rows=5)).state
    assert len(clients) - 1 not in state.client_clusters
    assert sorted(state.client_clusters) == list(range(len(clients) - 1))


def test_settings_round_trip_and_named_errors() -> None:
    algorithm = ClusteredEM(4, n_clusters=3, cluster_components=2, assignment="summary", warmup=5)
    assert algorithm.config.total_components == 10
    rebuilt = build_algorithm(algorithm_name(algorithm), algorithm_settings(algorithm))
    assert rebuilt.config == algorithm.config
    with pytest.raises(ValueError, match="assignment must be one of"):
        ClusteredEM(2, assignment="nearest")
    with pytest.raises(ValueError, match=r"mixture_weights must be one of \['personal'\]"):
        ClusteredEM(2, mixture_weights="global")
    clients, _ = clustered_clients(per_cluster=1, n=60)
    with pytest.raises(ValueError, match="n_clusters=4 exceeds the 3 client"):
        run_simulation(ClusteredEM(3, n_clusters=4, cluster_components=1), clients)


def test_each_cluster_takes_the_components_its_members_use_most() -> None:
    members = [
        torch.tensor([[0.1, 0.1, 0.7, 0.1], [0.1, 0.1, 0.5, 0.3]], dtype=torch.float64),
        torch.tensor([[0.2, 0.7, 0.0, 0.1]], dtype=torch.float64),
    ]
    owners, log_w = partition_components(members, 1)
    assert owners.tolist() == [-1, 1, 0, -1]  # 2 is cluster 0's, 1 is cluster 1's
    w = log_w.exp()
    assert float(w[0, 1]) == 0.0 and float(w[1, 2]) == 0.0
    assert_close_scaled(w[0], torch.tensor([0.1, 0.0, 0.6, 0.2], dtype=torch.float64) / 0.9)
    assert_close_scaled(w[1], torch.tensor([0.2, 0.7, 0.0, 0.1], dtype=torch.float64))
    owners, _ = partition_components(members, 2)  # a second pass, clusters in turn
    assert owners.tolist() == [1, 1, 0, 0]


def test_cluster_log_likelihoods_and_kmeans_by_hand() -> None:
    log_prob = torch.log(torch.tensor([[0.5, 0.1], [0.2, 0.4]], dtype=torch.float64))
    log_w = torch.log(torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64))
    got = cluster_log_likelihoods(log_prob, log_w)
    want = [
        (math.log(0.5) + math.log(0.2)) / 2,
        (math.log(0.3) + math.log(0.3)) / 2,
    ]
    assert_close_scaled(got, torch.tensor(want, dtype=torch.float64))
    rows = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]], dtype=torch.float64)
    labels, centers = hellinger_kmeans(rows, 2, torch.Generator().manual_seed(0))
    assert labels[0] == labels[1] != labels[2] == labels[3]
    assert centers.shape == (2, 2)
