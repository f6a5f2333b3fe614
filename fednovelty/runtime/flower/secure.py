"""Secure-sum rounds on the Flower engine: SecAgg's four steps as Message-API exchanges.

A run whose run config sets ``secure-sum = true`` (with ``secure-max-rows``, the public bound
on a node's rows; :func:`~fednovelty.runtime.flower.config.secure_from_run_config`) sends
every round through the protocol of :mod:`fednovelty.federated.secure`, each step one
exchange between the ServerApp and the round's ClientApps:

1. **keys** (``query.secagg_keys``): each node makes its two key pairs
   (:func:`~fednovelty.federated.secure.setup_keys`), keeps the private halves in its
   Flower ``context.state`` and replies its public keys.
2. **shares** (``query.secagg_shares``): the server relays the public keys of every node
   that answered (``m`` of them); each node splits a fresh self-mask seed and its masking
   key into ``t``-of-``m`` Shamir shares, ``t = max(2, floor(threshold m) + 1)``
   (:func:`~fednovelty.federated.secure.share_secrets`), and replies them, each encrypted
   for its holder.
3. **masked input** (``train``): the round's broadcast, with the ciphertexts addressed to
   the node (relayed; the server cannot read them) and the list of nodes that shared. The
   node runs its client step and client gate as in a plain round, encodes the released
   reply (:func:`~fednovelty.runtime.secure_rounds.encode`), quantises it in the public
   clipping ranges (:func:`~fednovelty.runtime.secure_rounds.round_clips`,
   :func:`~fednovelty.runtime.secure_rounds.quantize_encoded`), masks it
   (:func:`~fednovelty.federated.secure.mask_input`) and replies the masked vector, one
   ``uint8`` tensor of packed ring values per encoded tensor
   (:func:`~fednovelty.runtime.flower.codec.pack_ring`).
4. **unmask** (``query.secagg_reveal``): told which nodes sent a masked vector and which
   dropped, each sender reveals its shares
   (:func:`~fednovelty.federated.secure.reveal_shares`); the server rebuilds the masks
   (:func:`~fednovelty.federated.secure.unmask_sum`), dequantises
   (:func:`~fednovelty.runtime.secure_rounds.dequantize_encoded`) and decodes
   (:func:`~fednovelty.runtime.secure_rounds.decode`) one combined reply, client id
   :data:`~fednovelty.runtime.secure_rounds.COMBINED_ID`.

The round loop (:func:`fednovelty.runtime.loop.run_rounds`) sees steps 1 to 3 as the
transport's exchange (:class:`SecureGridTransport`) and step 4 as its ``combine`` hook: the
server step runs on the one combined reply, as
:class:`~fednovelty.runtime.secure_rounds.SecureRounds` does in the in-process engine.

**What the server sees**: public keys, ciphertexts, masked vectors (uniform on the ring),
revealed shares (a sender's self-mask seed or a dropped node's masking key, never both for
one node) and the combined reply. Its gate (:class:`SecureValidator`) checks each masked
reply's form (the encoded tensors' names, order and shapes for the round's broadcast,
ring values below ``2**bits``) and the combined reply's form and finiteness, the checks the
in-process engine applies to each noisy reply.

**What a node keeps** between the messages of a round, in its ``context.state`` (record
``fednovelty.secagg_state``, never sent): its private keys, its self-mask seed, the shares
it holds and the round's public keys, tagged with the round and the run's attempt (a
message of another round or attempt is refused); cleared once it revealed its shares.
A node refuses (its ClientApp raises, the server drops it): its own public keys relayed
changed, fewer than 2 nodes, a list of sharers not within the key holders or without
``t`` of them, a missing ciphertext, and a reveal request naming fewer than ``t`` senders
(a server claiming fewer could unmask one node's input) or a node both sender and dropped.

**Dropouts.** A node that fails after sending its keys (its shares, its client step, its
masked vector) is left out of the sum: its pairwise masks are rebuilt from the shares of
its masking key. One that sends its masked vector and then no shares stays in the sum. At
most ``m - t`` may go: fewer than ``max(2, min-clients, t)`` nodes left at the shares or
masked-input step makes the round a failed round (asked again, as any round with too few
replies); fewer than ``t`` senders revealing raises a
:class:`~fednovelty.exceptions.FederationError` (the round's sum cannot be recovered).

**Refused**, as in the in-process engine: an algorithm without ``dp_mode``, with
``dp_mode="local"`` or with personal mixture weights
(:func:`~fednovelty.runtime.secure_rounds.check_secure_algorithm`, by the server before the
first round and by every node), and a round of a kind without an additive private form
(:func:`~fednovelty.runtime.secure_rounds.additive_release`, before anything is sent).

**Differences from the in-process engine**: drops are real, not drawn
(``SecureSum.dropped`` / ``unresponsive`` are not run-config keys); each node draws its
stochastic rounding from ``(secure-seed, round, attempt, client id)``, so the sums agree
with the in-process engine's to within the quantisation error, not bit for bit; the ring's
quantisation levels are set by the number of nodes that shared (step 2).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fednovelty.exceptions import FederationError
from fednovelty.federated.base import FederatedAlgorithm
from fednovelty.federated.base import Message as FedMessage
from fednovelty.federated.secure import (
    STEPS,
    ClientState,
    SecureSumReport,
    error_bound,
    mask_input,
    quantization_levels,
    receive_shares,
    reveal_shares,
    setup_keys,
    share_secrets,
    unmask_sum,
)
from fednovelty.federated.validation import (
    InvalidReplyError,
    ReplyValidator,
    check_reply,
    is_skipped,
)
from fednovelty.federated.wire import unpack
from fednovelty.runtime.flower._compat import missing_flwr
from fednovelty.runtime.flower.codec import (
    SECAGG,
    SECAGG_STATE,
    CodecError,
    Field,
    decode_fields,
    encode_fields,
    encode_message,
    fields_record,
    pack_ring,
    ring_width,
    unpack_ring,
    wire_nbytes,
)
from fednovelty.runtime.flower.config import algorithm_from_run_config, secure_from_run_config
from fednovelty.runtime.flower.server import FlowerDelivery, GridTransport, exchange
from fednovelty.runtime.flower.validation import Dropped, Received, receive_replies
from fednovelty.runtime.secure_rounds import (
    COMBINED_ID,
    SecureSum,
    additive_release,
    check_secure_algorithm,
    decode,
    dequantize_encoded,
    encode,
    n_components_of,
    quantize_encoded,
    round_clips,
    round_metrics,
    senders_threshold,
)

try:
    from flwr.app import Context, Message, MessageType, RecordDict
    from flwr.supercore.primitives import asymmetric
except ImportError as error:  # pragma: no cover - depends on the installation
    raise missing_flwr(error) from error

__all__ = [
    "ACTIONS",
    "SecureGridTransport",
    "SecureValidator",
    "check_masked",
    "check_secure_run",
    "handle_keys",
    "handle_reveal",
    "handle_shares",
    "mask_reply",
    "rounding_rng",
]

logger = logging.getLogger("flwr").getChild("fednovelty")

#: the ClientApp's query actions of the protocol's steps 1, 2 and 4 (step 3 is ``train``).
KEYS_ACTION, SHARES_ACTION, REVEAL_ACTION = "secagg_keys", "secagg_shares", "secagg_reveal"
ACTIONS = (KEYS_ACTION, SHARES_ACTION, REVEAL_ACTION)


def _message_type(action: str) -> str:
    return f"{MessageType.QUERY}.{action}"


def check_secure_run(algorithm: FederatedAlgorithm, settings: SecureSum) -> None:
    """Refuse a Flower run whose rounds a secure sum cannot carry: the refusals of
    :func:`~fednovelty.runtime.secure_rounds.check_secure_algorithm`, and settings without
    ``max_rows`` (a deployment must agree on the public bound beforehand).

    Raises:
        ValueError: naming the reason and what to do.
    """
    check_secure_algorithm(algorithm)
    if settings.max_rows is None:
        raise ValueError(
            "secure sums on Flower need SecureSum.max_rows (run_config 'secure-max-rows'): "
            "the public bound on a node's rows, agreed before the first round."
        )


def rounding_rng(seed: int | None, round: int, attempt: int, client: int) -> np.random.Generator:
    """A node's stochastic-rounding stream for one round: seeded by ``(seed, round,
    attempt, client)``, fresh entropy when ``seed`` is ``None``."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, round, attempt, client]))


