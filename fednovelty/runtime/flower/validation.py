"""Flower replies on receipt: decode them, bind each to its node, then validate.

On real nodes a reply can be missing (the node is down, slow, or its ClientApp raised), or
malformed or hostile. :func:`receive_replies` turns one round's Flower replies into
fednovelty messages keyed by client id; the round loop passes them through the run's
:class:`~fednovelty.federated.trust.validation.ReplyValidator`, the same checks the in-process
engine applies (shapes, finite values, statistics some rows could produce, what each client
declared before); :func:`settle_replies` lists what was kept and dropped.
:func:`accept_replies` does the three in one call.

**Client identity is bound to the node.** A node's client id (its ``partition-id``) is the
one its first valid reply named; from then on that node is that client and no other node
may answer as it: a reply from another node naming a bound client id, or from a bound node
naming another id, is dropped (logged), not the run. Rows of another width than the
federation's are dropped the same way. A reply that fails is reported as :class:`Dropped`;
the engine decides whether the round can go on (``min_clients``). Functions here are pure
apart from reading Flower ``Message`` attributes (``metadata.src_node_id``, ``has_error()``,
``content``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fednovelty.exceptions import FederationError
from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError
from fednovelty.federated.trust.reply_form import (
    NON_NEGATIVE,
    check_reply,
    covariance_shape,
    expected_shapes,
)
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime.flower.codec import CodecError, decode_message

__all__ = [
    "NON_NEGATIVE",
    "Accepted",
    "Dropped",
    "FederationError",
    "InvalidReplyError",
    "Received",
    "accept_replies",
    "check_reply",
    "covariance_shape",
    "expected_shapes",
    "receive_replies",
    "settle_replies",
]


@dataclass(frozen=True)
class Dropped:
    """A reply the server did not use.

    Attributes:
        client_id: the client the node registered as (``None`` for an unknown node).
        node_id: Flower's node id.
        reason: what was wrong (``"no reply within ..."``, a node error, a failed check).
    """

    client_id: int | None
    node_id: int
    reason: str


@dataclass
class Accepted:
    """One round's replies after the checks.

    Attributes:
        replies: valid replies by client id, in increasing client id (the order
            ``run_simulation`` hands them to the server step, so sums add in the same order).
        nodes: client id -> node id of every valid reply.
        dropped: one :class:`Dropped` per unusable or missing reply.
        bytes_up: fednovelty payload bytes of every decoded reply, valid or not.
    """

    replies: dict[int, Message]
    nodes: dict[int, int]
    dropped: list[Dropped]
    bytes_up: int = 0


@dataclass
class Received:
    """One round's Flower replies decoded and bound to their nodes, not yet validated.

    Attributes:
        replies: client id -> decoded reply of every reply a node may send as that client.
        widths: client id -> the row width its reply header declares.
        nodes: client id -> the node that sent it.
        refused: replies not usable before any check of their content (from a node not
            asked, a node error, undecodable, or naming a client another node answers as).
        missing: one :class:`Dropped` per asked node that sent nothing.
        bytes_up: fednovelty payload bytes of every decoded reply.
    """

    replies: dict[int, Message] = field(default_factory=dict)
    widths: dict[int, int] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)
    refused: list[Dropped] = field(default_factory=list)
    missing: list[Dropped] = field(default_factory=list)
    bytes_up: int = 0


def receive_replies(
    replies: Iterable[Any],
    asked: Mapping[int, int | None],
    bound: Mapping[int, int] | None = None,
) -> Received:
    """Decode one round's Flower replies and bind each to its node.

    Args:
        replies: Flower ``Message`` replies received in time.
        asked: node id -> client id of every node asked this round (``None``: the node has
            no client id yet; its reply's own ``client_id`` is taken if no other node holds
            it).
        bound: client id -> node id of every node bound in earlier rounds.

    Returns:
        :class:`Received`.
    """
    bound = dict(bound or {})
    received = Received()
    answered: set[int] = set()
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if node not in asked:
            received.refused.append(Dropped(None, node, "reply from a node that was not asked"))
            continue
        answered.add(node)
        client = asked[node]
        if reply.has_error():
            error = reply.error
            received.refused.append(
                Dropped(client, node, f"node error {error.code}: {error.reason}")
            )
            continue
        try:
            message, header = decode_message(reply.content)
            named = int(header["client_id"])
            width = int(header["n_features"])
        except (CodecError, KeyError, TypeError, ValueError) as error:
            received.refused.append(Dropped(client, node, f"malformed reply: {error}"))
            continue
        received.bytes_up += message.nbytes()
        holder = bound.get(named, received.nodes.get(named))
        if client is not None and named != client:
            reason = f"reply names client {named}; this node is client {client}"
        elif holder is not None and holder != node:
            reason = f"reply names client {named}, which node {holder} answers as"
        else:
            received.replies[named], received.widths[named] = message, width
            received.nodes[named] = node
            continue
        received.refused.append(Dropped(client, node, reason))
    for node, client in asked.items():
        if node not in answered:
            received.missing.append(Dropped(client, node, "no reply within the round timeout"))
    return received


def settle_replies(
    received: Received, valid: Mapping[int, Message], invalid: Mapping[int, str]
) -> Accepted:
    """:class:`Accepted` from the received replies and their validation (``valid`` replies
    by client id; ``invalid``: client id -> reason). Drops are listed refused first, then
    invalid, then missing."""
    dropped = [
        *received.refused,
        *(Dropped(c, received.nodes[c], f"invalid reply: {why}") for c, why in invalid.items()),
        *received.missing,
    ]
    nodes = {c: received.nodes[c] for c in valid}
    return Accepted(dict(valid), nodes, dropped, received.bytes_up)


def accept_replies(
    replies: Iterable[Any],
    asked: Mapping[int, int | None],
    broadcast: Message,
    validator: ReplyValidator,
    bound: Mapping[int, int] | None = None,
) -> Accepted:
    """Decode one round's Flower replies, bind them to their nodes and validate them:
    :func:`receive_replies`, ``validator.accept``, :func:`settle_replies`.

    Args:
        replies: Flower ``Message`` replies received in time.
        asked: node id -> client id of every node asked this round (see
            :func:`receive_replies`).
        broadcast: the round's fednovelty message.
        validator: the run's :class:`ReplyValidator` (knows the federation's width and what
            each client declared).
        bound: client id -> node id of every node bound in earlier rounds.

    Returns:
        :class:`Accepted`; the caller binds the nodes of ``Accepted.nodes``.
    """
    received = receive_replies(replies, asked, bound)
    valid, invalid = validator.accept(broadcast, received.replies, received.widths)
    return settle_replies(received, valid, invalid)
