"""The clients' privacy policy: whatever a (hostile) server asks, no reply reveals a raw row.

The property tests fuzz every kind of message the algorithms' clients answer (k-means with
``n_clusters`` up to 10**9, the raw-row ``subset`` round with ``fraction=1``, ranges, counts,
moments, assignment and EM rounds with random parameters, a centre exactly on a far-out row,
local fits with many candidate K, the joint model's rounds, PCA moments) against small and
skewed clients (1-15 rows; a few dozen rows with one far-out row). Every reply must:

- carry no tensor at all when it says ``skipped``, and come from a client with at least
  ``min_rows`` rows otherwise;
- release no vector equal to a client row (any row of any tensor of width ``d``, and the
  means the statistics imply: ``shift + sums / counts``, ``sum / n``);
- back every released per-component statistic by at least ``min_rows`` rows: hard counts
  at least the floor (or exactly zero), soft components at least the floor in effective
  rows (Kish's ``(sum r)^2 / sum r^2``, recomputed here from the broadcast parameters).

Client rows are drawn from a seeded normal distribution (continuous, so no two rows and no
mean of several rows coincide with a row by chance), never by hypothesis itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.func import functional_call

from fednovelty.detectors import FedGenGMMDetector, FedGMMDetector
from fednovelty.detectors.options import Privacy
from fednovelty.exceptions import DataLossWarning
from fednovelty.federated import FederatedEM, FedGenGMM, Message, PrivacyPolicy
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.mixtures.pca import FederatedPCA
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.backing import effective_rows
from fednovelty.federated.trust.floors import (
    backed_mixture,
    merge_small_clusters,
    suppress_components,
    trimmed_range,
)
from fednovelty.mixture import (
    MixtureParams,
    e_step_stats,
    log_gaussian_prob,
    predict_proba,
    stats_from_resp,
)
from fednovelty.mixture.em import moment_shift
from fednovelty.mixture.kmeans import assign, one_hot
from fednovelty.runtime import run_simulation

FLOOR = 5  # PrivacyPolicy's default min_rows
POLICY = PrivacyPolicy()
#: why a client below the floor skips (its terms say).
REASON = gate.client_context(0, policy=POLICY).terms.below_floor
COVARIANCE_TYPES = ("full", "tied", "diag", "spherical")
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: settings under which FederatedEM's protocol has rounds of a kind (a client answers only
#: the rounds of its own protocol, and reads every setting from its own configuration).
PROTOCOL = {
    "moments": {"standardize": True},
    "range": {"init_params": "separated"},
    "count": {"init_params": "subset"},
    "subset": {"init_params": "subset"},
}


def em_answering(kind: str, n_components: int = 2, **settings) -> FederatedEM:
    """A ``FederatedEM`` whose protocol has rounds of ``kind``."""
    return FederatedEM(n_components, **PROTOCOL.get(kind, {}), **settings)


# ---------------------------------------------------------------------------- clients
def client_rows(seed: int, n_rows: int, n_features: int, far_out: bool) -> Tensor:
    """``n_rows`` continuous rows; with ``far_out`` the last one lies 60 sd away."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n_rows, n_features))
    if far_out and n_rows > 1:
        X[-1] = 60.0 + rng.normal(size=n_features)
    return torch.as_tensor(X)


@st.composite
def clients(draw) -> Tensor:
    """A small client (1-15 rows) or a skewed one (16-60 rows, one far out)."""
    seed = draw(st.integers(0, 2**32 - 1))
    d = draw(st.integers(1, 4))
    if draw(st.booleans()):
        return client_rows(seed, draw(st.integers(1, 15)), d, draw(st.booleans()))
    return client_rows(seed, draw(st.integers(16, 60)), d, True)


def points(draw, X: Tensor, k: int) -> Tensor:
    """``k`` centres: random, or exactly on a client row (the far-out row most often)."""
    n, d = X.shape
    out = []
    for _ in range(k):
        where = draw(st.sampled_from(["random", "far", "row"]))
        if where == "far":
            out.append(X[-1])
        elif where == "row":
            out.append(X[draw(st.integers(0, n - 1))])
        else:
            seed = draw(st.integers(0, 2**32 - 1))
            out.append(torch.as_tensor(np.random.default_rng(seed).normal(0, 3, size=d)))
    return torch.stack(out).to(X.dtype)


