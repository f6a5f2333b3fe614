"""The batched paths of the in-process engine give each reply what the one-by-one path gives.

The client gate releases and packs many clients' replies at once
(``release_many.release_many``), the wire packs and unpacks many messages at once
(``wire_many``), and both stack the replies' tensors as views where a batched E-step left
them in one tensor (``stacking.stacked_runs``). Every released, packed and unpacked message
is compared here bit for bit (bytes, so ``-0.0`` and NaN payloads count) with
``release``, ``pack`` and ``unpack`` of each message alone: honest replies from a batched
E-step of clients of several sizes and floors (some components below a floor, a client
below it), replies a forger rewrote among them (not views, NaN, asymmetric or triangular
second moments, a whole value below the floor), differential-privacy releases, and wire
descriptions ``unpack`` refuses.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fednovelty.federated import FederatedEM
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.stacking import stacked_runs
from fednovelty.federated.core.wire import WIRE, pack, unpack
from fednovelty.federated.core.wire_many import pack_many, unpack_many
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.release import release
from fednovelty.federated.trust.release_many import release_many


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (``-0.0`` differs from ``0.0``, NaN equals itself)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and a.contiguous().numpy().tobytes() == b.contiguous().numpy().tobytes()
    )


def assert_same_message(a: Message, b: Message) -> None:
    assert type(a) is type(b) and a.kind == b.kind
    assert a.scalars == b.scalars
    assert list(a.tensors) == list(b.tensors)
    for name in a.tensors:
        assert same_bits(a.tensors[name], b.tensors[name]), name
        assert a.tensors[name].is_contiguous() == b.tensors[name].is_contiguous(), name
    assert not a.backing and not b.backing


def clients(sizes, d=3, seed=0) -> list[torch.Tensor]:
    """Rows of three separated blobs, ``sizes[c]`` rows for client ``c``."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4, (3, d))
    return [
        torch.as_tensor(centers[rng.integers(0, 3, n)] + rng.normal(size=(n, d))) for n in sizes
    ]


def em_round(covariance_type="full", sizes=None, policies=None, **options):
    """A federated EM algorithm, its first EM broadcast and the clients' contexts."""
    sizes = sizes or [40, 40, 40, 8, 8, 3, 40, 25, 25, 25, 60]
    rows = clients(sizes)
    precisions = {"full": np.stack([np.eye(3)] * 3), "tied": np.eye(3), "diag": np.ones((3, 3))}
    algorithm = FederatedEM(
        3,
        covariance_type=covariance_type,
        weights_init=np.full(3, 1 / 3),
        means_init=np.stack([rows[0][i] for i in range(3)]).astype(float),
        precisions_init=precisions[covariance_type],
        max_iter=1,
        **options,
    )
    message = algorithm.configure(algorithm.start())
    policies = policies or [PrivacyPolicy(min_rows=m) for m in (5, 5, 1, 5, 30, 5, 12, 5, 5, 5, 5)]
    contexts = [gate.client_context(c, policy=p, wire=True) for c, p in enumerate(policies)]
    return algorithm, message, rows, contexts


def one_by_one(replies, spec, algorithm, message, rows, contexts, wire, wire_dtype=None):
    out = []
    for reply, X, context in zip(replies, rows, contexts, strict=True):
        released = release(
            reply,
            spec,
            context.terms.policy,
            algorithm.config,
            message,
            context.terms,
            tuple(X.shape),
        )
        out.append(pack(released, wire_dtype) if wire else released)
    return out


def batched(replies, spec, algorithm, message, rows, contexts, wire, wire_dtype=None):
    return release_many(
        replies,
        spec,
        [c.terms.policy for c in contexts],
        algorithm.config,
        message,
        [c.terms for c in contexts],
        [tuple(X.shape) for X in rows],
        wire=[wire] * len(replies),
        wire_dtype=wire_dtype,
    )


