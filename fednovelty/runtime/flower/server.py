"""The server side: any fednovelty algorithm's rounds over a Flower ``Grid``.

:func:`run_rounds` is the round loop of ``run_simulation``
(:func:`fednovelty.runtime.loop.run_rounds`) with a :class:`GridTransport` in place of the
in-process clients: the same ``start`` -> ``configure`` -> client steps (now on the nodes)
-> validation -> ``server_step`` over the replies keyed by client id in increasing order ->
``finished``. Same algorithm objects, same message bytes, same reply order, same client
sampling: for the same partition and seeds the final state equals the simulation's to
float64 round-off.

What the engine adds for real nodes:

- **Client ids.** Flower's node ids are random; fednovelty's client ids (which seed each
  client's randomness and order the sums) are the nodes' ``partition-id``. Every reply
  names its client id and row width, so with ``fraction=1`` (every client every round, the
  default) the engine learns them from the first round's replies at no extra cost. Client
  sampling (``fraction < 1``) needs them beforehand: then every node is first asked for
  them in a ``query`` message (one more ClientApp start per node). A client id is bound to
  the node that first answered validly as it: another node naming it, or rows of another
  width, is dropped and logged, and the run goes on.
- **Robust rounds.** The loop validates the replies with the same
  :class:`~fednovelty.federated.trust.validation.ReplyValidator` as in the simulation; a missing,
  malformed or inconsistent reply is dropped and logged, and the round goes on with the
  others. A round with fewer than ``min_clients`` valid replies is recorded as failed and
  asked again; ``max_failed_rounds`` failed rounds in a row stop the run with a
  :class:`~fednovelty.exceptions.FederationError`. Each round waits at most
  ``round_timeout`` seconds for a node; a node the SuperLink already counts as gone
  (it missed its heartbeats) is dropped at once with Flower's ``NODE_UNAVAILABLE`` reason
  (:func:`attribute_reply`).
- **Bytes.** The loop hands the transport each broadcast packed and unpacks the replies
  (:mod:`fednovelty.federated.core.wire`: triangles of symmetric and triangular matrices, the
  ``wire_dtype`` setting); ``RoundRecord.bytes_down`` / ``bytes_up`` count the packed
  fednovelty payload bytes as the simulation does; the metrics add ``wire_bytes_down`` /
  ``wire_bytes_up``, the bytes of the Flower records (``.npy`` headers and names included).
- **Secure sums.** With ``secure=`` (run config ``secure-sum``) every round runs SecAgg's
  four steps as Flower exchanges and the server step gets one combined reply
  (:mod:`fednovelty.runtime.flower.secure`; a round of a kind without an additive private
  form is refused, as in the simulation). The server asks a threshold; each node holds it
  to its own floor (:mod:`fednovelty.runtime.flower.secure_node`) and refuses a lower one.

:func:`make_server_app` wraps it in a ``ServerApp`` configured by the run config (see
:mod:`.config`) that writes the result to ``result-path``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fednovelty.exceptions import FederationError
from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.core.base import Message as FedMessage
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import loop
from fednovelty.runtime.flower._compat import (
    Context,
    Grid,
    Message,
    MessageType,
    RecordDict,
    ServerApp,
)
from fednovelty.runtime.flower.codec import CodecError, decode_message, encode_message, wire_nbytes
from fednovelty.runtime.flower.config import (
    ALGORITHM_KEY,
    EngineConfig,
    algorithm_from_run_config,
    needs_width,
    secure_from_run_config,
)
from fednovelty.runtime.flower.results import FlowerResult, algorithm_config, save_result
from fednovelty.runtime.flower.validation import Dropped, Received, receive_replies, settle_replies
from fednovelty.runtime.loop import Delivery, RoundRecord, Settled, Transport, sample_clients
from fednovelty.runtime.secure_rounds import SecureSum

#: a child of Flower's logger, so the engine's lines appear wherever Flower's do (the
#: SuperLink's console, ``flwr run --stream``, ``flwr log``).
logger = logging.getLogger("flwr").getChild("fednovelty")


@dataclass(frozen=True)
class NodeInfo:
    """A registered node: its client id and the shape of its rows."""

    node_id: int
    client_id: int
    n_samples: int
    n_features: int


def exchange(
    grid: Grid,
    contents: Mapping[int, RecordDict],
    message_type: str,
    *,
    group_id: str,
    timeout: float,
    poll: float = 0.2,
) -> list[Message]:
    """Send one message per node and collect the replies that arrive within ``timeout``.

    Like ``Grid.send_and_receive`` but polls every ``poll`` seconds (Flower's own wait
    polls every 3 s).

    Args:
        contents: node id -> record to send it.
        message_type: Flower message type (``"train"``, ``"query"``).
        group_id: Flower's group (the round number).
        timeout: seconds to wait for the replies.
    """
    messages = [
        Message(content, dst_node_id=node, message_type=message_type, group_id=group_id)
        for node, content in contents.items()
    ]
    ids = list(grid.push_messages(messages))
    sent = {i: int(m.metadata.dst_node_id) for i, m in zip(ids, messages, strict=False) if i}
    pending = set(sent)
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(attribute_reply(m, sent) for m in got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return replies


@dataclass(frozen=True)
class ReplyOrigin:
    """The metadata :func:`receive_replies` reads: who a reply is from, what it answers."""

    src_node_id: int
    reply_to_message_id: str


@dataclass(frozen=True)
class LinkErrorReply:
    """An error reply the SuperLink wrote in a node's place (Flower sends it from the
    SuperLink's own node id: e.g. ``NODE_UNAVAILABLE`` once the node has missed its
    heartbeats), attributed to the node the message went to. Reads like an error
    ``Message``: ``metadata``, ``error``, ``has_error()``, ``has_content()``."""

    metadata: ReplyOrigin
    error: Any

    def has_error(self) -> bool:
        return True

    def has_content(self) -> bool:
        return False


def attribute_reply(reply: Message, sent: Mapping[str, int]) -> Message | LinkErrorReply:
    """``reply`` as sent, or, for an error reply from another node than the one its
    message went to (``sent``: message id -> node id), a :class:`LinkErrorReply` from
    that node: so a node the SuperLink counts as gone is dropped with Flower's reason,
    not as a reply from a node that was not asked."""
    to = reply.metadata.reply_to_message_id
    node = sent.get(to)
    if node is None or int(reply.metadata.src_node_id) == node or not reply.has_error():
        return reply
    return LinkErrorReply(ReplyOrigin(node, to), reply.error)


def wait_for_nodes(grid: Grid, n_nodes: int, timeout: float, poll: float = 0.5) -> list[int]:
    """Node ids once at least ``n_nodes`` are connected (sorted).

    Raises:
        FederationError: fewer than ``n_nodes`` connected within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= n_nodes:
            return nodes
        if time.monotonic() >= deadline:
            raise FederationError(
                f"only {len(nodes)} node(s) connected within {timeout:.0f} s; waiting for "
                f"{n_nodes}. Start more SuperNodes, or lower num-nodes / min-clients."
            )
        time.sleep(poll)


