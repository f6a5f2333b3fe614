"""Differential privacy at the two gates: what a client under a ``DPPolicy`` releases (rows
clipped, only declared private forms, within its budget, the log-likelihood withheld), what
the server accepts and how it post-processes noisy sums. References are computed here by
hand in numpy and SciPy from the client's rows."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import epsilon_spent
from fednovelty.federated.trust.dp_mechanism import noisy_scatter, recentre_stats
from fednovelty.federated.trust.dp_postprocess import plausible_stats
from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.mixture import SufficientStats
from fednovelty.runtime.simulation import run_simulation

F64 = torch.float64
MEANS = np.array([[-1.0, 0.0, 0.5], [1.5, 1.0, -0.5]])
COVS = np.stack([np.eye(3) * 0.6, np.diag([1.0, 0.3, 0.8])])


def _em(**settings) -> FederatedEM:
    """Federated EM from given parameters (no start rounds): its first round is ``em``."""
    return FederatedEM(
        2,
        weights_init=[0.4, 0.6],
        means_init=MEANS,
        precisions_init=np.linalg.inv(COVS),
        **settings,
    )


def _rows(n: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, 1.2, (n, 3))
    X[:3] *= 6.0  # three rows far outside the clipping ball
    return X


def _by_hand(X: np.ndarray, bound: float, shift: np.ndarray) -> dict[str, np.ndarray]:
    """Full-covariance statistics of ``X`` clipped to radius ``bound`` about the origin, under
    the mixture of MEANS/COVS with weights (0.4, 0.6), about ``shift``."""
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    clipped = np.where(norms > bound, X * bound / norms, X)
    dens = np.stack(
        [
            w * multivariate_normal(m, c).pdf(clipped)
            for w, m, c in zip((0.4, 0.6), MEANS, COVS, strict=True)
        ],
        axis=1,
    )
    resp = dens / dens.sum(1, keepdims=True)
    v = clipped - shift
    return {
        "counts": resp.sum(0),
        "sums": resp.T @ v,
        "second": np.einsum("ik,ia,ib->kab", resp, v, v),
    }


def _answer(algorithm, X, policy, client_id=0, state=None):
    message = algorithm.configure(algorithm.start() if state is None else state)
    context = gate.client_context(client_id, policy=policy)
    return message, gate.answer(algorithm, torch.as_tensor(X), message, context), context


def test_without_noise_the_release_is_the_clipped_rows_statistics_and_no_log_likelihood():
    bound = 2.5
    algorithm = _em(dp_mode="local", dp_noise_multiplier=0.0, dp_clip=bound)
    X = _rows()
    policy = PrivacyPolicy(dp=DPPolicy(0.0, bound, "local"))
    message, reply, _ = _answer(algorithm, X, policy)
    expected = _by_hand(X, bound, message.tensors["shift"].numpy())
    for name, value in expected.items():
        got = reply.tensors[name].numpy()
        np.testing.assert_allclose(got, value, rtol=1e-10, atol=1e-10 * np.abs(value).max())
    assert float(reply.tensors["log_likelihood"]) == 0.0  # withheld
    assert float(reply.tensors["n_samples"]) == pytest.approx(expected["counts"].sum(), rel=1e-12)


def test_the_floor_gives_way_to_the_noise_under_dp():
    """A component backed by fewer than min_rows rows is zeroed by the floor, not under DP
    (which components were zeroed would depend on the rows)."""
    X = _rows(n=40)
    floor = PrivacyPolicy(min_rows=20)
    private = PrivacyPolicy(min_rows=20, dp=DPPolicy(0.0, 100.0, "local"))
    _, floored, _ = _answer(_em(), X, floor)
    _, released, _ = _answer(_em(dp_mode="local", dp_clip=100.0), X, private)
    assert (floored.tensors["counts"] == 0).any()
    assert (released.tensors["counts"] > 0).all()


def test_a_reply_without_a_private_form_is_refused_under_dp():
    algorithm = FederatedEM(2, init_params="kmeans")  # no dp_mode: the k-FED centroid round
    policy = PrivacyPolicy(dp=DPPolicy(1.0, 3.0, "local"))
    message, reply, _ = _answer(algorithm, _rows(), policy)
    assert message.kind == "centroids"
    assert reply.scalars["skipped"] and "no private form" in reply.scalars["reason"]
    assert not reply.tensors


def test_the_client_refuses_releases_beyond_its_budget():
    """A budget of exactly two releases' epsilon (read from the accountant) allows two and
    refuses the third; the ledger is the client's, outside the algorithm's state."""
    algorithm = _em(dp_mode="local", dp_noise_multiplier=1.0, dp_clip=3.0)
    budget = epsilon_spent(1.0, 2, 1e-5)
    policy = PrivacyPolicy(dp=DPPolicy(1.0, 3.0, "local", epsilon=budget, delta=1e-5))
    message = algorithm.configure(algorithm.start())
    context = gate.client_context(0, policy=policy)
    X = torch.as_tensor(_rows())
    first, second, third = (gate.answer(algorithm, X, message, context) for _ in range(3))
    assert not first.scalars.get("skipped") and not second.scalars.get("skipped")
    assert third.scalars["skipped"] and "budget is spent" in third.scalars["reason"]
    assert context.terms.ledger.releases == 2 and "dp_releases" not in context.state
    assert context.terms.ledger.gaussian == pytest.approx(2 * 3 / 1.0**2, rel=1e-12)


def test_each_release_draws_fresh_noise_and_only_a_test_seed_reproduces_it():
    algorithm = _em(dp_mode="local", dp_noise_multiplier=2.0, dp_clip=3.0)
    X = _rows()

    def two(seed):
        policy = PrivacyPolicy(dp=DPPolicy(2.0, 3.0, "local", insecure_seed=seed))
        message = algorithm.configure(algorithm.start())
        context = gate.client_context(0, policy=policy)
        return [gate.answer(algorithm, torch.as_tensor(X), message, context) for _ in range(2)]

    fresh, again = two(None), two(None)  # the default: fresh OS entropy every release
    assert not torch.equal(fresh[0].tensors["sums"], again[0].tensors["sums"])
    assert not torch.equal(fresh[0].tensors["sums"], fresh[1].tensors["sums"])
    a, b = two(7), two(7)  # tests only
    assert torch.equal(a[0].tensors["sums"], b[0].tensors["sums"])
    assert not torch.equal(a[0].tensors["sums"], a[1].tensors["sums"])
    assert not torch.equal(a[0].tensors["sums"], two(8)[0].tensors["sums"])


def test_central_mode_clients_add_no_noise_and_the_server_adds_it_to_the_sum():
    bound, z = 3.0, 5.0
    clients = [torch.as_tensor(_rows(200, seed)) for seed in range(4)]
    policy = PrivacyPolicy(dp=DPPolicy(z, bound, "central", n_clients=4))
    algorithm = _em(dp_mode="central", dp_noise_multiplier=z, dp_clip=bound, max_iter=1)
    message, reply, _ = _answer(algorithm, clients[0].numpy(), policy)
    expected = _by_hand(clients[0].numpy(), bound, message.tensors["shift"].numpy())
    np.testing.assert_allclose(reply.tensors["sums"].numpy(), expected["sums"], rtol=1e-10)

    def fit(**settings):
        algorithm = _em(dp_mode="central", dp_noise_multiplier=z, dp_clip=bound, max_iter=1)
        algorithm = FederatedEM.from_config(dataclasses.replace(algorithm.config, **settings))
        return run_simulation(algorithm, clients, privacy=policy).state.params.means

    # the server's noise is fresh: the same random_state gives two fits
    assert not torch.equal(fit(random_state=0), fit(random_state=0))
    # only the test seed reproduces it
    assert torch.equal(fit(dp_insecure_seed=5), fit(dp_insecure_seed=5))
    assert not torch.equal(fit(dp_insecure_seed=5), fit(dp_insecure_seed=6))


def test_the_server_gate_checks_noisy_replies_for_form_only():
    algorithm = _em(dp_mode="local", dp_noise_multiplier=1.0, dp_clip=3.0)
    message = algorithm.configure(algorithm.start())
    policy = PrivacyPolicy(dp=DPPolicy(30.0, 3.0, "local", insecure_seed=0))
    reply = gate.answer(
        algorithm, torch.as_tensor(_rows(6)), message, gate.client_context(0, policy=policy)
    )
    assert (reply.tensors["counts"] < 0).any()  # the noise made a count negative
    strict = ReplyValidator(n_features=3, specs=algorithm.reply_spec)
    with pytest.raises(InvalidReplyError):
        strict.check(0, reply, message)
    private = ReplyValidator(n_features=3, specs=algorithm.reply_spec, private=True)
    private.check(0, reply, message)
    broken = Message("em", {**reply.tensors, "sums": reply.tensors["sums"] * math.nan})
    with pytest.raises(InvalidReplyError, match="NaN"):
        private.check(0, broken, message)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_recentring_statistics_matches_statistics_taken_about_the_new_point(covariance_type):
    rng = np.random.default_rng(1)
    X, resp = rng.normal(size=(30, 3)), rng.dirichlet(np.ones(2), 30)
    s, t = np.array([0.3, -1.0, 2.0]), np.array([-0.5, 0.2, 0.1])

    def stats(c):
        v = X - c
        full = np.einsum("ik,ia,ib->kab", resp, v, v)
        second = {
            "full": full,
            "tied": full.sum(0),
            "diag": np.einsum("kaa->ka", full),
            "spherical": np.einsum("kaa->k", full),
        }[covariance_type]
        return resp.sum(0), resp.T @ v, second

    counts, sums, second = (torch.as_tensor(a) for a in stats(s))
    moved_sums, moved_second = recentre_stats(
        counts, sums, second, torch.as_tensor(s - t), covariance_type
    )
    _, sums_t, second_t = stats(t)
    np.testing.assert_allclose(moved_sums.numpy(), sums_t, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(moved_second.numpy(), second_t, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_post_processed_noisy_sums_are_statistics_rows_in_the_ball_could_have(covariance_type):
    rng = np.random.default_rng(2)
    k, d, bound = 3, 4, 2.0
    shape = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    second = torch.as_tensor(rng.normal(0, 50, shape[covariance_type]))
    stats = SufficientStats(
        counts=torch.tensor([-3.0, 2.0, 400.0], dtype=F64),
        sums=torch.as_tensor(rng.normal(0, 40, (k, d))),
        second=second,
        shift=torch.full((d,), 0.5, dtype=F64),
        log_likelihood=torch.tensor(0.0, dtype=F64),
        n_samples=torch.tensor(399.0, dtype=F64),
        covariance_type=covariance_type,
    )
    out = plausible_stats(stats, bound, min_count=4.0, min_variance=1e-3, second_noise=10.0)
    assert bool((out.counts >= 4.0).all())
    means = out.shift + out.sums / out.counts.unsqueeze(1)
    assert bool((torch.linalg.vector_norm(means, dim=1) <= bound * (1 + 1e-12)).all())
    offsets = out.sums / out.counts.unsqueeze(1)
    if covariance_type == "full":
        cov = out.second / out.counts[:, None, None] - offsets.unsqueeze(2) * offsets.unsqueeze(1)
        eig = torch.linalg.eigvalsh(cov)
        floors = (2 * 10.0 * math.sqrt(d) / out.counts).clamp(1e-3, bound**2)
        assert bool((eig >= floors.unsqueeze(1) * (1 - 1e-9)).all())
        assert bool((eig <= bound**2 * (1 + 1e-9)).all())
    elif covariance_type == "tied":
        scatter = out.second - (out.sums.T / out.counts) @ out.sums
        assert bool((torch.linalg.eigvalsh(scatter) > 0).all())
    elif covariance_type == "diag":
        assert bool((out.second / out.counts.unsqueeze(1) - offsets.square() > 0).all())
    else:
        assert bool((out.second / out.counts - offsets.square().sum(1) > 0).all())
    assert float(out.n_samples) == pytest.approx(float(out.counts.sum()), rel=1e-12)


def test_noisy_scatter_without_noise_keeps_the_reply_and_with_noise_stays_symmetric():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 3))
    mean = X.mean(0)
    tensors = {
        "n_samples": torch.tensor(50.0, dtype=F64),
        "mean": torch.as_tensor(mean),
        "scatter": torch.as_tensor((X - mean).T @ (X - mean)),
    }
    same = noisy_scatter(tensors, 0.0, 3.0, SeededNoise(0))
    for name, value in tensors.items():
        np.testing.assert_allclose(same[name].numpy(), value.numpy(), rtol=1e-12, atol=1e-12)
    noisy = noisy_scatter(tensors, 2.0, 3.0, SeededNoise(0))
    assert torch.equal(noisy["scatter"], noisy["scatter"].T)
    assert not torch.equal(noisy["mean"], tensors["mean"])


def _standardised_em(mode: str, z: float, bound: float, **settings) -> FederatedEM:
    """Private federated EM with the moments round (standardisation in the box (-8, 8))."""
    return FederatedEM(
        2,
        standardize=True,
        bounds=([-8.0] * 3, [8.0] * 3),
        kmeans_rounds=1,
        dp_mode=mode,
        dp_noise_multiplier=z,
        dp_clip=bound,
        **settings,
    )


def test_small_clients_noisy_replies_are_not_dropped_as_implausible():
    """Local noise on 30-row clients makes their moments wild against each other; the
    server's cross-client screen would drop them all (it judges lies, and noise is none)."""
    bound, z = 3.0, 40.0
    clients = [torch.as_tensor(_rows(30, seed)) for seed in range(12)]
    algorithm = _standardised_em("local", z, bound, max_iter=2)
    policy = PrivacyPolicy(dp=DPPolicy(z, bound, "local", n_clients=12, insecure_seed=0))
    result = run_simulation(algorithm, clients, privacy=policy)
    assert [r.kind for r in result.history] == ["moments", "assign", "em", "em"]
    assert all(len(r.replied) == 12 and not r.dropped for r in result.history)