# --------------------------------------------------------------------------- fields
def _ints(fields: Mapping[str, Field], name: str) -> list[int]:
    values = fields.get(name, [])  # empty lists are not sent (codec.encode_fields)
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise ValueError(f"protocol field {name!r} must be a list of client ids; got {values!r}.")
    return [int(v) for v in values]


def _blobs(fields: Mapping[str, Field], name: str, length: int | None = None) -> list[bytes]:
    values = fields.get(name, [])
    if not isinstance(values, list) or not all(isinstance(v, bytes) for v in values):
        raise ValueError(f"protocol field {name!r} must be a list of bytes.")
    if length is not None and len(values) != length:
        raise ValueError(f"protocol field {name!r} holds {len(values)} values; expected {length}.")
    return list(values)


def _blob(fields: Mapping[str, Field], name: str) -> bytes:
    value = fields.get(name)
    if not isinstance(value, bytes) or not value:
        raise ValueError(f"protocol field {name!r} must be non-empty bytes.")
    return value


def _key_table(clients: list[int], masks: list[bytes], encryptions: list[bytes]) -> dict:
    """client -> (masking public key PEM, encryption public key PEM), ids unique."""
    if len(set(clients)) != len(clients):
        raise ValueError(f"the relayed key list names a client twice: {clients}.")
    return dict(zip(clients, zip(masks, encryptions, strict=True), strict=True))