def forged(replies: list[Message]) -> list[Message]:
    """The batched E-step's replies with some rewritten the ways a forger could: a ``-0.0``,
    a copy (no view), NaN, second moments asymmetric (where the floor keeps and where it
    zeroes the component), upper-triangular and negated, a row count backed below the
    floor."""
    out = list(replies)

    def rewrite(i, **tensors):
        reply = out[i]
        backing = dict(reply.backing)
        backing.update(tensors.pop("backing", {}))
        new = {name: t.clone() for name, t in reply.tensors.items()}
        new.update(tensors)
        out[i] = Message(reply.kind, new, dict(reply.scalars), backing=backing)

    signed = out[0].tensors["sums"].clone()
    signed[0, 0] = -0.0
    rewrite(0, sums=signed)  # a zero that tells by its sign
    rewrite(1)  # copies, not views of the batch
    nan = out[2].tensors["second"].clone()
    nan.view(-1)[-1] = float("nan")
    rewrite(2, second=nan)
    floored = out[6].tensors["second"].clone()  # client 6's floor zeroes its component 1
    if floored.ndim == 3:  # full: asymmetric where the floor zeroes it, a triangle again
        floored[1, 0, 1] += 1.0
    rewrite(6, second=floored)
    rewrite(7, second=out[7].tensors["second"].triu())
    rewrite(8, backing={"n_samples": torch.tensor(2.0, dtype=torch.float64)})
    rewrite(9, second=-out[9].tensors["second"])
    asymmetric = out[10].tensors["second"].clone()
    asymmetric.view(-1)[1] += 1.0  # (0, 1) of the first matrix, kept: travels whole
    rewrite(10, second=asymmetric)
    return out


@pytest.mark.parametrize("covariance_type", ["full", "diag", "tied"])
@pytest.mark.parametrize("wire_dtype", [None, "float32"])
def test_release_many_gives_each_client_the_release_and_pack_of_its_reply(
    covariance_type, wire_dtype
):
    algorithm, message, rows, contexts = em_round(covariance_type)
    replies = algorithm.client_steps(list(zip(rows, contexts, strict=True)), message)
    spec = algorithm.reply_spec("em")
    for version in (replies, forged(replies)):
        for wire in (False, True):
            expected = one_by_one(
                version, spec, algorithm, message, rows, contexts, wire, wire_dtype
            )
            got = batched(version, spec, algorithm, message, rows, contexts, wire, wire_dtype)
            for a, b in zip(got, expected, strict=True):
                assert_same_message(a, b)
    released = batched(replies, spec, algorithm, message, rows, contexts, False)
    assert "fewer rows than" in released[5].scalars["reason"]  # 3 rows, floor 5
    assert "no entry is backed" in released[3].scalars["reason"]  # 8 rows, 3 components
    assert bool((released[6].tensors["counts"] == 0).any())  # floor 12: a component zeroed
    assert not bool((released[0].tensors["counts"] == 0).any())


def test_a_refusal_is_the_one_release_gives_with_its_reason():
    algorithm, message, rows, contexts = em_round()
    replies = algorithm.client_steps(list(zip(rows, contexts, strict=True)), message)
    spec = algorithm.reply_spec("em")
    version = forged(replies)
    got = batched(version, spec, algorithm, message, rows, contexts, True)
    assert got[8].scalars["skipped"]
    assert "'n_samples' is backed by 2 effective rows" in got[8].scalars["reason"]
    # the 30-row floor: a 8-row client releases nothing
    assert got[4].scalars["skipped"]


def test_private_releases_are_the_clients_own_noise_and_ledger():
    """Under differential privacy each client's release is its own (noise from its seed,
    charged to its ledger), in a batch as alone."""

    def contexts_with(seed):
        return [
            gate.client_context(
                c,
                policy=PrivacyPolicy(dp=DPPolicy(1.0, 30.0, "local", insecure_seed=seed + c)),
                wire=True,
            )
            for c in range(11)
        ]

    algorithm, message, rows, _ = em_round(dp_mode="local", dp_noise_multiplier=1.0, dp_clip=30.0)
    spec = algorithm.reply_spec("em")
    alone, together = contexts_with(3), contexts_with(3)
    replies = algorithm.client_steps(list(zip(rows, alone, strict=True)), message)
    expected = one_by_one(replies, spec, algorithm, message, rows, alone, True)
    got = batched(replies, spec, algorithm, message, rows, together, True)
    for a, b in zip(got, expected, strict=True):
        assert_same_message(a, b)
    for a, b in zip(alone, together, strict=True):
        assert a.terms.ledger == b.terms.ledger and a.terms.ledger.releases == 1


def test_personal_weights_and_the_gate_of_a_batch_equal_one_client_at_a_time():
    """``answer_many`` (batched E-step, batched gate) against ``answer`` per client: the
    same skips and zeros, statistics equal to round-off, the same kept personal weights."""
    algorithm, message, rows, contexts = em_round(mixture_weights="personal")
    _, _, _, alone = em_round(mixture_weights="personal")
    sent = pack(message)
    many = gate.answer_many(algorithm, list(zip(rows, contexts, strict=True)), sent)
    one = [gate.answer(algorithm, X, sent, c) for X, c in zip(rows, alone, strict=True)]
    for a, b in zip(many, one, strict=True):
        assert a.scalars.keys() == b.scalars.keys() and a.scalars.get(WIRE) == b.scalars.get(WIRE)
        assert a.scalars.get("reason") == b.scalars.get("reason")
        for name in b.tensors:
            x, y = a.tensors[name], b.tensors[name]
            assert torch.equal(x == 0, y == 0), name  # the same entries floored
            assert float((x - y).abs().max()) <= 1e-12 * max(1.0, float(y.abs().max())), name
    for a, b in zip(contexts, alone, strict=True):
        for name, value in b.state.items():
            assert float((a.state[name] - value).abs().max()) <= 1e-12


