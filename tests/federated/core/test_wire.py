"""The wire form of messages (``fednovelty.federated.core.wire``): exact round trips of symmetric,
triangular and other tensors, byte counts against the closed form d(d+1)/2, float32 on the
wire, and refusal of packed messages no ``pack`` writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fednovelty.federated import FederatedEM, Message
from fednovelty.federated.core.config import TorchSettings
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.core.wire import (
    WIRE,
    WireFormatError,
    matrix_form,
    pack,
    packed_side,
    travelled_narrower,
    triangle_size,
    unpack,
)
from fednovelty.federated.trust import gate
from fednovelty.federated.trust.privacy import PrivacyPolicy

K, D = 3, 5


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def mirrored(k: int = K, d: int = D) -> torch.Tensor:
    a = torch.randn(k, d, d, dtype=torch.float64, generator=generator(2)).triu()
    return a + a.mT - torch.diag_embed(a.diagonal(dim1=-2, dim2=-1))


def message() -> Message:
    g = generator(3)
    return Message(
        "em",
        {
            "symmetric": mirrored(),
            "upper": torch.randn(K, D, D, dtype=torch.float64, generator=g).triu(),
            "lower": torch.randn(D, D, dtype=torch.float64, generator=g).tril(),
            "square": torch.randn(K, D, D, dtype=torch.float64, generator=g),
            "means": torch.randn(K, D, dtype=torch.float64, generator=g),
            "count": torch.tensor(7.0, dtype=torch.float64),
            "labels": torch.arange(D * D).reshape(D, D).triu(),  # integer: never packed
        },
        {"covariance_type": "full", "seed": 11},
    )


def assert_same(a: Message, b: Message) -> None:
    assert a.kind == b.kind and a.scalars == b.scalars and list(a.tensors) == list(b.tensors)
    for name, tensor in a.tensors.items():
        other = b.tensors[name]
        assert other.dtype == tensor.dtype and other.shape == tensor.shape, name
        assert torch.equal(other, tensor), name


def test_forms_are_recognised_exactly() -> None:
    m = message()
    forms = {name: matrix_form(t) for name, t in m.tensors.items()}
    assert forms == {
        "symmetric": "symmetric",
        "upper": "upper",
        "lower": "lower",
        "square": None,
        "means": None,
        "count": None,
        "labels": None,
    }
    # one ulp off symmetric is not symmetric; a 1 x 1 matrix is left alone
    nudged = mirrored().clone()
    nudged[0, 0, 1] = torch.nextafter(nudged[0, 0, 1], torch.tensor(np.inf, dtype=torch.float64))
    assert matrix_form(nudged) is None
    assert matrix_form(torch.ones(4, 1, 1, dtype=torch.float64)) is None


def test_round_trip_is_exact_and_packs_by_the_closed_form() -> None:
    m = message()
    packed = pack(m)
    assert_same(unpack(packed), m)
    shapes = {name: tuple(t.shape) for name, t in packed.tensors.items()}
    assert shapes["symmetric"] == (K, D * (D + 1) // 2)
    assert shapes["upper"] == (K, 15) and shapes["lower"] == (15,)
    assert shapes["square"] == (K, D, D) and shapes["labels"] == (D, D)
    # the upper triangle row by row, by hand
    by_hand = [m.tensors["upper"][0, i, j] for i in range(D) for j in range(i, D)]
    assert torch.equal(packed.tensors["upper"][0], torch.stack(by_hand))
    by_hand = [m.tensors["lower"][i, j] for i in range(D) for j in range(i + 1)]
    assert torch.equal(packed.tensors["lower"], torch.stack(by_hand))
    described = json.loads(packed.scalars[WIRE])
    assert described == {"symmetric": ["symmetric"], "upper": ["upper"], "lower": ["lower"]}
    # bytes: raw minus the dropped halves plus the description
    saved = 8 * (2 * K + 1) * (D * D - D * (D + 1) // 2)
    assert packed.nbytes() == m.nbytes() - saved + len(packed.scalars[WIRE])


def test_triangle_sizes() -> None:
    assert [triangle_size(d) for d in (1, 2, 5, 54)] == [1, 3, 15, 1485]
    assert [packed_side(n) for n in (1, 3, 15, 1485)] == [1, 2, 5, 54]
    assert [packed_side(n) for n in (0, 2, 14, 1484)] == [None] * 4


def test_nothing_to_pack_travels_as_it_is() -> None:
    m = Message("tick", {"value": torch.ones(3, dtype=torch.float64)}, {"who": "all"})
    packed = pack(m)
    assert WIRE not in packed.scalars and packed.nbytes() == m.nbytes()
    assert_same(unpack(packed), m)
    packed = pack(message())
    assert pack(packed) is packed  # a packed message is not packed twice


def test_float32_on_the_wire_halves_float64_and_comes_back_in_the_working_dtype() -> None:
    m = message()
    packed = pack(m, "float32")
    floats = [n for n, t in m.tensors.items() if t.dtype == torch.float64]
    assert json.loads(packed.scalars[WIRE])["cast"] == floats
    assert all(packed.tensors[n].dtype == torch.float32 for n in floats)
    assert packed.tensors["labels"].dtype == torch.int64
    back = unpack(packed, torch.float64)
    for name, tensor in m.tensors.items():
        restored = back.tensors[name]
        assert restored.dtype == tensor.dtype and restored.shape == tensor.shape
        if name in floats:  # rounded to float32: relative error <= 2**-24
            scale = tensor.abs().amax()
            assert float((restored - tensor).abs().amax()) <= 2**-24 * float(scale)
            assert torch.equal(restored, tensor.float().double())
    assert torch.equal(back.tensors["symmetric"], back.tensors["symmetric"].mT)
    # None keeps the dtype the tensors travelled in
    assert unpack(packed).tensors["means"].dtype == torch.float32
    saved = m.nbytes() - pack(m).nbytes() + len(pack(m).scalars[WIRE])
    floats_bytes = sum(m.tensors[n].numel() * 8 for n in floats) - saved
    expected = m.nbytes() - saved - floats_bytes // 2 + len(packed.scalars[WIRE])
    assert packed.nbytes() == expected


def test_wire_dtype_is_a_validated_setting() -> None:
    assert TorchSettings().wire_dtype is None
    assert TorchSettings(wire_dtype=torch.float32).wire_dtype == "float32"
    settings = TorchSettings(wire_dtype="float32")
    assert TorchSettings.from_json(settings.to_json()) == settings
    with pytest.raises(ValueError, match="wire_dtype"):
        TorchSettings(wire_dtype="float16")


def crafted(description: object, **tensors: torch.Tensor) -> Message:
    raw = description if isinstance(description, str) else json.dumps(description)
    return Message("em", dict(tensors), {WIRE: raw})


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (crafted({"symmetric": ["second"]}, second=torch.zeros(3, 14)), "d\\(d\\+1\\)/2"),
        (crafted({"upper": ["second"]}, second=torch.zeros(3, 1)), "d >= 2"),
        (crafted({"upper": ["missing"]}, second=torch.zeros(3, 15)), "names no tensor"),
        (crafted({"diagonal": ["second"]}, second=torch.zeros(15)), "unknown key"),
        (crafted({"upper": ["a"], "lower": ["a"]}, a=torch.zeros(15)), "twice"),
        (crafted({"upper": "second"}, second=torch.zeros(15)), "list of tensor names"),
        (crafted("[1, 2]", second=torch.zeros(15)), "not a JSON object"),
        (crafted("{not json", second=torch.zeros(15)), "not a JSON object"),
        (crafted({"upper": ["n"]}, n=torch.zeros(15, dtype=torch.int64)), "only floating"),
        (crafted({"cast": ["n"]}, n=torch.zeros(3, dtype=torch.int64)), "not floating"),
    ],
)
def test_malformed_packed_messages_are_refused(reply: Message, reason: str) -> None:
    with pytest.raises(WireFormatError, match=reason) as caught:
        unpack(reply)
    assert isinstance(caught.value, InvalidReplyError)  # the error the loop drops replies by


def test_a_client_answers_a_packed_broadcast_with_a_packed_reply() -> None:
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.normal(size=(200, D)))
    eye = torch.eye(D, dtype=torch.float64).expand(K, D, D)
    algorithm = FederatedEM(
        K,
        weights_init=torch.full((K,), 1 / K),
        means_init=X[:K],
        precisions_init=eye + 0.1 * mirrored(),
        random_state=0,
    )
    policy = PrivacyPolicy(min_rows=1)
    state = algorithm.start()
    broadcast = algorithm.configure(state)
    while broadcast.kind != "em":  # preparation rounds (feature moments)
        reply = gate.answer(algorithm, X, broadcast, gate.client_context(0, policy=policy))
        state, _ = algorithm.server_step(state, {0: reply})
        broadcast = algorithm.configure(state)
    assert matrix_form(broadcast.tensors["precisions_cholesky"]) == "upper"
    plain = gate.answer(algorithm, X, broadcast, gate.client_context(0, policy=policy))
    wired = gate.answer(
        algorithm, X, pack(broadcast), gate.client_context(0, policy=policy, wire=True)
    )
    assert_same(unpack(wired), plain)  # same reply, the broadcast's triangles restored
    assert WIRE not in plain.scalars
    float32 = FederatedEM.from_config(
        type(algorithm.config).from_json({**algorithm.config.to_json(), "wire_dtype": "float32"})
    )
    narrow = gate.answer(
        float32, X, pack(broadcast), gate.client_context(0, policy=policy, wire=True)
    )
    assert all(t.dtype == torch.float32 for t in narrow.tensors.values())
    narrow_bytes, wide_bytes = (
        sum(t.numel() * t.element_size() for t in m.tensors.values()) for m in (narrow, pack(plain))
    )
    assert 2 * narrow_bytes == wide_bytes


@pytest.mark.parametrize("form", ["symmetric", "upper", "lower"])
def test_many_matrices_pack_the_same_by_one_flat_index_or_along_the_last_dimension(
    form, monkeypatch
) -> None:
    """Small stacks gather through one cached flat index, large ones along the last
    dimension: both give the triangle row by row and its exact inverse."""
    from fednovelty.federated.core import wire

    square = torch.randn(4, K, D, D, dtype=torch.float64, generator=generator(5))
    square = {"symmetric": square + square.mT, "upper": square.triu(), "lower": square.tril()}[form]
    flat = wire.to_triangle(square, form)
    monkeypatch.setattr(wire, "FLAT_INDEX_ENTRIES", 0)
    along = wire.to_triangle(square, form)
    assert torch.equal(flat, along) and flat.shape == (4, K, triangle_size(D))
    rows, cols = (torch.triu_indices if form != "lower" else torch.tril_indices)(D, D)
    assert torch.equal(flat, square[..., rows, cols])  # by hand, row by row
    back_along = wire.from_triangle(along, form)
    monkeypatch.setattr(wire, "FLAT_INDEX_ENTRIES", 1 << 20)
    assert torch.equal(wire.from_triangle(flat, form), back_along)
    assert torch.equal(back_along, square)


def test_travelled_narrower_is_true_only_for_a_cast_or_an_unreadable_description() -> None:
    m = message()
    assert not travelled_narrower(m)  # never packed
    assert not travelled_narrower(pack(m))  # triangles, no cast
    assert travelled_narrower(pack(m, "float32"))
    garbled = Message(m.kind, m.tensors, {**m.scalars, WIRE: "{not json"})
    assert travelled_narrower(garbled)  # unpack will name it
    assert travelled_narrower(Message(m.kind, m.tensors, {WIRE: 3}))
