"""VGM2 and its baselines under a client's differential-privacy policy (the vgm2* modules):
what the client half releases, one noise-free DP-SGD step of the markers (pairs of rows) and
of FedAvg's network against per-row autograd, clipping and Adam's first step by hand, the
noise from the client's own generator, and the server's equal weights."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from fednovelty.federated.bayesian.vgm2 import VGM2, VGM2Config
from fednovelty.federated.bayesian.vgm2_fedavg import VGM2FedAvg, VGM2FedAvgConfig
from fednovelty.federated.bayesian.vgm2_local import VGM2Local
from fednovelty.federated.bayesian.vgm2_markers import aggregate_priors
from fednovelty.federated.bayesian.vgm2_networks import embed
from fednovelty.federated.bayesian.vgm2_prototype import VGM2Prototype, VGM2PrototypeConfig
from fednovelty.federated.bayesian.vgm2_settings import EncoderSettings
from fednovelty.federated.core.base import Message
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import GATE_STREAM, STEP_STREAM, DPPolicy, release_noise
from fednovelty.federated.trust.dp_sgd import DPSGDSettings
from fednovelty.federated.trust.noise import GRID_BITS
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.mixture.dirnig import (
    default_markers,
    free_from_markers,
    kl_markers,
    markers_from_free,
    same_class_logit,
)

F64 = torch.float64
SMALL = {"hidden": 8, "embedding_dim": 3, "local_epochs": 1, "rounds": 2, "dtype": F64}


def make_client(rows: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor([0, 1]).repeat_interleave(rows // 2)
    X = 0.4 * torch.randn(rows, 6, generator=g, dtype=F64) + 3 * torch.eye(6, dtype=F64)[labels]
    return X, labels


def private_policy(noise: float = 1.0, steps: int = 3, rate: float = 0.5, seed: int | None = 7):
    return PrivacyPolicy(
        min_rows=1,
        dp=DPPolicy(2.0, 1e300, "local", 2, insecure_seed=seed),
        dp_sgd=DPSGDSettings(noise, 0.8, rate, steps, expected_batch=6.0),
    )


def answer(algorithm, data, policy: PrivacyPolicy, seed: int = 0) -> tuple[Message, dict]:
    state = algorithm.new_state()
    message = algorithm.steps[0].configure(state)
    message.scalars["seed"] = seed
    context = gate.client_context(3, {}, policy)
    return algorithm.steps[0].client_step(data, message, context), context.state


# ----------------------------------------------------------------------------- settings
def test_dp_mode_refuses_the_prototype_baseline_and_robust_averages() -> None:
    with pytest.raises(ValueError, match="prototype baseline has no private form"):
        VGM2PrototypeConfig(n_features=6, n_classes=2, dp_mode="central")
    with pytest.raises(ValueError, match="robust_aggregation='sum'"):
        VGM2FedAvgConfig(n_features=6, n_classes=2, robust_aggregation="median", dp_mode="local")
    with pytest.raises(ValueError, match="dp_mode must be one of"):
        VGM2Config(n_features=6, n_classes=2, dp_mode="secret")
    assert VGM2Config(n_features=6, n_classes=2, dp_mode="local").private


# ----------------------------------------------------------------------------- client half
def test_private_client_releases_dp_sgd_markers_and_a_count_without_the_loss() -> None:
    algorithm = VGM2(6, 2, **SMALL)
    reply, kept = answer(algorithm, make_client(), private_policy())
    assert sorted(reply.tensors) == ["markers", "n_samples"]
    assert reply.scalars == {"dp_sgd_steps": 3}
    assert bool((reply.tensors["markers"][:, [0, 2, 3, 4]] > 0).all())
    assert "vgm2.graph.heads" not in kept  # no kNN graph of the rows under DP-SGD
    # the same client seed gives the same markers; the server's round seed plays no part
    again, _ = answer(algorithm, make_client(), private_policy(), seed=12345)
    assert torch.equal(again.tensors["markers"], reply.tensors["markers"])
    other, _ = answer(algorithm, make_client(), private_policy(seed=8))
    assert not torch.equal(other.tensors["markers"], reply.tensors["markers"])
    # without a test seed the noise is fresh: two answers differ
    fresh = [answer(algorithm, make_client(), private_policy(seed=None))[0] for _ in range(2)]
    assert not torch.equal(fresh[0].tensors["markers"], fresh[1].tensors["markers"])


def test_private_client_without_dp_sgd_states_no_steps() -> None:
    """Without the policy's DP-SGD the markers train as usual and the reply states no
    steps: the gate's ``dp_sgd`` part refuses it."""
    policy = PrivacyPolicy(min_rows=1, dp=DPPolicy(2.0, 1e300, "local", 2, insecure_seed=7))
    reply, _ = answer(VGM2(6, 2, **SMALL), make_client(), policy)
    assert "dp_sgd_steps" not in reply.scalars and "loss" not in reply.tensors


