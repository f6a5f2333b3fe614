"""Fed-CAM (fednovelty/federated/clustered/) under differential privacy: the client
gate's ``"parts"`` release (models trained by DP-SGD, row count and loss withheld), the
declaration it rests on, the noisy cluster choice against closed forms, one noise-free
DP-SGD step of the additive pair against numpy, its noise against its calibration, and the
server's equal-weight averages."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from _tolerance import assert_close_scaled
from scipy.special import ndtr

from fednovelty.federated.clustered.cam_algorithm import ClusteredAlgorithm
from fednovelty.federated.clustered.cam_models import model_rows, nearest_cluster
from fednovelty.federated.clustered.cam_private import (
    AdditivePair,
    clipped_loss_sums,
    noisy_cluster_losses,
    private_models,
)
from fednovelty.federated.clustered.cam_step import CLUSTER_KIND, MODEL_REPLIES
from fednovelty.federated.clustered.fesem import FeSEM
from fednovelty.federated.clustered.ifca import IFCA
from fednovelty.federated.clustered.ifca_cam import IFCACAM
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import RELEASE_TENSORS, ReplySpec
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_sgd import HISTOGRAM_SHARE, DPSGDSettings
from fednovelty.federated.trust.ledger import PrivacyLedger
from fednovelty.federated.trust.noise import SeededNoise
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.release import release

F64 = torch.float64
D = 3
BOUNDS = ([-2.0] * D, [2.0] * D)
SGD = DPSGDSettings(noise_multiplier=1.0, clip_norm=1.0, sample_rate=0.2, steps=4)
SPEC = MODEL_REPLIES[CLUSTER_KIND]


def _rows(n: int, flip: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, D, generator=g, dtype=F64) * 4 - 2
    return X, ((X[:, 0] > 0) ^ flip).long()


def _cam(method: type[ClusteredAlgorithm] = IFCACAM, **settings) -> ClusteredAlgorithm:
    options = dict(
        n_clusters=2,
        rounds=4,
        learner_factory="linear",
        learning_rate=0.1,
        dtype=F64,
        random_state=0,
        bounds=BOUNDS,
        dp_mode="local",
        dp_noise_multiplier=1.0,
        dp_clip=math.sqrt(D),
    )
    if method is IFCACAM:
        options["warmup_rounds"] = 0  # the first round is a clustered one
    return method(D, 2, **{**options, **settings})


def _policy(z: float = 1.0, insecure_seed: int | None = 0, sgd=SGD, epsilon=None) -> PrivacyPolicy:
    dp = DPPolicy(z, math.sqrt(D), "local", 4, epsilon=epsilon, insecure_seed=insecure_seed)
    return PrivacyPolicy(dp=dp, dp_sgd=sgd)


def _first_round(algorithm: ClusteredAlgorithm) -> Message:
    return algorithm.configure(algorithm.start())


# ----------------------------------------------------------------------------- the gate
def test_the_gate_releases_the_dp_sgd_models_and_withholds_the_row_count_and_loss():
    algorithm = _cam()
    message = _first_round(algorithm)
    assert message.kind == CLUSTER_KIND
    data, policy = _rows(120, False, 0), _policy()
    raw = algorithm.client_step(data, message, gate.client_context(0, policy=policy))
    models = {n for n in raw.tensors if n.startswith(("cluster.", "global."))}
    assert models == {f"{h}.{p}" for h in ("cluster", "global") for p in ("weight", "bias")}
    assert raw.scalars["dp_sgd_steps"] == SGD.steps and raw.scalars["cluster"] in (0, 1)
    out = release(raw, SPEC, policy, algorithm.config, message)
    assert float(out.tensors["n_samples"]) == 0.0 and float(out.tensors["loss"]) == 0.0
    for name in models:  # DP-SGD's output leaves as it is (post-processing)
        assert torch.equal(out.tensors[name], raw.tensors[name])
    assert out.scalars == raw.scalars


def test_the_gate_refuses_what_no_part_declares_and_models_not_trained_by_its_dp_sgd():
    algorithm = _cam()
    message = _first_round(algorithm)
    data, policy = _rows(120, False, 0), _policy()
    raw = algorithm.client_step(data, message, gate.client_context(0, policy=policy))
    extra = Message(
        raw.kind,
        {**raw.tensors, "mean": torch.zeros(D, dtype=F64)},
        dict(raw.scalars),
        backing={**raw.backing, "mean": torch.tensor(120.0)},
    )
    spec = replace(SPEC, backing={**SPEC.backing, "mean": "client"})
    out = release(extra, spec, policy, algorithm.config, message)
    assert out.scalars.get("skipped") and "'mean'" in out.scalars["reason"]
    lying = Message(raw.kind, raw.tensors, {**raw.scalars, "dp_sgd_steps": 99}, backing=raw.backing)
    out = release(lying, SPEC, policy, algorithm.config, message)
    assert out.scalars.get("skipped") and "DP-SGD steps" in out.scalars["reason"]
    without = _policy(sgd=None)
    out = release(raw, SPEC, without, algorithm.config, message)
    assert out.scalars.get("skipped") and "not trained by DP-SGD" in out.scalars["reason"]
    own = gate.answer(algorithm, data, message, gate.client_context(0, policy=without))
    assert own.scalars.get("skipped") and "DP-SGD" in own.scalars["reason"]


def test_each_round_is_one_noisy_release_with_fresh_noise_and_the_budget_binds():
    algorithm = _cam()
    message = _first_round(algorithm)
    # a budget of exactly two rounds' DP-SGD steps, read from the accountant
    budget = PrivacyLedger().after(0.0, (SGD.noise_multiplier, SGD.sample_rate, 2 * SGD.steps))
    policy = _policy(epsilon=budget.epsilon(1e-5))
    data, context = _rows(120, False, 0), gate.client_context(0, policy=policy)
    first = gate.answer(algorithm, data, message, context)
    second = gate.answer(algorithm, data, message, context)
    assert context.terms.ledger.releases == 2 and "dp_releases" not in context.state
    assert not torch.equal(first.tensors["cluster.weight"], second.tensors["cluster.weight"])
    third = gate.answer(algorithm, data, message, context)
    assert third.scalars.get("skipped") and "budget is spent" in third.scalars["reason"]


def test_the_private_reply_draws_fresh_noise_never_the_broadcasts_seed():
    algorithm = _cam()
    message = _first_round(algorithm)
    data = _rows(120, False, 0)
    other = Message(message.kind, message.tensors, {**message.scalars, "seed": 12345})

    def weight(broadcast, seed):
        context = gate.client_context(0, policy=_policy(insecure_seed=seed))
        return gate.answer(algorithm, data, broadcast, context).tensors["global.weight"]

    assert not torch.equal(weight(message, None), weight(message, None))
    # with a test seed the broadcast's seed changes nothing
    assert torch.equal(weight(message, 7), weight(other, 7))
    assert not torch.equal(weight(message, 7), weight(message, 8))


def test_a_parts_release_needs_its_parts_declared():
    assert RELEASE_TENSORS["parts"] == frozenset()
    with pytest.raises(ValueError, match="declare each tensor"):
        ReplySpec("k", shapes=lambda b, d: {}, private="parts")
    with pytest.raises(ValueError, match="private_parts must map"):
        ReplySpec("k", shapes=lambda b, d: {}, private="parts", private_parts={"x": "noisy"})
    spec = ReplySpec("k", shapes=lambda b, d: {}, private="parts", private_parts={"x": "withheld"})
    assert spec.private_part("x") == "withheld" and spec.private_part("y") is None


# ----------------------------------------------------------------------------- the choice
def _numpy_clipped_sums(models, X, y, bound, offset=None) -> np.ndarray:
    """Each linear model's sum of min(CE, bound), by numpy's log-softmax."""
    Xn, yn = X.numpy(), y.numpy()
    out = []
    for params in models:
        z = Xn @ params["weight"].numpy().T + params["bias"].numpy()
        z = z if offset is None else z + offset
        z = z - z.max(1, keepdims=True)
        ce = -(z[np.arange(len(yn)), yn] - np.log(np.exp(z).sum(1)))
        out.append(np.minimum(ce, bound).sum())
    return np.asarray(out)


def _broadcast_models(algorithm: ClusteredAlgorithm):
    state = algorithm.start()
    return [dict(p) for p in state.cluster_models], dict(state.global_model)


def test_clipped_loss_sums_match_numpy_and_one_row_moves_them_by_at_most_the_bound():
    algorithm = _cam(IFCA, n_clusters=3)
    models, _ = _broadcast_models(algorithm)
    X, y = _rows(50, False, 3)
    X = X * 5  # far rows: some losses above the bound
    bound = 1.0
    sums = clipped_loss_sums(algorithm.template, models, X, y, None, bound)
    assert_close_scaled(sums, _numpy_clipped_sums(models, X, y, bound), rtol=1e-10)
    for i in range(X.shape[0]):
        keep = torch.arange(X.shape[0]) != i
        moved = sums - clipped_loss_sums(algorithm.template, models, X[keep], y[keep], None, bound)
        assert float(moved.abs().max()) <= bound * (1 + 1e-12)
        assert float(moved.norm()) <= math.sqrt(3) * bound * (1 + 1e-12)


def test_the_choice_noise_has_its_calibrated_spread():
    sums = torch.tensor([10.0, 12.0, 15.0], dtype=F64)
    g = SeededNoise(0)
    draws = torch.stack([noisy_cluster_losses(sums, 1.5, 2.0, g) for _ in range(3000)])
    expected = 2.0 * math.sqrt(3) * 1.5  # multiplier x the L2 sensitivity sqrt(K) L
    assert abs(float(draws.std(0).mean()) / expected - 1) < 0.04
    assert_close_scaled(draws.mean(0), sums, rtol=0.03)


def test_the_ifca_choice_is_report_noisy_min_with_the_clients_multiplier():
    algorithm = _cam(IFCA)
    step = algorithm.steps[-1]
    models, _ = _broadcast_models(algorithm)
    X, y = _rows(200, False, 4)
    X = model_rows(X, BOUNDS)
    bound = algorithm.config.dp_loss_clip
    sums = _numpy_clipped_sums(models, X, y, bound)
    best, gap = int(sums.argmin()), float(abs(sums[1] - sums[0]))
    z = gap / (HISTOGRAM_SHARE * math.sqrt(2) * bound)  # noise spread = the gap
    picks = []
    for seed in range(600):
        context = gate.client_context(0, policy=_policy(z=z, insecure_seed=seed))
        generator = SeededNoise(seed, 0, 0)
        picks.append(step.private_choice(models, X, y, None, None, context, generator))
    # two clusters: P(min) = Phi(gap / (sqrt(2) spread)) for noise of spread `gap` on each
    expected = float(ndtr(1 / math.sqrt(2)))
    assert abs(np.mean(np.asarray(picks) == best) - expected) < 0.06
    context = gate.client_context(0, policy=_policy(z=1e-6))
    assert step.private_choice(models, X, y, None, None, context, SeededNoise(0, 0, 0)) == best


def test_a_fesem_client_joins_the_centre_nearest_its_released_model_else_a_random_one():
    algorithm = _cam(FeSEM, n_clusters=3)
    step = algorithm.steps[-1]
    models, _ = _broadcast_models(algorithm)
    kept = {k: v + 0.01 for k, v in models[2].items()}
    context = gate.client_context(0, policy=_policy())
    X, y = _rows(50, False, 5)
    fc = algorithm.linear_names
    centres = torch.stack([torch.cat([p[n].reshape(-1) for n in fc]) for p in models])
    mine = torch.cat([kept[n].reshape(-1) for n in fc]).unsqueeze(0)
    nearest = int(nearest_cluster(mine, centres)[0])
    assert step.private_choice(models, X, y, None, kept, context, SeededNoise(0, 0, 0)) == 2
    assert nearest == 2
    other_rows = _rows(80, True, 6)
    picks = []
    for seed in range(300):  # no released model: uniform, whatever the rows
        one = step.private_choice(models, X, y, None, None, context, SeededNoise(seed, 0, 0))
        two = step.private_choice(models, *other_rows, None, None, context, SeededNoise(seed, 0, 0))
        assert one == two
        picks.append(one)
    assert np.abs(np.bincount(picks, minlength=3) / 300 - 1 / 3).max() < 0.09


# ----------------------------------------------------------------------------- DP-SGD
def _softmax_step(W, b, X, y, offset, rate):
    """One full-batch gradient step of mean CE(y, X W^T + b + offset), by numpy."""
    z = X @ W.T + b + offset
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return W - rate * p.T @ X / len(y), b - rate * p.mean(0)


def test_one_noise_free_step_of_the_additive_pair_is_the_papers_parallel_update():
    algorithm = _cam()
    models, glob = _broadcast_models(algorithm)
    theta, big = models[1], glob
    X, y = _rows(40, True, 7)
    settings = DPSGDSettings(0.0, 1e9, 1.0, 1, expected_batch=float(X.shape[0]))
    pair = AdditivePair(algorithm.template, theta, big)
    starts = [
        {f"cluster.{k}": v for k, v in theta.items()},
        {f"global.{k}": v for k, v in big.items()},
    ]
    out = private_models(pair, starts, X, y, settings, SeededNoise(0), learning_rate=0.3)

    def lin(p):
        return X.numpy() @ p["weight"].numpy().T + p["bias"].numpy()

    Xn, yn = X.numpy(), y.numpy()
    W, b = _softmax_step(theta["weight"].numpy(), theta["bias"].numpy(), Xn, yn, lin(big), 0.3)
    assert_close_scaled(out[0]["cluster.weight"], W, rtol=1e-10)
    assert_close_scaled(out[0]["cluster.bias"], b, rtol=1e-10)
    W, b = _softmax_step(big["weight"].numpy(), big["bias"].numpy(), Xn, yn, lin(theta), 0.3)
    assert_close_scaled(out[1]["global.weight"], W, rtol=1e-10)
    assert_close_scaled(out[1]["global.bias"], b, rtol=1e-10)
    frozen = dict(pair.named_parameters())  # the pair's own halves are never trained
    assert torch.equal(frozen["cluster.weight"], theta["weight"])
    assert torch.equal(frozen["global.weight"], big["weight"])


def test_the_pairs_noise_is_sigma_c_over_the_expected_sample_on_each_half():
    algorithm = _cam()
    models, glob = _broadcast_models(algorithm)
    X, y = _rows(20, False, 8)
    sigma, clip, rate = 2000.0, 1e-3, 0.05
    settings = DPSGDSettings(sigma, clip, 1.0, 1, expected_batch=float(X.shape[0]))
    pair = AdditivePair(algorithm.template, models[0], glob)
    starts = [
        {f"cluster.{k}": v for k, v in models[0].items()},
        {f"global.{k}": v for k, v in glob.items()},
    ]
    moved = []
    for seed in range(20):
        out = private_models(pair, starts, X, y, settings, SeededNoise(seed), learning_rate=rate)
        for start, trained in zip(starts, out, strict=True):
            moved += [(trained[k] - start[k]).flatten() for k in start]
    # sgd: learning rate x M (2) on the noisy mean gradient of weight 1/M, noise sigma C / n
    expected = 2 * rate * sigma * clip / X.shape[0]
    assert abs(float(torch.cat(moved).std()) / expected - 1) < 0.12


# ----------------------------------------------------------------------------- the server
def test_the_server_averages_private_replies_with_equal_weights_and_drops_unnamed_clusters():
    algorithm = _cam(IFCA, rounds=3)
    state = algorithm.start()
    message = algorithm.configure(state)
    names = algorithm.parameter_names
    copies = [{n: torch.full_like(state.cluster_models[0][n], v) for n in names} for v in (1, 3, 9)]
    replies = {}
    for cid, (params, cluster) in enumerate(zip(copies, (0, 0, 5), strict=True)):
        tensors = {f"cluster.{n}": v for n, v in params.items()}
        tensors.update(n_samples=torch.tensor(0.0, dtype=F64), loss=torch.tensor(0.0, dtype=F64))
        replies[cid] = Message(message.kind, tensors, {"cluster": cluster, "dp_sgd_steps": 4})
    untouched = {n: v.clone() for n, v in state.cluster_models[1].items()}
    state, metrics = algorithm.server_step(state, replies)
    for n in names:  # clients 0 and 1 weigh the same; client 2 names no cluster
        assert_close_scaled(state.cluster_models[0][n], torch.full_like(untouched[n], 2.0))
        assert torch.equal(state.cluster_models[1][n], untouched[n])
    assert state.client_clusters == {0: 0, 1: 0}
    assert math.isnan(state.losses[-1]) and "loss" not in metrics
