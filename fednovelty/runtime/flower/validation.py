"""Checks of client replies on receipt, before any of them reaches a server step.

On real nodes a reply can be missing (the node is down, slow, or its ClientApp raised), or
malformed (another fednovelty version, a bug, a hostile node). The server step of an
algorithm assumes well-formed messages, and one NaN in a sum of statistics would poison the
whole model. So every reply is checked against what the round's broadcast asked for:

- its kind is the broadcast's kind and it names the client the node registered as;
- every tensor the algorithm's reply carries is there, with the expected shape
  (:func:`expected_shapes`: statistics ``(K,)``, ``(K, d)``, second moments by covariance
  type, local mixtures of any ``k``, ...; a tensor also in the broadcast keeps its shape);
- floating tensors are finite; counts, sample counts and weights are non-negative.

A reply that fails is dropped and reported (:class:`Dropped`); the engine decides whether the
round can go on (``min_clients``). Functions here are pure apart from reading Flower
``Message`` attributes (``metadata.src_node_id``, ``has_error()``, ``content``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fednovelty.federated.base import Message
from fednovelty.runtime.flower.codec import CodecError, decode_message

#: reply tensors that must be >= 0 wherever they appear.
NON_NEGATIVE: tuple[str, ...] = ("counts", "n_samples", "joint_counts", "weights", "n", "m2")
STATS_KINDS: tuple[str, ...] = ("assign", "em", "joint_em")

Dim = int | str  # a fixed size, or a symbol every use of which in one reply must agree on
Shape = tuple[Dim, ...]


class InvalidReplyError(ValueError):
    """A client reply does not have the form the round asked for."""


class FederationError(RuntimeError):
    """The nodes cannot form one federation, or a round has too few valid replies: two
    nodes with one client id, rows of different widths, fewer than ``min_clients``."""


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


def covariance_shape(covariance_type: str, k: Dim, d: int) -> Shape:
    """Shape of per-component second moments / precision factors by covariance type."""
    shapes = {"full": (k, d, d), "tied": (d, d), "diag": (k, d), "spherical": (k,)}
    if covariance_type not in shapes:
        raise InvalidReplyError(f"unknown covariance_type {covariance_type!r}.")
    return shapes[covariance_type]


def _learner_count(broadcast: Message) -> int:
    return len({name.split(".")[1] for name in broadcast.tensors if name.startswith("learner.")})


def expected_shapes(broadcast: Message, reply: Message, n_features: int) -> dict[str, Shape]:
    """Tensors a reply to ``broadcast`` must carry and their shapes.

    Args:
        broadcast: the round's message to the clients.
        reply: the client's reply (its ``skipped`` scalar matters for ``local_fit``).
        n_features: ``d``, the width of the client's rows.

    Returns:
        name -> shape; a string dimension (``"k"``) is free but equal wherever it appears.
        Unknown kinds return ``{}`` (only the value checks apply).
    """
    d, kind, scalars = n_features, broadcast.kind, broadcast.scalars
    if kind in STATS_KINDS:
        centers = broadcast.tensors["centers" if kind == "assign" else "means"]
        k = int(centers.shape[0])
        shapes: dict[str, Shape] = {
            "counts": (k,),
            "sums": (k, d),
            "second": covariance_shape(str(scalars["covariance_type"]), k, d),
            "log_likelihood": (),
            "n_samples": (),
        }
        if kind == "joint_em":
            shapes["joint_counts"] = (k, _learner_count(broadcast))
        return shapes
    if kind == "local_fit":
        if reply.scalars.get("skipped"):
            return {"n_samples": ()}
        return {
            "weights": ("k",),
            "means": ("k", d),
            "precisions_cholesky": covariance_shape(str(scalars["covariance_type"]), "k", d),
            "n_samples": (),
        }
    simple: dict[str, dict[str, Shape]] = {
        "centroids": {"centers": ("k", d), "counts": ("k",), "n_samples": ()},
        "range": {"min": (d,), "max": (d,), "n_samples": ()},
        "count": {"n_samples": ()},
        "subset": {"rows": ("r", d), "n_samples": ()},
        "moments": {"n_samples": (), "mean": (d,), "m2": (d,)},
        "moments_mean": {"n": (), "sum": (d,)},
        "moments_scatter": {"n": (), "scatter": (d, d)},
    }
    return dict(simple.get(kind, {}))


def _match_shape(name: str, actual: tuple[int, ...], shape: Shape, bound: dict[str, int]) -> None:
    ok = len(actual) == len(shape)
    for size, want in zip(actual, shape, strict=False):
        if isinstance(want, str):
            ok = ok and bound.setdefault(want, size) == size
        else:
            ok = ok and size == want
    if not ok:
        pretty = tuple(bound.get(s, s) if isinstance(s, str) else s for s in shape)
        raise InvalidReplyError(f"tensor {name!r} has shape {actual}; expected {pretty}.")


def check_reply(reply: Message, broadcast: Message, n_features: int) -> None:
    """Raise if ``reply`` is not a well-formed answer to ``broadcast``.

    Args:
        reply: a decoded client reply.
        broadcast: the round's message.
        n_features: ``d`` of the client's rows (from the node's registration).

    Raises:
        InvalidReplyError: wrong kind, missing or unexpected tensor, wrong shape, NaN/inf,
            or a negative count / weight.
    """
    if reply.kind != broadcast.kind:
        raise InvalidReplyError(f"reply of kind {reply.kind!r} to a {broadcast.kind!r} round.")
    shapes = expected_shapes(broadcast, reply, n_features)
    missing = sorted(set(shapes) - set(reply.tensors))
    if missing:
        raise InvalidReplyError(f"reply lacks tensor(s) {missing}.")
    bound: dict[str, int] = {}
    for name, tensor in reply.tensors.items():
        if name in shapes:
            _match_shape(name, tuple(tensor.shape), shapes[name], bound)
        elif name in broadcast.tensors:
            _match_shape(name, tuple(tensor.shape), tuple(broadcast.tensors[name].shape), bound)
        elif shapes:
            raise InvalidReplyError(f"reply has unexpected tensor {name!r}.")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InvalidReplyError(f"tensor {name!r} has NaN or inf values.")
        if name in NON_NEGATIVE and tensor.numel() and bool((tensor < 0).any()):
            raise InvalidReplyError(f"tensor {name!r} has negative values.")
    if broadcast.kind == "centroids" and bound.get("k", 0) > int(broadcast.scalars["n_clusters"]):
        raise InvalidReplyError(
            f"reply has {bound['k']} centroids; at most {broadcast.scalars['n_clusters']} asked."
        )


@dataclass
class Accepted:
    """One round's replies after the checks.

    Attributes:
        replies: valid replies by client id, in increasing client id (the order
            ``run_simulation`` hands them to the server step, so sums add in the same order).
        nodes: client id -> node id of every valid reply.
        widths: client id -> row width the client reported.
        dropped: one :class:`Dropped` per unusable or missing reply.
    """

    replies: dict[int, Message]
    nodes: dict[int, int]
    widths: dict[int, int]
    dropped: list[Dropped]


def accept_replies(
    replies: Iterable[Any],
    asked: Mapping[int, int | None],
    broadcast: Message,
    n_features: int | None = None,
) -> Accepted:
    """Decode and check one round's Flower replies; keep the good ones.

    Args:
        replies: Flower ``Message`` replies received in time.
        asked: node id -> client id of every node asked this round (``None``: not known
            yet, the reply's own ``client_id`` is taken).
        broadcast: the round's fednovelty message.
        n_features: ``d`` of the clients' rows; ``None`` takes each reply's reported width
            (the caller checks that they agree, :func:`check_widths`).

    Raises:
        FederationError: two nodes replied as the same client.
    """
    accepted = Accepted({}, {}, {}, [])
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if node not in asked:
            accepted.dropped.append(Dropped(None, node, "reply from a node that was not asked"))
            continue
        client = asked[node]
        if reply.has_error():
            error = reply.error
            reason = f"node error {error.code}: {error.reason}"
            accepted.dropped.append(Dropped(client, node, reason))
            continue
        try:
            message, header = decode_message(reply.content)
            named = int(header["client_id"])
            if client is not None and named != client:
                raise InvalidReplyError(
                    f"reply names client {named}; the node answered as client {client} before."
                )
            width = int(header["n_features"]) if n_features is None else n_features
            check_reply(message, broadcast, width)
        except (CodecError, InvalidReplyError, KeyError, TypeError, ValueError) as error:
            accepted.dropped.append(Dropped(client, node, f"malformed reply: {error}"))
            continue
        if named in accepted.nodes:
            raise FederationError(
                f"nodes {accepted.nodes[named]} and {node} both replied as client {named}; "
                "give every SuperNode its own partition-id."
            )
        accepted.replies[named] = message
        accepted.nodes[named], accepted.widths[named] = node, width
    answered = set(accepted.nodes.values()) | {d.node_id for d in accepted.dropped}
    for node, client in asked.items():
        if node not in answered:
            accepted.dropped.append(Dropped(client, node, "no reply within the round timeout"))
    accepted.replies = dict(sorted(accepted.replies.items()))
    return accepted


def check_widths(widths: Mapping[int, int]) -> None:
    """Raise if clients' rows have different widths (client id -> n_features).

    Raises:
        FederationError: naming every client's width.
    """
    if len(set(widths.values())) > 1:
        listing = ", ".join(f"client {c}: {w}" for c, w in sorted(widths.items()))
        raise FederationError(
            f"the clients' rows have different numbers of features ({listing}); every client "
            "needs the same columns."
        )
