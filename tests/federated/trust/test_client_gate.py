"""The client gate (``release.release``) and what client steps state behind their replies:
a hostile server's crafted broadcasts obtain no value backed by fewer than ``min_rows``
effective rows, recomputed here from the client's rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fednovelty.federated import ClusteredEMConfig, StreamConfig
from fednovelty.federated.clustered.clustered_em import ClusteredEMStep, warmup_config
from fednovelty.federated.clustered.mixture_clusters import row_log_likelihoods
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import STATS_BACKING, ReplySpec
from fednovelty.federated.mixtures.em import EMStep, FederatedEM
from fednovelty.federated.streams.streaming import StreamStep
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.backing import deviation_rows
from fednovelty.federated.trust.contrast import contrast_rows
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.release import release
from fednovelty.mixture import log_gaussian_prob

F64 = torch.float64
POLICY = PrivacyPolicy(min_rows=5)


def _spec(kind: str, backing: dict[str, str], limit=None) -> ReplySpec:
    return ReplySpec(kind, shapes=lambda broadcast, d: {}, backing=backing, limit=limit)


# ----------------------------------------------------------------------------- the gate
def test_release_floors_groups_and_refuses_what_it_cannot_classify():
    reply = Message(
        "em",
        {
            "counts": torch.tensor([9.0, 2.0]),
            "sums": torch.ones(2, 3),
            "n_samples": torch.tensor(11.0),
        },
        backing={
            "counts": torch.tensor([9.0, 2.0]),
            "sums": torch.tensor([9.0, 2.0]),
            "n_samples": torch.tensor(11.0),
        },
    )
    spec = _spec("em", {"counts": "components", "sums": "components", "n_samples": "client"})
    out = release(reply, spec, POLICY, None, None)
    assert out.tensors["counts"].tolist() == [9.0, 0.0]
    assert out.tensors["sums"][1].abs().sum() == 0 and out.tensors["sums"][0].sum() == 3
    assert out.backing == {}
    # a tensor the declaration does not classify, or without a stated backing: not released
    narrow = _spec("em", {"counts": "components", "n_samples": "client"})
    assert "'sums'" in release(reply, narrow, POLICY, None, None).scalars["reason"]
    bare = Message("em", dict(reply.tensors), backing={"counts": torch.tensor([9.0, 2.0])})
    assert release(bare, spec, POLICY, None, None).scalars["skipped"]
    # a whole-client value below the floor, and more groups than the client allows
    small = Message(
        "em", {"n_samples": torch.tensor(3.0)}, backing={"n_samples": torch.tensor(3.0)}
    )
    assert release(small, spec, POLICY, None, None).scalars["skipped"]
    limited = _spec("em", spec.backing, limit=lambda config, broadcast: 1)
    refused = release(reply, limited, POLICY, None, None)
    assert refused.scalars["skipped"] and "allows (1)" in refused.scalars["reason"]


def test_release_removes_a_local_mixtures_unbacked_components_and_renormalises():
    reply = Message(
        "local_fit",
        {"weights": torch.tensor([0.6, 0.1, 0.3]), "means": torch.arange(6.0).view(3, 2)},
        backing={
            "weights": torch.tensor([6.0, 1.0, 3.0]) * 2,
            "means": torch.tensor([12.0, 2.0, 6.0]),
        },
    )
    out = release(
        reply, _spec("local_fit", {"weights": "model", "means": "model"}), POLICY, None, None
    )
    assert torch.allclose(out.tensors["weights"], torch.tensor([2 / 3, 1 / 3]))
    assert out.tensors["means"].tolist() == [[0.0, 1.0], [4.0, 5.0]]


def test_deviation_rows_is_one_for_a_relu_probe_and_large_for_honest_log_densities():
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=200))
    top = x.sort().values
    probe = torch.relu(x - (top[-1] + top[-2]) / 2)  # one row beyond the kink
    assert float(deviation_rows(probe)) == pytest.approx(1.0)
    assert float(contrast_rows(torch.stack([x, x + probe], 1))) == pytest.approx(1.0)
    honest = float(deviation_rows(-0.5 * x.square()))
    assert 0.3 * 200 < honest < 0.6 * 200
    assert float(deviation_rows(torch.ones(7))) == 7


# ----------------------------------------------------------------------------- item 1
def _v_pair(t_low: float, t_high: float, sigma: float):
    """Two equal-variance components whose log-sum-exp is a V with its kink half-way."""
    return [t_low, t_high], sigma


def _clustered_probe(X: torch.Tensor, thresholds: list[float], c: float = 10.0):
    """A cluster_em broadcast with one V-shaped two-Gaussian cluster row per threshold."""
    means, clusters = [], []
    for j, t in enumerate(thresholds):
        means += [t - c / 2, t + c / 2]
        clusters += [j, j]
    m = len(means)
    log_w = torch.full((len(thresholds), m), -math.inf, dtype=F64)
    for j in range(len(thresholds)):
        log_w[j, 2 * j : 2 * j + 2] = math.log(0.5)
    means_t = torch.tensor(means, dtype=F64).unsqueeze(1)
    return Message(
        "cluster_em",
        {
            "weights": torch.full((m,), 1.0 / m, dtype=F64),
            "means": means_t,
            "precisions_cholesky": torch.ones(m, 1, dtype=F64),
            "shift": torch.zeros(1, dtype=F64),
            "component_clusters": torch.tensor(clusters),
            "cluster_log_weights": log_w,
        },
    )


def _cluster_step():
    config = ClusteredEMConfig(
        n_components=4, n_clusters=2, cluster_components=2, covariance_type="diag", random_state=0
    )
    return ClusteredEMStep(config, EMStep(warmup_config(config))), config


CLUSTER_SPEC = _spec(
    "cluster_em",
    {**STATS_BACKING, "cluster_log_likelihood": "clusters"},
    limit=lambda config, broadcast: {
        "clusters": config.n_clusters,
        "components": config.total_components,
    },
)

SEVEN = torch.tensor([0.11, 0.52, 0.27, 0.93, 0.45, 0.68, 10.37], dtype=F64).unsqueeze(1)


def test_clustered_em_two_v_probes_give_no_far_row():
    """Two cluster rows whose Vs share their middle Gaussian agree on every row below both
    kinks: the difference of the plain per-row means is the far row's alone (its coordinate
    exactly). The client sends no such contrast: its scores are equal, its reply released."""
    step, config = _cluster_step()
    message = _clustered_probe(SEVEN, [-5.0, 5.0])
    t = message.tensors
    log_prob = log_gaussian_prob(SEVEN, t["means"], t["precisions_cholesky"], "diag")
    plain = row_log_likelihoods(log_prob, t["cluster_log_weights"]).mean(0)
    n = SEVEN.shape[0]
    recovered = (float(plain[1] - plain[0]) * n + 50.0) / 10.0  # (10 x - 50) / n
    assert recovered == pytest.approx(10.37, abs=1e-9)  # what unprotected scores give
    reply = step.client_step(SEVEN, message, gate.client_context(0, policy=POLICY))
    released = release(reply, CLUSTER_SPEC, POLICY, config, message)
    scores = released.tensors["cluster_log_likelihood"]
    assert float(scores[1] - scores[0]) == 0.0  # no contrast between the cluster rows


def test_clustered_em_hundreds_of_cluster_rows_are_refused_by_the_clients_own_limit():
    step, config = _cluster_step()
    thresholds = list(np.linspace(-2.0, 12.0, 400))
    message = _clustered_probe(SEVEN, thresholds)
    reply = step.client_step(SEVEN, message, gate.client_context(0, policy=POLICY))
    released = release(reply, CLUSTER_SPEC, POLICY, config, message)
    assert released.scalars["skipped"] and "configuration allows" in released.scalars["reason"]


def test_clustered_em_honest_scores_are_released():
    step, config = _cluster_step()
    rng = np.random.default_rng(1)
    X = torch.as_tensor(rng.normal(size=(60, 1)))
    message = _clustered_probe(X, [0.0, 0.5], c=1.0)
    reply = step.client_step(X, message, gate.client_context(0, policy=POLICY))
    released = release(reply, CLUSTER_SPEC, POLICY, config, message)
    assert not released.scalars.get("skipped"), released.scalars
    assert torch.equal(
        released.tensors["cluster_log_likelihood"], reply.tensors["cluster_log_likelihood"]
    )


# ----------------------------------------------------------------------------- item 4
STREAM_SPEC = _spec(
    "stream",
    {"counts": "components", "n_samples": "client", "drift": "client"},
    limit=lambda config, broadcast: config.n_components,
)


def _stream(k_config: int, means: torch.Tensor, scale: float):
    k = means.shape[0]
    config = StreamConfig(
        n_components=k_config,
        weights_init=torch.full((k_config,), 1.0 / k_config, dtype=F64),
        means_init=torch.zeros(k_config, 1, dtype=F64),
        precisions_init=torch.ones(k_config, 1, dtype=F64),
        covariance_type="diag",
        rounds=0,
    )
    message = Message(
        "stream",
        {
            "weights": torch.full((k,), 1.0 / k, dtype=F64),
            "means": means,
            "precisions_cholesky": torch.full((k, 1), 1.0 / scale, dtype=F64),
            "shift": torch.zeros(1, dtype=F64),
        },
        {"window_round": 0},
    )
    return StreamStep(config), config, message


def test_streaming_track_only_histogram_of_narrow_components_is_refused():
    """40 narrow components: the tracked counts are a histogram placing every row within
    0.04; the client's config allows 3 components and no count is backed by 5 rows."""
    rng = np.random.default_rng(2)
    X = torch.as_tensor(rng.uniform(0, 1.6, size=(30, 1)))
    means = torch.linspace(0.02, 1.58, 40, dtype=F64).unsqueeze(1)
    step, config, message = _stream(3, means, scale=0.01)
    reply = step.client_step(X, message, gate.client_context(0, policy=POLICY))
    counts = reply.tensors["counts"]
    bins = torch.bucketize(X[:, 0], torch.linspace(0.0, 1.6, 41, dtype=F64)[1:-1])
    assert int(((counts > 0.5) & (counts < 1.5)).sum()) >= 10  # single rows within 0.04
    released = release(reply, STREAM_SPEC, POLICY, config, message)
    assert released.scalars["skipped"] and "allows (3)" in released.scalars["reason"]
    # within the limit, a component of one row is floored
    step, config, message = _stream(40, means, scale=0.01)
    reply = step.client_step(X, message, gate.client_context(0, policy=POLICY))
    released = release(reply, STREAM_SPEC, POLICY, config, message)
    if not released.scalars.get("skipped"):
        kept = released.tensors["counts"] > 0
        assert bool((torch.bincount(bins, minlength=40)[kept] >= 5).all())


