"""The node's side of secure-sum rounds on the Flower engine (the protocol's four steps on a
node; the server's side and the exchanges: :mod:`fednovelty.runtime.flower.secure`).

**What a node keeps** between the messages of a round, in its ``context.state`` (record
``fednovelty.secagg_state``, never sent): its private keys, its self-mask seed, the shares
it holds and the round's public keys, tagged with the round and the run's attempt (a
message of another round or attempt is refused); cleared once it revealed its shares.

**What the node decides, never the server** (:func:`secure_from_node_config`, the node's
``node_config``, set by whoever starts the SuperNode): the least threshold ``t`` it shares
its secrets with, ``secure-threshold`` (default 0.5: ``t >= floor(m / 2) + 1`` of the ``m``
nodes whose keys the server relayed to it, a majority), and the fewest nodes in a round,
``secure-min-senders`` (default 2; ``t`` is at least it too). The server states the
round's ``t`` in its relay of the keys (its run config's ``secure-threshold``); a node whose
floor is higher refuses with the named reason ``threshold-below-node-floor``, one told of
fewer nodes than its fewest with ``too-few-nodes`` (:class:`NodeRefusal`). With ``t`` below
a majority a server that tells nodes different sender lists can rebuild the masking key of
every node but one and the self-mask of that one, and unmask its input alone; with a
majority it cannot (each node reveals one share of each owner: ``t (m - 1)`` key shares
needed, at most ``m (m - t)`` revealed). What no node can stop: a server that invents nodes
(node authentication, :mod:`fednovelty.runtime.flower.credentials`, is what binds a key to a
node), or one whose sum holds fewer noisy replies than ``dp-clients`` (less noise than
calibrated; ``secure-min-senders = dp-clients`` refuses that too, giving up drop tolerance).

**A node in distributed-DP mode** (``dp-mode = "distributed"`` in its node config) adds
``1/m`` of the noise variance: it answers a ``train`` round only through a secure sum
(:func:`plain_round_refusal`: a skipped reply, reason ``plain-round-in-distributed-mode``).

**Randomness**: key pairs, self-mask seeds and the stochastic rounding come from the node's
operating system (``os.urandom``); nothing of the run config seeds them.

A node refuses (its ClientApp raises, the server drops it): its own public keys relayed
changed, a threshold or node count below its floor, a list of sharers not within the key
holders or without ``t`` of them, a missing or unreadable ciphertext (naming its sender),
and a reveal request naming fewer than ``t`` senders or a node both sender and dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.core.base import Message as FedMessage
from fednovelty.federated.core.wire import unpack
from fednovelty.federated.trust.noise import fresh_noise
from fednovelty.federated.trust.reply_form import is_skipped
from fednovelty.federated.trust.secure import (
    ClientState,
    mask_input,
    quantization_levels,
    receive_shares,
    reveal_shares,
    setup_keys,
    share_secrets,
)
from fednovelty.runtime.flower._compat import Context, Message, RecordDict, asymmetric
from fednovelty.runtime.flower.codec import (
    SECAGG,
    SECAGG_STATE,
    Field,
    decode_fields,
    encode_fields,
    fields_record,
    pack_ring,
    ring_width,
    unpack_ring,
)
from fednovelty.runtime.flower.config import algorithm_from_run_config, secure_from_run_config
from fednovelty.runtime.secure_rounds import (
    SecureSum,
    additive_release,
    check_secure_algorithm,
    encode,
    n_components_of,
    quantize_encoded,
    round_clips,
)

__all__ = [
    "ACTIONS",
    "NODE_KEYS",
    "NodeRefusal",
    "NodeSecure",
    "agreed_threshold",
    "bytes_field",
    "bytes_list",
    "check_secure_run",
    "handle_keys",
    "handle_reveal",
    "handle_shares",
    "int_list",
    "join_masked",
    "mask_reply",
    "node_floor",
    "plain_round_refusal",
    "secure_from_node_config",
    "split_masked",
]

#: the ClientApp's query actions of the protocol's steps 1, 2 and 4 (step 3 is ``train``).
KEYS_ACTION, SHARES_ACTION, REVEAL_ACTION = "secagg_keys", "secagg_shares", "secagg_reveal"
ACTIONS = (KEYS_ACTION, SHARES_ACTION, REVEAL_ACTION)
#: node_config keys of what protects the node in a secure sum -> the ``NodeSecure`` field.
NODE_KEYS = {"secure-threshold": "threshold", "secure-min-senders": "min_senders"}


class NodeRefusal(ValueError):
    """A node's refusal of what the server asks: ``reason`` is a short name
    (``threshold-below-node-floor``, ``too-few-nodes``), first in the message."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"refused ({reason}): {detail}")
        self.reason = reason


