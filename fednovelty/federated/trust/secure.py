"""Secure sums of clients' named float tensors: the SecAgg protocol (Bonawitz et al., CCS 2017,
as in Flower's SecAgg+ with every client a neighbour of every other), run in-process on
Flower's primitives (``fednovelty[flower]``): key pairs, Diffie-Hellman shared keys, Fernet
encryption of shares, Shamir shares, the quantisation mapping and the ring arithmetic.

Steps (:func:`secure_sum` runs them in order): :func:`setup_keys`, :func:`share_secrets`
(Shamir shares, ``threshold`` of ``m``, of a fresh self-mask seed and of the masking secret
key), :func:`mask_input` (quantise, add the masks, mod ``2**bits``), :func:`reveal_shares`
and :func:`unmask_sum`. The server learns the sum of the inputs of the clients whose masked
vectors it received, to the quantisation error (:func:`error_bound`), and who dropped;
assumed: an honest-but-curious server colluding with fewer than ``threshold`` clients,
authenticated channels, inputs inside the public clipping range (checked).

Randomness comes from the operating system's CSPRNG (key pairs, 32-byte self-mask seeds, the
stochastic rounding via :mod:`fednovelty.federated.trust.noise`); masks are AES-256 in counter mode
(``prg="aes-ctr"``, the only generator): Flower's ``pseudo_rand_gen`` folds its seed to 32
bits and is refused (:class:`InsecurePRGError`). A client whose shares cannot be read is left
out by name (:class:`MalformedShareWarning`), and an unmasked sum outside what the public
ranges allow raises :class:`~fednovelty.federated.trust.secure_ring.ImplausibleSumError`. Not done:
no network, no defence against a server that lies about who dropped, no verifiable shares,
no sparse neighbour graph. Protocol, bound and costs: ``docs/secure_sums.md``; the rounds of
a federated algorithm run through it in :mod:`fednovelty.runtime.secure_rounds`.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.trust.noise import noise_source
from fednovelty.federated.trust.secure_ring import (  # the ring's half of the protocol
    KEY_SHARE_BYTES,
    SEED_BYTES,
    SEED_SHARE_BYTES,
    MalformedShareError,
    MalformedShareWarning,
    SecureSumError,
    check_prg,
    check_range,
    check_sum_range,
    dequantize_sum,
    error_bound,
    quantization_levels,
    quantize,
    share_defect,
    usable_responders,
)
from fednovelty.federated.trust.secure_ring import MAX_LEVELS as MAX_LEVELS  # re-exported
from fednovelty.federated.trust.secure_ring import PRGS as PRGS
from fednovelty.federated.trust.secure_ring import REFUSED_PRGS as REFUSED_PRGS
from fednovelty.federated.trust.secure_ring import ImplausibleSumError as ImplausibleSumError
from fednovelty.federated.trust.secure_ring import InsecurePRGError as InsecurePRGError

#: the ring widths accepted: masks live in Z mod 2**bits, held in 64-bit integers.
MIN_BITS, MAX_BITS = 16, 62
#: the protocol's steps, in order, as named in a report's timings and byte counts.
STEPS = ("setup", "share_keys", "mask", "unmask")


def _flower():
    """Flower's secure-aggregation primitives (the optional extra ``fednovelty[flower]``)."""
    try:
        from flwr.common.secure_aggregation import ndarrays_arithmetic, secaggplus_utils
        from flwr.common.secure_aggregation.crypto import shamir, symmetric_encryption
        from flwr.supercore.primitives import asymmetric
    except ImportError:  # pragma: no cover - the extra is installed in the test environment
        raise ImportError(
            "secure sums use Flower's secure-aggregation primitives: "
            "pip install 'fednovelty[flower]'."
        ) from None
    return asymmetric, symmetric_encryption, shamir, secaggplus_utils, ndarrays_arithmetic