# --------------------------------------------------------------------------- node side
def _settings(context: Context) -> tuple[FederatedAlgorithm, SecureSum]:
    """The run's algorithm and secure-sum settings, refused as the server refuses them."""
    settings = secure_from_run_config(context.run_config)
    if settings is None:
        raise ValueError(
            "the server sent a secure-sum protocol message, but this run's config has no "
            "'secure-sum = true'; the node takes no part."
        )
    algorithm = algorithm_from_run_config(context.run_config)
    check_secure_run(algorithm, settings)
    return algorithm, settings


def _save(state: RecordDict, node: ClientState, public: Mapping[str, Field]) -> None:
    """Keep ``node``'s secrets and the round's ``public`` fields in ``context.state``."""
    owners = sorted(node.held_shares)
    state[SECAGG_STATE] = fields_record(
        {
            "client": node.client,
            "mask_key": asymmetric.private_key_to_bytes(node.mask_key),
            "mask_public": node.mask_public,
            "encryption_key": asymmetric.private_key_to_bytes(node.encryption_key),
            "encryption_public": node.encryption_public,
            "self_seed": node.self_seed,
            "owners": owners,
            "seed_shares": [node.held_shares[o][0] for o in owners],
            "key_shares": [node.held_shares[o][1] for o in owners],
            **public,
        }
    )


def _load(state: RecordDict, header: Mapping[str, Any]) -> tuple[ClientState, dict[str, Field]]:
    """``(the node's ClientState, the round's public fields)`` kept by :func:`_save`.

    Raises:
        ValueError: nothing kept, or kept for another round or attempt of the run.
    """
    round_, attempt = int(header.get("round", -1)), int(header.get("attempt", 0))
    if SECAGG_STATE not in state.config_records:
        raise ValueError(
            f"this node holds no secure-sum keys for round {round_}: the protocol's steps "
            "must come in order (keys, shares, masked input, unmask)."
        )
    kept = dict(state.config_records[SECAGG_STATE])
    if (kept["round"], kept["attempt"]) != (round_, attempt):
        raise ValueError(
            f"this node's secure-sum keys are of round {kept['round']} (attempt "
            f"{kept['attempt']}), not round {round_} (attempt {attempt}); it takes no part."
        )
    node = ClientState(
        int(kept["client"]),
        asymmetric.bytes_to_private_key(kept["mask_key"]),
        kept["mask_public"],
        asymmetric.bytes_to_private_key(kept["encryption_key"]),
        kept["encryption_public"],
        self_seed=kept["self_seed"],
        held_shares={
            owner: (seed, key)
            for owner, seed, key in zip(
                _ints(kept, "owners"),
                _blobs(kept, "seed_shares"),
                _blobs(kept, "key_shares"),
                strict=True,
            )
        },
    )
    secrets = ("client", "mask_key", "mask_public", "encryption_key", "encryption_public",
               "self_seed", "owners", "seed_shares", "key_shares")  # fmt: skip
    return node, {k: v for k, v in kept.items() if k not in secrets}


def _public_keys(kept: Mapping[str, Field]) -> dict[int, tuple[bytes, bytes]]:
    return _key_table(
        _ints(kept, "clients"), _blobs(kept, "mask_publics"), _blobs(kept, "encryption_publics")
    )


def handle_keys(message: Message, context: Context, client_id: int) -> Message:
    """Step 1 on a node: fresh key pairs, kept in ``context.state``; reply the public keys."""
    _settings(context)
    _, header = decode_fields(message.content)
    (node,) = setup_keys([int(client_id)]).values()
    tag = {"round": int(header["round"]), "attempt": int(header.get("attempt", 0))}
    _save(context.state, node, tag)
    reply = encode_fields(
        {"mask_public": node.mask_public, "encryption_public": node.encryption_public},
        client_id=node.client,
    )
    return Message(reply, reply_to=message)


def handle_shares(message: Message, context: Context) -> Message:
    """Step 2 on a node: check the relayed public keys, split its self-mask seed and
    masking key into Shamir shares and reply them encrypted for their holders."""
    _, settings = _settings(context)
    fields, header = decode_fields(message.content)
    node, kept = _load(context.state, header)
    clients = _ints(fields, "clients")
    masks = _blobs(fields, "mask_publics", len(clients))
    encryptions = _blobs(fields, "encryption_publics", len(clients))
    keys = _key_table(clients, masks, encryptions)
    if keys.get(node.client) != (node.mask_public, node.encryption_public):
        raise ValueError(
            f"client {node.client}: the relayed key list does not hold this node's own public "
            "keys unchanged; the relay is not trustworthy, the node takes no part."
        )
    if len(keys) < 2:
        raise ValueError(f"client {node.client}: a secure sum needs 2 nodes; got {len(keys)}.")
    threshold = senders_threshold(settings.threshold, len(keys))
    ciphertexts = share_secrets(node, keys, threshold)
    public = {"clients": clients, "mask_publics": masks, "encryption_publics": encryptions}
    _save(context.state, node, {**kept, **public, "threshold": threshold})
    holders = sorted(ciphertexts)
    reply = encode_fields(
        {"holders": holders, "ciphertexts": [ciphertexts[h] for h in holders]},
        client_id=node.client,
    )
    return Message(reply, reply_to=message)