def register_nodes(grid: Grid, nodes: Iterable[int], timeout: float) -> list[NodeInfo]:
    """Ask every node for its client id and data shape (a ``query`` message); nodes that
    fail are logged and left out. Returns the registrations sorted by client id.

    A node that registers a client id another node already holds, or rows of another
    width than most nodes', is logged and left out.
    """
    content = encode_message(FedMessage("describe"))
    asked = list(nodes)
    replies = exchange(
        grid, dict.fromkeys(asked, content), MessageType.QUERY, group_id="0", timeout=timeout
    )
    infos: dict[int, NodeInfo] = {}
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if reply.has_error():
            logger.warning("node %d failed to register: %s", node, reply.error.reason)
            continue
        try:
            message, header = decode_message(reply.content)
            info = NodeInfo(
                node,
                int(header["client_id"]),
                int(message.scalars["n_samples"]),
                int(message.scalars["n_features"]),
            )
        except (CodecError, KeyError, ValueError) as error:
            logger.warning("node %d sent an unreadable registration: %s", node, error)
            continue
        if info.client_id in infos:
            logger.warning(
                "node %d registered as client %d, which node %d holds; node %d is left out",
                node,
                info.client_id,
                infos[info.client_id].node_id,
                node,
            )
            continue
        infos[info.client_id] = info
    for node in sorted(set(asked) - {i.node_id for i in infos.values()}):
        logger.warning("node %d did not register within %.0f s", node, timeout)
    widths = Counter(i.n_features for i in infos.values())
    if widths:
        top = max(widths.values())
        width = min(w for w, c in widths.items() if c == top)
        for c, info in sorted(infos.items()):
            if info.n_features != width:
                logger.warning(
                    "client %d (node %d) has rows of %d features, the federation's %d; left out",
                    c,
                    info.node_id,
                    info.n_features,
                    width,
                )
                del infos[c]
    return [infos[c] for c in sorted(infos)]