# --------------------------------------------------------------------------- masks
def mask_stream(seed: bytes, length: int, bits: int, prg: str = "aes-ctr") -> np.ndarray:
    """``length`` pseudo-random integers (length,) uint64 in [0, 2**bits) from ``seed``: the
    AES-256 key stream (counter mode, zero nonce) of the 32-byte ``seed``, 8 bytes a value,
    masked to ``bits`` bits, uniform on the ring; a seed keys one stream only.

    Raises:
        InsecurePRGError: ``prg`` of :data:`REFUSED_PRGS`. ValueError: another ``prg`` or a
            seed that is not 32 bytes.
    """
    check_prg(prg)
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise ValueError(f"a mask seed must be a {SEED_BYTES}-byte AES-256 key; got {seed!r:.40}.")
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    encryptor = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8")
    return words & np.uint64(2**bits - 1)


def pairwise_seed(private_key, public_key_pem: bytes) -> bytes:
    """The 32-byte seed two clients share: Flower's ``generate_shared_key`` (ECDH on
    SECP384R1, then HKDF-SHA256) of one's private key and the other's public key, decoded
    from Flower's url-safe base64."""
    asymmetric, symmetric, *_ = _flower()
    shared = symmetric.generate_shared_key(
        private_key, asymmetric.bytes_to_public_key(public_key_pem)
    )
    return base64.urlsafe_b64decode(shared)


# --------------------------------------------------------------------------- the parties
@dataclass
class ClientState:
    """What one client keeps through a round: its masking key pair (``mask_key``, its
    public PEM ``mask_public``), its encryption key pair (for the shares it sends), its
    self-mask seed and the shares other clients gave it (owner -> (seed share, key share))."""

    client: int
    mask_key: object
    mask_public: bytes
    encryption_key: object
    encryption_public: bytes
    self_seed: bytes = b""
    held_shares: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)


def setup_keys(clients: list[int]) -> dict[int, ClientState]:
    """Step 1: each client makes two fresh key pairs (Flower's ``generate_key_pairs``) and
    advertises both public keys (PEM); the server relays all of them to everyone."""
    asymmetric = _flower()[0]
    states = {}
    for client in clients:
        mask_key, mask_public = asymmetric.generate_key_pairs()
        encryption_key, encryption_public = asymmetric.generate_key_pairs()
        states[client] = ClientState(
            client,
            mask_key,
            asymmetric.public_key_to_bytes(mask_public),
            encryption_key,
            asymmetric.public_key_to_bytes(encryption_public),
        )
    return states


def _private_scalar(private_key) -> bytes:
    """The 48-byte secret scalar of a SECP384R1 key (what is shared; Flower shares the PEM)."""
    return private_key.private_numbers().private_value.to_bytes(48, "big")


def _key_from_scalar(scalar: bytes):
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.derive_private_key(int.from_bytes(scalar, "big"), ec.SECP384R1())


def share_secrets(
    state: ClientState, public_keys: Mapping[int, tuple[bytes, bytes]], threshold: int
) -> dict[int, bytes]:
    """Step 2, one client: draw a fresh 32-byte self-mask seed, split it and the masking
    key's secret scalar into ``threshold``-of-``m`` Shamir shares (Flower's
    ``create_shares``), keep its own and encrypt the others, each for its holder (Flower's
    ``encrypt`` under the shared key of the encryption key pairs). ``public_keys``: client ->
    (mask public PEM, encryption public PEM), every client. Returns holder -> ciphertext."""
    _, symmetric, shamir, utils, _ = _flower()
    holders = sorted(public_keys)
    state.self_seed = os.urandom(32)
    seed_shares = shamir.create_shares(state.self_seed, threshold, len(holders))
    key_shares = shamir.create_shares(_private_scalar(state.mask_key), threshold, len(holders))
    ciphertexts = {}
    for holder, seed_share, key_share in zip(holders, seed_shares, key_shares, strict=True):
        if holder == state.client:
            state.held_shares[holder] = (seed_share, key_share)
            continue
        key = base64.urlsafe_b64encode(pairwise_seed(state.encryption_key, public_keys[holder][1]))
        plain = utils.share_keys_plaintext_concat(state.client, holder, seed_share, key_share)
        ciphertexts[holder] = symmetric.encrypt(key, plain)
    return ciphertexts