def test_private_prototype_client_releases_nothing() -> None:
    reply, _ = answer(VGM2Prototype(6, 2, **SMALL), make_client(), private_policy())
    assert reply.scalars["skipped"] and "no private form" in reply.scalars["reason"]


def test_private_local_client_trains_as_usual_and_withholds_the_loss() -> None:
    """Nothing the Local baseline trains leaves the client: no DP-SGD, the row count only;
    what it keeps is what the plain client keeps."""
    private, kept = answer(VGM2Local(6, 2, **SMALL), make_client(), private_policy())
    plain, plain_kept = answer(VGM2Local(6, 2, **SMALL), make_client(), PrivacyPolicy(min_rows=1))
    assert sorted(private.tensors) == ["n_samples"] and not private.scalars
    assert sorted(plain.tensors) == ["loss", "n_samples"]
    assert kept.keys() == plain_kept.keys()
    assert all(torch.equal(kept[k], plain_kept[k]) for k in kept)


def test_only_methods_with_a_private_form_train_by_dp_sgd() -> None:
    """Each method's step states its private form: VGM2 and FedAvg train by DP-SGD, Local
    trains as usual, the prototype baseline is refused (client and server)."""
    steps = {cls: cls(6, 2, **SMALL).steps[0] for cls in (VGM2, VGM2FedAvg, VGM2Local)}
    assert [s.private_training for s in steps.values()] == [True, True, False]
    assert all(s.no_private_form is None for s in steps.values())
    assert VGM2Prototype(6, 2, **SMALL).steps[0].no_private_form is not None
    assert EncoderSettings.NO_PRIVATE_FORM is None
    assert VGM2PrototypeConfig.NO_PRIVATE_FORM is not None


def _adam_first_step(start: np.ndarray, gradient: np.ndarray, rate: float) -> np.ndarray:
    """Adam's first step (bias-corrected m / sqrt(v) = g / |g|)."""
    return start - rate * gradient / (np.abs(gradient) + 1e-8)


def test_one_noise_free_marker_step_is_the_clipped_pair_units_by_hand() -> None:
    """sigma = 0, q = 1, one step, frozen encoder: the markers' unconstrained parameters
    move by Adam's first step on the sum over the cycle's units of the pair loss's
    gradient (autograd, one unit at a time) clipped to C / 3, over n."""
    config = {**SMALL, "train_encoder": False, "kl_weight": 0.3}
    algorithm = VGM2(6, 2, **config)
    X, y = make_client(rows=6)
    policy = private_policy(noise=0.0, steps=1, rate=1.0)
    reply, _ = answer(algorithm, (X, y), policy)
    prior = algorithm.initial_prior()
    scale = algorithm.config.marker_learning_rate / algorithm.config.learning_rate
    Z = embed(algorithm.encoder, algorithm.initial_encoder(), X).detach()
    replay = release_noise(policy.dp, 3, 0, STEP_STREAM)
    replay.uniform((6,))  # the Poisson sample: every row
    order = replay.permutation(6).tolist()
    start = (free_from_markers(prior.clone()) / scale).numpy()
    total = np.zeros_like(start)
    for a, b in zip(order, order[1:] + order[:1], strict=True):
        free = torch.tensor(start, requires_grad=True)
        markers = markers_from_free(scale * free)
        s = (Z[a] - Z[b]).square().sum().add(1e-12).sqrt().reshape(1)
        same = torch.tensor([float(y[a] == y[b])], dtype=F64)
        loss = nn.functional.binary_cross_entropy_with_logits(
            same_class_logit(s, markers), same
        ) + 0.3 * kl_markers(markers, prior)
        loss.backward()
        unit = free.grad.numpy()
        total += unit * min(1.0, 0.8 / 3 / np.linalg.norm(unit))
    trained = _adam_first_step(start, total / 6, algorithm.config.learning_rate)
    expected = markers_from_free(scale * torch.tensor(trained))
    torch.testing.assert_close(reply.tensors["markers"], expected, rtol=1e-9, atol=1e-12)