@dataclass
class FlowerDelivery(Delivery):
    """A :class:`Delivery` with what the Flower transport needs once the replies are
    validated: the nodes asked (node id -> client id, ``None`` where not yet known) and the
    decoded replies with their nodes."""

    nodes: dict[int, int | None] = field(default_factory=dict)
    received: Received = field(default_factory=Received)

    @classmethod
    def of(
        cls, received: Received, asked: dict[int, int | None], n_asked: int, down: int, up: int
    ) -> FlowerDelivery:
        """The delivery of ``received``, the decoded replies of the nodes ``asked`` (node id
        -> client id): ``n_asked`` messages sent, ``down`` and ``up`` wire bytes (the
        ``wire_bytes_down`` / ``wire_bytes_up`` metrics)."""
        return cls(
            received.replies,
            asked=tuple(sorted(c for c in asked.values() if c is not None)),
            n_asked=n_asked,
            bytes_up=received.bytes_up,
            widths=received.widths,
            metrics={"wire_bytes_down": down, "wire_bytes_up": up},
            nodes=asked,
            received=received,
        )


class GridTransport(Transport):
    """Rounds over the nodes of a Flower ``Grid``: encode, push, pull, decode, bind.

    Args:
        grid: the Flower ``Grid``.
        client_of: node id -> client id of every node (``None``: learnt from its first
            valid reply).
        engine: ``fraction`` (a fraction below 1 samples the known client ids),
            ``round_timeout``.
        rng: the sampling stream (``np.random.default_rng(engine.seed)``).

    Attributes:
        dropped: every dropped reply of the run, as ``{"round", "client_id", "node_id",
            "reason"}``.
    """

    def __init__(
        self,
        grid: Grid,
        client_of: dict[int, int | None],
        engine: EngineConfig,
        rng: np.random.Generator,
    ) -> None:
        self.grid, self.client_of, self.engine, self.rng = grid, client_of, engine, rng
        self.dropped: list[dict] = []
        self._n_asked = 0
        self.attempt = 0  # sent with every message: a node's kept state is of one attempt
        self._node_of: dict[int, int] = {}  # client id -> node of its last decoded reply

    def ask(self) -> dict[int, int | None]:
        """Node id -> client id of the nodes asked this round: every node, or with
        ``fraction < 1`` a sample of the known client ids (:func:`sample_clients`)."""
        if self.engine.fraction >= 1.0:
            return dict(self.client_of)
        known = sorted(c for c in self.client_of.values() if c is not None)
        sampled, _ = sample_clients(known, self.engine.fraction, 0.0, self.rng)
        node_of = {c: n for n, c in self.client_of.items() if c is not None}
        return {node_of[c]: c for c in sampled}

    def exchange(self, number: int, message: FedMessage) -> FlowerDelivery:
        """Push the encoded message to this round's nodes; decode what comes back in time."""
        asked = self.ask()
        content = encode_message(message, round=number, attempt=self.attempt)
        replies = exchange(
            self.grid,
            dict.fromkeys(asked, content),
            MessageType.TRAIN,
            group_id=str(number),
            timeout=self.engine.round_timeout,
        )
        bound = {c: n for n, c in self.client_of.items() if c is not None}
        received = receive_replies(replies, asked, bound)
        self._n_asked = len(asked)
        up = sum(wire_nbytes(r.content) for r in replies if r.has_content())
        return FlowerDelivery.of(received, asked, len(asked), wire_nbytes(content) * len(asked), up)

    def settle(self, number: int, delivery: FlowerDelivery, valid, invalid) -> Settled:
        """Bind the nodes of the valid replies, log and keep every drop; the round's client
        ids (those bound now included)."""
        accepted = settle_replies(delivery.received, valid, invalid)
        self.client_of.update({n: c for c, n in accepted.nodes.items()})
        self._node_of.update(delivery.received.nodes)
        for d in accepted.dropped:
            logger.warning("round %d: dropped client %s (node %d): %s", number, *_fields(d))
            self.dropped.append({"round": number, **_as_dict(d)})
        sampled = sorted(c for c in (self.client_of[n] for n in delivery.nodes) if c is not None)
        return Settled(tuple(sampled), tuple((d.client_id, d.reason) for d in accepted.dropped))

    def exclude(self, client_ids: Iterable[int]) -> None:
        """Ask the nodes of ``client_ids`` (bound to them, or whose last reply named them)
        no more in this run."""
        for c in client_ids:
            nodes = {n for n, bound in self.client_of.items() if bound == c}
            nodes.update({self._node_of[c]} if c in self._node_of else set())
            for node in nodes:
                self.client_of.pop(node, None)
                logger.warning("client %d (node %d) is excluded from this run", c, node)

    def restart(self) -> None:
        """The next messages carry the next attempt number: each node starts its client
        state afresh (:func:`~fednovelty.runtime.flower.codec.load_client_state`), and the
        sampling stream starts again from the engine's seed."""
        self.attempt += 1
        self.rng = np.random.default_rng(self.engine.seed)

    def log_round(self, record: RoundRecord) -> None:
        """Log one finished round on Flower's logger."""
        logger.info(
            "round %d (%s): %d/%d replied validly%s, %.1f s, %d B down, %d B up",
            record.round,
            record.kind,
            len(record.replied),
            self._n_asked,
            " (failed: asked again)" if record.failed else "",
            record.seconds,
            record.bytes_down,
            record.bytes_up,
        )