# ----------------------------------------------------------------------------- property (a)
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(5, 25),
    k=st.integers(1, 8),
    log_scale=st.floats(-4, 3),
    at_rows=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_em_reply_never_releases_a_component_below_the_floor(n, k, log_scale, at_rows, seed):
    """Federated EM's client half under any well-formed em broadcast: every released
    component's responsibilities, recomputed with numpy from the broadcast, have Kish
    effective rows >= min_rows."""
    from fednovelty.federated import EMConfig

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2)) * rng.uniform(0.1, 10)
    means = X[rng.integers(0, n, k)] if at_rows else rng.normal(size=(k, 2)) * 5
    scale = 10.0**log_scale
    weights = rng.dirichlet(np.ones(k))
    message = Message(
        "em",
        {
            "weights": torch.as_tensor(weights),
            "means": torch.as_tensor(means),
            "precisions_cholesky": torch.full((k, 2), 1 / scale, dtype=F64),
            "shift": torch.zeros(2, dtype=F64),
        },
    )
    step = EMStep(EMConfig(n_components=k, covariance_type="diag"))
    reply = step.client_step(torch.as_tensor(X), message, gate.client_context(0, policy=POLICY))
    released = release(reply, _spec("em", STATS_BACKING), POLICY, None, message)
    if released.scalars.get("skipped"):
        return
    log_r = np.log(weights) - 0.5 * (((X[:, None, :] - means[None]) / scale) ** 2).sum(2)
    r = np.exp(log_r - log_r.max(1, keepdims=True))
    r /= r.sum(1, keepdims=True)
    kish = r.sum(0) ** 2 / np.maximum((r**2).sum(0), 1e-300)
    sent = released.tensors["counts"].numpy() > 0
    assert (kish[sent] >= 5 * (1 - 1e-6)).all(), (kish, sent)