def receive_shares(
    state: ClientState, ciphertexts: Mapping[int, bytes], public_keys: Mapping[int, tuple]
) -> None:
    """A client decrypts the shares other clients sent it (source -> ciphertext) and keeps
    them.

    Raises:
        MalformedShareError: naming the source (``error.client``) of a ciphertext that does
            not decrypt under their shared key, of a plaintext that names another source or
            destination, or of a share of the wrong form (:func:`share_defect`).
    """
    _, symmetric, _, utils, _ = _flower()
    from cryptography.fernet import InvalidToken

    n = len(public_keys)
    for source, ciphertext in ciphertexts.items():
        key = base64.urlsafe_b64encode(pairwise_seed(state.encryption_key, public_keys[source][1]))
        try:
            plain = symmetric.decrypt(key, ciphertext)
        except (InvalidToken, TypeError, ValueError, binascii.Error) as error:
            raise MalformedShareError(
                f"client {state.client}: the shares client {source} sent it cannot be read "
                f"({type(error).__name__}: not encrypted under their shared key); client "
                f"{source} is left out of the round.",
                client=source,
            ) from None
        src, dst, seed_share, key_share = utils.share_keys_plaintext_separate(plain)
        defect = (
            f"says {src} -> {dst}"
            if (src, dst) != (source, state.client)
            else share_defect(seed_share, SEED_SHARE_BYTES, n)
            or share_defect(key_share, KEY_SHARE_BYTES, n)
        )
        if defect:
            raise MalformedShareError(
                f"client {state.client}: the shares client {source} sent it are malformed "
                f"({defect}); client {source} is left out of the round.",
                client=source,
            )
        state.held_shares[source] = (seed_share, key_share)


def mask_input(
    state: ClientState,
    quantized: np.ndarray,
    public_keys: Mapping[int, tuple[bytes, bytes]],
    bits: int,
    prg: str = "aes-ctr",
) -> np.ndarray:
    """Step 3, one client: its quantised input (n,) uint64 plus its self-mask plus, for each
    other client ``j``, the mask of their shared seed (added when this client's id is the
    larger, subtracted otherwise, so each pair cancels in the sum), mod ``2**bits``, with
    Flower's ndarray arithmetic. Returns the masked vector (n,) uint64, uniform on the ring."""
    arithmetic = _flower()[4]
    n = quantized.shape[0]
    masked = arithmetic.parameters_addition(
        [quantized], [mask_stream(state.self_seed, n, bits, prg)]
    )
    for other in sorted(public_keys):
        if other == state.client:
            continue
        pair = [mask_stream(pairwise_seed(state.mask_key, public_keys[other][0]), n, bits, prg)]
        combine = (
            arithmetic.parameters_addition
            if state.client > other
            else arithmetic.parameters_subtraction
        )
        masked = combine(masked, pair)
    return arithmetic.parameters_mod(masked, 2**bits)[0]


def reveal_shares(state: ClientState, senders: set[int], dropped: set[int]) -> dict[int, bytes]:
    """Step 4, one client: the share of each sender's self-mask seed and of each dropped
    client's masking key (owner -> share). Never both for one owner: that would unmask it.

    Raises:
        ValueError: a client listed both as a sender and as dropped.
    """
    both = senders & dropped
    if both:
        raise ValueError(
            f"client {state.client}: the server lists {sorted(both)} both as senders and as "
            "dropped; revealing both shares would unmask them, abort the round."
        )
    revealed = {owner: state.held_shares[owner][0] for owner in sorted(senders)}
    revealed |= {owner: state.held_shares[owner][1] for owner in sorted(dropped)}
    return revealed