def precision_factors(draw, covariance_type: str, k: int, d: int) -> Tensor:
    """Random valid precision Cholesky factors, from very wide to very sharp (sd 1e-3)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    log_scale = draw(st.floats(-2.0, 7.0))

    def diagonal(shape):
        return np.exp(log_scale + rng.uniform(-0.5, 0.5, size=shape))

    if covariance_type in ("full", "tied"):
        shape = (k, d, d) if covariance_type == "full" else (d, d)
        factor = np.triu(rng.normal(size=shape), 1) * np.exp(log_scale) * 0.1
        factor = factor + np.eye(d) * diagonal(shape[:-1])[..., None]
        return torch.as_tensor(factor)
    return torch.as_tensor(diagonal((k, d) if covariance_type == "diag" else (k,)))


@st.composite
def em_rounds(draw, X: Tensor) -> Message:
    """An ``em`` or ``assign`` broadcast with random parameters."""
    d = X.shape[1]
    ct = draw(st.sampled_from(COVARIANCE_TYPES))
    k = draw(st.integers(1, 6))
    means = points(draw, X, k)
    shift = points(draw, X, 1)[0]
    if draw(st.booleans()):
        return Message("assign", {"centers": means, "shift": shift}, expect={"covariance_type": ct})
    raw = torch.as_tensor(draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k)))
    tensors = {
        "weights": (raw / raw.sum()).to(X.dtype),
        "means": means,
        "precisions_cholesky": precision_factors(draw, ct, k, d),
        "shift": shift,
    }
    return Message("em", tensors, expect={"covariance_type": ct})


# ---------------------------------------------------------------------------- checks
def released_rows(reply: Message, d: int, shift: Tensor | None) -> list[Tensor]:
    """Every vector of width ``d`` the reply releases or implies, each (m, d)."""
    t = reply.tensors
    rows = [v.reshape(-1, d) for v in t.values() if v.ndim >= 1 and v.shape[-1] == d]
    if "sums" in t:
        occupied = t["counts"] > 0
        rows.append(shift + t["sums"][occupied] / t["counts"][occupied].unsqueeze(1))
    if "sum" in t:
        rows.append((t["sum"] / t["n"]).reshape(1, d))
    return rows


def assert_no_raw_row(reply: Message, X: Tensor, shift: Tensor | None = None) -> None:
    for rows in released_rows(reply, X.shape[1], shift):
        same = torch.isclose(rows.unsqueeze(1), X.unsqueeze(0), rtol=1e-9, atol=0.0).all(-1)
        assert not bool(same.any()), f"{reply.kind} reply releases a client row"


def assert_floor(reply: Message, n_rows: int) -> bool:
    """The reply is skipped (and empty) or comes from a client at the floor; returns
    whether it released anything."""
    if reply.scalars.get("skipped"):
        assert reply.tensors == {}, f"skipped {reply.kind} reply carries {sorted(reply.tensors)}"
        assert reply.scalars["reason"]
        return False
    assert n_rows >= FLOOR, f"a client of {n_rows} rows answered {reply.kind}"
    return True


def kish(resp: Tensor) -> Tensor:
    """Effective rows per column of ``resp`` (n, ...), computed directly."""
    return resp.sum(0).square() / resp.square().sum(0).clamp_min(1e-300)


def assert_stats_backed(reply: Message, message: Message, X: Tensor) -> None:
    """Hard (``assign``) or soft (``em``) components: released ones backed by the floor,
    suppressed ones all zero."""
    t, b = reply.tensors, message.tensors
    if message.kind == "assign":
        labels, _ = assign(X, b["centers"])
        resp = one_hot(labels, b["centers"].shape[0], X)
        rows = resp.sum(0)
    else:
        params = MixtureParams(
            b["weights"], b["means"], b["precisions_cholesky"], message.expect["covariance_type"]
        )
        resp = predict_proba(params, X)
        rows = kish(resp)
    released = t["counts"] > 0
    assert bool((rows[released] >= FLOOR * (1 - 1e-6)).all()), (rows, t["counts"])
    np.testing.assert_allclose(t["counts"][released], resp.sum(0)[released], rtol=1e-6)
    assert bool((t["sums"][~released] == 0).all())
    if message.expect["covariance_type"] != "tied":
        assert bool((t["second"][~released] == 0).all())


# ---------------------------------------------------------------------------- property tests
@FUZZ
@given(X=clients(), data=st.data())
def test_init_rounds_reveal_no_row(X, data):
    d, n = X.shape[1], X.shape[0]
    kind = data.draw(st.sampled_from(["centroids", "subset", "range", "count", "moments"]))
    scalars = {"seed": data.draw(st.integers(0, 2**31))}
    n_clusters = 2
    if kind == "centroids":
        n_clusters = data.draw(st.sampled_from([1, 2, 3, 10, 64, 10**9]))
    if kind == "subset":
        scalars["fraction"] = data.draw(st.sampled_from([1.0, 0.5, 0.01]))
    message = Message(kind, {}, scalars)
    if data.draw(st.booleans()):  # a standardised round: the client works on z-scores
        message.tensors.update(offset=torch.zeros(d, dtype=X.dtype), scale=torch.ones(d))
    algorithm = em_answering(kind, n_clusters)
    reply = gate.answer(algorithm, X, message, gate.client_context(0, policy=POLICY))
    if not assert_floor(reply, n):
        return
    assert kind != "subset", "the subset round was answered without allow_raw_rows"
    assert_no_raw_row(reply, X)
    if kind == "centroids":
        counts = reply.tensors["counts"]
        assert bool((counts >= FLOOR).all()) and float(counts.sum()) == n
        assert counts.shape[0] <= n // FLOOR


@FUZZ
@given(X=clients(), data=st.data())
def test_statistics_rounds_reveal_no_row(X, data):
    message = data.draw(em_rounds(X))
    weights = data.draw(st.sampled_from(["global", "personal"]))
    algorithm = FederatedEM(
        2, covariance_type=message.expect["covariance_type"], mixture_weights=weights
    )
    reply = gate.answer(algorithm, X, message, gate.client_context(0, policy=POLICY))
    if not assert_floor(reply, X.shape[0]):
        return
    assert_no_raw_row(reply, X, message.tensors["shift"])
    assert_stats_backed(reply, message, X)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(X=clients(), data=st.data())
def test_local_fits_reveal_no_row(X, data):
    most = data.draw(st.integers(1, 40))
    algorithm = FedGenGMM(
        k_range=(1, most),
        covariance_type=data.draw(st.sampled_from(COVARIANCE_TYPES)),
        min_client_samples=data.draw(st.integers(1, 3)),
        standardize=data.draw(st.booleans()),
        prior_strength=data.draw(st.sampled_from([None, 3.0])),
        max_iter=20,
    )
    message = algorithm.configure(algorithm.start())
    reply = gate.answer(algorithm, X, message, gate.client_context(0, policy=POLICY))
    if not assert_floor(reply, X.shape[0]):
        return
    assert_no_raw_row(reply, X)
    weights = reply.tensors["weights"]
    assert bool((weights * X.shape[0] >= FLOOR * (1 - 1e-9)).all())
    assert weights.shape[0] <= X.shape[0] // FLOOR
    np.testing.assert_allclose(float(weights.sum()), 1.0, rtol=1e-12)


def joint_responsibilities(message: Message, X: Tensor, y: Tensor, k2: int) -> Tensor:
    """``q_i(m1, m2)`` (n, M1, M2) of a first joint round, computed here from scratch."""
    t = message.tensors
    ct = message.expect["covariance_type"]
    log_n = log_gaussian_prob(X, t["means"], t["precisions_cholesky"], ct)
    template = nn.Linear(X.shape[1], 2).double()
    log_py = []
    for m2 in range(k2):
        params = {name: t[f"learner.{m2}.{name}"] for name in ("weight", "bias")}
        logits = functional_call(template, params, (X,))
        log_py.append(-nn.functional.cross_entropy(logits, y, reduction="none"))
    log_pi = (t["weights"] / k2).log()
    joint = log_pi[None, :, None] + log_n[:, :, None] + torch.stack(log_py, 1)[:, None, :]
    flat = joint.reshape(X.shape[0], -1)
    return (flat - flat.logsumexp(1, keepdim=True)).exp().view_as(joint)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(X=clients(), data=st.data())
def test_joint_rounds_reveal_no_row(X, data):
    n, d = X.shape
    k2 = data.draw(st.integers(1, 3))
    base = data.draw(em_rounds(X).filter(lambda m: m.kind == "em"))
    labels = np.random.default_rng(data.draw(st.integers(0, 2**31))).integers(0, 2, n)
    y = torch.as_tensor(labels)
    sharp = data.draw(st.floats(0.1, 30.0))
    learners = {}
    for m2 in range(k2):
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
        learners[f"learner.{m2}.weight"] = torch.as_tensor(rng.normal(0, sharp, (2, d)))
        learners[f"learner.{m2}.bias"] = torch.as_tensor(rng.normal(0, sharp, 2))
    ct = base.expect["covariance_type"]
    message = Message("joint_em", {**base.tensors, **learners}, {"seed": 3}, expect=base.expect)
    algorithm = JointFedGMM(base.tensors["means"].shape[0], k2, 2, covariance_type=ct)
    reply = gate.answer(algorithm, (X, y), message, gate.client_context(0, policy=POLICY))
    if not assert_floor(reply, n):
        return
    assert_no_raw_row(reply, X, base.tensors["shift"])
    q = joint_responsibilities(message, X, y, k2)
    cells = reply.tensors["joint_counts"] > 0
    assert bool((kish(q)[cells] >= FLOOR * (1 - 1e-6)).all())
    gaussians = kish((q * cells).sum(2))
    assert bool((gaussians[reply.tensors["counts"] > 0] >= FLOOR * (1 - 1e-6)).all())
    np.testing.assert_allclose(reply.tensors["joint_counts"].sum(1), reply.tensors["counts"])
    for m2 in range(k2):  # a learner trained on fewer effective rows goes back unchanged
        trained = not torch.equal(
            reply.tensors[f"learner.{m2}.bias"], learners[f"learner.{m2}.bias"]
        )
        if trained:
            assert float(kish(q.sum(1))[m2]) >= FLOOR * (1 - 1e-6)


@FUZZ
@given(X=clients(), data=st.data())
def test_pca_rounds_reveal_no_row(X, data):
    d = X.shape[1]
    if data.draw(st.booleans()):
        message = Message("moments_mean")
    else:
        message = Message("moments_scatter", {"mean": points(data.draw, X, 1)[0]})
    reply = gate.answer(FederatedPCA(1), X, message, gate.client_context(0, policy=POLICY))
    if assert_floor(reply, X.shape[0]):
        assert_no_raw_row(reply, X)
        assert reply.tensors["n"].shape == () and d == X.shape[1]


# ---------------------------------------------------------------------------- unit tests
def test_policy_fields_are_validated():
    assert PrivacyPolicy() == PrivacyPolicy(min_rows=5, allow_raw_rows=False, max_clusters=64)
    with pytest.raises(ValueError, match="min_rows must be >= 1, got 0"):
        PrivacyPolicy(min_rows=0)
    with pytest.raises(ValueError, match="max_clusters must be >= 1"):
        PrivacyPolicy(max_clusters=-3)
    with pytest.raises(TypeError, match="min_rows must be an int, got str"):
        PrivacyPolicy(min_rows="5")
    with pytest.raises(TypeError, match="min_rows must be an int, got bool"):
        PrivacyPolicy(min_rows=True)
    with pytest.raises(TypeError, match="allow_raw_rows must be True or False"):
        PrivacyPolicy(allow_raw_rows="yes")
    with pytest.raises(TypeError, match="privacy must be a PrivacyPolicy"):
        run_simulation(FederatedEM(1), [torch.zeros(6, 2)], privacy={"min_rows": 5})


def far_out_client(n_rows: int = 200) -> Tensor:
    X = client_rows(0, n_rows, 3, far_out=True)
    X[-1] = torch.tensor([1e3, -1e3, 1e3], dtype=X.dtype)
    return X


def test_a_far_out_row_is_never_a_centroid():
    X = far_out_client()
    message = Message("centroids", scalars={"seed": 0})
    reply = gate.answer(FederatedEM(8), X, message, gate.client_context(0))
    centers, counts = reply.tensors["centers"], reply.tensors["counts"]
    assert bool((counts >= FLOOR).all()) and float(counts.sum()) == X.shape[0]
    assert not bool(torch.isclose(centers, X[-1], rtol=1e-9).all(1).any())
    # the unprotected protocol (no floor) sends the far-out row itself as a centroid
    bare = gate.answer(FederatedEM(8), X, message, gate.client_context(0, policy=PrivacyPolicy(1)))
    assert bool(torch.isclose(bare.tensors["centers"], X[-1], rtol=1e-9).all(1).any())


def test_small_clusters_merge_into_the_nearest_large_one():
    X = torch.tensor([[0.0], [0.1], [0.2], [0.3], [0.4], [10.0], [10.1], [10.2], [3.0]])
    labels = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 2])
    centers = torch.tensor([[0.2], [10.1], [3.0]])
    merged, counts = merge_small_clusters(X, labels, centers, min_rows=5)
    torch.testing.assert_close(counts, torch.tensor([9.0]))
    torch.testing.assert_close(merged, X.mean(0, keepdim=True))
    merged, counts = merge_small_clusters(X, labels, centers, min_rows=3)
    torch.testing.assert_close(counts, torch.tensor([6.0, 3.0]))  # 3.0 joins the 0.x cluster
    torch.testing.assert_close(merged[0], X[[0, 1, 2, 3, 4, 8]].mean(0))
    with pytest.raises(ValueError, match="no k-means cluster has min_rows=10 rows"):
        merge_small_clusters(X, labels, centers, min_rows=10)


def test_a_huge_n_clusters_is_bounded_by_the_policy():
    X = client_rows(1, 40, 2, far_out=False)
    message = Message("centroids", scalars={"seed": 0})
    reply = gate.answer(FederatedEM(10**9), X, message, gate.client_context(0))
    assert 1 <= reply.tensors["centers"].shape[0] <= 40 // FLOOR
    assert bool((reply.tensors["counts"] >= FLOOR).all())
    capped = gate.client_context(0, policy=PrivacyPolicy(min_rows=2, max_clusters=3))
    assert gate.answer(FederatedEM(10**9), X, message, capped).tensors["centers"].shape[0] <= 3
    assert gate.client_context(0).terms.cluster_bound(10**9, 40) == 8
    three = gate.client_context(0, policy=PrivacyPolicy(max_clusters=3)).terms
    assert three.cluster_bound(10**9, 40) == 3


def test_subset_is_refused_unless_raw_rows_are_allowed():
    X = client_rows(2, 30, 2, far_out=False)
    message = Message("subset", scalars={"fraction": 1.0, "seed": 0})
    refused = gate.answer(em_answering("subset"), X, message, gate.client_context(0))
    assert refused.scalars["skipped"] and refused.tensors == {}
    assert "allow_raw_rows" in refused.scalars["reason"]
    allowed = gate.client_context(0, policy=PrivacyPolicy(allow_raw_rows=True))
    rows = gate.answer(em_answering("subset"), X, message, allowed).tensors["rows"]
    assert rows.shape == X.shape  # fraction 1: every row, as the user allowed
    assert bool(torch.isclose(rows.unsqueeze(1), X.unsqueeze(0)).all(-1).any(1).all())


def test_a_three_row_client_releases_nothing():
    X = client_rows(3, 3, 2, far_out=False)
    params = {
        "weights": torch.tensor([0.5, 0.5], dtype=X.dtype),
        "means": X[:2].clone(),
        "precisions_cholesky": torch.eye(2, dtype=X.dtype).expand(2, 2, 2).clone(),
        "shift": X.mean(0),
    }
    messages = [
        Message("moments"),
        Message("centroids", scalars={"seed": 0}),
        Message("range"),
        Message("count"),
        Message("assign", {"centers": X[:2], "shift": X[0]}),
        Message("em", params),
    ]
    replies = [gate.answer(em_answering(m.kind), X, m, gate.client_context(0)) for m in messages]
    fedgen = FedGenGMM(k_range=(1, 2))
    replies.append(gate.answer(fedgen, X, fedgen.configure(fedgen.start()), gate.client_context(0)))
    replies += [
        gate.answer(FederatedPCA(1), X, Message("moments_mean"), gate.client_context(0)),
        gate.answer(
            FederatedPCA(1), X, Message("moments_scatter", {"mean": X[0]}), gate.client_context(0)
        ),
    ]
    joint = JointFedGMM(2, 1, 2)
    learner = {
        "learner.0.weight": torch.zeros(2, 2, dtype=X.dtype),
        "learner.0.bias": torch.zeros(2, dtype=X.dtype),
    }
    message = Message("joint_em", {**params, **learner}, {"seed": 0})
    replies.append(
        gate.answer(joint, (X, torch.tensor([0, 1, 0])), message, gate.client_context(0))
    )
    for reply in replies:
        assert reply.scalars == {
            "skipped": True,
            "reason": gate.client_context(0, policy=POLICY).terms.below_floor,
        }, reply.kind
        assert reply.tensors == {}, reply.kind  # not even the row count
    # min_rows=1 is the unprotected protocol: the same client answers every round
    bare = gate.client_context(0, policy=PrivacyPolicy(min_rows=1))
    assert all(
        not gate.answer(em_answering(m.kind), X, m, bare).scalars.get("skipped") for m in messages
    )


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_a_component_on_a_far_out_row_is_suppressed(covariance_type):
    """A server centres a sharp component on the far-out row: that component's statistics
    (one row's) go out as zeros, the other's are those of the remaining rows."""
    X, ct = far_out_client(60), covariance_type
    loose_and_sharp = {  # component 0 over the bulk, component 1 sharp on the far-out row
        "full": torch.stack([torch.eye(3), 1e3 * torch.eye(3)]),
        "tied": torch.eye(3),
        "diag": torch.tensor([[1.0] * 3, [1e3] * 3]),
        "spherical": torch.tensor([1.0, 1e3]),
    }[ct].to(X.dtype)
    tensors = {
        "weights": torch.tensor([0.9, 0.1], dtype=X.dtype),
        "means": torch.stack([X[:-1].mean(0), X[-1]]),
        "precisions_cholesky": loose_and_sharp,
        "shift": X.mean(0),
    }
    message = Message("em", tensors)
    t = gate.answer(FederatedEM(2, covariance_type=ct), X, message, gate.client_context(0)).tensors
    assert float(t["counts"][1]) == 0.0 and bool((t["sums"][1] == 0).all())
    params = MixtureParams(tensors["weights"], tensors["means"], loose_and_sharp, ct)
    keep = torch.tensor([1.0, 0.0], dtype=X.dtype)
    expected = stats_from_resp(X, predict_proba(params, X) * keep, ct, tensors["shift"])
    for name in ("counts", "sums", "second"):
        scale = float(getattr(expected, name).abs().max())
        np.testing.assert_allclose(
            t[name], getattr(expected, name), rtol=1e-9, atol=1e-12 * scale, err_msg=name
        )
    assert float(t["n_samples"]) == X.shape[0]


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_a_vb_component_on_a_far_out_row_is_suppressed(covariance_type):
    """Federated VB's rounds keep the floor as EM's do: a component the broadcast centres
    sharply on the far-out row goes out as zeros, the other carries the rest's statistics."""
    from fednovelty.federated.bayesian.variational import FederatedVB

    X, ct = far_out_client(60), covariance_type
    sharp = {
        "full": torch.stack([torch.eye(3), 1e3 * torch.eye(3)]),
        "tied": torch.eye(3),
        "diag": torch.tensor([[1.0] * 3, [1e3] * 3]),
        "spherical": torch.tensor([1.0, 1e3]),
    }[ct].to(X.dtype)
    tensors = {
        "log_weights": torch.tensor([0.9, 0.1], dtype=X.dtype).log(),
        "means": torch.stack([X[:-1].mean(0), X[-1]]),
        "precisions_cholesky": sharp,
        "shift": X.mean(0),
    }
    algorithm = FederatedVB(2, covariance_type=ct)
    t = gate.answer(algorithm, X, Message("vb", tensors), gate.client_context(0)).tensors
    assert float(t["counts"][1]) == 0.0 and bool((t["sums"][1] == 0).all())
    assert float(t["counts"][0]) > X.shape[0] - 2
    bare = gate.client_context(0, policy=PrivacyPolicy(min_rows=1))  # no floor: both released
    loose = gate.answer(algorithm, X, Message("vb", tensors), bare).tensors
    assert 0.5 < float(loose["counts"][1]) <= 1.0 + 1e-9


def test_local_fits_keep_only_backed_components():
    X = client_rows(5, 12, 2, far_out=True)
    algorithm = FedGenGMM(k_range=(1, 10))
    reply = gate.answer(
        algorithm, X, algorithm.configure(algorithm.start()), gate.client_context(0)
    )
    assert reply.tensors["weights"].shape[0] <= 12 // FLOOR
    params = MixtureParams(
        torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64),
        torch.zeros(3, 2, dtype=torch.float64),
        torch.ones(3, dtype=torch.float64),
        "spherical",
    )
    kept = backed_mixture(params, 20, 5)  # 10, 6 and 4 rows: the last goes
    torch.testing.assert_close(kept.weights, torch.tensor([0.625, 0.375], dtype=torch.float64))
    assert backed_mixture(params, 20, 1) is params
    with pytest.raises(ValueError, match="no component"):
        backed_mixture(params, 5, 5)