def mask_reply(
    algorithm: FederatedAlgorithm,
    request: FedMessage,
    reply: FedMessage,
    content: RecordDict,
    context: Context,
) -> FedMessage:
    """Step 3 on a node: the released ``reply`` to ``request`` as its masked vector.

    Reads the round's sharers and the ciphertexts relayed to this node (``content``'s
    ``fednovelty.secagg`` record), keeps the decrypted shares, then encodes, quantises and
    masks the reply. A ``skipped`` reply goes back as it is (the node is then dropped from
    the sum, like a node that failed). ``request`` and ``reply`` may be packed
    (:mod:`fednovelty.federated.wire`): they are unpacked first, and the masked tensors go
    back as they are.

    Returns:
        a message of ``request.kind`` with one ``uint8`` tensor (encoded shape + (width,))
        per encoded tensor, in :func:`~fednovelty.runtime.secure_rounds.encode`'s order.

    Raises:
        ValueError: a protocol check failed, or a value outside its public range.
    """
    _, settings = _settings(context)
    fields, header = decode_fields(content)
    node, kept = _load(context.state, header)
    keys, threshold = _public_keys(kept), int(kept["threshold"])
    sharers = sorted(_ints(fields, "clients"))
    if not set(sharers) <= set(keys) or node.client not in sharers or len(sharers) < threshold:
        raise ValueError(
            f"client {node.client}: the round's sharers {sharers} must be among the key "
            f"holders {sorted(keys)}, include this node and number at least t={threshold}."
        )
    sources = _ints(fields, "sources")
    ciphertexts = _blobs(fields, "ciphertexts", len(sources))
    if sorted(sources) != [c for c in sharers if c != node.client]:
        raise ValueError(
            f"client {node.client}: shares relayed from {sorted(sources)}; expected one from "
            f"every other sharer {[c for c in sharers if c != node.client]}."
        )
    receive_shares(node, dict(zip(sources, ciphertexts, strict=True)), keys)
    _save(context.state, node, {**kept, "sharers": sharers})
    if is_skipped(reply):
        return reply
    dtype = getattr(algorithm.config, "dtype", None)  # the masked form is its own wire form
    request, reply = unpack(request, dtype), unpack(reply, dtype)
    release = additive_release(algorithm, request.kind)
    covariance_type = getattr(algorithm.config, "covariance_type", None)
    encoded = encode(release, reply.tensors, request, covariance_type)
    clips = round_clips(
        algorithm,
        release,
        n_components_of(release, encoded),
        max_rows=settings.max_rows,
        noise_margin=settings.noise_margin,
    )
    levels = quantization_levels(settings.bits, len(sharers))
    rng = rounding_rng(settings.seed, int(header["round"]), int(header["attempt"]), node.client)
    vector = quantize_encoded(node.client, encoded, clips, levels, rng)
    masked = mask_input(node, vector, {c: keys[c] for c in sharers}, settings.bits, settings.prg)
    return FedMessage(request.kind, split_masked(masked, encoded, settings.bits))


def split_masked(masked: np.ndarray, encoded: Mapping[str, torch.Tensor], bits: int) -> dict:
    """A masked vector (n_values,) uint64 cut into one packed tensor per encoded tensor:
    name -> (*shape, ceil(bits / 8)) uint8, in ``encoded``'s order."""
    packed, out, offset = pack_ring(masked, bits), {}, 0
    for name, tensor in encoded.items():
        size = tensor.numel()
        piece = packed[offset : offset + size].reshape(*tensor.shape, packed.shape[1])
        out[name] = torch.from_numpy(np.ascontiguousarray(piece))
        offset += size
    return out


def join_masked(tensors: Mapping[str, torch.Tensor], bits: int) -> np.ndarray:
    """Inverse of :func:`split_masked`: the packed tensors, in order, as one vector
    (n_values,) uint64."""
    width = ring_width(bits)
    rows = [t.detach().cpu().numpy().reshape(-1, width) for t in tensors.values()]
    return unpack_ring(np.concatenate(rows) if rows else np.zeros((0, width), np.uint8), bits)