def unmask_sum(
    masked: Mapping[int, np.ndarray],
    revealed: Mapping[int, Mapping[int, bytes]],
    dropped: set[int],
    public_keys: Mapping[int, tuple[bytes, bytes]],
    threshold: int,
    bits: int,
    prg: str = "aes-ctr",
    n_holders: int | None = None,
) -> np.ndarray:
    """Step 4, the server: add the masked vectors (sender -> (n,) uint64) mod ``2**bits``,
    rebuild each sender's self-mask seed and each dropped client's masking key from the
    revealed shares (responder -> owner -> share; Flower's ``combine_shares``), subtract the
    self-masks and the pairwise masks the senders shared with dropped clients. A responder
    whose shares are malformed (:func:`usable_responders`, shares among ``n_holders``,
    default ``len(public_keys)``) is passed over with a :class:`MalformedShareWarning`
    naming it. Returns the sum (n,) uint64 of the senders'
    quantised inputs.

    Raises:
        SecureSumError: fewer than ``threshold`` clients revealed well-formed shares.
    """
    _, _, shamir, _, arithmetic = _flower()
    count = len(public_keys) if n_holders is None else n_holders
    revealed, bad = usable_responders(revealed, set(masked), set(dropped), count)
    for responder, why in bad.items():
        warnings.warn(
            MalformedShareWarning(
                f"client {responder} revealed malformed shares ({why}); its shares are "
                "passed over and the round unmasked from the others'."
            ),
            stacklevel=2,
        )
    if len(revealed) < threshold:
        raise SecureSumError(
            f"unmasking needs the shares of at least threshold={threshold} clients; only "
            f"{len(revealed)} answered ({len(masked)} sent masked vectors, {len(dropped)} "
            f"dropped before{', malformed shares from clients ' + str(sorted(bad)) if bad else ''}"
            "). The round's sum cannot be recovered: run it again, or choose a lower "
            "threshold (it tolerates m - threshold drops)."
        )
    n = next(iter(masked.values())).shape[0]
    total = [np.zeros(n, dtype=np.uint64)]
    for vector in masked.values():
        total = arithmetic.parameters_addition(total, [vector])
    holders = sorted(revealed)[:threshold]
    for sender in sorted(masked):
        seed = shamir.combine_shares([revealed[h][sender] for h in holders])
        total = arithmetic.parameters_subtraction(total, [mask_stream(seed, n, bits, prg)])
    for gone in sorted(dropped):
        key = _key_from_scalar(shamir.combine_shares([revealed[h][gone] for h in holders]))
        for sender in sorted(masked):
            pair = [mask_stream(pairwise_seed(key, public_keys[sender][0]), n, bits, prg)]
            # the sender added the pair's mask when its id was the larger: take it back.
            undo = (
                arithmetic.parameters_subtraction
                if sender > gone
                else arithmetic.parameters_addition
            )
            total = undo(total, pair)
    return arithmetic.parameters_mod(total, 2**bits)[0]


# --------------------------------------------------------------------------- the round
@dataclass
class SecureSumReport:
    """What a secure sum cost and what the server saw.

    ``bytes_up`` / ``bytes_down``: client -> step (:data:`STEPS`) -> bytes it sent / got
    (public keys as PEM, encrypted shares, the masked vector at ``ceil(bits / 8)`` bytes a
    value, revealed shares, 8 bytes a client id). ``seconds``: step -> wall time of all
    parties in turn (client work summed over clients; ``"unmask"`` includes the server's).
    ``error_bound``: tensor -> the most any summed value can be off (:func:`error_bound`).
    ``server_view``: client -> the masked vector (n,) uint64 the server got from it.
    ``refused``: client -> why it was left out (a share it sent could not be read).
    """

    n_clients: int
    threshold: int
    bits: int
    levels: int
    n_values: int
    senders: tuple[int, ...]
    dropped: tuple[int, ...]
    unresponsive: tuple[int, ...]
    clip_range: dict[str, float]
    error_bound: dict[str, float]
    bytes_up: dict[int, dict[str, int]]
    bytes_down: dict[int, dict[str, int]]
    seconds: dict[str, float]
    server_view: dict[int, np.ndarray]
    refused: dict[int, str] = field(default_factory=dict)

    def mean_bytes(self, direction: str = "up") -> float:
        """A client's total bytes sent (``"up"``) or received (``"down"``), averaged over
        the clients."""
        table = self.bytes_up if direction == "up" else self.bytes_down
        return sum(sum(steps.values()) for steps in table.values()) / len(table)


def _layout(client_tensors: Mapping[int, Mapping[str, Tensor]]) -> dict[str, torch.Size]:
    """The names and shapes every client must send (the first client's), checked."""
    if len(client_tensors) < 2:
        raise ValueError(f"client_tensors must hold at least 2 clients; got {len(client_tensors)}.")
    first, *rest = client_tensors
    layout = {name: tensor.shape for name, tensor in client_tensors[first].items()}
    for client in rest:
        theirs = {name: tensor.shape for name, tensor in client_tensors[client].items()}
        if theirs != layout:
            raise ValueError(
                f"client {client} sends tensors {theirs}, client {first} sends {layout}; every "
                "client must send the same names and shapes."
            )
    return layout