@dataclass(frozen=True)
class NodeSecure:
    """What a node requires of a secure sum (module docstring).

    Attributes:
        threshold: the node's least ``t`` as a share of the ``m`` nodes it was told of:
            ``t >= max(2, floor(threshold m) + 1)``; in (0, 1), default 0.5 (a majority).
        min_senders: the fewest nodes (and the least ``t``) it takes part with; >= 2.

    Raises:
        ValueError: a field out of range, naming its node-config key.
    """

    threshold: float = 0.5
    min_senders: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.threshold, bool) or not (
            isinstance(self.threshold, int | float) and 0 < self.threshold < 1
        ):
            raise ValueError(
                f"node config 'secure-threshold' must be in (0, 1); got {self.threshold!r}."
            )
        if (
            isinstance(self.min_senders, bool)
            or not isinstance(self.min_senders, int)
            or self.min_senders < 2
        ):
            raise ValueError(
                f"node config 'secure-min-senders' must be an integer >= 2; got "
                f"{self.min_senders!r}."
            )


def secure_from_node_config(node_config: Mapping[str, Any]) -> NodeSecure:
    """The node's own secure-sum floor from its ``node_config`` (:data:`NODE_KEYS`; a key
    not set keeps :class:`NodeSecure`'s default), e.g. ``--node-config "... secure-threshold
    =0.6 secure-min-senders=3"``.

    Raises:
        ValueError: a value that is not a number or out of range, naming the key.
    """
    fields: dict[str, Any] = {}
    for key, name in NODE_KEYS.items():
        if key not in node_config:
            continue
        value = node_config[key]
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"node config {key!r} must be a number; got {value!r}.") from None
        if name == "min_senders" and not number.is_integer():
            raise ValueError(f"node config {key!r} must be an integer; got {value!r}.")
        fields[name] = int(number) if name == "min_senders" else number
    return NodeSecure(**fields)


def node_floor(settings: NodeSecure, m: int) -> int:
    """The least ``t`` a node with ``settings`` shares its secrets with among ``m`` nodes:
    ``max(min_senders, max(2, floor(threshold m) + 1))``, which may exceed ``m``."""
    return max(settings.min_senders, 2, math.floor(settings.threshold * m) + 1)


def plain_round_refusal(dp: Any, content: RecordDict) -> str | None:
    """Why a node whose DP policy is ``dp`` refuses a ``train`` message of ``content``, or
    ``None``: in ``"distributed"`` mode every round must come through a secure sum (its
    reply alone carries ``z / sqrt(m)``, not the ``z`` its budget was charged for)."""
    if getattr(dp, "mode", None) != "distributed" or SECAGG in content.config_records:
        return None
    return (
        "refused (plain-round-in-distributed-mode): this node adds 1/m of the noise "
        '(dp-mode "distributed") and answers only rounds that come through a secure sum; '
        "run with secure-sum = true, or start the node with dp-mode local."
    )


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


# --------------------------------------------------------------------------- fields
def int_list(fields: Mapping[str, Field], name: str) -> list[int]:
    """Protocol field ``name``: a list of client ids (missing: empty)."""
    values = fields.get(name, [])  # empty lists are not sent (codec.encode_fields)
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    ):
        raise ValueError(f"protocol field {name!r} must be a list of client ids; got {values!r}.")
    return [int(v) for v in values]


def bytes_list(fields: Mapping[str, Field], name: str, length: int | None = None) -> list[bytes]:
    """Protocol field ``name``: a list of byte strings, of ``length`` where given."""
    values = fields.get(name, [])
    if not isinstance(values, list) or not all(isinstance(v, bytes) for v in values):
        raise ValueError(f"protocol field {name!r} must be a list of bytes.")
    if length is not None and len(values) != length:
        raise ValueError(f"protocol field {name!r} holds {len(values)} values; expected {length}.")
    return list(values)


