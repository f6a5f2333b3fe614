"""The first round's defences (``fednovelty.federated.trust.plausible``): the gross-outlier rule
every run applies, and the robust moments of the robust options."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fednovelty.federated import FedGenGMM, Message
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.plausible import (
    GROSS_SCALE,
    GROSS_Z,
    gross_outliers,
    gross_screen,
    robust_moments,
)
from fednovelty.mixture import feature_moments, merge_moments


def _clients(n_clients=10, seed=0):
    """Non-IID clients: each holds rows around its own centre, (n_c, 3)."""
    rng = np.random.default_rng(seed)
    return [
        torch.as_tensor(rng.normal(rng.normal(0, 3, 3), 1.0, (int(rng.integers(20, 80)), 3)))
        for _ in range(n_clients)
    ]


def _moments_replies(clients):
    return {c: Message("moments", feature_moments(X).tensors()) for c, X in enumerate(clients)}


def _with(reply: Message, **tensors) -> Message:
    return Message(reply.kind, {**reply.tensors, **tensors}, dict(reply.scalars))


def test_honest_moments_pass_and_a_gross_liar_is_named():
    replies = _moments_replies(_clients())
    assert gross_screen(Message("moments"), replies) == {}
    liar = _with(replies[3], mean=torch.full((3,), 1e133, dtype=torch.float64))
    dropped = gross_screen(Message("moments"), {**replies, 3: liar})
    assert list(dropped) == [3] and "'moments' reply is implausible" in dropped[3]


@pytest.mark.parametrize(
    "lie",
    [
        {"mean": lambda m, s: m + 2 * GROSS_Z * s},  # far, in the median client's units
        {"m2": lambda m, s: (2 * GROSS_SCALE * s) ** 2 * 50},  # too wide (n = 50)
        {"mean": lambda m, s: m * float("nan")},
    ],
)
def test_each_part_of_the_rule_catches_its_lie(lie):
    clients = [torch.randn(50, 3, generator=torch.Generator().manual_seed(c)) for c in range(5)]
    replies = _moments_replies(clients)
    ((name, forge),) = lie.items()
    mean, scale = replies[0].tensors["mean"], torch.ones(3, dtype=torch.float64)
    replies[2] = _with(replies[2], **{name: forge(mean, scale)})
    assert list(gross_screen(Message("moments"), replies)) == [2]


def test_a_feature_constant_for_most_clients_is_not_judged():
    """A binary feature that most clients never see: the client that holds its ones is
    honest, and the rule has no spread to judge it by."""
    clients = [torch.randn(40, 2, generator=torch.Generator().manual_seed(c)) for c in range(6)]
    for X in clients:
        X[:, 1] = 0.0
    clients[4][:10, 1] = 1.0
    assert gross_screen(Message("moments"), _moments_replies(clients)) == {}


def test_fewer_than_three_clients_only_non_finite_replies_are_dropped():
    means = torch.tensor([[0.0], [1e133]], dtype=torch.float64)
    assert gross_outliers(means, torch.ones(2, 1)).tolist() == [False, False]
    means = torch.tensor([[0.0], [float("inf")]])
    assert gross_outliers(means, torch.ones(2, 1)).tolist() == [False, True]


def test_skipped_replies_and_other_kinds_are_not_screened():
    replies = _moments_replies(_clients(4))
    replies[1] = Message("moments", scalars={"skipped": True, "reason": "floor"})
    assert gross_screen(Message("moments"), replies) == {}
    assert gross_screen(Message("em"), {0: Message("em")}) == {}


def test_a_local_mixture_at_1e133_is_named():
    algorithm = FedGenGMM(client_components=2, random_state=0)
    message = algorithm.configure(algorithm.start())
    replies = {
        c: algorithm.client_step(X, message, gate.client_context(c))
        for c, X in enumerate(_clients(6))
    }
    assert gross_screen(message, replies) == {}
    liar = _with(replies[5], means=torch.full_like(replies[5].tensors["means"], 1e133))
    assert list(gross_screen(message, {**replies, 5: liar})) == [5]


def test_robust_moments_hold_against_one_liar_of_ten():
    """A liar below the gross threshold (mean 100 client spreads away, scale x 50): the
    plain merge moves the pooled mean by about 10 spreads and the scale x 16; the trimmed
    and median combinations keep them near the honest federation's."""
    clients = _clients()
    honest = merge_moments(feature_moments(X) for X in clients)
    replies = _moments_replies(clients)
    t = replies[7].tensors
    lied = {**t, "mean": t["mean"] + 100.0, "m2": t["m2"] * 2500}
    stacked = {
        k: torch.stack([(lied if c == 7 else r.tensors)[k] for c, r in replies.items()])
        for k in ("n_samples", "mean", "m2")
    }
    plain = merge_moments(
        feature_moments(X) if c != 7 else type(honest)(**lied) for c, X in enumerate(clients)
    )
    assert float((plain.variance / honest.variance).sqrt().min()) > 5
    for method in ("trimmed", "median"):
        robust = robust_moments(stacked["n_samples"], stacked["mean"], stacked["m2"], method, 0.1)
        ratio = (robust.variance / honest.variance).sqrt()
        assert float(ratio.min()) > 0.5 and float(ratio.max()) < 2.0
        shift = (robust.mean - honest.mean).abs() / honest.variance.sqrt()
        assert float(shift.max()) < 0.5
        assert float(robust.n_samples) == float(honest.n_samples)