def _clip_ranges(clip_range: float | Mapping[str, float], names: list[str]) -> dict[str, float]:
    clips = (
        dict(clip_range) if isinstance(clip_range, Mapping) else dict.fromkeys(names, clip_range)
    )
    missing = [name for name in names if name not in clips]
    if missing:
        raise ValueError(f"clip_range has no range for tensors {missing}; give one per tensor.")
    for name in names:
        if not (
            isinstance(clips[name], int | float) and math.isfinite(clips[name]) and clips[name] > 0
        ):
            raise ValueError(
                f"clip_range for {name!r} must be a positive finite number; got {clips[name]!r}."
            )
    return {name: float(clips[name]) for name in names}


def _check_settings(
    clients: list[int], threshold: int, bits: int, dropped: set, unresponsive: set
) -> None:
    if not (isinstance(bits, int) and MIN_BITS <= bits <= MAX_BITS):
        raise ValueError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}]; got {bits!r}.")
    if not (isinstance(threshold, int) and 2 <= threshold <= len(clients)):
        raise ValueError(
            f"threshold must be an integer in [2, {len(clients)}] (the number of clients); "
            f"got {threshold!r}. Above m/2 is the usual choice."
        )
    for name, group in (("dropped", dropped), ("unresponsive", unresponsive)):
        unknown = set(group) - set(clients)
        if unknown:
            raise ValueError(
                f"{name} names clients {sorted(unknown)} that are not in client_tensors."
            )
    if set(dropped) & set(unresponsive):
        raise ValueError(
            "a client cannot be both dropped (before masking) and unresponsive (after)."
        )
    for client in clients:
        if not (isinstance(client, int) and 0 <= client < 2**63):
            raise ValueError(f"client ids must be integers in [0, 2**63); got {client!r}.")


def _received(
    states: Mapping[int, ClientState],
    relayed: Mapping[int, Mapping[int, bytes]],
    public_keys: Mapping[int, tuple[bytes, bytes]],
    holders: list[int],
) -> dict[int, str]:
    """Each of ``holders`` decrypts the shares relayed to it (holder -> source ->
    ciphertext). Returns source -> why, for each client a share of which could not be read
    (:class:`MalformedShareError`), each warned of (:class:`MalformedShareWarning`)."""
    refused: dict[int, str] = {}
    for holder in holders:
        for source, ciphertext in relayed[holder].items():
            try:
                receive_shares(states[holder], {source: ciphertext}, public_keys)
            except MalformedShareError as error:
                refused.setdefault(source, str(error))
    for why in refused.values():
        warnings.warn(MalformedShareWarning(why), stacklevel=3)
    return refused