def run_rounds(
    grid: Grid,
    algorithm: FederatedAlgorithm,
    engine: EngineConfig | None = None,
    *,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
    secure: SecureSum | None = None,
    registered: Sequence[NodeInfo] | None = None,
) -> FlowerResult:
    """Run ``algorithm`` to completion on the nodes of ``grid``.

    Args:
        grid: the Flower ``Grid`` handed to ``ServerApp.main``.
        algorithm: a ``FederatedAlgorithm`` (the nodes build the same one from the run
            config).
        engine: ``min_clients``, ``fraction``, ``seed`` (client sampling, as
            ``run_simulation``'s ``random_state``), timeouts; default ``EngineConfig()``.
        callbacks: called with each ``RoundRecord`` as it completes.
        secure: run every round through a secure sum with these settings
            (:mod:`fednovelty.runtime.flower.secure`; ``max_rows`` required); ``min_clients``
            is then at least 2. The nodes read the same settings from the run config, and
            their own floor (threshold, fewest senders) from their node config.
        registered: the nodes' registrations, if the caller asked them already
            (:func:`register_nodes`; :func:`serve` does to learn the rows' width): the rounds
            ask these nodes, their client ids known, and no node is asked again.

    Returns:
        :class:`FlowerResult` (``client_states`` empty: they stay on the nodes). Each
        ``RoundRecord.sampled`` lists the known client ids of the nodes asked; a node that
        has never replied validly has none yet, but its broadcast counts in ``bytes_down``.

    Raises:
        FederationError: too few nodes, or ``max_failed_rounds`` rounds in a row with
            fewer than ``min_clients`` valid replies.
        ValueError: ``secure`` with an algorithm or a round a secure sum cannot carry.
    """
    engine = engine or EngineConfig()
    nodes = (
        wait_for_nodes(grid, max(engine.num_nodes, engine.min_clients), engine.nodes_timeout)
        if registered is None
        else [i.node_id for i in registered]
    )
    client_of: dict[int, int | None] = dict.fromkeys(nodes)  # node id -> client id
    validator, combine, min_clients = ReplyValidator(), None, engine.min_clients
    if secure is not None:  # imported here: the secure transport extends GridTransport
        from fednovelty.runtime.flower.secure import SecureValidator, check_secure_run

        check_secure_run(algorithm, secure)
        validator, min_clients = (
            SecureValidator(algorithm=algorithm, bits=secure.bits),
            max(2, engine.min_clients),
        )
    if registered is not None or engine.fraction < 1.0:  # sampling needs the client ids
        infos = (
            register_nodes(grid, nodes, engine.round_timeout)
            if registered is None
            else list(registered)
        )
        client_of = {i.node_id: i.client_id for i in infos}
        validator.n_features = infos[0].n_features if infos else None
        logger.info("registered clients %s", sorted(i.client_id for i in infos))
    rng = np.random.default_rng(engine.seed)
    if secure is None:
        transport = GridTransport(grid, client_of, engine, rng)
    else:
        from fednovelty.runtime.flower.secure import SecureGridTransport

        transport = SecureGridTransport(
            grid, client_of, engine, rng, algorithm=algorithm, settings=secure, validator=validator
        )
        combine = transport.combine
    state, history = loop.run_rounds(
        algorithm,
        transport,
        validator=validator,
        min_clients=min_clients,
        max_failed_rounds=engine.max_failed_rounds,
        callbacks=(transport.log_round, *callbacks),
        combine=combine,
    )
    return FlowerResult(
        state=state,
        history=history,
        client_states={},
        algorithm=type(algorithm).__name__,
        config=algorithm_config(algorithm),
        dropped=transport.dropped,
    )