# ----------------------------------------------------------------------------- item 2
def _pfedem_probe():
    """A client of 30 rows: 23 near 0, 6 at 3 and one far row at 1000; a broadcast of 8
    components (the client's own config allows 8): 7 equal narrow ones at 0 and a
    wide-tailed one at 1000 whose weight makes it the argmax of the rows at 3 by a hair
    (responsibility ~0.15 each) and the far row's (responsibility 1)."""
    from fednovelty.federated import PFedEM
    from fednovelty.federated.core.aggregate import learner_name

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-1, 1, 23), np.full(6, 3.0), [1000.0]])
    X = torch.as_tensor(x).unsqueeze(1)
    y = torch.as_tensor((np.arange(30) % 2).astype(np.int64))
    k, wide = 8, 1000.0
    # w0 N(3; 1000, wide^2) = 1.2 w N(3; 0, 1): the wide component wins the rows at 3
    log_ratio = -math.log(wide) - 0.5 * ((3 - 1000) / wide) ** 2 + 4.5
    w0_over_w = 1.2 * math.exp(-log_ratio)
    w = 1.0 / (k - 1 + w0_over_w)
    weights = torch.tensor([w0_over_w * w] + [w] * (k - 1), dtype=F64)
    means = torch.tensor([[1000.0]] + [[0.0]] * (k - 1), dtype=F64)
    prec = torch.tensor([[1 / wide]] + [[1.0]] * (k - 1), dtype=F64)
    algorithm = PFedEM(k, 2, covariance_type="diag", random_state=0)
    tensors = {
        "weights": weights,
        "means": means,
        "precisions_cholesky": prec,
        "shift": torch.zeros(1, dtype=F64),
    }
    for j, learner in enumerate(algorithm._initial_learners(1)):
        tensors.update({learner_name(j, name): v for name, v in learner.items()})
    message = Message("pfedem", tensors, {"seed": 0})
    # numpy/scipy recomputation of the responsibilities of the wide component
    from scipy.stats import norm

    log_p = np.log(weights.numpy()) + norm.logpdf(x[:, None], means.numpy()[:, 0], 1 / prec[:, 0])
    gamma = np.exp(log_p - log_p.max(1, keepdims=True))
    gamma /= gamma.sum(1, keepdims=True)
    return algorithm, (X, y), message, gamma, x