def test_effective_rows_and_squared_counts():
    hard = one_hot(torch.tensor([0, 0, 1, 0]), 3, torch.zeros(1, dtype=torch.float64))
    torch.testing.assert_close(
        effective_rows(hard.sum(0), hard.square().sum(0)),
        torch.tensor([3.0, 1.0, 0.0], dtype=torch.float64),
    )
    flat = torch.full((10, 1), 0.01, dtype=torch.float64)  # 0.1 rows spread evenly over 10
    torch.testing.assert_close(
        effective_rows(flat.sum(0), flat.square().sum(0)), torch.tensor([10.0], dtype=torch.float64)
    )
    # the chunked E-step's sum of squared responsibilities, against predict_proba's
    X = client_rows(6, 700, 3, far_out=True)
    params = MixtureParams(
        torch.tensor([0.3, 0.3, 0.4], dtype=X.dtype),
        X[[0, 1, -1]].clone(),
        torch.eye(3, dtype=X.dtype).expand(3, 3, 3).clone(),
        "full",
    )
    squared = X.new_zeros(3)
    stats = e_step_stats(
        X,
        params.weights.log(),
        params.means,
        params.precisions_cholesky,
        "full",
        moment_shift(params),
        chunk_size=64,
        squared_counts=squared,
    )
    resp = predict_proba(params, X)
    np.testing.assert_allclose(squared, resp.square().sum(0), rtol=1e-10)
    np.testing.assert_allclose(stats.counts, resp.sum(0), rtol=1e-10)


