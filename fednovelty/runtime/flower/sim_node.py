"""The virtual SuperNode of Flower's Simulation Engine: fednovelty's ClientApp handlers on
rows held in Ray's object store.

:func:`make_sim_client_app` answers the messages of a deployment's ClientApp
(:mod:`fednovelty.runtime.flower.client`: ``train``, ``query`` and nothing else of its own)
by calling the very same handlers, :func:`~fednovelty.runtime.flower.client.handle_train`
and :func:`~fednovelty.runtime.flower.client.handle_query`, with three things a
simulation's node lacks put into its ``Context`` first:

- the **run config** (``algorithm``, ``algorithm-params``, ``seed``): ``flwr.simulation.
  run_simulation`` starts a run without one, so each message's context gets the run's,
  from which the handler rebuilds the algorithm exactly as a deployed node does;
- the **node's privacy policy** as its node config keys (``privacy-min-rows``, ...;
  :data:`~fednovelty.runtime.flower.client.PRIVACY_KEYS`), read by the handler as a
  deployed node reads its own;
- the **client's kept state** at the start of each attempt of the run (what
  ``run_simulation``'s ``client_states`` gives the in-process clients), stored in the
  node's ``context.state`` where the handler loads it
  (:func:`~fednovelty.runtime.flower.codec.load_client_state`).

Rows: every client's rows are put once into Ray's object store by the engine; the
ClientApp carries the reference, and each actor process fetches the table once (zero-copy
from the shared store) and keeps it for the run (:data:`_TABLES`). Node ``partition-id``
``p`` holds the ``p``-th client of the table (client ids in increasing order). This works
because every actor runs on this machine; on a Ray cluster of several machines the rows
must come from each node's own files (``data-path``), as in a deployment
(:func:`~fednovelty.runtime.flower.client.load_node_data`).

One more query, ``query.fednovelty_client_state``, returns the client's state as kept at
the end of the run (the engine asks it once, after the last round), so the simulation's
result has every client's state as the in-process engine's has.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fednovelty.federated.core.base import Message as FedMessage
from fednovelty.runtime.flower._compat import ClientApp, Context, Message
from fednovelty.runtime.flower.client import handle_query, handle_train
from fednovelty.runtime.flower.codec import (
    CLIENT_ATTEMPT,
    HEADER,
    encode_message,
    load_client_state,
    store_client_state,
)

#: the query action that returns a client's final state (``query.<action>``).
STATE_ACTION = "fednovelty_client_state"
#: the kind of the state query and of its reply.
STATE_KIND = "client_state"


@dataclass
class ClientTable:
    """Every virtual client's data for one run, by partition id.

    Attributes:
        client_ids: (n_clients,) client id of each partition, increasing.
        rows: each client's rows (n_c, n_features) as numpy.
        labels: each client's labels (n_c,) as numpy, or ``None`` for rows alone.
        states: each client's kept state at the start of the run, as numpy arrays by name.
    """

    client_ids: list[int]
    rows: list[np.ndarray]
    labels: list[np.ndarray] | None = None
    states: list[dict[str, np.ndarray]] = field(default_factory=list)

    def data(self, partition: int) -> tuple[int, Any]:
        """``(client_id, rows)`` or ``(client_id, (rows, labels))`` of one partition; the
        arrays are copies (the shared store's are read-only)."""
        rows = np.array(self.rows[partition])
        if self.labels is None:
            return self.client_ids[partition], rows
        return self.client_ids[partition], (rows, np.array(self.labels[partition]))

    def start_state(self, partition: int) -> dict[str, torch.Tensor]:
        """The client's kept state at the start of every attempt of the run."""
        kept = self.states[partition] if self.states else {}
        return {name: torch.from_numpy(np.array(value)) for name, value in kept.items()}


#: the tables this process has fetched, by run key (each actor fetches a run's once).
_TABLES: dict[str, ClientTable] = {}
#: torch threads already set in this process.
_THREADS: list[int] = []


def _table(key: str, reference: Any) -> ClientTable:
    """The run's client table, fetched from Ray's object store on first use."""
    table = _TABLES.get(key)
    if table is None:
        import ray

        for old in list(_TABLES):  # one run at a time: drop an earlier run's rows
            del _TABLES[old]
        table = _TABLES[key] = ray.get(reference)
    return table


def _setup(n: int, quiet: bool) -> None:
    """Run this actor's torch with ``n`` threads (its ``num_cpus``; Ray does not pin them)
    and, where ``quiet``, Flower's logger of this actor at ``ERROR`` (its line on every
    actor's stop hidden)."""
    if not _THREADS or _THREADS[0] != n:
        torch.set_num_threads(n)
        _THREADS[:] = [n]
    if quiet:
        logging.getLogger("flwr").setLevel(logging.ERROR)


def _attempt(message: Message) -> int:
    header = message.content.config_records.get(HEADER)
    return int(header.get("attempt", 0)) if header is not None else 0


def _seed_state(context: Context, table: ClientTable, partition: int, attempt: int) -> None:
    """Store the client's starting state in the node's ``context.state`` when nothing of
    ``attempt`` is there yet (first message of the run, or of a restarted attempt)."""
    stored = context.state.config_records.get(CLIENT_ATTEMPT)
    if stored is not None and int(stored["attempt"]) == attempt:
        return
    start = table.start_state(partition)
    if start:
        store_client_state(context.state, start, attempt)


@dataclass(frozen=True)
class NodeSettings:
    """What every virtual node of one run is given (small: it travels with each message).

    Attributes:
        key: the run's key (the table cache's).
        reference: Ray's reference to the run's :class:`ClientTable`.
        run_config: the run config (``algorithm``, ``algorithm-params``, ``seed``).
        node_config: node-config keys every node adds to its own (its privacy policy).
        threads: torch threads of an actor.
        quiet: Flower's log lines in the actors below ``ERROR`` hidden.
    """

    key: str
    reference: Any
    run_config: Mapping[str, Any]
    node_config: Mapping[str, Any]
    threads: int = 1
    quiet: bool = True


def _prepare(context: Context, settings: NodeSettings) -> tuple[Context, ClientTable, int]:
    """The node's context as the handlers read it: the run config and the node keys added
    (Flower refuses changes to a simulation node's own ``run_config``, so this is a new
    ``Context`` sharing the node's ``state``); its table and partition."""
    _setup(settings.threads, settings.quiet)
    node_config = {**context.node_config, **settings.node_config}
    given = Context(
        run_id=context.run_id,
        node_id=context.node_id,
        node_config=node_config,
        state=context.state,
        run_config=dict(settings.run_config),
    )
    table = _table(settings.key, settings.reference)
    return given, table, int(node_config["partition-id"])


def make_sim_client_app(settings: NodeSettings) -> ClientApp:
    """A ClientApp answering ``train`` and ``query`` with the deployment's handlers, and
    ``query.fednovelty_client_state`` with the client's final state (module docstring)."""
    app = ClientApp()

    def load(context: Context) -> tuple[int, Any]:
        return _table(settings.key, settings.reference).data(
            int(context.node_config["partition-id"])
        )

    @app.train()
    def train(message: Message, context: Context) -> Message:
        given, table, partition = _prepare(context, settings)
        _seed_state(given, table, partition, _attempt(message))
        return handle_train(message, given, load)

    @app.query()
    def query(message: Message, context: Context) -> Message:
        given, _, _ = _prepare(context, settings)
        return handle_query(message, given, load)

    @app.query(STATE_ACTION)
    def client_state(message: Message, context: Context) -> Message:
        _, table, partition = _prepare(context, settings)
        attempt = _attempt(message)
        stored = context.state.config_records.get(CLIENT_ATTEMPT)
        if stored is not None and int(stored["attempt"]) == attempt:
            state = load_client_state(context.state, attempt)
        else:  # not asked in this attempt: the state it started with
            state = table.start_state(partition)
        reply = FedMessage(STATE_KIND, tensors=state)
        return Message(
            encode_message(reply, client_id=table.client_ids[partition]), reply_to=message
        )

    return app


__all__ = [
    "STATE_ACTION",
    "STATE_KIND",
    "ClientTable",
    "NodeSettings",
    "make_sim_client_app",
]