def test_pfedem_wide_component_with_seven_hard_rows_is_floored_by_effective_rows():
    algorithm, data, message, gamma, x = _pfedem_probe()
    hard = int((gamma.argmax(1) == 0).sum())
    kish = gamma[:, 0].sum() ** 2 / (gamma[:, 0] ** 2).sum()
    share = gamma[-1, 0] * x[-1] / (gamma[:, 0] * x).sum()
    assert hard == 7 and kish < 5 and share > 0.99  # the hard-count rule would release it
    released = gate.answer(algorithm, data, message, gate.client_context(0, policy=POLICY))
    assert not released.scalars.get("skipped"), released.scalars
    assert float(released.tensors["hard_counts"][0]) == 0
    assert bool((released.tensors["client_means"][0] == 0).all())
    assert bool((released.tensors["client_vars"][0] == 0).all())
    assert float(released.tensors["hard_counts"][1:].sum()) == 23  # the others are released


# ----------------------------------------------------------------------------- item 3
def test_vgm2_prototype_of_a_one_row_class_is_not_released():
    """The prototype baseline's class mean of a one-row class is that row's embedding:
    the client step computes it, the gate zeros the class (prototype and count)."""
    from fednovelty.federated.bayesian.vgm2_networks import embed
    from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype
    from fednovelty.federated.bayesian.vgm2_settings import ENCODER

    rng = np.random.default_rng(4)
    X = torch.as_tensor(rng.normal(size=(12, 6)))
    y = torch.tensor([0] * 6 + [1] * 5 + [2])  # class 2: one row
    small = {"hidden": 8, "embedding_dim": 3, "local_epochs": 1, "batch_size": 16}
    algorithm = VGM2Prototype(6, 3, rounds=1, **small)
    message = algorithm.configure(algorithm.start())
    context = gate.client_context(0, policy=POLICY)
    raw = algorithm.client_step((X, y), message, context)
    state = context.state
    encoder = {k.removeprefix(ENCODER): v for k, v in state.items() if k.startswith(ENCODER)}
    with torch.no_grad():
        row = embed(algorithm.encoder, encoder, X[-1:])[0]
    torch.testing.assert_close(raw.tensors["prototypes"][2], row)  # what the step computes
    released = gate.answer(algorithm, (X, y), message, gate.client_context(0, policy=POLICY))
    assert not released.scalars.get("skipped"), released.scalars
    assert released.tensors["class_counts"].tolist() == [6.0, 5.0, 0.0]
    assert bool((released.tensors["prototypes"][2] == 0).all())
    assert bool((released.tensors["prototypes"][:2] != 0).any())