# ----------------------------------------------------------------------------- the wire
def matrices(n=6, d=4, seed=0) -> list[torch.Tensor]:
    """(2, d, d) tensors of every form a matrix travels in, as views of one base."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 2, d, d, dtype=torch.float64, generator=g)
    base = base + base.mT
    base[1] = base[1].triu()
    base[2] = base[2].tril()
    base[3, 0, 0, 1] += 1.0  # neither
    base[4, 1, 2, 2] = float("nan")  # symmetric but for a NaN: not equal to itself
    base[5, 0, 1, 0] = -0.0
    base[5, 0, 0, 1] = 0.0
    return list(base.unbind(0))


def test_pack_many_and_unpack_many_are_pack_and_unpack_of_each_message():
    parts = matrices() + matrices(seed=1)[:1] * 3  # a run of equal forms, then copies
    messages = [
        Message("em", {"second": m, "counts": m[:, 0, 0].clone()}, {"round": i})
        for i, m in enumerate(parts)
    ]
    for wire_dtype in (None, "float32"):
        packed = pack_many(messages, wire_dtype)
        for a, b in zip(packed, [pack(m, wire_dtype) for m in messages], strict=True):
            assert_same_message(a, b)
        for dtype in (None, torch.float64):
            got, refused = unpack_many(dict(enumerate(packed)), dtype)
            assert not refused
            for c, message in enumerate(packed):
                assert_same_message(got[c], unpack(message, dtype))


def test_unpack_many_refuses_what_unpack_refuses_with_its_reason():
    good = pack_many([Message("em", {"second": m}) for m in matrices()[:1] * 4])
    broken = {
        "not json": "{",
        "unknown key": json.dumps({"zipped": ["second"]}),
        "no tensor": json.dumps({"symmetric": ["other"]}),
    }
    messages = dict(enumerate(good))
    for key, raw in broken.items():
        for copy in range(2):  # a description two replies share
            messages[f"{key}{copy}"] = Message("em", dict(good[0].tensors), {WIRE: raw})
    messages["short triangle"] = Message(
        "em", {"second": torch.zeros(2, 7, dtype=torch.float64)}, {WIRE: '{"symmetric":["second"]}'}
    )
    got, refused = unpack_many(messages)
    for key, message in messages.items():
        try:
            expected = unpack(message)
        except Exception as error:
            assert str(refused[key]) == str(error) and key not in got
        else:
            assert_same_message(got[key], expected)
    assert set(refused) == {*(f"{k}{c}" for k in broken for c in range(2)), "short triangle"}
    assert list(got) == [k for k in messages if k in got]  # the order of the round


# ----------------------------------------------------------------------------- stacking
def test_stacked_runs_are_the_stack_and_views_only_where_the_values_are_the_same():
    base = torch.arange(5 * 3 * 3, dtype=torch.float64).view(5, 3, 3).clone()
    views = list(base.unbind(0))
    odd = [
        views[0],
        views[1].mT,  # the right address, other strides
        views[2],
        views[3].clone(),  # a copy
        views[4],
        base[4, :, :],  # a view again after the copy: a new run may begin
    ]
    complex_base = torch.randn(4, 2, dtype=torch.complex128)
    parts = [complex_base[i].imag for i in range(4)]  # views of another dtype, negated
    conjugated = [complex_base.conj()[i].imag for i in range(4)]
    cases = ({"x": views}, {"x": odd}, {"x": views[::-1]}, {"x": views, "y": odd})
    for columns in (*cases, {"x": parts}, {"x": conjugated}):
        for most in (1, 2, 3, 10):
            runs = stacked_runs(columns, most)
            covered = [i for items, _ in runs for i in items]
            assert covered == list(range(len(next(iter(columns.values())))))
            for items, stacks in runs:
                assert len(items) <= most
                for name, stack in stacks.items():
                    expected = torch.stack([columns[name][i] for i in items])
                    assert same_bits(stack, expected)
    ((items, stacks),) = stacked_runs({"x": views}, 10)
    assert stacks["x"]._base is base  # no copy where the tensors are one already
