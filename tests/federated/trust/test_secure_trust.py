"""What a secure sum trusts, and what it refuses by name: masks only from AES-256 in counter
mode (Flower's 32-bit ``pseudo_rand_gen`` refused), a client whose share cannot be read left
out by name while the round goes on, a responder whose revealed share is malformed passed
over by name, and an unmasked sum the public ranges cannot produce refused.

Names introduced with these checks are read from the raised error or warning (its class
name), so that each test fails on code without the check rather than at import."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import fednovelty.federated.trust.secure as secure
from fednovelty.federated.trust.secure import secure_sum

CLIP = 10.0


def _clients(m: int, n: int = 6, seed: int = 0) -> dict[int, dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    return {c: {"x": torch.as_tensor(rng.uniform(-5, 5, n))} for c in range(m)}


def _plain(clients, ids) -> np.ndarray:
    return np.sum([clients[c]["x"].numpy() for c in ids], axis=0)


# ----------------------------------------------------------------- masks
def test_flowers_32_bit_prg_is_refused_by_name():
    """``pseudo_rand_gen`` folds its seed to 32 bits: a server could try every mask."""
    for call in (
        lambda: secure.mask_stream(os.urandom(32), 4, 32, "flower"),
        lambda: secure_sum(_clients(3), clip_range=CLIP, threshold=2, prg="flower"),
    ):
        with pytest.raises(ValueError, match="32 bits") as caught:
            call()
        assert caught.type.__name__ == "InsecurePRGError"
    assert "flower" not in secure.PRGS


def test_masks_take_a_256_bit_key_only():
    with pytest.raises(ValueError, match="32-byte"):
        secure.mask_stream(b"\x01" * 4, 4, 32)


# ----------------------------------------------------------------- shares
def _corrupting(victim: int):
    """``share_secrets`` whose ciphertexts from ``victim`` are cut short (unreadable)."""
    original = secure.share_secrets

    def share_secrets(state, public_keys, threshold):
        ciphertexts = original(state, public_keys, threshold)
        if state.client == victim:
            return {holder: text[: len(text) // 2] for holder, text in ciphertexts.items()}
        return ciphertexts

    return share_secrets


def test_a_client_whose_shares_cannot_be_read_is_left_out_by_name(monkeypatch):
    clients = _clients(5)
    monkeypatch.setattr(secure, "share_secrets", _corrupting(3))
    with pytest.warns(UserWarning, match=r"client 3") as caught:
        sums, report = secure_sum(clients, clip_range=CLIP, threshold=3)
    assert {type(w.message).__name__ for w in caught} == {"MalformedShareWarning"}
    assert report.senders == (0, 1, 2, 4)
    assert set(report.refused) == {3} and "client 3" in report.refused[3]
    error = np.abs(sums["x"].numpy() - _plain(clients, [0, 1, 2, 4])).max()
    assert error <= report.error_bound["x"]


def test_too_few_readable_clients_stop_the_round_naming_them(monkeypatch):
    monkeypatch.setattr(secure, "share_secrets", _corrupting(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"client 1") as caught:
            secure_sum(_clients(3), clip_range=CLIP, threshold=3)
    assert caught.type.__name__ == "SecureSumError"


def test_a_malformed_revealed_share_passes_its_responder_over_by_name(monkeypatch):
    clients = _clients(5, seed=1)
    original = secure.reveal_shares

    def reveal_shares(state, senders, dropped):
        shares = original(state, senders, dropped)
        if state.client == 2:
            return {owner: share[:7] for owner, share in shares.items()}
        return shares

    monkeypatch.setattr(secure, "reveal_shares", reveal_shares)
    with pytest.warns(UserWarning, match=r"client 2") as caught:
        sums, report = secure_sum(clients, clip_range=CLIP, threshold=3, dropped={4})
    assert {type(w.message).__name__ for w in caught} == {"MalformedShareWarning"}
    error = np.abs(sums["x"].numpy() - _plain(clients, [0, 1, 2, 3])).max()
    assert error <= report.error_bound["x"]


# ----------------------------------------------------------------- lies
def test_an_unmasked_sum_outside_the_public_ranges_is_refused(monkeypatch):
    """A client offsets its masked vector by half the ring. With one of four clients
    dropped, three inputs sum into [0, 3 T] (T = floor((2**bits - 1) / 4)), a quarter of the
    ring left over: the offset lands there and the sum is refused, naming the tensor."""
    original = secure.mask_input
    bits = 32

    def mask_input(state, quantized, public_keys, bits_, prg="aes-ctr"):
        masked = original(state, quantized, public_keys, bits_, prg)
        if state.client == 0:
            masked = (masked + np.uint64(2 ** (bits - 1))) % np.uint64(2**bits)
        return masked

    monkeypatch.setattr(secure, "mask_input", mask_input)
    clients = {c: {"x": torch.zeros(4, dtype=torch.float64)} for c in range(4)}
    with pytest.raises(ValueError, match=r"'x'") as caught:
        secure_sum(clients, clip_range=CLIP, threshold=3, bits=bits, dropped={3})
    assert caught.type.__name__ == "ImplausibleSumError"
