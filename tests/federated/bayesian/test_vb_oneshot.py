"""One-shot federated VB: local posteriors under one prior, matched and combined once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled

from fednovelty.federated import PrivacyPolicy, build_algorithm
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.bayesian.vb_oneshot import (
    FederatedVBOneShot,
    VBOneShotConfig,
    match_components,
)
from fednovelty.federated.core.base import client_generator, derived_seed
from fednovelty.federated.registry import algorithm_settings
from fednovelty.federated.trust import gate
from fednovelty.mixture.kmeans import kmeans, one_hot
from fednovelty.mixture.stats import stats_from_resp
from fednovelty.mixture.variational import fit_vb, vb_log_resp, vb_m_step
from fednovelty.mixture.vb_predictive import vb_predictive_log_prob
from fednovelty.mixture.vb_prior import default_prior
from fednovelty.runtime import run_simulation

torch.set_num_threads(1)

NO_FLOOR = PrivacyPolicy(min_rows=1)
CENTERS = np.array([[0.0, 0.0, 0.0], [5.0, 1.0, 0.0], [-2.0, 5.0, 1.0]])


def blobs(n_per: int = 150, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = np.concatenate([c + rng.normal(size=(n_per, 3)) * [1.0, 0.6, 0.8] for c in CENTERS])
    return X[rng.permutation(len(X))]


def split(X: np.ndarray, n_clients: int) -> list[torch.Tensor]:
    return [torch.as_tensor(part) for part in np.array_split(X, n_clients)]


def order_by_means(posterior, reference_means):
    """Indices of ``posterior``'s components closest to each reference mean."""
    distances = torch.cdist(reference_means, posterior.means)
    return distances.argmin(1)


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_one_client_is_the_local_fit_up_to_matching(covariance_type):
    X = torch.as_tensor(blobs(100))
    k = 5
    algorithm = FederatedVBOneShot(
        k, covariance_type=covariance_type, weight_concentration_prior_type="dirichlet_distribution"
    )
    state = run_simulation(algorithm, [X], privacy=NO_FLOOR).state
    # the client's fit, by hand: the pooled-moments prior, k-means labels, fit_vb, the
    # statistics of the converged responsibilities
    prior = default_prior(
        X, k, covariance_type, weight_concentration_prior_type="dirichlet_distribution"
    )
    _, labels = kmeans(X, k, generator=client_generator(derived_seed(0, 0), 0))
    shift = prior.mean
    init = vb_m_step(stats_from_resp(X, one_hot(labels, k, X), covariance_type, shift), prior)
    fitted = fit_vb(X, init, prior).posterior
    resp = vb_log_resp(X, fitted)[1].exp()
    local = vb_m_step(stats_from_resp(X, resp, covariance_type, shift), prior)
    for name, value in local.tensors().items():
        assert_close_scaled(state.client_posteriors[0].tensors()[name], value, rtol=1e-7)
    # one client: every used slot is one of its components, unchanged
    counts = resp.sum(0)
    used = counts >= 1.0
    slot = state.assignments[0]
    assert torch.equal(slot >= 0, used)
    post = state.posterior
    for c in torch.nonzero(used).flatten().tolist():
        s = int(slot[c])
        for name in ("means", "mean_precision", "degrees_of_freedom", "covariances"):
            assert_close_scaled(getattr(post, name)[s], getattr(local, name)[c], rtol=1e-7)
        assert_close_scaled(post.weight_concentration[s], local.weight_concentration[c], rtol=1e-7)


@pytest.mark.parametrize("how", ["natural", "moment"])
@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_iid_clients_come_close_to_exact(how, covariance_type):
    X = blobs(200)
    test = torch.as_tensor(blobs(100, seed=1))
    clients = split(X, 4)
    one_shot = FederatedVBOneShot(
        6, covariance_type=covariance_type, posterior_aggregation=how, random_state=0
    )
    state = run_simulation(one_shot, clients).state
    exact = run_simulation(FederatedVB(6, covariance_type=covariance_type), clients).state
    assert state.effective_n_components == 3
    assert state.dropped == {}
    means = state.posterior.means[order_by_means(state.posterior, torch.as_tensor(CENTERS))]
    assert float((means - torch.as_tensor(CENTERS)).abs().max()) < 0.4
    assert_close_scaled(
        state.posterior.weights.sort(descending=True).values[:3], [1 / 3] * 3, rtol=0.05
    )
    got = float(vb_predictive_log_prob(test, state.posterior).mean())
    want = float(vb_predictive_log_prob(test, exact.posterior).mean())
    assert got > want - 0.02  # mean log-density per held-out row
    assert state.rounds == 2


def test_the_two_rules_differ_when_clients_disagree():
    rng = np.random.default_rng(3)
    clients = [
        torch.as_tensor(rng.normal(size=(120, 2)) * scale + shift)
        for scale, shift in ((0.5, 0.0), (2.0, 0.5))
    ]
    states = {
        how: run_simulation(
            FederatedVBOneShot(1, posterior_aggregation=how, match_threshold=10.0), clients
        ).state
        for how in ("natural", "moment")
    }
    natural, moment = states["natural"].posterior, states["moment"].posterior
    # natural averaging averages covariances (plus the means' spread); moment matching
    # inverts the average precision: the narrower client weighs more.
    assert torch.linalg.det(natural.covariances[0]) > torch.linalg.det(moment.covariances[0])


def _round_replies(algorithm, clients, policy=NO_FLOOR):
    state = algorithm.start()
    while True:
        message = algorithm.configure(state)
        replies = {
            cid: algorithm.client_step(X, message, gate.client_context(cid, policy=policy))
            for cid, X in enumerate(clients)
        }
        if message.kind == "vb_local":
            return state, replies
        state, _ = algorithm.server_step(state, replies)