def handle_reveal(message: Message, context: Context) -> Message:
    """Step 4 on a node: reveal the shares of the senders' self-mask seeds and of the
    dropped nodes' masking keys; forget the round's secrets."""
    _settings(context)
    fields, header = decode_fields(message.content)
    node, kept = _load(context.state, header)
    if "sharers" not in kept:
        raise ValueError(f"client {node.client}: no masked input was made this round.")
    sharers, threshold = set(_ints(kept, "sharers")), int(kept["threshold"])
    senders, dropped = set(_ints(fields, "senders")), set(_ints(fields, "dropped"))
    if not (senders | dropped) <= sharers or node.client not in senders:
        raise ValueError(
            f"client {node.client}: senders {sorted(senders)} and dropped {sorted(dropped)} "
            f"must be sharers of the round ({sorted(sharers)}), this node a sender."
        )
    if len(senders) < threshold:
        raise ValueError(
            f"client {node.client}: the server names {len(senders)} senders, fewer than "
            f"t={threshold}; revealing would let it unmask a sum of fewer inputs than agreed."
        )
    revealed = reveal_shares(node, senders, dropped)
    del context.state[SECAGG_STATE]
    owners = sorted(revealed)
    reply = encode_fields(
        {"owners": owners, "shares": [revealed[o] for o in owners]}, client_id=node.client
    )
    return Message(reply, reply_to=message)


# --------------------------------------------------------------------------- server gate
def check_masked(
    reply: FedMessage,
    broadcast: FedMessage,
    n_features: int,
    release: str,
    bits: int,
    *,
    spec: Any = None,
    covariance_type: str | None = None,
) -> None:
    """Raise unless ``reply`` is a masked reply to ``broadcast``: one ``uint8`` tensor of
    shape (*encoded shape, ceil(bits / 8)) per tensor of the encoded form of a well-formed
    ``release`` reply (its names, order and shapes, :func:`~fednovelty.federated.validation.
    check_reply` of the form), every ring value below ``2**bits``.

    Raises:
        InvalidReplyError: naming what is wrong.
    """
    if reply.kind != broadcast.kind:
        raise InvalidReplyError(f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round.")
    width = ring_width(bits)
    zeros = {}
    for name, tensor in reply.tensors.items():
        if tensor.dtype != torch.uint8 or tensor.ndim < 1 or tensor.shape[-1] != width:
            raise InvalidReplyError(
                f"masked tensor {name!r} must be uint8 of shape (..., {width}); got "
                f"{tuple(tensor.shape)} {tensor.dtype}."
            )
        try:
            unpack_ring(tensor.numpy().reshape(-1, width), bits)
        except ValueError as error:
            raise InvalidReplyError(f"masked tensor {name!r}: {error}") from None
        zeros[name] = torch.zeros(tuple(tensor.shape[:-1]), dtype=torch.float64)
    try:
        plain = decode(release, zeros, broadcast, covariance_type)
        form = encode(release, plain, broadcast, covariance_type)
    except (KeyError, IndexError, RuntimeError, ValueError) as error:
        raise InvalidReplyError(
            f"the masked tensors {list(zeros)} are not the encoded form of a {release!r} "
            f"reply: {error}"
        ) from None
    layout = [(name, tuple(tensor.shape)) for name, tensor in zeros.items()]
    expected = [(name, tuple(tensor.shape)) for name, tensor in form.items()]
    if layout != expected:
        raise InvalidReplyError(
            f"masked tensors {layout}; the encoded form of a {release!r} reply is {expected}."
        )
    check_reply(FedMessage(broadcast.kind, plain), broadcast, n_features, spec, noisy=True)


@dataclass
class SecureValidator(ReplyValidator):
    """The server gate of a secure run: a non-skipped reply to a round with an additive
    private form is a masked reply, checked by :func:`check_masked` (and records nothing:
    the server cannot read one node's row count); anything else as
    :class:`~fednovelty.federated.validation.ReplyValidator`.

    Attributes:
        algorithm: the run's algorithm (its reply declarations and covariance type).
        bits: the ring's width.
    """

    algorithm: Any = None
    bits: int = 48

    def _release(self, kind: str) -> str | None:
        try:
            return additive_release(self.algorithm, kind)
        except ValueError:
            return None

    def check(self, client_id: int, reply: FedMessage, broadcast: FedMessage) -> None:
        release = self._release(broadcast.kind)
        if release is None or is_skipped(reply):
            super().check(client_id, reply, broadcast)
            return
        check_masked(
            reply,
            broadcast,
            self.n_features,
            release,
            self.bits,
            spec=self.spec(broadcast.kind),
            covariance_type=getattr(self.algorithm.config, "covariance_type", None),
        )

    def _record(self, client_id: int, reply: FedMessage, broadcast=None) -> None:
        if self._release(reply.kind) is None or is_skipped(reply):
            super()._record(client_id, reply, broadcast)


# --------------------------------------------------------------------------- server side
@dataclass
class SecureRound:
    """One round's public protocol state on the server, from the exchange to the combine.

    ``nodes``: client id -> node id of the key holders; ``public_keys``: their public keys;
    ``sharers``: those that replied their shares, increasing; ``bytes_up`` /
    ``bytes_down``: client -> protocol step -> wire bytes of its messages;
    ``seconds``: step -> wall time of the exchange; ``wire_up`` / ``wire_down``: bytes of
    every Flower message of the round (the broadcast included)."""

    number: int
    message: FedMessage
    release: str
    nodes: dict[int, int] = field(default_factory=dict)
    public_keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    threshold: int = 2
    sharers: list[int] = field(default_factory=list)
    bytes_up: dict[int, dict[str, int]] = field(default_factory=dict)
    bytes_down: dict[int, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEPS, 0.0))
    wire_up: int = 0
    wire_down: int = 0

    def count(self, client: int, step: str, up: int = 0, down: int = 0) -> None:
        for table, size in ((self.bytes_up, up), (self.bytes_down, down)):
            table.setdefault(client, dict.fromkeys(STEPS, 0))[step] += size