def secure_sum(
    client_tensors: Mapping[int, Mapping[str, Tensor]],
    *,
    clip_range: float | Mapping[str, float],
    threshold: int,
    bits: int = 32,
    dropped: set[int] = frozenset(),
    unresponsive: set[int] = frozenset(),
    insecure_seed: int | None = None,
    prg: str = "aes-ctr",
    device: torch.device | str | None = None,
) -> tuple[dict[str, Tensor], SecureSumReport]:
    """The sum over clients of each named tensor, as the server gets it from SecAgg: each
    client's tensors (client -> name -> tensor, the same names and shapes for all) quantised
    in the public ``clip_range`` (one float, or one per name) on a ring of ``2**bits``.

    ``dropped`` clients go away after sharing their secrets, before sending a masked vector:
    the sum leaves them out. ``unresponsive`` ones send it but not their shares afterwards:
    the sum keeps them. A client whose shares cannot be read is left out before anyone
    masks, with a :class:`MalformedShareWarning` naming it (``report.refused``). Keys, masks
    and the stochastic rounding come from the operating system's randomness;
    ``insecure_seed`` (TESTING ONLY: whoever knows it re-draws the rounding) seeds the
    rounding. Returns name -> sum (in the first client's dtype, on ``device`` or its device)
    and the :class:`SecureSumReport`.

    Raises:
        ValueError: mismatched tensors, a bad setting, a value outside the clipping range.
        InsecurePRGError: a refused ``prg``.
        SecureSumError: fewer than ``threshold`` senders left, or fewer than ``threshold``
            clients to reveal well-formed shares (naming the clients left out).
        ImplausibleSumError: an unmasked sum outside the public ranges.
    """
    layout = _layout(client_tensors)
    names, clients = list(layout), sorted(client_tensors)
    clips = _clip_ranges(clip_range, names)
    _check_settings(clients, threshold, bits, set(dropped), set(unresponsive))
    check_prg(prg)
    levels = quantization_levels(bits, len(clients))
    sizes = [math.prod(layout[name]) for name in names]
    width = math.ceil(bits / 8)
    up = {c: dict.fromkeys(STEPS, 0) for c in clients}
    down = {c: dict.fromkeys(STEPS, 0) for c in clients}
    seconds = dict.fromkeys(STEPS, 0.0)

    start = time.perf_counter()
    states = setup_keys(clients)
    public_keys = {c: (s.mask_public, s.encryption_public) for c, s in states.items()}
    advertised = sum(len(a) + len(b) for a, b in public_keys.values())
    for c in clients:
        up[c]["setup"], down[c]["setup"] = (
            len(public_keys[c][0]) + len(public_keys[c][1]),
            advertised,
        )
    seconds["setup"] = time.perf_counter() - start

    start = time.perf_counter()
    relayed: dict[int, dict[int, bytes]] = {c: {} for c in clients}
    for c in clients:
        for holder, ciphertext in share_secrets(states[c], public_keys, threshold).items():
            relayed[holder][c] = ciphertext
            up[c]["share_keys"] += len(ciphertext) + 8
            down[holder]["share_keys"] += len(ciphertext) + 8
    seconds["share_keys"] = time.perf_counter() - start

    start = time.perf_counter()
    refused = _received(states, relayed, public_keys, [c for c in clients if c not in dropped])
    shared = [c for c in clients if c not in refused]  # who masks with whom
    senders = [c for c in shared if c not in dropped]
    if refused and len(senders) < threshold:
        named = ", ".join(f"client {c}" for c in sorted(refused))
        raise SecureSumError(
            f"{len(senders)} senders are left, fewer than threshold={threshold}: {named} "
            f"left out (shares that cannot be read), {len(dropped)} dropped. The round's "
            "sum cannot be unmasked.",
            client=min(refused),
        )
    keys = {c: public_keys[c] for c in shared}
    masked = {}
    for c in senders:
        source = noise_source(insecure_seed, c)
        pieces = []
        for name in names:
            values = client_tensors[c][name].detach().to("cpu", torch.float64).numpy().reshape(-1)
            check_range(c, name, values, clips[name])
            pieces.append(quantize(values, clips[name], levels, source))
        masked[c] = mask_input(states[c], np.concatenate(pieces), keys, bits, prg)
        up[c]["mask"] = width * masked[c].shape[0]
    seconds["mask"] = time.perf_counter() - start

    start = time.perf_counter()
    gone = {c for c in dropped if c in keys}
    revealed = {}
    for c in senders:
        down[c]["unmask"] = 8 * len(clients)
        if c in unresponsive:
            continue
        revealed[c] = reveal_shares(states[c], set(senders), gone)
        up[c]["unmask"] = sum(len(share) + 8 for share in revealed[c].values())
    total = unmask_sum(masked, revealed, gone, keys, threshold, bits, prg, len(clients))
    check_sum_range(total, len(senders), levels, list(zip(names, sizes, strict=True)))
    sums, offset = {}, 0
    for name, size in zip(names, sizes, strict=True):
        values = dequantize_sum(total[offset : offset + size], clips[name], levels, len(senders))
        like = client_tensors[clients[0]][name]
        sums[name] = torch.as_tensor(
            values, dtype=like.dtype, device=device or like.device
        ).reshape(layout[name])
        offset += size
    seconds["unmask"] = time.perf_counter() - start

    report = SecureSumReport(
        n_clients=len(clients),
        threshold=threshold,
        bits=bits,
        levels=levels,
        n_values=sum(sizes),
        senders=tuple(senders),
        dropped=tuple(sorted(gone)),
        unresponsive=tuple(sorted(unresponsive)),
        clip_range=clips,
        error_bound={name: error_bound(clips[name], levels, len(senders)) for name in names},
        bytes_up=up,
        bytes_down=down,
        seconds=seconds,
        server_view=masked,
        refused=refused,
    )
    return sums, report