def test_central_mode_noises_the_pooled_moments_too():
    """The moments round counts as a release: in central mode the server must add the noise
    to the pooled moments (fresh noise: two runs differ; a test seed reproduces it)."""
    clients = [torch.as_tensor(_rows(200, seed)) for seed in range(3)]
    policy = PrivacyPolicy(dp=DPPolicy(50.0, 3.0, "central", n_clients=3))

    def offset(seed):
        algorithm = _standardised_em("central", 50.0, 3.0, max_iter=1, dp_insecure_seed=seed)
        state = algorithm.start()
        message = algorithm.configure(state)
        replies = {
            c: gate.answer(algorithm, X, message, gate.client_context(c, policy=policy))
            for c, X in enumerate(clients)
        }
        algorithm.server_step(state, replies)
        return state.offset

    assert torch.equal(offset(0), offset(0))
    assert not torch.allclose(offset(0), offset(1))
    assert not torch.allclose(offset(None), offset(None))


def test_an_empty_client_sends_noise_like_the_others():
    """Under DP a client with no rows answers every summed round with the noise alone and
    pays for it, so the server cannot tell 0 rows from 1 (before: it skipped, by name)."""
    algorithm = FederatedEM(
        2,
        bounds=([-4.0] * 3, [4.0] * 3),
        standardize=True,
        kmeans_rounds=1,
        max_iter=2,
        dp_mode="local",
        dp_noise_multiplier=2.0,
        dp_clip=3.0,
    )
    policy = PrivacyPolicy(dp=DPPolicy(2.0, 3.0, "local"))
    clients = [torch.as_tensor(_rows(100, s)) for s in range(3)]
    clients.append(torch.zeros(0, 3, dtype=F64))
    result = run_simulation(algorithm, clients, privacy=policy)
    assert all(len(r.replied) == 4 and not r.skipped for r in result.history)
    assert result.ledgers[3] == result.ledgers[0]  # the same releases, the same cost
    # one noisy release of zeros: the statistics are the noise alone
    given = _em(dp_mode="local", dp_noise_multiplier=2.0, dp_clip=3.0)
    empty = torch.zeros(0, 3, dtype=F64)
    message = given.configure(given.start())
    reply = gate.answer(given, empty, message, gate.client_context(0, policy=policy))
    assert not reply.scalars.get("skipped") and reply.tensors["counts"].shape == (2,)
    assert float(reply.tensors["counts"].abs().max()) > 0