def test_trimmed_range_and_tied_suppression_need_their_inputs():
    X = torch.arange(12.0, dtype=torch.float64).view(6, 2)
    low, high = trimmed_range(X, 2)
    torch.testing.assert_close(low, torch.tensor([1.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(high, torch.tensor([9.0, 10.0], dtype=torch.float64))
    low, high = trimmed_range(X, 1)
    torch.testing.assert_close((low, high), (X.amin(0), X.amax(0)))
    stats = stats_from_resp(X, torch.ones(6, 1, dtype=X.dtype), "tied", X.mean(0))
    with pytest.raises(ValueError, match="tied_second"):
        suppress_components(stats, torch.tensor([False]))


def test_a_client_below_the_floor_is_left_out_of_the_fit():
    rng = np.random.default_rng(0)
    big = [torch.as_tensor(rng.normal(c, 1, (80, 2))) for c in (0.0, 6.0)]
    tiny = torch.as_tensor(rng.normal(3.0, 1, (3, 2)))
    algorithm = FederatedEM(2, random_state=0)
    with_tiny = run_simulation(algorithm, {0: big[0], 1: big[1], 2: tiny})
    without = run_simulation(FederatedEM(2, random_state=0), {0: big[0], 1: big[1]})
    for name in ("weights", "means", "precisions_cholesky"):
        np.testing.assert_allclose(
            getattr(with_tiny.state.params, name), getattr(without.state.params, name), rtol=1e-12
        )


def test_detectors_take_the_floor_and_subset_still_works():
    rng = np.random.default_rng(0)
    X = np.vstack(
        [rng.normal(0, 1, (100, 2)), rng.normal(5, 1, (100, 2)), rng.normal(2, 1, (3, 2))]
    )
    groups = np.repeat([0, 1, 2], [100, 100, 3])
    with pytest.warns(UserWarning, match=r"client 2 \(3 rows; .*privacy floor \(min_rows=5\)"):
        det = FedGenGMMDetector(n_components=2, random_state=0).fit(X, groups=groups)
    assert det.skipped_clients_ == [2]
    bare = FedGenGMMDetector(n_components=2, random_state=0, privacy=Privacy(min_rows=1))
    assert bare.fit(X, groups=groups).skipped_clients_ == []  # no floor: 3 rows take part
    with pytest.raises(ValueError, match="'min_rows' parameter of Privacy"):
        FedGMMDetector(2, privacy=Privacy(min_rows=0)).fit(X, groups=groups)
    with pytest.warns(UserWarning, match="raw rows"):
        subset = FedGMMDetector(2, init_params="subset", random_state=0).fit(X, groups=groups)
    assert [r["kind"] for r in subset.history_[:3]] == ["moments", "count", "subset"]
    assert subset.history_[2]["rows_shared"] > 0


def test_flower_nodes_read_their_policy_from_their_own_config():
    pytest.importorskip("flwr")
    from fednovelty.exceptions import ClientDataError
    from fednovelty.runtime.flower.client import policy_from_node_config

    assert policy_from_node_config({"partition-id": 0}) == PrivacyPolicy()
    policy = policy_from_node_config(
        {"privacy-min-rows": 10, "privacy-allow-raw-rows": "true", "privacy-max-clusters": "8"}
    )
    assert policy == PrivacyPolicy(min_rows=10, allow_raw_rows=True, max_clusters=8)
    with pytest.raises(ClientDataError, match="'privacy-min-rows' must be a positive integer"):
        policy_from_node_config({"privacy-min-rows": 2.5})
    with pytest.raises(ClientDataError, match="min_rows must be >= 1"):
        policy_from_node_config({"privacy-min-rows": 0})
    with pytest.raises(ClientDataError, match="'privacy-allow-raw-rows' must be true or false"):
        policy_from_node_config({"privacy-allow-raw-rows": "maybe"})


def test_a_flower_node_enforces_its_own_policy(monkeypatch):
    """``handle_train`` builds the client's policy from the node's config: the same subset
    broadcast is refused by a default node and answered by one that allows raw rows."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict
    from flwr.app import Message as FlowerMessage
    from flwr.supercore.task_identity import TaskIdentity

    from fednovelty.runtime.flower.client import handle_train
    from fednovelty.runtime.flower.codec import decode_message, encode_message

    for name, value in (("_run_id", 1), ("_node_id", 5), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    params = {"n_components": 2, "init_params": "subset"}
    run_config = {"algorithm": "FederatedEM", "algorithm-params": json.dumps(params)}
    rows = np.random.default_rng(0).normal(size=(30, 2))
    broadcast = Message("subset", scalars={"fraction": 1.0, "seed": 0})
    for node_extra, answered in (({}, False), ({"privacy-allow-raw-rows": True}, True)):
        message = FlowerMessage(encode_message(broadcast), dst_node_id=5, message_type="train")
        message.metadata.__dict__["_message_id"] = "m0"
        node = {"partition-id": 0, **node_extra}
        context = Context(1, 5, node, RecordDict(), run_config)
        reply, _ = decode_message(handle_train(message, context, lambda _: (0, rows)).content)
        assert ("rows" in reply.tensors) is answered
        assert bool(reply.scalars.get("skipped", False)) is not answered


def test_privacy_page_example_runs(capsys):
    text = (Path(__file__).resolve().parents[3] / "docs" / "privacy.md").read_text()
    block = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]  # the floor's example
    with pytest.warns(DataLossWarning, match="client 2 .*privacy floor"):
        exec(compile(block, "docs/privacy.md", "exec"), {})
    assert capsys.readouterr().out.strip() == "[2]"


def test_flower_nodes_calibrate_their_own_differential_privacy():
    pytest.importorskip("flwr")
    from fednovelty.exceptions import ClientDataError
    from fednovelty.federated.trust.dp_calibration import calibrate_noise
    from fednovelty.runtime.flower.client import policy_from_node_config

    policy = policy_from_node_config(
        {
            "dp-epsilon": "1.0",
            "dp-releases": 12,
            "dp-clip": 3,
            "dp-mode": "distributed",
            "dp-clients": "4",
            "dp-insecure-seed": 7,
        }
    )
    dp = policy.dp
    assert dp.noise_multiplier == calibrate_noise(1.0, 1e-5, 12)
    fields = (dp.clip_norm, dp.mode, dp.n_clients, dp.epsilon, dp.delta, dp.insecure_seed)
    assert fields == (3.0, "distributed", 4, 1.0, 1e-5, 7)
    assert policy_from_node_config({"privacy-min-rows": 3}).dp is None
    with pytest.raises(ClientDataError, match=r"needs \['dp-releases'\]"):
        policy_from_node_config({"dp-epsilon": 1.0, "dp-clip": 3.0})
    with pytest.raises(ClientDataError, match="mode must be one of"):
        policy_from_node_config({"dp-epsilon": 1, "dp-releases": 2, "dp-clip": 1, "dp-mode": "x"})


def test_flower_nodes_calibrate_their_own_dp_sgd_beside_the_statistics():
    pytest.importorskip("flwr")
    from fednovelty.federated.trust.dp_sgd import learning_epsilon, release_blocks
    from fednovelty.runtime.flower.client import policy_from_node_config

    node = {"dp-epsilon": 2.0, "dp-releases": 8, "dp-clip": 1.0, "dp-sgd-steps": 10}
    policy = policy_from_node_config({**node, "dp-learner-rounds": 6, "dp-sample-rate": 0.1})
    sgd, z = policy.dp_sgd, policy.dp.noise_multiplier
    assert (sgd.steps, sgd.sample_rate, sgd.clip_norm) == (10, 0.1, 1.0)
    spent = learning_epsilon(z, release_blocks(8, 6), sgd.noise_multiplier, 0.1, 60, 1e-5)
    assert 1.98 < spent <= 2.0  # the node's own calibration spends its budget
    assert (
        policy_from_node_config({k: v for k, v in node.items() if k != "dp-sgd-steps"}).dp_sgd
        is None
    )