def test_one_noise_free_fedavg_step_is_the_clipped_rows_by_hand() -> None:
    """FedAvg under DP-SGD: per-row cross-entropy gradients of encoder and head together
    (autograd, one row at a time), clipped jointly to C, summed over n, Adam's first step."""
    algorithm = VGM2FedAvg(6, 2, **SMALL)
    X, y = make_client(rows=6)
    reply, _ = answer(algorithm, (X, y), private_policy(noise=0.0, steps=1, rate=1.0))
    assert reply.scalars == {"dp_sgd_steps": 1}
    encoder, head = algorithm.initial_encoder(), algorithm.initial_head()
    names = [f"encoder.{k}" for k in encoder] + [f"head.{k}" for k in head]
    starts = [v.numpy() for v in (*encoder.values(), *head.values())]
    totals = [np.zeros_like(v) for v in starts]
    for i in range(6):
        leaves = [torch.tensor(v, requires_grad=True) for v in starts]
        h = torch.relu(X[i] @ leaves[0].T + leaves[1]) @ leaves[2].T + leaves[3]
        out = h @ leaves[4].T + leaves[5]
        nn.functional.cross_entropy(out.unsqueeze(0), y[i : i + 1]).backward()
        grads = [leaf.grad.numpy() for leaf in leaves]
        norm = np.sqrt(sum(float((g**2).sum()) for g in grads))
        for total, g in zip(totals, grads, strict=True):
            total += g * min(1.0, 0.8 / norm)
    for name, start, total in zip(names, starts, totals, strict=True):
        expected = _adam_first_step(start, total / 6, algorithm.config.learning_rate)
        np.testing.assert_allclose(reply.tensors[name].numpy(), expected, rtol=1e-9, atol=1e-12)


# ----------------------------------------------------------------------------- the gate
def test_gate_releases_dp_sgd_markers_and_noises_the_count() -> None:
    """The reply's private form is its parts: the markers leave as trained, the row count
    with the histogram's noise ``8 z`` drawn from the client's first release generator."""
    algorithm = VGM2(6, 2, **SMALL)
    data, policy = make_client(), private_policy()
    assert algorithm.reply_spec("vgm2").private == "parts"
    trained, _ = answer(algorithm, data, policy)
    message = algorithm.steps[0].configure(algorithm.new_state())
    message.scalars["seed"] = 0
    released = gate.answer(algorithm, data, message, gate.client_context(3, {}, policy))
    assert torch.equal(released.tensors["markers"], trained.tensors["markers"])
    noise = release_noise(policy.dp, 3, 0, GATE_STREAM).normal(())
    grid = 2.0 ** (math.floor(math.log2(8 * 2.0)) - GRID_BITS)  # the noisy value's grid
    torch.testing.assert_close(
        released.tensors["n_samples"], 12 + 8 * 2.0 * noise, rtol=0, atol=grid
    )


def test_gate_refuses_markers_not_trained_by_dp_sgd() -> None:
    policy = PrivacyPolicy(min_rows=1, dp=DPPolicy(2.0, 1e300, "local", 2, insecure_seed=7))
    algorithm = VGM2(6, 2, **SMALL)
    message = algorithm.steps[0].configure(algorithm.new_state())
    released = gate.answer(algorithm, make_client(), message, gate.client_context(3, {}, policy))
    assert released.scalars["skipped"] and not released.tensors
    assert "not trained by DP-SGD" in released.scalars["reason"]


# ----------------------------------------------------------------------------- server half
def test_private_server_weighs_clients_equally_and_expects_no_loss() -> None:
    algorithm = VGM2(6, 2, dp_mode="central", **SMALL)
    step = algorithm.steps[0]
    state = algorithm.new_state()
    broadcast = step.configure(state)
    assert broadcast.scalars["private"] is True
    prior = algorithm.initial_prior()
    first, second = prior.clone(), prior.clone()
    first[:, 1] += 0.5
    second[:, 3] *= 2
    replies = {
        0: Message("vgm2", {"markers": first, "n_samples": torch.tensor(-3.0, dtype=F64)}),
        1: Message("vgm2", {"markers": second, "n_samples": torch.tensor(900.0, dtype=F64)}),
    }
    assert step.reply_problem(replies[0], broadcast) is None
    _, metrics = step.server_step(state, replies)
    assert metrics["n_invalid"] == 0 and np.isnan(metrics["loss"])
    equal = aggregate_priors([first, second], torch.ones(2, dtype=F64), "moment")
    torch.testing.assert_close(state.prior, equal, rtol=1e-12, atol=1e-12)
    with_loss = Message("vgm2", {**replies[1].tensors, "loss": torch.tensor(0.5, dtype=F64)})
    assert "expected" in step.reply_problem(with_loss, broadcast)
    plain = VGM2(6, 2, **SMALL)
    assert "private" not in plain.steps[0].configure(plain.new_state()).scalars


def test_default_markers_reach_the_reference_prior() -> None:
    """The reference of the marker test starts where the client does."""
    assert torch.equal(VGM2(6, 2, **SMALL).initial_prior(), default_markers(3, dtype=F64))