class SecureGridTransport(GridTransport):
    """A :class:`~fednovelty.runtime.flower.server.GridTransport` whose rounds run the
    protocol (module docstring): :meth:`exchange` runs steps 1 to 3 and returns the masked
    replies, :meth:`combine` (the round loop's ``combine``) runs step 4 and returns the one
    combined reply with the round's secure-sum metrics
    (:func:`~fednovelty.runtime.secure_rounds.round_metrics`, where ``secure_seconds`` is
    the server's wall time of the four exchanges, the nodes' work and Flower's delivery
    included; ``secure_seconds_<step>`` for each of
    :data:`~fednovelty.federated.secure.STEPS`; ``secure_wire_bytes_up`` /
    ``secure_wire_bytes_down``: every Flower message of the round, the broadcast included).

    Args:
        grid, client_of, engine, rng: as :class:`GridTransport`.
        algorithm: the run's algorithm (checked by :func:`check_secure_run`).
        settings: the run's :class:`~fednovelty.runtime.secure_rounds.SecureSum`.
        validator: the run's :class:`SecureValidator` (the combined reply's form check).
    """

    def __init__(
        self,
        grid,
        client_of: dict[int, int | None],
        engine,
        rng: np.random.Generator,
        *,
        algorithm: FederatedAlgorithm,
        settings: SecureSum,
        validator: SecureValidator,
    ) -> None:
        super().__init__(grid, client_of, engine, rng)
        check_secure_run(algorithm, settings)
        self.algorithm, self.settings, self.validator = algorithm, settings, validator
        self.round: SecureRound | None = None

    # ---------------------------------------------------------------- one exchange
    def _step(
        self,
        current: SecureRound,
        step: str,
        message_type: str,
        contents: Mapping[int, RecordDict],
        expected: Mapping[int, int | None],
    ) -> tuple[dict[int, tuple[int, dict[str, Field]]], list[Dropped]]:
        """Send ``contents`` (node -> record), decode the protocol replies and bind each to
        the client its node is (``expected``; ``None``: the id its reply names, unless
        another node holds it). Returns ``(client -> (node, fields), drops)``."""
        start = time.perf_counter()
        replies = exchange(
            self.grid,
            contents,
            message_type,
            group_id=str(current.number),
            timeout=self.engine.round_timeout,
        )
        bound = {c: n for n, c in self.client_of.items() if c is not None}
        accepted: dict[int, tuple[int, dict[str, Field]]] = {}
        drops: list[Dropped] = []
        answered: set[int] = set()
        why = f"secure sum ({step})"
        for reply in replies:
            node = int(reply.metadata.src_node_id)
            if node not in contents:
                drops.append(Dropped(None, node, f"{why}: reply from a node that was not asked"))
                continue
            answered.add(node)
            client = expected[node]
            current.wire_up += wire_nbytes(reply.content) if reply.has_content() else 0
            if reply.has_error():
                error = reply.error
                drops.append(
                    Dropped(client, node, f"{why}: node error {error.code}: {error.reason}")
                )
                continue
            try:
                fields, header = decode_fields(reply.content)
                named = int(header["client_id"])
            except (CodecError, KeyError, TypeError, ValueError) as error:
                drops.append(Dropped(client, node, f"{why}: malformed reply: {error}"))
                continue
            holder = bound.get(named, accepted.get(named, (None,))[0])
            if client is not None and named != client:
                drops.append(Dropped(client, node, f"{why}: reply names client {named}"))
            elif holder is not None and holder != node:
                drops.append(Dropped(client, node, f"{why}: client {named} is node {holder}'s"))
            else:
                accepted[named] = (node, fields)
                current.count(named, step, up=wire_nbytes(reply.content))
        for node, content in contents.items():
            current.wire_down += wire_nbytes(content)
            if node not in answered:
                drops.append(Dropped(expected[node], node, f"{why}: no reply within the timeout"))
        for client, (node, _) in accepted.items():
            current.count(client, step, down=wire_nbytes(contents[node]))
        current.seconds[step] += time.perf_counter() - start
        return accepted, drops

    def _failed(
        self, current: SecureRound, asked: dict[int, int | None], drops: list[Dropped], why: str
    ) -> FlowerDelivery:
        """A round the protocol cannot finish: no replies (the loop records it as failed
        and asks again), the drops listed."""
        logger.warning("round %d: secure sum stopped: %s", current.number, why)
        self.round = None
        self._n_asked = len(asked)
        return FlowerDelivery(
            {},
            asked=tuple(sorted(c for c in asked.values() if c is not None)),
            n_asked=0,
            bytes_up=0,
            metrics={"wire_bytes_down": current.wire_down, "wire_bytes_up": current.wire_up},
            nodes=asked,
            received=Received(refused=drops),
        )

    def exchange(self, number: int, message: FedMessage) -> FlowerDelivery:
        """Steps 1 to 3 of the round (module docstring); the masked replies."""
        current = SecureRound(number, message, additive_release(self.algorithm, message.kind))
        asked = self.ask()
        header = {"round": number, "attempt": self.attempt}
        need = max(2, self.engine.min_clients)
        # 1. keys
        request = encode_fields({}, **header)
        keys, drops = self._step(
            current, "setup", _message_type(KEYS_ACTION), dict.fromkeys(asked, request), asked
        )
        for client, (node, fields) in sorted(keys.items()):
            try:
                pair = (_blob(fields, "mask_public"), _blob(fields, "encryption_public"))
                for pem in pair:
                    asymmetric.bytes_to_public_key(pem)
            except ValueError as error:
                drops.append(Dropped(client, node, f"secure sum (setup): {error}"))
                continue
            current.nodes[client], current.public_keys[client] = node, pair
        if len(current.nodes) < need:
            return self._failed(
                current, asked, drops, f"{len(current.nodes)} sent keys; {need} needed"
            )
        current.threshold = senders_threshold(self.settings.threshold, len(current.nodes))
        # 2. shares
        clients = sorted(current.nodes)
        relay = encode_fields(
            {
                "clients": clients,
                "mask_publics": [current.public_keys[c][0] for c in clients],
                "encryption_publics": [current.public_keys[c][1] for c in clients],
            },
            **header,
        )
        holders = {current.nodes[c]: c for c in clients}
        replies, lost = self._step(
            current,
            "share_keys",
            _message_type(SHARES_ACTION),
            dict.fromkeys(holders, relay),
            holders,
        )
        drops += lost
        shares: dict[int, dict[int, bytes]] = {}
        for client, (node, fields) in sorted(replies.items()):
            try:
                targets = _ints(fields, "holders")
                ciphertexts = _blobs(fields, "ciphertexts", len(targets))
                if targets != [c for c in clients if c != client]:
                    raise ValueError(f"shares for {targets}; expected every other key holder")
            except ValueError as error:
                drops.append(Dropped(client, node, f"secure sum (share_keys): {error}"))
                continue
            shares[client] = dict(zip(targets, ciphertexts, strict=True))
        current.sharers = sorted(shares)
        if len(current.sharers) < max(need, current.threshold):
            return self._failed(
                current,
                asked,
                drops,
                f"{len(current.sharers)} shared; {max(need, current.threshold)} needed",
            )
        # 3. masked input: the broadcast and the shares relayed to each sharer
        contents = {}
        for holder in current.sharers:
            sources = [c for c in current.sharers if c != holder]
            secagg = fields_record(
                {
                    "clients": current.sharers,
                    "sources": sources,
                    "ciphertexts": [shares[c][holder] for c in sources],
                }
            )
            content = encode_message(message, round=number, attempt=self.attempt)
            content[SECAGG] = secagg
            contents[current.nodes[holder]] = content
            current.count(holder, "mask", down=secagg.count_bytes())
        start = time.perf_counter()
        replies = exchange(
            self.grid,
            contents,
            MessageType.TRAIN,
            group_id=str(number),
            timeout=self.engine.round_timeout,
        )
        current.seconds["mask"] += time.perf_counter() - start
        sent = {current.nodes[c]: c for c in current.sharers}
        bound = {c: n for n, c in self.client_of.items() if c is not None}
        received = receive_replies(replies, sent, bound)
        received.refused[:0] = drops
        up = sum(wire_nbytes(r.content) for r in replies if r.has_content())
        down = sum(wire_nbytes(c) for c in contents.values())
        current.wire_up, current.wire_down = current.wire_up + up, current.wire_down + down
        for reply in replies:
            client = sent.get(int(reply.metadata.src_node_id))
            if client is not None and reply.has_content():
                current.count(client, "mask", up=wire_nbytes(reply.content))
        masked = [c for c, r in received.replies.items() if not is_skipped(r)]
        if len(masked) < max(need, current.threshold):
            return self._failed(
                current,
                asked,
                [*received.refused, *received.missing],
                f"{len(masked)} sent a masked input; {max(need, current.threshold)} needed",
            )
        self.round = current
        self._n_asked = len(asked)
        return FlowerDelivery(
            received.replies,
            asked=tuple(sorted(c for c in asked.values() if c is not None)),
            n_asked=len(contents),
            bytes_up=received.bytes_up,
            widths=received.widths,
            metrics={"wire_bytes_down": down, "wire_bytes_up": up},
            nodes=asked,
            received=received,
        )

    # ---------------------------------------------------------------- step 4
    def combine(
        self, message: FedMessage, valid: Mapping[int, FedMessage]
    ) -> tuple[dict[int, FedMessage], dict[str, Any]]:
        """Step 4: the senders reveal their shares, the server unmasks, dequantises and
        decodes the sum. Returns ``({COMBINED_ID: combined reply}, metrics)``.

        Raises:
            FederationError: fewer than ``t`` valid masked replies, or fewer than ``t``
                senders revealed their shares (the sum cannot be recovered), or a combined
                reply of the wrong form.
        """
        current, settings = self.round, self.settings
        # the exchange carried the broadcast packed; the loop hands over the round's own
        if current is None or current.message.kind != message.kind:
            raise RuntimeError("combine() must follow this round's exchange().")
        self.round = None
        senders = sorted(c for c, r in valid.items() if c in current.sharers and not is_skipped(r))
        dropped = sorted(set(current.sharers) - set(senders))
        if len(senders) < current.threshold:
            raise FederationError(
                f"round {current.number}: {len(senders)} valid masked inputs, fewer than "
                f"t={current.threshold}; the secure sum cannot be unmasked."
            )
        request = encode_fields(
            {"senders": senders, "dropped": dropped}, round=current.number, attempt=self.attempt
        )
        nodes = {current.nodes[c]: c for c in senders}
        answers, lost = self._step(
            current, "unmask", _message_type(REVEAL_ACTION), dict.fromkeys(nodes, request), nodes
        )
        revealed: dict[int, dict[int, bytes]] = {}
        for client, (node, fields) in sorted(answers.items()):
            try:
                owners = _ints(fields, "owners")
                values = _blobs(fields, "shares", len(owners))
                if owners != sorted(senders + dropped):
                    raise ValueError(f"shares of {owners}; expected {sorted(senders + dropped)}")
            except ValueError as error:
                lost.append(Dropped(client, node, f"secure sum (unmask): {error}"))
                continue
            revealed[client] = dict(zip(owners, values, strict=True))
        for drop in lost:
            logger.warning("round %d: client %s (node %d): %s", current.number, *_fields(drop))
            self.dropped.append({"round": current.number, **_as_dict(drop)})
        start = time.perf_counter()
        first = valid[senders[0]].tensors
        layout = {name: tuple(t.shape[:-1]) for name, t in first.items()}
        masked = {c: join_masked(valid[c].tensors, settings.bits) for c in senders}
        keys = {c: current.public_keys[c] for c in current.sharers}
        try:
            total = unmask_sum(
                masked, revealed, set(dropped), keys, current.threshold, settings.bits, settings.prg
            )
        except ValueError as error:
            raise FederationError(f"round {current.number}: {error}") from None
        levels = quantization_levels(settings.bits, len(current.sharers))
        clips = round_clips(
            self.algorithm,
            current.release,
            n_components_of(current.release, first),
            max_rows=settings.max_rows,
            noise_margin=settings.noise_margin,
        )
        dtype = getattr(self.algorithm, "dtype", torch.float64)
        sums = dequantize_encoded(total, layout, clips, levels, len(senders), dtype=dtype)
        covariance_type = getattr(self.algorithm.config, "covariance_type", None)
        combined = FedMessage(message.kind, decode(current.release, sums, message, covariance_type))
        current.seconds["unmask"] += time.perf_counter() - start
        try:
            check_reply(
                combined,
                message,
                self.validator.n_features,
                self.validator.spec(message.kind),
                noisy=True,
            )
        except InvalidReplyError as error:
            raise FederationError(
                f"round {current.number}: the combined reply is malformed: {error}"
            ) from None
        report = SecureSumReport(
            n_clients=len(current.sharers),
            threshold=current.threshold,
            bits=settings.bits,
            levels=levels,
            n_values=int(total.shape[0]),
            senders=tuple(senders),
            dropped=tuple(dropped),
            unresponsive=tuple(sorted(set(senders) - set(revealed))),
            clip_range=clips,
            error_bound={n: error_bound(clips[n], levels, len(senders)) for n in layout},
            bytes_up=current.bytes_up,
            bytes_down=current.bytes_down,
            seconds=current.seconds,
            server_view=masked,
        )
        metrics = {
            **round_metrics(report),
            **{f"secure_seconds_{step}": current.seconds[step] for step in STEPS},
            "secure_wire_bytes_up": current.wire_up,
            "secure_wire_bytes_down": current.wire_down,
        }
        return {COMBINED_ID: combined}, metrics


def _fields(dropped: Dropped) -> tuple:
    return dropped.client_id, dropped.node_id, dropped.reason


def _as_dict(dropped: Dropped) -> dict:
    return {"client_id": dropped.client_id, "node_id": dropped.node_id, "reason": dropped.reason}
