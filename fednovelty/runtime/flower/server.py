"""The server side: any fednovelty algorithm's rounds over a Flower ``Grid``.

:func:`run_rounds` is ``run_simulation`` with Flower nodes in place of in-process clients,
and the same contract: ``algorithm.start``, then per round ``configure`` -> every sampled
client's ``client_step`` (now on its node) -> ``server_step`` over the replies keyed by
client id in increasing order -> ``finished``. Same algorithm objects, same message bytes,
same reply order, same client sampling: for the same partition and seeds the final state
equals the simulation's to float64 round-off.

What the engine adds for real nodes:

- **Client ids.** Flower's node ids are random; fednovelty's client ids (which seed each
  client's randomness and order the sums) are the nodes' ``partition-id``. Every reply
  names its client id and row width, so with ``fraction=1`` (every client every round, the
  default) the engine learns them from the first round's replies at no extra cost. Client
  sampling (``fraction < 1``) needs them beforehand: then every node is first asked for
  them in a ``query`` message (one more ClientApp start per node). A client id is bound to
  the node that first answered validly as it: another node naming it, or rows of another
  width, is dropped and logged, and the run goes on.
- **Robust rounds.** Replies go through the same
  :class:`~fednovelty.federated.validation.ReplyValidator` as in the simulation; a missing,
  malformed or inconsistent reply is dropped and logged, and the round goes on with the
  others. A round with fewer than ``min_clients`` valid replies is recorded as failed and
  asked again; ``max_failed_rounds`` failed rounds in a row stop the run with a
  :class:`~fednovelty.exceptions.FederationError`. Each round waits at most
  ``round_timeout`` seconds.
- **Bytes.** ``RoundRecord.bytes_down`` / ``bytes_up`` count fednovelty payload bytes as the
  simulation does; the metrics add ``wire_bytes_down`` / ``wire_bytes_up``, the bytes of the
  Flower records (``.npy`` headers and names included).

:func:`make_server_app` wraps it in a ``ServerApp`` configured by the run config (see
:mod:`.config`) that writes the result to ``result-path``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from fednovelty.exceptions import FederationError
from fednovelty.federated.base import FederatedAlgorithm
from fednovelty.federated.base import Message as FedMessage
from fednovelty.federated.validation import ReplyValidator
from fednovelty.runtime.flower._compat import missing_flwr
from fednovelty.runtime.flower.codec import CodecError, decode_message, encode_message, wire_nbytes
from fednovelty.runtime.flower.config import (
    ALGORITHM_KEY,
    EngineConfig,
    algorithm_from_run_config,
)
from fednovelty.runtime.flower.results import FlowerResult, algorithm_config, save_result
from fednovelty.runtime.flower.validation import Dropped, accept_replies
from fednovelty.runtime.simulation import RoundRecord, failed_rounds_message, sample_clients
from fednovelty.runtime.threads import run_server_step

try:
    from flwr.app import Context, Message, MessageType, RecordDict
    from flwr.serverapp import Grid, ServerApp
except ImportError as error:  # pragma: no cover - depends on the installation
    raise missing_flwr(error) from error

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

    Like ``Grid.send_and_receive`` but polls every ``poll`` seconds (Flower's polls every
    3 s, which adds ~1.5 s to every round on average).

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
    pending = {i for i in grid.push_messages(messages) if i}
    deadline = time.monotonic() + timeout
    replies: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return replies


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


def run_rounds(
    grid: Grid,
    algorithm: FederatedAlgorithm,
    engine: EngineConfig | None = None,
    *,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
) -> FlowerResult:
    """Run ``algorithm`` to completion on the nodes of ``grid``.

    Args:
        grid: the Flower ``Grid`` handed to ``ServerApp.main``.
        algorithm: a ``FederatedAlgorithm`` (the nodes build the same one from the run
            config).
        engine: ``min_clients``, ``fraction``, ``seed`` (client sampling, as
            ``run_simulation``'s ``random_state``), timeouts; default ``EngineConfig()``.
        callbacks: called with each ``RoundRecord`` as it completes.

    Returns:
        :class:`FlowerResult` (``client_states`` empty: they stay on the nodes). Each
        ``RoundRecord.sampled`` lists the known client ids of the nodes asked; a node that
        has never replied validly has none yet, but its broadcast counts in ``bytes_down``.

    Raises:
        FederationError: too few nodes, or ``max_failed_rounds`` rounds in a row with
            fewer than ``min_clients`` valid replies.
    """
    engine = engine or EngineConfig()
    nodes = wait_for_nodes(grid, max(engine.num_nodes, engine.min_clients), engine.nodes_timeout)
    client_of: dict[int, int | None] = dict.fromkeys(nodes)  # node id -> client id
    validator = ReplyValidator()
    if engine.fraction < 1.0:  # sampling needs the client ids before the first round
        infos = register_nodes(grid, nodes, engine.round_timeout)
        client_of = {i.node_id: i.client_id for i in infos}
        validator.n_features = infos[0].n_features if infos else None
        logger.info("registered clients %s", sorted(i.client_id for i in infos))
    rng = np.random.default_rng(engine.seed)
    history: list[RoundRecord] = []
    dropped_all: list[dict] = []
    failed_in_a_row = 0
    state = algorithm.start()
    while not algorithm.finished(state):
        number = len(history) + 1
        if sum(not r.failed for r in history) >= algorithm.max_rounds:
            name, most = type(algorithm).__name__, algorithm.max_rounds
            raise RuntimeError(f"{name} exceeded {most} rounds.")
        started = time.perf_counter()
        message = algorithm.configure(state)
        if engine.fraction < 1.0:
            known = sorted(c for c in client_of.values() if c is not None)
            sampled, _ = sample_clients(known, engine.fraction, 0.0, rng)
            node_of = {c: n for n, c in client_of.items() if c is not None}
            asked = {node_of[c]: c for c in sampled}
        else:
            sample_clients(sorted(client_of), 1.0, 0.0, rng)  # same draws as run_simulation
            asked = dict(client_of)
        content = encode_message(message, round=number)
        replies = exchange(
            grid,
            dict.fromkeys(asked, content),
            MessageType.TRAIN,
            group_id=str(number),
            timeout=engine.round_timeout,
        )
        bound = {c: n for n, c in client_of.items() if c is not None}
        accepted = accept_replies(replies, asked, message, validator, bound)
        client_of.update({n: c for c, n in accepted.nodes.items()})
        for d in accepted.dropped:
            logger.warning("round %d: dropped client %s (node %d): %s", number, *_fields(d))
            dropped_all.append({"round": number, **_as_dict(d)})
        valid = accepted.replies
        failed = len(valid) < engine.min_clients
        metrics: dict = {}
        if not failed:
            state, metrics = run_server_step(algorithm, state, valid)
        wire_up = sum(wire_nbytes(r.content) for r in replies if r.has_content())
        sampled_ids = sorted(c for c in (client_of[n] for n in asked) if c is not None)
        record = RoundRecord(
            round=number,
            kind=message.kind,
            sampled=tuple(sampled_ids),
            replied=tuple(valid),
            bytes_down=message.nbytes() * len(asked),
            bytes_up=accepted.bytes_up,
            seconds=time.perf_counter() - started,
            metrics={
                **metrics,
                "wire_bytes_down": wire_nbytes(content) * len(asked),
                "wire_bytes_up": wire_up,
            },
            dropped=tuple(
                (d.client_id, d.reason) for d in accepted.dropped if d.client_id is not None
            ),
            failed=failed,
        )
        history.append(record)
        logger.info(
            "round %d (%s): %d/%d replied validly%s, %.1f s, %d B down, %d B up",
            number,
            message.kind,
            len(valid),
            len(asked),
            " (failed: asked again)" if failed else "",
            record.seconds,
            record.bytes_down,
            record.bytes_up,
        )
        for callback in callbacks:
            callback(record)
        failed_in_a_row = failed_in_a_row + 1 if failed else 0
        if failed_in_a_row >= engine.max_failed_rounds:
            raise FederationError(
                failed_rounds_message(history[-failed_in_a_row:], engine.min_clients)
            )
    return FlowerResult(
        state=state,
        history=history,
        client_states={},
        algorithm=type(algorithm).__name__,
        config=algorithm_config(algorithm),
        dropped=dropped_all,
    )


def _fields(dropped: Dropped) -> tuple:
    return dropped.client_id, dropped.node_id, dropped.reason


def _as_dict(dropped: Dropped) -> dict:
    return {"client_id": dropped.client_id, "node_id": dropped.node_id, "reason": dropped.reason}


def serve(grid: Grid, context: Context) -> FlowerResult:
    """The body of fednovelty's ``ServerApp.main``: build the algorithm and the engine from
    ``context.run_config``, run the rounds, write the result to ``result-path``."""
    run_config = context.run_config
    algorithm = algorithm_from_run_config(run_config)
    engine = EngineConfig.from_run_config(run_config)
    name = run_config[ALGORITHM_KEY]
    logger.info("fednovelty: %s on Flower, result -> %s", name, engine.result_path)
    result = run_rounds(grid, algorithm, engine)
    save_result(result, engine.result_path)
    logger.info(
        "fednovelty: %d round(s), %d B up, %d B down; result written to %s",
        len(result.history),
        result.bytes_up,
        result.bytes_down,
        engine.result_path,
    )
    return result


def make_server_app() -> ServerApp:
    """A ServerApp whose ``main`` is :func:`serve`."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        serve(grid, context)

    return app