@pytest.mark.parametrize("rounds", [0, 1])
def test_a_window_round_the_client_never_began_is_refused_not_a_crash(rounds):
    """A crafted ``window_round=1`` to a client that did not answer the window's first round
    (or whose own config tracks only) is refused by name."""
    config = StreamConfig(
        n_components=2,
        weights_init=torch.tensor([0.5, 0.5], dtype=F64),
        means_init=torch.tensor([[0.0], [5.0]], dtype=F64),
        precisions_init=torch.ones(2, 1, dtype=F64),
        covariance_type="diag",
        rounds=rounds,
    )
    step = StreamStep(config)
    message = Message(
        "stream",
        {
            "weights": config.weights_init,
            "means": config.means_init,
            "precisions_cholesky": config.precisions_init,
            "shift": torch.zeros(1, dtype=F64),
        },
        scalars={"window_round": 1},
    )
    reply = step.client_step(SEVEN, message, gate.client_context(0, policy=POLICY))
    assert reply.scalars["skipped"] and "refused" in reply.scalars["reason"]


def test_a_windows_outlying_row_is_winsorised_not_released():
    """A window's log p values: every row equal but one far row (a probe) -> the released
    values are all equal (the far row clipped to the others); an honest window with one
    outlying row keeps all its rows, the outlier clipped, its sums backed by the floor."""
    from fednovelty.federated.trust.contrast import winsorised_row_values

    def backed_row_values(values, min_rows):
        return winsorised_row_values(values, min_rows, powers=(1, 2))

    probe = torch.full((30,), -2.0, dtype=F64)
    probe[7] = 40.0
    values, rows = backed_row_values(probe, POLICY.min_rows)
    assert values.shape == (30,) and bool((values == -2.0).all())
    rng = np.random.default_rng(0)
    honest = torch.as_tensor(rng.normal(-3.0, 1.0, 150))
    honest[0] = -60.0
    values, rows = backed_row_values(honest, POLICY.min_rows)
    assert values.shape == (150,) and float(values.min()) > -60.0
    assert float(rows) >= POLICY.min_rows


