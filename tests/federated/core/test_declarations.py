"""Steps declare their replies, and the server gate reads the declarations
(``federated.core.declarations``, ``federated.trust.validation``).

Every registered algorithm declares every kind it answers (an honest run of each drops
nothing); a step without declarations cannot be chained; a reply of an undeclared kind is
refused; ``vb_prior`` and ``cluster_em`` replies are checked like any other: a scatter of
the wrong shape is dropped by name and the fit goes on as without the liar, a scatter or
clustered statistics outside the client's declared box are dropped by name.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from _liars import shifted_component

from fednovelty.federated import Message
from fednovelty.federated.bayesian.variational import FederatedVB
from fednovelty.federated.clustered.clustered_em import ClusteredEM
from fednovelty.federated.core.base import skipped_reply
from fednovelty.federated.core.declarations import (
    InvalidReplyError,
    ReplySpec,
    UndeclaredReplyError,
    declare,
    declared_spec,
)
from fednovelty.federated.core.steps import ChainedAlgorithm, Step
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.reply_form import check_reply
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import run_simulation
from tests.federated.trust.test_liar_property import CASES
from tests.federated.trust.test_validation import WithForger, make_clients, with_tensors

D = 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_registered_algorithm_declares_every_kind_it_answers(name) -> None:
    build, data = CASES[name]
    algorithm = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_simulation(algorithm, data(), random_state=0)
    kinds = {record.kind for record in result.history}
    assert kinds
    for kind in kinds:
        spec = algorithm.reply_spec(kind)
        assert spec.kind == kind and declared_spec(kind) is spec
    dropped = [(r.kind, c, why) for r in result.history for c, why in r.dropped]
    assert dropped == []  # the declarations accept every honest reply


class _Undeclared(Step):
    kinds = ("undeclared",)

    def configure(self, state: Any) -> Message:
        return Message("undeclared")

    def client_step(self, X, message, context) -> Message:
        return Message("undeclared", {"n_samples": torch.tensor(1.0)})

    def server_step(self, state, replies):
        return None, {}


class _Chain(ChainedAlgorithm):
    def __init__(self, step: Step) -> None:
        self._chain([step])


def test_a_step_without_declarations_cannot_be_chained() -> None:
    with pytest.raises(UndeclaredReplyError, match=r"_Undeclared answers .*'undeclared'"):
        _Chain(_Undeclared())

    class Declared(_Undeclared):
        replies = declare(
            ReplySpec(
                "undeclared",
                shapes=lambda b, d: {"n_samples": ()},
                backing={"n_samples": "client"},
            )
        )

    chain = _Chain(Declared())
    assert chain.reply_spec("undeclared") is Declared.replies["undeclared"]
    with pytest.raises(UndeclaredReplyError, match="'em'"):
        chain.reply_spec("em")


def test_a_reply_of_a_kind_the_algorithm_does_not_declare_is_refused() -> None:
    algorithm = FederatedVB(2)
    broadcast = Message("em", {"means": torch.zeros(2, D)}, expect={"covariance_type": "full"})
    reply = Message("em", {"n_samples": torch.tensor(5.0)})
    validator = ReplyValidator(D, specs=algorithm.reply_spec)
    valid, dropped = validator.accept(broadcast, {0: reply})
    assert valid == {} and "no step of FederatedVB answers messages of kind 'em'" in dropped[0]
    with pytest.raises(InvalidReplyError, match=r"no fednovelty step declares .*'tick'"):
        check_reply(Message("tick"), Message("tick"), D)


# ----------------------------------------------------------------------------- vb_prior
def _liar_in_the_prior_round(scatter):
    """The liar (client 4) sends ``scatter(reply)`` in the ``vb_prior`` round and refuses
    every later round (a skipped reply): accepted or not, it contributes nothing else."""

    def forge(reply: Message, message: Message) -> Message:
        if message.kind == "vb_prior":
            return with_tensors(reply, scatter=scatter(reply.tensors["scatter"]))
        return skipped_reply(message.kind, "left")

    return forge


def _vb_fit(clients, forge=None):
    algorithm = FederatedVB(3, max_iter=6, random_state=0)
    if forge is not None:
        algorithm = WithForger(algorithm, 4, forge)
    return run_simulation(algorithm, clients)


def test_a_prior_scatter_of_the_wrong_shape_is_dropped_and_the_fit_goes_on() -> None:
    clients = make_clients()
    lied = _vb_fit(clients, _liar_in_the_prior_round(lambda s: s[:2, :2]))
    prior_round = lied.history[0]
    assert prior_round.kind == "vb_prior" and prior_round.replied == (0, 1, 2, 3)
    assert prior_round.dropped == ((4, "tensor 'scatter' has shape (2, 2); expected (3, 3)."),)
    honest = _vb_fit(clients[:4])
    for name in ("means", "covariances", "weight_concentration"):
        got, want = getattr(lied.state.posterior, name), getattr(honest.state.posterior, name)
        scale = max(float(want.abs().max()), 1e-300)
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-12 * scale), name


def test_a_non_psd_prior_scatter_is_dropped_by_name() -> None:
    lied = _vb_fit(make_clients(), _liar_in_the_prior_round(lambda s: -s))
    assert "'scatter' is not positive semi-definite" in lied.history[0].dropped[0][1]


def test_a_huge_prior_scatter_is_refused_by_the_declared_moments() -> None:
    """After a ``moments`` round (the client's box), a ``vb_prior`` scatter of 1e300 I
    spreads further than the client's rows can: dropped by name; the honest one passes."""
    X = make_clients(1)[0]
    spec = FederatedVB(2).reply_spec("vb_prior")
    context = gate.client_context(0)
    moments = Message(
        "moments",
        {
            "n_samples": torch.tensor(60.0, dtype=torch.float64),
            "mean": X.mean(0),
            "m2": (X - X.mean(0)).square().sum(0),
        },
    )
    prior = FederatedVB(2).client_step(X, Message("vb_prior"), context)
    validator = ReplyValidator(D)
    assert validator.accept(Message("moments"), {0: moments})[1] == {}
    assert validator.accept(Message("vb_prior"), {0: prior})[1] == {}
    huge = with_tensors(prior, scatter=1e300 * torch.eye(D, dtype=torch.float64))
    check_reply(huge, Message("vb_prior"), D, spec)  # some rows could have it
    valid, dropped = validator.accept(Message("vb_prior"), {0: huge})
    assert valid == {} and "spread further than the client's declared moments" in dropped[0]


def test_the_prior_round_declares_the_box_of_the_later_rounds() -> None:
    """A ``vb_prior`` reply declares the client's moments: a later centroid far outside
    the rows it described is dropped by name."""
    X = make_clients(1)[0]
    algorithm = FederatedVB(2)
    prior = algorithm.client_step(X, Message("vb_prior"), gate.client_context(0))
    validator = ReplyValidator(D, specs=algorithm.reply_spec)
    assert validator.accept(Message("vb_prior"), {0: prior})[1] == {}
    broadcast = Message("centroids", scalars={"seed": 0}, expect={"n_clusters": 2})
    far = Message(
        "centroids",
        {
            "centers": torch.full((1, D), 1e6, dtype=torch.float64),
            "counts": torch.tensor([60.0], dtype=torch.float64),
            "n_samples": torch.tensor(60.0, dtype=torch.float64),
        },
    )
    check_reply(far, broadcast, D)
    valid, dropped = validator.accept(broadcast, {0: far})
    assert valid == {} and "means lie outside the range" in dropped[0]


# ----------------------------------------------------------------------------- cluster_em
def test_shifted_clustered_statistics_are_dropped_by_name() -> None:
    """``cluster_em`` statistics are held to the client's declared box, as ``em`` ones:
    the rows of component 0 moved 100 sd away, consistently (statistics some rows could
    have), are dropped by name in every clustered round."""
    algorithm = ClusteredEM(2, n_clusters=1, cluster_components=2, standardize=True, max_iter=3)
    X = make_clients(1)[0]
    validator = ReplyValidator(D, specs=algorithm.reply_spec)
    state, context, seen = algorithm.start(), gate.client_context(0), []
    while not algorithm.finished(state):
        message = algorithm.configure(state)
        reply = algorithm.client_step(X, message, context)
        if message.kind == "cluster_em":
            moved = shifted_component(reply, 100.0)
            check_reply(moved, message, D)
            seen.append(validator.accept(message, {0: moved})[1])
        valid, dropped = validator.accept(message, {0: reply})
        assert dropped == {}
        state, _ = algorithm.server_step(state, valid)
    assert seen and all("component means lie outside" in d[0] for d in seen)


def test_a_feature_a_client_holds_constant_passes_the_box_despite_round_off() -> None:
    """Standardised statistics of a feature constant on the client (declared M2 = 0) carry
    round-off of order n (eps * |value|)^2 (26_optdigits: 1e-31 about a shift one ulp
    from the declared mean): accepted; a real spread of 1e-10 per row is still refused."""
    from fednovelty.federated.trust.declared_box import _Box

    center = torch.tensor([-0.045960223163125466], dtype=torch.float64)
    shift = torch.nextafter(center, torch.zeros_like(center))
    zero = torch.zeros(1, 1, dtype=torch.float64)
    box = _Box(
        center, torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), 1e-6
    )
    counts = torch.tensor([283.0], dtype=torch.float64)
    box.spread(counts, zero, zero, shift, 283.0, "diag")  # round-off only: accepted
    with pytest.raises(InvalidReplyError, match="spread further"):
        box.spread(counts, zero, zero + 283 * 1e-10, shift, 283.0, "diag")