def _fields(dropped: Dropped) -> tuple:
    return dropped.client_id, dropped.node_id, dropped.reason


def _as_dict(dropped: Dropped) -> dict:
    return {"client_id": dropped.client_id, "node_id": dropped.node_id, "reason": dropped.reason}


def serve(grid: Grid, context: Context) -> FlowerResult:
    """The body of fednovelty's ``ServerApp.main``: build the algorithm, the engine and the
    secure-sum settings (``secure-sum``) from ``context.run_config``, run the rounds, write
    the result to ``result-path`` (logged as an absolute path).

    Settings that depend on the rows' width (``"auto"``, :data:`~.config.WIDTH_AUTO`) are
    resolved with the federation's width: the nodes are first asked for it
    (:func:`register_nodes`, one more ClientApp start per node), and the rounds ask the
    nodes that answered."""
    run_config = context.run_config
    engine = EngineConfig.from_run_config(run_config)
    registered, width = None, None
    if needs_width(run_config):
        nodes = wait_for_nodes(
            grid, max(engine.num_nodes, engine.min_clients), engine.nodes_timeout
        )
        registered = register_nodes(grid, nodes, engine.round_timeout)
        if not registered:
            raise FederationError(
                'no node told its rows\' width, which the "auto" settings of '
                "algorithm-params need; see the nodes' logs, or give those settings numbers."
            )
        width = registered[0].n_features
        logger.info('rows of %d features: the "auto" settings are set for them', width)
    algorithm = algorithm_from_run_config(run_config, n_features=width)
    secure = secure_from_run_config(run_config)
    name = run_config[ALGORITHM_KEY]
    logger.info(
        "fednovelty: %s on Flower%s, result -> %s",
        name,
        " with secure sums" if secure is not None else "",
        engine.result_path,
    )
    result = run_rounds(grid, algorithm, engine, secure=secure, registered=registered)
    save_result(result, engine.result_path)
    logger.info(
        "fednovelty: %d round(s), %d B up, %d B down; result written to %s",
        len(result.history),
        result.bytes_up,
        result.bytes_down,
        os.path.abspath(engine.result_path),
    )
    return result


def make_server_app() -> ServerApp:
    """A ServerApp whose ``main`` is :func:`serve`."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        serve(grid, context)

    return app