def test_an_em_log_likelihood_probe_gives_no_far_row():
    """Two Gaussians of equal variance make log p a softplus of x: with the first's weight
    tiny, log p(x) = log w1 + log N(x; 0, s^2) + softplus(x - 5), so the plain sum over
    the rows, less n log N's constant, is the far row's excess over 5 (to about 0.1). The
    released log-likelihood winsorises that row: it gives nothing of it."""
    from fednovelty.mixture import e_step_stats

    s2, t = 1000.0, 5.0
    offset = s2 / 2 - t  # log(w2 / w1): the softplus's kink at x = t
    weights = torch.tensor([math.exp(-offset), 1.0], dtype=F64)
    means = torch.tensor([[0.0], [s2]], dtype=F64)
    prec = torch.full((2, 1), 1.0 / math.sqrt(s2), dtype=F64)
    shift = torch.zeros(1, dtype=F64)
    message = Message(
        "em",
        {"weights": weights, "means": means, "precisions_cholesky": prec, "shift": shift},
    )
    n, constant = SEVEN.shape[0], -offset - 0.5 * math.log(2 * math.pi * s2)

    def far_row_from(log_likelihood: float) -> float:
        return t + (log_likelihood - n * constant)

    plain = e_step_stats(SEVEN, weights.log(), means, prec, "diag", shift)
    assert far_row_from(float(plain.log_likelihood)) == pytest.approx(10.37, abs=0.1)
    algorithm = FederatedEM(2, covariance_type="diag")
    reply = gate.answer(algorithm, SEVEN, message, gate.client_context(0, policy=POLICY))
    assert not reply.scalars.get("skipped")
    assert abs(far_row_from(float(reply.tensors["log_likelihood"])) - 10.37) > 3.0


def test_blanked_entries_carry_no_sign():
    """An entry below the floor leaves as +0.0: blanked as ``value * 0`` a negative value
    went out as -0.0, so a server choosing the shift read sign(x - shift) of a lone far row
    per feature, one bit a round, and had the row after 48 rounds."""
    reply = Message(
        "em",
        {"counts": torch.tensor([9.0, 1.0]), "sums": torch.tensor([[1.0, -2.0], [-3.0, 4.0]])},
        backing={"counts": torch.tensor([9.0, 1.0]), "sums": torch.tensor([9.0, 1.0])},
    )
    spec = _spec("em", {"counts": "components", "sums": "components"})
    out = release(reply, spec, POLICY, None, None)
    assert out.tensors["sums"][1].tolist() == [0.0, 0.0]
    assert not bool(torch.signbit(out.tensors["sums"][1]).any())
    # end to end: a component holding one far row, the shift beyond it on every feature
    rng = np.random.default_rng(0)
    X = torch.as_tensor(np.vstack([rng.normal(size=(30, 3)), [[40.0, -40.0, 40.0]]]))
    algorithm = FederatedEM(
        2,
        weights_init=[0.5, 0.5],
        means_init=[[0.0, 0.0, 0.0], [40.0, -40.0, 40.0]],
        precisions_init=np.stack([np.eye(3)] * 2),
    )
    message = algorithm.configure(algorithm.start())
    for shift in ([41.0, -39.0, 39.0], [39.0, -41.0, 41.0]):
        crafted = Message(
            message.kind, {**message.tensors, "shift": torch.tensor(shift)}, dict(message.scalars)
        )
        released = gate.answer(algorithm, X, crafted, gate.client_context(0, policy=POLICY))
        lone = int(released.tensors["counts"].argmin())
        assert float(released.tensors["counts"][lone]) == 0.0
        assert not bool(torch.signbit(released.tensors["sums"][lone]).any())
        assert not bool(torch.signbit(released.tensors["second"][lone]).any())