def bytes_field(fields: Mapping[str, Field], name: str) -> bytes:
    """Protocol field ``name``: non-empty bytes."""
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
    # which rounds a secure sum carries does not depend on the rows' width: any width
    # resolves the "auto" settings for this check
    algorithm = algorithm_from_run_config(context.run_config, n_features=1)
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
                int_list(kept, "owners"),
                bytes_list(kept, "seed_shares"),
                bytes_list(kept, "key_shares"),
                strict=True,
            )
        },
    )
    secrets = ("client", "mask_key", "mask_public", "encryption_key", "encryption_public",
               "self_seed", "owners", "seed_shares", "key_shares")  # fmt: skip
    return node, {k: v for k, v in kept.items() if k not in secrets}


def _public_keys(kept: Mapping[str, Field]) -> dict[int, tuple[bytes, bytes]]:
    return _key_table(
        int_list(kept, "clients"),
        bytes_list(kept, "mask_publics"),
        bytes_list(kept, "encryption_publics"),
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


def agreed_threshold(client: int, asked: Field, m: int, settings: NodeSecure) -> int:
    """The ``t`` a node shares its secrets with: the server's ``asked`` for the ``m`` key
    holders it relayed, if it is an integer in [``node_floor(settings, m)``, ``m``].

    Raises:
        NodeRefusal: ``too-few-nodes`` (``m`` below the node's fewest senders) or
            ``threshold-below-node-floor``, naming the node's floor and its keys.
        ValueError: ``asked`` not an integer, or above ``m``.
    """
    floor = node_floor(settings, m)
    if m < settings.min_senders:
        raise NodeRefusal(
            "too-few-nodes",
            f"client {client}: the server relayed the keys of {m} nodes; this node takes part "
            f"with at least {settings.min_senders} (node config 'secure-min-senders').",
        )
    if isinstance(asked, bool) or not isinstance(asked, int):
        raise ValueError(f"client {client}: the server states no threshold t ({asked!r}).")
    if asked < floor:
        raise NodeRefusal(
            "threshold-below-node-floor",
            f"client {client}: the server asks t={asked} of m={m} nodes; this node shares "
            f"its secrets with at least t={floor} (node config 'secure-threshold' = "
            f"{settings.threshold:g}, 'secure-min-senders' = {settings.min_senders}): with "
            "fewer, a server that tells nodes different sender lists can unmask one node's "
            "input. Raise the run config's secure-threshold.",
        )
    if asked > m:
        raise ValueError(f"client {client}: the server asks t={asked} of only m={m} nodes.")
    return asked


def handle_shares(message: Message, context: Context) -> Message:
    """Step 2 on a node: check the relayed public keys and the server's threshold against
    the node's own floor (:func:`agreed_threshold`), split its self-mask seed and masking
    key into Shamir shares and reply them encrypted for their holders."""
    _settings(context)
    mine = secure_from_node_config(context.node_config)  # the node's floor, not the server's
    fields, header = decode_fields(message.content)
    node, kept = _load(context.state, header)
    clients = int_list(fields, "clients")
    masks = bytes_list(fields, "mask_publics", len(clients))
    encryptions = bytes_list(fields, "encryption_publics", len(clients))
    keys = _key_table(clients, masks, encryptions)
    if keys.get(node.client) != (node.mask_public, node.encryption_public):
        raise ValueError(
            f"client {node.client}: the relayed key list does not hold this node's own public "
            "keys unchanged; the relay is not trustworthy, the node takes no part."
        )
    if len(keys) < 2:
        raise ValueError(f"client {node.client}: a secure sum needs 2 nodes; got {len(keys)}.")
    threshold = agreed_threshold(node.client, fields.get("threshold"), len(keys), mine)
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
    (:mod:`fednovelty.federated.core.wire`): they are unpacked first, and the masked tensors go
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
    sharers = sorted(int_list(fields, "clients"))
    if not set(sharers) <= set(keys) or node.client not in sharers or len(sharers) < threshold:
        raise ValueError(
            f"client {node.client}: the round's sharers {sharers} must be among the key "
            f"holders {sorted(keys)}, include this node and number at least t={threshold}."
        )
    sources = int_list(fields, "sources")
    ciphertexts = bytes_list(fields, "ciphertexts", len(sources))
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
    vector = quantize_encoded(node.client, encoded, clips, levels, fresh_noise())
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
    sharers, threshold = set(int_list(kept, "sharers")), int(kept["threshold"])
    senders, dropped = set(int_list(fields, "senders")), set(int_list(fields, "dropped"))
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