def _tamper(reply, **tensors):
    return type(reply)(reply.kind, {**reply.tensors, **tensors}, dict(reply.scalars))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: {"counts": t["counts"] * 10}, "more than the"),
        (lambda t: {"sums": t["sums"] * float("nan")}, "NaN"),
        (lambda t: {"second": t["second"][:1]}, "shape"),
        (lambda t: {"n_samples": t["n_samples"] + 5}, "declared"),
        (lambda t: {"second": -t["second"]}, "positive semi-definite"),
    ],
)
def test_tampered_replies_are_dropped_by_name(change, reason):
    clients = split(blobs(60), 3)
    algorithm = FederatedVBOneShot(4)
    state, replies = _round_replies(algorithm, clients)
    replies[1] = _tamper(replies[1], **change(replies[1].tensors))
    state, metrics = algorithm.server_step(state, replies)
    assert list(state.dropped) == [1] and reason in state.dropped[1]
    assert metrics["n_clients"] == 2 and sorted(state.client_posteriors) == [0, 2]
    assert bool(torch.isfinite(state.posterior.means).all())


def test_every_reply_bad_fails_the_round_with_the_reasons():
    clients = split(blobs(30), 2)
    algorithm = FederatedVBOneShot(3)
    state, replies = _round_replies(algorithm, clients)
    replies = {cid: _tamper(r, counts=r.tensors["counts"] * 100) for cid, r in replies.items()}
    with pytest.raises(ValueError, match="no client sent a valid local posterior"):
        algorithm.server_step(state, replies)


def test_degenerate_clients():
    X = blobs(60)
    clients = [*split(X, 3), torch.as_tensor(X[:1]), torch.as_tensor(X[:7])]
    # below the floor of 5 rows: the one-row client skips both rounds; the 7-row client
    # fits one k-means cluster and suppresses every component backed by < 5 rows
    result = run_simulation(FederatedVBOneShot(4), clients)
    state = result.state
    assert sorted(state.client_posteriors) == [0, 1, 2, 4]
    counts = state.posterior.weight_concentration[0] - 1.0
    assert bool(torch.isfinite(state.posterior.means).all())
    assert float(counts.sum()) <= len(X) + 7 + 1e-6
    # no floor: a one-row client takes part (one k-means cluster, one row behind it)
    tiny = [torch.as_tensor(X[:1]), torch.as_tensor(X[1:40])]
    alone = run_simulation(FederatedVBOneShot(1), tiny, privacy=NO_FLOOR).state
    assert sorted(alone.client_posteriors) == [0, 1]
    assert int((alone.assignments[0] >= 0).sum()) == 1
    post = alone.posterior
    assert bool(torch.isfinite(post.means).all()) and bool(torch.isfinite(post.covariances).all())
    assert float(post.weight_concentration[0, 0]) == pytest.approx(1.0 + 40.0, rel=1e-9)


def test_match_components_pairs_like_with_like_and_keeps_clients_apart():
    means = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.1, 0.0], [10.2, 0.1], [0.05, 0.1]])
    covs = torch.eye(2).expand(5, 2, 2).double()
    counts = torch.tensor([50.0, 40.0, 30.0, 20.0, 5.0], dtype=torch.float64)
    owners = torch.tensor([0, 0, 1, 1, 1])  # client 1 has two components near the origin
    reference = (torch.tensor([5.0, 0.0]).double(), 30.0 * torch.eye(2).double())
    slots = match_components(means.double(), covs, counts, owners, reference, 4, 0.5)
    assert slots.tolist() == [0, 1, 0, 1, 2]
    capped = match_components(means.double(), covs, counts, owners, reference, 2, 0.5)
    assert capped.tolist() == [0, 1, 0, 1, 0]  # no room: the closest slot after all


def test_settings_are_checked_and_travel_as_json():
    with pytest.raises(ValueError, match="posterior_aggregation"):
        VBOneShotConfig(n_components=3, posterior_aggregation="mean")
    with pytest.raises(ValueError, match="match_threshold"):
        VBOneShotConfig(n_components=3, match_threshold=0.0)
    with pytest.raises(ValueError, match=r"covariance_type must be one of \['full', 'diag'"):
        VBOneShotConfig(n_components=3, covariance_type="tied")
    with pytest.raises(TypeError, match="means_init"):  # local k-means starts every client
        VBOneShotConfig(n_components=3, means_init=[[0.0], [1.0], [2.0]])
    algorithm = FederatedVBOneShot(3, posterior_aggregation="natural", match_threshold=0.25)
    rebuilt = build_algorithm("FederatedVBOneShot", algorithm_settings(algorithm))
    assert rebuilt.config == algorithm.config
    assert rebuilt.posterior_aggregation == "natural" and rebuilt.match_threshold == 0.25


def test_a_process_that_imports_only_one_shot_vb_checks_its_replies():
    """A Flower ServerApp imports the one algorithm it runs: the one-shot fit must not lean
    on a declaration another module registers (every client's ``vb_local`` reply was
    refused as an undeclared ``vb`` kind when only this algorithm's modules were loaded)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from fednovelty.federated.registry import build_algorithm\n"
        "from fednovelty.runtime.simulation import run_simulation\n"
        "assert 'fednovelty.federated.bayesian.variational' not in sys.modules\n"
        "g = torch.Generator().manual_seed(0)\n"
        "clients = [torch.randn(60, 3, generator=g, dtype=torch.float64) for _ in range(3)]\n"
        "a = build_algorithm('FederatedVBOneShot', {'n_components': 2})\n"
        "print(sorted(run_simulation(a, clients, random_state=0).state.client_posteriors))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[0, 1, 2]"
