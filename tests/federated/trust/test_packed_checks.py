"""The server gate checks replies unpacked together on the triangles they travelled in.

``wire_many.unpack_runs`` returns, with the unpacked replies, the runs it unpacked together
and their stacked triangles (``core.packed_runs.PackedRun``); ``batch_checks.batch_passes``
checks such a run's statistics on the triangles instead of stacking the unpacked matrices
again. Every verdict must be the one the matrices get: the same replies cleared, the same
replies dropped with the same reason, the same fitted numbers bit for bit (a whole run with
the runs against the same run without them). Forged replies that travel packed (indefinite,
NaN, overflowing, claiming more rows) are among them.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from _blob_federation import D, K, decisions, em, federation
from _liars import Forging

from fednovelty.federated import Message
from fednovelty.federated.core.wire import from_triangle, pack, to_triangle, unpack
from fednovelty.federated.core.wire_many import unpack_many, unpack_runs
from fednovelty.federated.trust import batch_checks, gate
from fednovelty.federated.trust.batch_checks import batch_passes, stats_batch_passes
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import loop, run_simulation


def forged(reply: Message, how: str) -> Message:
    """``reply`` (unpacked) forged as ``how`` says, packed again: it travels as triangles
    (but for a NaN, which is not equal to itself: that matrix travels whole)."""
    t = {name: value.clone() for name, value in reply.tensors.items()}
    largest = int(t["counts"].argmax())
    if how == "indefinite":
        t["second"][largest] = -t["second"][largest]
    elif how == "nan":
        t["second"][largest, 0, 0] = float("nan")
    elif how == "overflow":
        t["second"] = t["second"] * 1e306
    elif how == "rows":
        t["counts"] = t["counts"] * 10
    elif how == "slightly_low":  # an eigenvalue below zero by a millionth of the scale
        n, s = t["counts"][largest], t["sums"][largest]
        t["second"][largest] = torch.outer(s, s) / n - 1e-3 * torch.eye(D, dtype=s.dtype)
    elif how == "within_tolerance":  # below zero by far less than the tolerance
        n, s = t["counts"][largest], t["sums"][largest]
        t["second"][largest] = torch.outer(s, s) / n - 1e-13 * torch.eye(D, dtype=s.dtype)
    return pack(Message(reply.kind, t, dict(reply.scalars)))


FORGERIES = ("indefinite", "nan", "overflow", "rows", "slightly_low", "within_tolerance")


def packed_round(n_clients=60, seed=1):
    """An EM broadcast, and the packed replies of the clients of 20 rows or more (views of
    the batch that answered them) with every forgery twice among them (adjacent copies,
    unpacked together), by client id."""
    algorithm = em()
    message = algorithm.configure(algorithm.start())
    clients = [X for X in federation(n_clients, seed=seed) if X.shape[0] >= 20]
    contexts = [
        gate.client_context(c, policy=PrivacyPolicy(min_rows=1), wire=True)
        for c in range(len(clients))
    ]
    packed = gate.answer_many(algorithm, list(zip(clients, contexts, strict=True)), pack(message))
    replies = dict(enumerate(packed))
    for i, how in enumerate(FORGERIES):
        for j in (0, 1):
            cid = 2 + 2 * i + j
            replies[cid] = forged(unpack(replies[cid]), how)
    return algorithm, message, replies


def accept(algorithm, message, replies, runs=()):
    validator = ReplyValidator(n_features=D, specs=algorithm.reply_spec)
    return validator.accept(message, replies, None, runs)


def test_unpack_runs_is_unpack_many_with_the_triangles_of_its_runs():
    _, _, replies = packed_round()
    unpacked, refused, runs = unpack_runs(replies)
    expected, expected_refused = unpack_many(replies)
    assert not refused and not expected_refused and list(unpacked) == list(expected)
    for cid, message in unpacked.items():
        for name, tensor in message.tensors.items():
            other = expected[cid].tensors[name]
            assert torch.equal(tensor.nan_to_num(7.0), other.nan_to_num(7.0)), name
    covered = [k for run in runs for k in run.keys]
    assert len(covered) == len(set(covered)) >= len(replies) - 3  # views and copies alike
    assert {2, 3, 6, 7, 8, 9, 10, 11}.issubset(covered)  # forged, packed (a NaN is not)
    for run in runs:
        pairs = zip(run.keys, run.messages, strict=True)
        assert run.intact() and all(unpacked[k] is m for k, m in pairs)
        packed, form, matrices = run.triangles["second"]
        assert form == "symmetric" and packed.shape == (len(run.keys), K, D * (D + 1) // 2)
        same = from_triangle(packed, form).nan_to_num(7.0) == matrices.nan_to_num(7.0)
        assert bool(same.all())
        for i, m in enumerate(run.messages):
            assert m.tensors["second"].data_ptr() == matrices[i].data_ptr()


def test_the_gate_on_triangles_gives_every_reply_the_verdict_of_the_matrices():
    algorithm, message, replies = packed_round()
    unpacked, _, runs = unpack_runs(replies)
    spec = algorithm.reply_spec("em")
    with_runs = batch_passes(message, unpacked, D, spec, runs)
    without = batch_passes(message, unpacked, D, spec)
    assert with_runs == without
    assert {2, 3, 4, 5, 6, 7, 8, 9, 10, 11} - with_runs == {2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
    assert {0, 1, 12, 13, 14}.issubset(with_runs)  # honest ones cleared
    valid, dropped = accept(algorithm, message, unpacked, runs)
    valid_without, dropped_without = accept(algorithm, message, unpacked)
    assert dropped == dropped_without and list(valid) == list(valid_without)
    assert set(dropped) == {2, 3, 4, 5, 6, 7, 8, 9, 10, 11}  # within_tolerance passes alone
    assert "not positive semi-definite" in dropped[2] and "NaN" in dropped[4]
    assert "more than" in dropped[8]


def test_runs_are_checked_on_their_triangles_without_stacking_the_matrices():
    algorithm, message, replies = packed_round()
    unpacked, _, runs = unpack_runs(replies)
    spec = algorithm.reply_spec("em")
    expected = batch_passes(message, unpacked, D, spec)
    outside = len(unpacked) - sum(len(run.keys) for run in runs)
    stacked: list[int] = []
    stack = batch_checks.stacked_runs

    def spy(columns, most):
        stacked.append(len(next(iter(columns.values()))))
        return stack(columns, most)

    with mock.patch.object(batch_checks, "stacked_runs", spy):
        assert batch_passes(message, unpacked, D, spec, runs) == expected
    assert sum(stacked) <= outside < len(unpacked) // 4


def test_a_run_written_into_after_unpacking_is_checked_on_its_matrices():
    algorithm, message, replies = packed_round()
    unpacked, _, runs = unpack_runs(replies)
    unpacked[20].tensors["second"][0].neg_()  # in place: the run's triangles are stale
    assert not all(run.intact() for run in runs)
    valid, dropped = accept(algorithm, message, unpacked, runs)
    copies = {
        c: Message(r.kind, {n: t.clone() for n, t in r.tensors.items()}, dict(r.scalars))
        for c, r in unpacked.items()
    }
    valid_copies, dropped_copies = accept(algorithm, message, copies)
    assert dropped == dropped_copies and 20 in dropped and list(valid) == list(valid_copies)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_full_statistics_on_triangles_pass_as_on_matrices(dtype):
    """``stats_batch_passes`` of symmetric triangles against the matrices they unpack to:
    Gram matrices from honest rows, rows with a deficit near the tolerance, negated ones,
    huge and non-finite entries."""
    g = torch.Generator().manual_seed(0)
    r, k, d = 64, 3, 5
    rows = torch.randn(r, k, 4, d, dtype=torch.float64, generator=g)  # rank 4 < d
    weights = torch.rand(r, k, 4, 1, dtype=torch.float64, generator=g)
    counts = weights.sum((2, 3))
    sums = (weights * rows).sum(2)
    second = (weights * rows).mT @ rows
    second = (second + second.mT) / 2  # exactly symmetric, as a released second moment is
    low = torch.logspace(-16, -4, r, dtype=torch.float64)[:, None, None, None]
    second[:, 1] -= low[:, 0] * torch.eye(d, dtype=torch.float64) * second[:, 1].abs().amax()
    second[5, 2] = -second[5, 2]
    second[6, 0] *= 1e307  # n S overflows the check's range
    second[7, 0, 1, 1] = float("inf")
    second[8, 2, 0, 0] = float("nan")
    counts[9, 0] = 0.0
    broadcast = Message("em", expect={"covariance_type": "full"})
    stacked = {
        "counts": counts.to(dtype),
        "sums": sums.to(dtype),
        "second": second.to(dtype),
        "n_samples": counts.sum(1).to(dtype) + 1,
    }
    expected = stats_batch_passes(stacked, broadcast)
    triangles = {**stacked, "second": to_triangle(stacked["second"], "symmetric")}
    got = stats_batch_passes(triangles, broadcast, {"second": "symmetric"})
    assert torch.equal(got, expected)
    assert 0 < int(expected.sum()) < r - 4  # some cleared, some left to the reply alone
    assert not bool(got[5:9].any())


def without_runs(replies):
    unpacked, refused = unpack_many(replies)
    return unpacked, refused, []


def non_psd_from_round_two(reply: Message, message: Message, number: int) -> Message:
    if number < 2:
        return reply
    second = reply.tensors["second"].clone()
    second[int(reply.tensors["counts"].argmax())] *= -1
    return pack(Message(reply.kind, {**reply.tensors, "second": second}, dict(reply.scalars)))


def dp_policy() -> PrivacyPolicy:
    return PrivacyPolicy(dp=DPPolicy(1.0, 30.0, "local", insecure_seed=5))


@pytest.mark.parametrize(
    "make, privacy",
    [
        (lambda: em(), None),
        (lambda: em(mixture_weights="personal"), None),
        (lambda: Forging(em(), 7, non_psd_from_round_two), None),
        (lambda: Forging(em(), 7, non_psd_from_round_two), PrivacyPolicy(min_rows=1)),
        (lambda: em(dp_mode="local", dp_noise_multiplier=1.0, dp_clip=30.0), dp_policy()),
    ],
    ids=["honest", "personal", "liar", "liar-unfloored", "dp"],
)
def test_a_round_with_runs_fits_the_numbers_of_a_round_without_them(make, privacy):
    """The whole run, bit for bit and verdict for verdict, with the gate reading the runs'
    triangles and with the gate stacking the unpacked matrices."""
    clients = federation()
    fast = run_simulation(make(), clients, privacy=privacy)
    with mock.patch.object(loop, "unpack_runs", without_runs):
        slow = run_simulation(make(), clients, privacy=privacy)
    assert decisions(fast) == decisions(slow)
    a, b = fast.state.params, slow.state.params
    for name in ("weights", "means", "precisions_cholesky"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
