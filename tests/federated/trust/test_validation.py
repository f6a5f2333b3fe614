"""The server's checks of client replies (``federated.trust.validation``), as both engines use them.

Honest replies of every round, covariance type and dtype pass; a reply that no rows could
produce, that exceeds what the broadcast allowed, or that contradicts what its client
declared before is dropped by name, and the run goes on without that client.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from _liars import Forging, shifted_component

from fednovelty.federated import FederatedEM, FedGenGMM, Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.reply_form import check_reply
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.federated.trust.value_checks import check_stats_tensors
from fednovelty.runtime import run_simulation

D = 3


def make_clients(n_clients: int = 5, dtype=torch.float64) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(60 + 20 * c, D, generator=gen, dtype=torch.float64) * (1 + c) + 4 * c).to(
            dtype
        )
        for c in range(n_clients)
    ]


def WithForger(inner, forger: int, forge) -> Forging:
    """``inner`` with client ``forger``'s replies replaced by ``forge(reply, message)``
    (after its client gate: a liar does not hold itself to its policy)."""
    return Forging(inner, forger, lambda reply, message, n: forge(reply, message), skipped=True)


def with_tensors(reply: Message, **tensors) -> Message:
    return Message(reply.kind, {**reply.tensors, **tensors}, dict(reply.scalars))


def drops(result) -> list[tuple[int, str]]:
    return [d for record in result.history for d in record.dropped]


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"standardize": True, "prior_strength": 5.0},
        {"init_params": "separated", "prior_strength": 2.0},
        {"mixture_weights": "personal", "standardize": True},
    ],
)
def test_honest_federated_em_runs_drop_nothing(covariance_type, dtype, options) -> None:
    algorithm = FederatedEM(3, covariance_type=covariance_type, dtype=dtype, max_iter=15, **options)
    result = run_simulation(algorithm, make_clients(dtype=dtype))
    assert drops(result) == []


@pytest.mark.parametrize("covariance_type", ["full", "tied", "diag", "spherical"])
def test_honest_fedgengmm_runs_drop_nothing(covariance_type) -> None:
    algorithm = FedGenGMM(covariance_type=covariance_type, standardize=True, prior_strength=5.0)
    assert drops(run_simulation(algorithm, make_clients())) == []


def em_broadcast_and_reply(covariance_type: str = "full") -> tuple[Message, Message]:
    X = make_clients(1)[0]
    algorithm = FederatedEM(
        2,
        covariance_type=covariance_type,
        means_init=X[:2],
        weights_init=[0.5, 0.5],
        precisions_init=torch.eye(D, dtype=torch.float64).expand(2, D, D).clone()
        if covariance_type == "full"
        else None,
    )
    state = algorithm.start()
    while state.phase != "em":
        message = algorithm.configure(state)
        state, _ = algorithm.server_step(
            state, {0: algorithm.client_step(X, message, gate.client_context(0))}
        )
    message = algorithm.configure(state)
    return message, algorithm.client_step(X, message, gate.client_context(0))


def negate_first(tensor: torch.Tensor) -> torch.Tensor:
    broken = tensor.clone()
    broken[0] = -broken[0].abs() - 1
    return broken


@pytest.mark.parametrize("covariance_type", ["full", "diag", "spherical"])
def test_second_moments_no_rows_could_produce_are_named(covariance_type) -> None:
    broadcast, reply = em_broadcast_and_reply(covariance_type)
    check_reply(reply, broadcast, D)
    broken = with_tensors(reply, second=negate_first(reply.tensors["second"]))
    with pytest.raises(InvalidReplyError, match="no rows have these statistics"):
        check_reply(broken, broadcast, D)


def test_counts_above_the_row_count_are_named() -> None:
    broadcast, reply = em_broadcast_and_reply()
    broken = with_tensors(reply, counts=reply.tensors["counts"] * 3)
    with pytest.raises(InvalidReplyError, match="more than the 60 rows sent"):
        check_reply(broken, broadcast, D)


def test_local_fits_beyond_the_broadcast_are_named() -> None:
    algorithm = FedGenGMM(k_range=(1, 3))
    broadcast = algorithm.configure(algorithm.start())
    reply = algorithm.client_step(make_clients(1)[0], broadcast, gate.client_context(0))
    check_reply(reply, broadcast, D)
    k = 200_000
    many = Message(
        "local_fit",
        {
            "weights": torch.full((k,), 1.0 / k, dtype=torch.float64),
            "means": torch.zeros(k, D, dtype=torch.float64),
            "precisions_cholesky": torch.eye(D, dtype=torch.float64).expand(k, D, D),
            "n_samples": torch.tensor(60.0, dtype=torch.float64),
        },
        dict(reply.scalars),
    )
    with pytest.raises(InvalidReplyError, match="200000 components; the round allows 3"):
        check_reply(many, broadcast, D)
    prec = reply.tensors["precisions_cholesky"].clone()
    prec[0, 0, 0] = 0.0
    with pytest.raises(InvalidReplyError, match="non-positive diagonal"):
        check_reply(with_tensors(reply, precisions_cholesky=prec), broadcast, D)
    prec = reply.tensors["precisions_cholesky"].clone()
    prec[0, 2, 0] = 1.0
    with pytest.raises(InvalidReplyError, match="not upper triangular"):
        check_reply(with_tensors(reply, precisions_cholesky=prec), broadcast, D)
    weights = reply.tensors["weights"] * 2
    with pytest.raises(InvalidReplyError, match="weights add up to 2"):
        check_reply(with_tensors(reply, weights=weights), broadcast, D)


def test_a_row_count_that_changes_after_it_was_declared_is_dropped() -> None:
    validator = ReplyValidator(D)
    broadcast, reply = em_broadcast_and_reply()
    valid, dropped = validator.accept(broadcast, {0: reply})
    assert list(valid) == [0] and dropped == {}
    grown = {
        name: (value * 50 if name in ("counts", "sums", "second", "n_samples") else value)
        for name, value in reply.tensors.items()
    }
    valid, dropped = validator.accept(broadcast, {0: Message("em", grown)})
    assert valid == {} and "claims 3000 rows; the client declared 60" in dropped[0]


def test_means_outside_the_declared_moments_are_dropped() -> None:
    algorithm = FederatedEM(2, standardize=True, max_iter=3)
    X = make_clients(1)[0]
    validator, state, context = ReplyValidator(D), algorithm.start(), gate.client_context(0)
    seen = []
    while not algorithm.finished(state):
        message = algorithm.configure(state)
        reply = algorithm.client_step(X, message, context)
        if message.kind == "em":  # the rows of component 0 moved 100 sd away, consistently
            moved = shifted_component(reply, 100.0)
            check_reply(moved, message, D)  # statistics some rows could have
            valid, dropped = validator.accept(message, {0: moved})
            seen.append(dropped)
        valid, dropped = validator.accept(message, {0: reply})
        assert dropped == {}
        state, _ = algorithm.server_step(state, valid)
    assert seen and all("component means lie outside" in d[0] for d in seen)


def test_a_forged_reply_drops_its_client_not_the_run() -> None:
    def forge(reply: Message, message: Message) -> Message:
        if message.kind != "em":
            return reply
        return with_tensors(reply, second=negate_first(reply.tensors["second"]))

    clients = make_clients()
    inner = FederatedEM(2, max_iter=10, random_state=0)
    result = run_simulation(WithForger(inner, 4, forge), clients)
    em_rounds = [r for r in result.history if r.kind == "em"]
    caught = em_rounds[0]  # it contributed to the earlier rounds: the run starts again
    assert caught.replied == (0, 1, 2, 3) and caught.restarted
    assert "no rows have these statistics" in caught.dropped[0][1]
    after = result.history[result.history.index(caught) + 1 :]
    assert all(4 not in r.sampled and not r.dropped for r in after)
    assert bool(torch.isfinite(result.state.params.means).all())


def test_a_200000_component_local_fit_is_dropped_in_a_run() -> None:
    def forge(reply: Message, message: Message) -> Message:
        k = 200_000
        return Message(
            "local_fit",
            {
                "weights": torch.full((k,), 1.0 / k, dtype=torch.float64),
                "means": torch.zeros(k, D, dtype=torch.float64),
                "precisions_cholesky": torch.ones(k, D, dtype=torch.float64),
                "n_samples": torch.tensor(60.0, dtype=torch.float64),
            },
            dict(reply.scalars),
        )

    inner = FedGenGMM(n_components=2, covariance_type="diag", k_range=(1, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_simulation(WithForger(inner, 2, forge), make_clients())
    assert result.history[0].replied == (0, 1, 3, 4)
    assert "200000 components; the round allows 5" in result.history[0].dropped[0][1]
    assert sorted(result.state.client_models) == [0, 1, 3, 4]


def test_the_server_checks_replies_against_what_it_expects_not_what_it_sent() -> None:
    """The covariance type of returned statistics is the server's own setting
    (``Message.expect``, never sent): a decoded copy of the broadcast cannot vouch for it."""
    broadcast, reply = em_broadcast_and_reply("diag")
    assert "covariance_type" not in broadcast.scalars
    assert broadcast.expect == {"covariance_type": "diag"}
    assert broadcast.nbytes() == Message(broadcast.kind, broadcast.tensors).nbytes()
    with pytest.raises(ValueError, match=r"must state expect\['covariance_type'\]"):
        check_reply(reply, Message(broadcast.kind, broadcast.tensors), D)
    as_full = Message(broadcast.kind, broadcast.tensors, expect={"covariance_type": "full"})
    with pytest.raises(InvalidReplyError, match="'second' has shape"):
        check_reply(reply, as_full, D)


def test_float32_statistics_of_a_nearly_empty_component_pass_and_lies_do_not():
    """Honest statistics sent in float32 where a component's responsibilities are so small
    that its count rounds to 0 while its moments stay subnormal pass the check (each entry
    may be one float32 step from its true value); a non-zero sum with nothing behind it is
    still refused."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(500):
        spread = 10 ** (5 * torch.rand(1, generator=gen).item() - 2)
        X = torch.randn(5, 3, dtype=torch.float64, generator=gen) * spread
        tiny = 10 ** (-47 + 9 * torch.rand(1, generator=gen).item())
        r = torch.rand(5, dtype=torch.float64, generator=gen) * tiny
        R = torch.stack([torch.ones(5, dtype=torch.float64), r], 1)  # (rows, K = 2)
        counts, sums, second = R.sum(0), R.T @ X, R.T @ X.square()
        check_stats_tensors(counts.float(), sums.float(), second.float(), 5.0, "diag")
    lie = torch.tensor([[1.0, 2.0, 0.0], [1e-3, 0.0, 0.0]], dtype=torch.float32)
    with pytest.raises(InvalidReplyError, match="smaller than its sums allow"):
        check_stats_tensors(
            torch.tensor([5.0, 0.0]), lie, torch.ones(2, 3).float() * torch.tensor([[1.0], [0.0]]),
            5.0, "diag",
        )  # fmt: skip