@pytest.mark.parametrize(
    "options",
    [{"aggregation": "trimmed"}, {"client_weight_cap": 3.0}, {"aggregation": "sum"}],
)
def test_the_moments_round_is_robust_when_the_robust_option_is_on(options):
    """FederatedEM's moments round with one liar among ten (mean 100 spreads away, below
    the gross threshold): with a robust option the standardisation stays within a factor
    2 of the honest one; the exact merge (no option) follows the liar."""
    from fednovelty.federated import FederatedEM

    clients = _clients()
    algorithm = FederatedEM(2, standardize=True, **options)
    honest_state = algorithm.start()
    replies = _moments_replies(clients)
    algorithm.server_step(honest_state, dict(replies))
    t = replies[7].tensors
    replies[7] = _with(replies[7], mean=t["mean"] + 100.0, m2=t["m2"] * 2500)
    state = algorithm.start()
    algorithm.server_step(state, replies)
    ratio = state.scale / honest_state.scale
    robust = options.get("aggregation") != "sum"
    assert bool(((ratio > 0.5) & (ratio < 2.0)).all()) == robust


# ------------------------------------------------------------ a prior scatter of 1e300 I
@pytest.mark.parametrize("name", ["FederatedVB", "FederatedVBOneShot", "FederatedKNNMarkers"])
def test_a_huge_prior_scatter_is_screened_and_the_fit_is_that_without_the_liar(name) -> None:
    """One client of ten sends a ``vb_prior`` scatter of 1e300 I (its other values honest):
    before, it collapsed federated VB, one-shot VB and the kNN markers; the first round's
    screen drops it by name, and the posterior equals the fit without that client."""
    from _liars import Forging

    from fednovelty.federated import registry
    from fednovelty.runtime import run_simulation

    settings = {"n_components": 3, "random_state": 0}
    if name == "FederatedKNNMarkers":
        settings["n_neighbors"] = 3
    build = registry.ALGORITHMS[name]
    clients = dict(enumerate(_clients()))

    def huge(reply, message, number):
        if message.kind != "vb_prior":
            return reply
        d = reply.tensors["scatter"].shape[0]
        return _with(reply, scatter=1e300 * torch.eye(d, dtype=reply.tensors["scatter"].dtype))

    attacked = run_simulation(Forging(build(**settings), 4, huge), clients, random_state=0)
    first = attacked.history[0]
    assert first.kind == "vb_prior" and [c for c, _ in first.dropped] == [4]
    alone = run_simulation(
        build(**settings), {c: X for c, X in clients.items() if c != 4}, random_state=0
    )
    for field in ("weight_concentration", "means", "covariances"):
        got = getattr(attacked.state.posterior, field)
        want = getattr(alone.state.posterior, field)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12 * float(want.abs().max()))


@pytest.mark.parametrize("name", ["FederatedEM", "ClusteredEM", "FederatedFactorEM"])
def test_a_far_centroid_is_screened_where_no_moments_round_comes_first(name) -> None:
    """Without standardisation the k-means centroids are the first round: one client of ten
    sending a centroid at 1e133 used to end the fit with a singular covariance under the
    plain sum; the screen drops it by name and the fit goes on (for the mixture of factor
    analysers too, whose start is the same k-means rounds)."""
    from _liars import Forging

    from fednovelty.federated import registry
    from fednovelty.runtime import run_simulation

    settings = {"n_components": 3, "random_state": 0, "max_iter": 5}
    if name == "ClusteredEM":
        settings.update(n_clusters=2, cluster_components=1)
    if name == "FederatedFactorEM":
        settings.update(n_factors=1)
    clients = dict(enumerate(_clients()))

    def far(reply, message, number):
        if message.kind != "centroids":
            return reply
        centers = reply.tensors["centers"].clone()
        centers[0] = 1e133
        return _with(reply, centers=centers)

    result = run_simulation(
        Forging(registry.ALGORITHMS[name](**settings), 4, far), clients, random_state=0
    )
    first = result.history[0]
    assert first.kind == "centroids" and [c for c, _ in first.dropped] == [4]
    assert bool(torch.isfinite(result.state.params.means).all())
    factors = getattr(result.state, "factors", None)  # a mixture of factor analysers
    if factors is not None:
        assert all(bool(torch.isfinite(t).all()) for t in factors.tensors().values())
