"""Secure-sum rounds on the Flower engine: SecAgg's four steps as Message-API exchanges (the
server's side here; each node's: :mod:`fednovelty.runtime.flower.secure_node`).

A run whose run config sets ``secure-sum = true`` (with ``secure-max-rows``, the public bound
on a node's rows; :func:`~fednovelty.runtime.flower.config.secure_from_run_config`) sends
every round through the protocol of :mod:`fednovelty.federated.trust.secure`, each step one
exchange between the ServerApp and the round's ClientApps:

1. **keys** (``query.secagg_keys``): each node makes its two key pairs
   (:func:`~fednovelty.federated.trust.secure.setup_keys`), keeps the private halves in its
   Flower ``context.state`` and replies its public keys.
2. **shares** (``query.secagg_shares``): the server relays the public keys of every node
   that answered (``m`` of them) and the threshold it asks, ``t = max(2, floor(threshold
   m) + 1)`` of its run config's ``secure-threshold``; each node checks ``t`` against its
   own floor (its node config: a lower one is refused,
   :func:`~fednovelty.runtime.flower.secure_node.agreed_threshold`), splits a fresh
   self-mask seed and its masking key into ``t``-of-``m`` Shamir shares
   (:func:`~fednovelty.federated.trust.secure.share_secrets`), and replies them, each encrypted
   for its holder.
3. **masked input** (``train``): the round's broadcast, with the ciphertexts addressed to
   the node (relayed; the server cannot read them) and the list of nodes that shared. The
   node runs its client step and client gate as in a plain round, encodes the released
   reply (:func:`~fednovelty.runtime.secure_rounds.encode`), quantises it in the public
   clipping ranges (:func:`~fednovelty.runtime.secure_rounds.round_clips`,
   :func:`~fednovelty.runtime.secure_rounds.quantize_encoded`, rounding from the node's
   ``os.urandom``), masks it (:func:`~fednovelty.federated.trust.secure.mask_input`) and replies
   the masked vector, one ``uint8`` tensor of packed ring values per encoded tensor
   (:func:`~fednovelty.runtime.flower.codec.pack_ring`).
4. **unmask** (``query.secagg_reveal``): told which nodes sent a masked vector and which
   dropped, each sender reveals its shares
   (:func:`~fednovelty.federated.trust.secure.reveal_shares`); the server rebuilds the masks
   (:func:`~fednovelty.federated.trust.secure.unmask_sum`), refuses a sum outside what the public
   ranges allow (:class:`~fednovelty.federated.trust.secure.ImplausibleSumError`), dequantises
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

**Dropouts.** A node that fails after sending its keys (its shares, its client step, its
masked vector) is left out of the sum: its pairwise masks are rebuilt from the shares of
its masking key. One that sends its masked vector and then no shares stays in the sum. At
most ``m - t`` may go: fewer than ``max(2, min-clients, t)`` nodes left at the shares or
masked-input step makes the round a failed round (asked again, as any round with too few
replies; a node's refusal, e.g. of a threshold below its floor, counts as a drop with its
reason); fewer than ``t`` senders revealing raises a
:class:`~fednovelty.exceptions.FederationError` (the round's sum cannot be recovered).

**Refused**, as in the in-process engine: an algorithm without ``dp_mode``, with
``dp_mode="local"`` or with personal mixture weights
(:func:`~fednovelty.runtime.secure_rounds.check_secure_algorithm`, by the server before the
first round and by every node), and a round of a kind without an additive private form
(:func:`~fednovelty.runtime.secure_rounds.additive_release`, before anything is sent).

**Differences from the in-process engine**: drops are real, not drawn
(``SecureSum.dropped`` / ``unresponsive`` are not run-config keys); each node draws its
stochastic rounding from its own OS entropy, so the sums agree with the in-process engine's
to within the quantisation error, not bit for bit; the ring's quantisation levels are set by
the number of nodes that shared (step 2).
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
from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.core.base import Message as FedMessage
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.trust.reply_form import check_reply, is_skipped
from fednovelty.federated.trust.secure import (
    STEPS,
    SecureSumReport,
    check_sum_range,
    error_bound,
    quantization_levels,
    unmask_sum,
)
from fednovelty.runtime.flower._compat import MessageType, RecordDict, asymmetric
from fednovelty.runtime.flower.codec import (
    SECAGG,
    CodecError,
    Field,
    decode_fields,
    encode_fields,
    encode_message,
    fields_record,
    wire_nbytes,
)
from fednovelty.runtime.flower.secure_gate import SecureValidator, check_masked
from fednovelty.runtime.flower.secure_node import (
    KEYS_ACTION,
    REVEAL_ACTION,
    SHARES_ACTION,
    bytes_field,
    bytes_list,
    check_secure_run,
    int_list,
    join_masked,
    split_masked,
)
from fednovelty.runtime.flower.server import FlowerDelivery, GridTransport, exchange
from fednovelty.runtime.flower.validation import Dropped, Received, receive_replies
from fednovelty.runtime.secure_rounds import (
    COMBINED_ID,
    SecureSum,
    additive_release,
    decode,
    dequantize_encoded,
    n_components_of,
    round_clips,
    round_metrics,
    senders_threshold,
)

__all__ = [
    "SecureGridTransport",
    "SecureValidator",
    "check_masked",
    "check_secure_run",
    "split_masked",
]

logger = logging.getLogger("flwr").getChild("fednovelty")


def _message_type(action: str) -> str:
    return f"{MessageType.QUERY}.{action}"


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
    :data:`~fednovelty.federated.trust.secure.STEPS`; ``secure_wire_bytes_up`` /
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
                pair = (
                    bytes_field(fields, "mask_public"),
                    bytes_field(fields, "encryption_public"),
                )
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
                "threshold": current.threshold,
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
                targets = int_list(fields, "holders")
                ciphertexts = bytes_list(fields, "ciphertexts", len(targets))
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
        return FlowerDelivery.of(received, asked, len(contents), down, up)

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
                owners = int_list(fields, "owners")
                values = bytes_list(fields, "shares", len(owners))
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
        holders = len(current.public_keys)  # the shares were made among every key holder
        try:
            total = unmask_sum(
                masked, revealed, set(dropped), keys, current.threshold, settings.bits,
                settings.prg, holders,
            )  # fmt: skip
        except ValueError as error:
            raise FederationError(f"round {current.number}: {error}") from None
        levels = quantization_levels(settings.bits, len(current.sharers))
        sizes = [(name, int(np.prod(shape))) for name, shape in layout.items()]
        check_sum_range(total, len(senders), levels, sizes)  # ImplausibleSumError
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
