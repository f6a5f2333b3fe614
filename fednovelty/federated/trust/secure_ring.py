"""The ring of a secure sum and what its parties can check: clients' floats quantised into
``Z mod 2**bits``, the sum's error bound, the generators masks may come from, the form of a
Shamir share, the range of an unmasked sum, and the named errors of a refusal
(:mod:`fednovelty.federated.trust.secure` runs the protocol on them).

A client's value in its public clipping range ``[-c, c]`` maps to an integer in ``[0, T]``
(Flower's mapping, rounded stochastically); ``T = floor((2**bits - 1) / m)`` keeps the sum of
``m`` of them below the ring's size, so the server's sum never wraps around.

**What the server can check** (:func:`check_sum_range`): the unmasked sum of ``n`` senders'
quantised inputs lies in ``[0, n T]``, whatever honest clients sent; a value outside is
refused (:class:`ImplausibleSumError`). That is all a secure sum can verify of its inputs,
and it is little: it catches a client that offsets its masked vector (or its quantised
input) only where the offset carries the sum out of ``[0, n T]``. With every one of the
``m`` clients sending, ``[0, m T]`` covers all but fewer than ``m`` of the ``2**bits`` ring
values, so almost no offset is caught; with ``n < m`` senders a uniformly random offset of
one value is caught with probability about ``1 - n / m``. An offset that keeps the sum in
range, any lie about one's own input within the clipping range, and a liar's identity are
never detected (the server sees only the sum); the server gate's form and range checks of
the decoded sum (:func:`~fednovelty.federated.trust.reply_form.check_reply`) catch a sum that is
not a possible reply at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fednovelty.federated.trust.noise import NoiseSource, check_source

#: the most quantisation levels: float64 holds integers exactly up to 2**53.
MAX_LEVELS = 2**53
#: the mask generators :func:`fednovelty.federated.trust.secure.mask_stream` knows.
PRGS = ("aes-ctr",)
#: generators refused by name (:class:`InsecurePRGError`), each with the reason.
REFUSED_PRGS = {
    "flower": "Flower's pseudo_rand_gen folds its seed to 32 bits before seeding numpy's "
    "Mersenne Twister, so each mask is one of 2**32 a server can try"
}
#: the bytes of a mask seed (an AES-256 key) and of its Shamir shares and the masking key's
#: (a 4-byte index, then 16 bytes a block of the padded secret).
SEED_BYTES, SEED_SHARE_BYTES, KEY_SHARE_BYTES = 32, 4 + 16 * 3, 4 + 16 * 4

__all__ = [
    "KEY_SHARE_BYTES",
    "MAX_LEVELS",
    "PRGS",
    "REFUSED_PRGS",
    "SEED_BYTES",
    "SEED_SHARE_BYTES",
    "ImplausibleSumError",
    "InsecurePRGError",
    "MalformedShareError",
    "MalformedShareWarning",
    "SecureSumError",
    "check_prg",
    "check_range",
    "check_sum_range",
    "dequantize_sum",
    "error_bound",
    "quantization_levels",
    "quantize",
    "responder_defect",
    "share_defect",
    "usable_responders",
]


class SecureSumError(ValueError):
    """A secure sum refused: the message names the client (``client``; ``None`` where the
    server cannot tell one) and what to do."""

    def __init__(self, message: str, client: int | None = None) -> None:
        super().__init__(message)
        self.client = client


class ImplausibleSumError(SecureSumError):
    """An unmasked sum the public clipping ranges cannot produce: some client lied about
    its masked vector (which one, the server cannot tell)."""


class InsecurePRGError(SecureSumError):
    """A mask generator that does not expand at least 128 bits of fresh entropy by a
    cryptographic PRG (:data:`REFUSED_PRGS`)."""


class MalformedShareError(SecureSumError):
    """A share that cannot be read: ``client`` is the one who sent it."""


class MalformedShareWarning(UserWarning):
    """A client left out of a round (or a responder passed over) because a share it sent
    cannot be read; the round goes on without it."""


def check_prg(prg: str) -> str:
    """``prg`` if it is one of :data:`PRGS`.

    Raises:
        InsecurePRGError: a generator of :data:`REFUSED_PRGS`, saying why.
        ValueError: an unknown name.
    """
    if prg in REFUSED_PRGS:
        raise InsecurePRGError(
            f"prg={prg!r} is refused: {REFUSED_PRGS[prg]}; use prg='aes-ctr' (AES-256 in "
            "counter mode keyed by 256 bits of fresh entropy)."
        )
    if prg not in PRGS:
        raise ValueError(f"prg must be one of {PRGS}; got {prg!r}.")
    return prg


def share_defect(share: object, length: int, n_holders: int) -> str | None:
    """Why ``share`` is not a Shamir share of ``length`` bytes among ``n_holders``
    (:data:`SEED_SHARE_BYTES`, :data:`KEY_SHARE_BYTES`; its 4-byte little-endian index in
    [1, n_holders]), or ``None``. A well-formed share with wrong content is not detected."""
    if not isinstance(share, bytes) or len(share) != length:
        size = len(share) if isinstance(share, bytes) else type(share).__name__
        return f"a share of {size} bytes where {length} are expected"
    index = int.from_bytes(share[:4], "little")
    if not 1 <= index <= n_holders:
        return f"a share of index {index}, outside [1, {n_holders}]"
    return None


def responder_defect(
    shares: Mapping[int, bytes], expected: Mapping[int, int], n: int, used: set[bytes]
) -> str | None:
    """Why one responder's revealed ``shares`` (owner -> share) are unusable, or ``None``:
    not one share of ``expected[owner]`` bytes for each expected owner (:func:`share_defect`
    among ``n`` holders), not all of one index, or an index in ``used`` (another
    responder's)."""
    if set(shares) != set(expected):
        return f"shares of {sorted(shares)} where {sorted(expected)} are expected"
    for owner in sorted(expected):
        defect = share_defect(shares[owner], expected[owner], n)
        if defect:
            return f"for client {owner}: {defect}"
    indices = {share[:4] for share in shares.values()}
    if len(indices) > 1:
        return "shares of different indices"
    if indices & used:
        return f"the share index {int.from_bytes(min(indices), 'little')} of another responder"
    return None


def usable_responders(
    revealed: Mapping[int, Mapping[int, bytes]], senders: set[int], dropped: set[int], n: int
) -> tuple[dict[int, Mapping[int, bytes]], dict[int, str]]:
    """``(responders whose shares are usable, responder -> why not)``: each must reveal a
    seed share (:data:`SEED_SHARE_BYTES`) of every sender and a key share
    (:data:`KEY_SHARE_BYTES`) of every dropped client, of ``n`` holders
    (:func:`responder_defect`; of two with one index, the larger id is passed over)."""
    good: dict[int, Mapping[int, bytes]] = {}
    bad: dict[int, str] = {}
    used: set[bytes] = set()
    expected = {o: SEED_SHARE_BYTES for o in senders} | {o: KEY_SHARE_BYTES for o in dropped}
    for responder in sorted(revealed):
        shares = revealed[responder]
        why = responder_defect(shares, expected, n, used)
        if why is None:
            good[responder] = shares
            used |= {share[:4] for share in shares.values()}
        else:
            bad[responder] = why
    return good, bad


def quantization_levels(bits: int, n_clients: int) -> int:
    """The largest quantised value ``T``: each input maps to an integer in [0, T], and the sum
    of ``n_clients`` of them stays below the ring's size ``2**bits`` (no wrap-around), capped
    at ``2**53`` (float64's exact integers)."""
    return min((2**bits - 1) // n_clients, MAX_LEVELS)


def quantize(values: np.ndarray, clip: float, levels: int, source: NoiseSource) -> np.ndarray:
    """Flower's quantisation of ``values`` (n,) in [-clip, clip] to integers (n,) uint64 in
    [0, levels]: ``(x + clip) * levels / (2 clip)``, rounded stochastically (up with
    probability equal to the fractional part, so the rounding is unbiased). The rounding's
    uniforms are the top 53 bits of ``source``'s words (:mod:`fednovelty.federated.trust.noise`:
    fresh OS entropy, or a test's seeded source); Flower's own ``quantize`` draws from
    numpy's global generator and casts to int32."""
    scaled = (values + clip) * (levels / (2 * clip))
    low = np.floor(scaled)
    words = check_source(source).bits(values.size).reshape(values.shape)
    up = (words >> np.uint64(11)).astype(np.float64) * 2.0**-53 < scaled - low
    return np.minimum(low + up, levels).astype(np.uint64)


def dequantize_sum(total: np.ndarray, clip: float, levels: int, n_inputs: int) -> np.ndarray:
    """The float sum (n,) float64 of ``n_inputs`` inputs from the sum ``total`` (n,) uint64 of
    their quantised values: ``(2 total - n_inputs levels) * clip / levels``, the integer part
    exact (Flower's ``dequantize`` plus its workflow's offset ``-(n - 1) clip``)."""
    centred = 2 * total.astype(np.int64) - np.int64(n_inputs * levels)
    return centred.astype(np.float64) * (clip / levels)


def error_bound(clip: float, levels: int, n_inputs: int) -> float:
    """The most the secure sum of ``n_inputs`` inputs can differ from their float64 sum, per
    value: each stochastic rounding moves a value by less than one step ``2 clip / levels``;
    float64 round-off adds at most ``6 eps clip`` an input when scaling it and ``2 eps clip``
    an input when dequantising (``eps`` = 2**-52)."""
    return n_inputs * clip * (2 / levels + 8 * float(np.finfo(np.float64).eps))


def check_range(client: int, name: str, values: np.ndarray, clip: float) -> None:
    """Refuse a value outside [-clip, clip] (or not finite): the secure sum cannot clip
    silently, the server would get a wrong sum.

    Raises:
        ValueError: naming the client, the tensor and the clip range it needs.
    """
    if not np.all(np.isfinite(values)):
        raise ValueError(f"client {client}: tensor {name!r} has non-finite values.")
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    if largest > clip:
        raise ValueError(
            f"client {client}: tensor {name!r} has a value of magnitude {largest:.6g} outside "
            f"the clipping range [-{clip:.6g}, {clip:.6g}]; widen clip_range for {name!r} to "
            f"at least {largest:.6g} (it is public: set it from bounds known before the round)."
        )


def check_sum_range(
    total: np.ndarray, n_inputs: int, levels: int, layout: Sequence[tuple[str, int]]
) -> None:
    """Refuse an unmasked sum ``total`` (n_values,) uint64 of ``n_inputs`` quantised inputs
    that honest clients cannot produce: a value above ``n_inputs * levels`` (module
    docstring: what this catches and what it cannot). ``layout``: ``(tensor name, number of
    values)`` in the vector's order, to name where the sum went wrong.

    Raises:
        ImplausibleSumError: naming the tensor, the value and the range.
    """
    most = np.uint64(n_inputs * levels)
    outside = np.flatnonzero(total > most)
    if outside.size == 0:
        return
    first, offset, where = int(outside[0]), 0, "?"
    for name, size in layout:
        if first < offset + size:
            where = name
            break
        offset += size
    raise ImplausibleSumError(
        f"the unmasked sum is implausible: {outside.size} of its {total.size} values lie "
        f"outside [0, {n_inputs} x {levels}], the most {n_inputs} inputs in their public "
        f"clipping ranges can sum to (first: tensor {where!r}, value {first - offset}); a "
        "client offset its masked vector. The round's sum is refused (which client lied "
        "cannot be told from the sum)."
    )
