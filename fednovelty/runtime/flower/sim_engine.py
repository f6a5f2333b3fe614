"""Flower's Simulation Engine as a fednovelty engine: any registered algorithm on virtual
SuperNodes (Ray actors), from Python.

:func:`run_flower_simulation` takes :func:`fednovelty.runtime.run_simulation`'s arguments
and returns its :class:`~fednovelty.runtime.simulation.SimulationResult`, but runs the
rounds through ``flwr.simulation.run_simulation(server_app=..., client_app=...,
num_supernodes=n_clients, backend_name="ray", backend_config=...)``: one virtual SuperNode
per client, each message handled by a pool of ClientApp actors. What runs is what a
deployment runs:

- the server is the round loop of :mod:`fednovelty.runtime.loop` behind the deployment's
  :class:`~fednovelty.runtime.flower.server.GridTransport` (and, with ``fraction < 1``, its
  node registration), inside a ServerApp whose thread Flower starts in this process: the
  algorithm object given is the one whose ``configure`` and ``server_step`` run;
- every node runs the deployment's ClientApp handlers
  (:mod:`fednovelty.runtime.flower.sim_node`), which rebuild the algorithm from the run
  config (``algorithm``, ``algorithm-params``: the registry name and settings JSON,
  :func:`~fednovelty.federated.registry.algorithm_settings`) and enforce the node's own
  privacy policy, given here as its node config.

So the model equals the in-process engine's for the same clients and seeds (client ids
in the same order, the same sampling stream, float64 statistics crossing as ``.npy`` bytes,
the server step over the replies in increasing client id); tested to 1e-9 relative in
``tests/runtime/test_flower_sim_engine.py`` and at 1,000 clients by
``benchmarks/flower_sim_scale.py``. The result's ``client_states`` are the nodes' kept
states, asked of every node once after the last round (one ``query`` message each).

**Where the rows come from.** All actors run on this machine, so the clients' rows are put
once into Ray's shared object store and each actor reads them from there (zero-copy);
node ``partition-id`` ``p`` is the ``p``-th client id in increasing order. On a Ray cluster
of several machines the rows must instead come from each node's own files (``data-path``),
as in a deployment (:func:`~fednovelty.runtime.flower.client.load_node_data`): this engine
refuses a Ray cluster of more than one node.

**Resources** (:mod:`fednovelty.runtime.flower.sim_resources`): ``client_resources`` are
Ray's options of one ClientApp actor (default one CPU, no GPU) and ``init_args`` go to
``ray.init`` (default: the cores this process may use, no dashboard, warnings only); both
are checked against the machine first (too many actors per GPU, a ``num_cpus`` no actor
fits, ``init_args`` Ray would ignore). A Ray the caller started (``ray.init`` before the
call) is used as it is and left running, and its ClientApp actors are kept for the next
run with the same ``client_resources`` (:func:`release_actors` stops them; Flower's backend
would stop the actors and Ray after every run, and a new actor spends seconds importing
torch, Flower and fednovelty); otherwise Ray starts and stops with the run.

**What it refuses, by name** (``ValueError``): simulated ``dropout`` (a virtual node
always answers; nodes of a deployment fail for real); ``secure_sum`` (secure rounds run on a
deployment, :mod:`fednovelty.runtime.flower.secure`); a privacy policy with differential
privacy (a node calibrates its own noise from its budget, which a ``PrivacyPolicy`` object
does not carry); an algorithm the registry cannot rebuild from its settings (a wrapper
such as the PCA front end's ``Projected``, a custom learner factory); client data tuples
other than ``(X, y)``. ``batch_clients`` is accepted and has no effect: a node runs its own
client, as ``batch_clients=False`` (equal fits to rounding).

Flower's ``run_simulation`` is deprecated in flwr 1.41 in favour of ``flwr run``; it logs a
deprecation line, which this engine keeps out of sight with Flower's other log lines below
``ERROR`` unless ``verbose=True``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import numpy as np
from torch import Tensor

from fednovelty.exceptions import FederationError
from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.core.base import Message as FedMessage
from fednovelty.federated.registry import algorithm_name, algorithm_settings, build_algorithm
from fednovelty.federated.trust.ledger import PrivacyLedger
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.federated.trust.validation import ReplyValidator
from fednovelty.runtime import loop
from fednovelty.runtime.clients import check_clients, client_rows
from fednovelty.runtime.flower._compat import Context, Grid, MessageType, ServerApp
from fednovelty.runtime.flower.client import PRIVACY_KEYS, policy_from_node_config
from fednovelty.runtime.flower.codec import CodecError, decode_message, encode_message
from fednovelty.runtime.flower.config import ALGORITHM_KEY, PARAMS_KEY, SEED_KEY, EngineConfig
from fednovelty.runtime.flower.server import GridTransport, exchange, register_nodes, wait_for_nodes
from fednovelty.runtime.flower.sim_node import (
    STATE_ACTION,
    ClientTable,
    NodeSettings,
    make_sim_client_app,
)
from fednovelty.runtime.flower.sim_resources import (
    DEFAULT_GPU_MEMORY,
    actor_threads,
    check_resources,
)
from fednovelty.runtime.loop import RoundRecord
from fednovelty.runtime.simulation import SimulationResult, failure_budget

__all__ = [
    "ENGINES",
    "release_actors",
    "run_config_of",
    "run_flower_simulation",
    "run_with_engine",
]

#: the engines a detector's ``ClientSampling.engine`` names.
ENGINES = ("in-process", "flower-sim")
#: seconds the server waits for one round's replies (a round of 10,000 clients on two
#: cores takes minutes).
ROUND_TIMEOUT = 3600.0


def run_config_of(algorithm: FederatedAlgorithm) -> dict[str, Any]:
    """The run config from which every node rebuilds ``algorithm``: its registry name and
    settings JSON, checked to rebuild an algorithm of the same class and settings.

    Raises:
        ValueError: the algorithm is not in the registry (e.g. a wrapper), or its settings
            do not carry over JSON (a custom learner factory), or they rebuild another one.
    """
    name = algorithm_name(algorithm)
    try:
        settings = algorithm_settings(algorithm)
        rebuilt = build_algorithm(name, settings)
    except ValueError as error:
        raise ValueError(
            f"flower-sim runs an algorithm the nodes rebuild from the registry and its "
            f"settings, as a deployment does; {type(algorithm).__name__} cannot be: {error} "
            'Use engine="in-process" (run_simulation).'
        ) from None
    if type(rebuilt) is not type(algorithm) or getattr(rebuilt, "config", None) != getattr(
        algorithm, "config", None
    ):
        raise ValueError(
            f"flower-sim: {type(algorithm).__name__}'s settings rebuild a different "
            f'algorithm ({type(rebuilt).__name__}) on the nodes; use engine="in-process".'
        )
    return {ALGORITHM_KEY: name, PARAMS_KEY: json.dumps(settings), SEED_KEY: 0}


def node_config_of(policy: PrivacyPolicy) -> dict[str, Any]:
    """The node-config keys that give every node ``policy`` (``privacy-min-rows``, ...).

    Raises:
        ValueError: a policy with differential privacy (a node calibrates its noise from
            its own budget keys), or one the keys do not express.
    """
    if policy.dp is not None or policy.dp_sgd is not None:
        raise ValueError(
            "flower-sim does not run differential privacy: a Flower node calibrates its own "
            "noise from its budget (node config dp-epsilon, dp-releases, dp-clip), which a "
            'PrivacyPolicy does not carry. Use engine="in-process", or a deployment.'
        )
    keys = {key: getattr(policy, name) for key, name in PRIVACY_KEYS.items()}
    if policy_from_node_config(keys) != policy:
        raise ValueError(f"flower-sim: the privacy policy {policy} has no node-config form.")
    return keys


def client_table(
    data: Mapping[int, Any], kept: Mapping[int, Mapping[str, Tensor]], labelled: bool
) -> ClientTable:
    """Every client's rows, labels and kept state as numpy, by increasing client id.

    Raises:
        ValueError: a data tuple other than ``(X, y)``, or one for an unlabelled algorithm.
    """
    ids = sorted(data)
    rows, labels = [], []
    for cid in ids:
        item = data[cid]
        parts = item if isinstance(item, tuple | list) else (item,)
        if not all(isinstance(part, Tensor | np.ndarray) for part in parts):
            raise ValueError(
                f"flower-sim: client {cid}'s data is a {type(client_rows(item)).__name__}; "
                "its rows go to the nodes as arrays: give tensors or numpy arrays (rows read "
                'in chunks run on engine="in-process").'
            )
        if isinstance(item, tuple | list):
            if len(item) != 2 or not labelled:
                raise ValueError(
                    f"flower-sim: client {cid}'s data is a tuple of {len(item)}; a Flower "
                    "node holds rows, or (rows, labels) for a labelled algorithm."
                )
            labels.append(_numpy(item[1]))
        rows.append(_numpy(client_rows(item)))
    states = [{k: _numpy(v) for k, v in kept.get(cid, {}).items()} for cid in ids]
    return ClientTable(ids, rows, labels if labelled else None, states)


def _numpy(tensor: Any) -> np.ndarray:
    if isinstance(tensor, Tensor):
        return tensor.detach().cpu().numpy().copy()
    return np.array(tensor)


def collect_states(
    grid: Grid, nodes: Sequence[int], attempt: int, timeout: float
) -> dict[int, dict[str, Tensor]]:
    """Every node's kept client state after the run (one ``query`` each), by client id.

    Raises:
        FederationError: a node that did not answer, or answered with an error.
    """
    content = encode_message(FedMessage("client_state"), attempt=attempt)
    replies = exchange(
        grid,
        dict.fromkeys(nodes, content),
        f"{MessageType.QUERY}.{STATE_ACTION}",
        group_id="states",
        timeout=timeout,
    )
    states: dict[int, dict[str, Tensor]] = {}
    for reply in replies:
        if reply.has_error():
            raise FederationError(f"a node failed to return its state: {reply.error.reason}")
        try:
            message, header = decode_message(reply.content)
        except CodecError as error:
            raise FederationError(f"a node returned an unreadable state: {error}") from None
        states[int(header["client_id"])] = dict(message.tensors)
    if len(states) != len(nodes):
        raise FederationError(
            f"{len(nodes) - len(states)} of {len(nodes)} node(s) did not return their state "
            f"within {timeout:.0f} s."
        )
    return states


def make_sim_server_app(
    algorithm: FederatedAlgorithm,
    engine: EngineConfig,
    outbox: dict[str, Any],
    *,
    n_features: int,
    progress: bool | None,
    callbacks: Sequence[Callable[[RoundRecord], None]],
    description: str | None,
) -> ServerApp:
    """A ServerApp that runs ``algorithm``'s rounds (the loop behind the deployment's
    :class:`GridTransport`), asks every node for its final client state and leaves
    ``state``, ``history`` and ``client_states`` in ``outbox``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        nodes = wait_for_nodes(grid, engine.num_nodes, engine.nodes_timeout)
        client_of: dict[int, int | None] = dict.fromkeys(nodes)
        if engine.fraction < 1.0:  # sampling needs the client ids first
            infos = register_nodes(grid, nodes, engine.round_timeout)
            client_of = {i.node_id: i.client_id for i in infos}
        transport = GridTransport(grid, client_of, engine, np.random.default_rng(engine.seed))
        state, history = loop.run_rounds(
            algorithm,
            transport,
            validator=ReplyValidator(n_features=n_features),
            min_clients=engine.min_clients,
            max_failed_rounds=engine.max_failed_rounds,
            callbacks=callbacks,
            progress=progress,
            description=description,
        )
        outbox["state"], outbox["history"] = state, history
        states = collect_states(grid, nodes, transport.attempt, engine.round_timeout)
        outbox["client_states"] = {c: states[c] for c in sorted(states)}

    return app


#: the ClientApp actors kept between runs on a Ray the caller started: Flower's actor pool
#: under its key (the Ray job's id, the client resources); at most one.
_KEPT: dict[tuple[str, str], Any] = {}


def release_actors() -> int:
    """Stop the ClientApp actors kept for the next run on a Ray the caller started (they
    hold their CPUs until then, or until ``ray.shutdown()``); returns how many."""
    import ray

    stopped = 0
    for pool in _KEPT.values():
        for actor in [*pool.pool, *pool._future_to_actor.values()]:
            with contextlib.suppress(Exception):  # an actor of a Ray already shut down
                ray.kill(actor)
                stopped += 1
    _KEPT.clear()
    return stopped


@contextlib.contextmanager
def ray_session(init_args: Mapping[str, Any]) -> Iterator[bool]:
    """Ray for one run: started with ``init_args`` (Flower's backend stops it and the actors
    at the end) unless it is running already. A running Ray (the caller's) is left running,
    and this run's ClientApp actors are kept for the next run with the same client resources
    (:func:`release_actors` stops them): Flower's backend would stop both after every run,
    and each new actor imports torch, Flower and fednovelty again (seconds). Yields whether
    Ray was running before."""
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if not ray.is_initialized():
        ray.init(**dict(init_args))
        try:
            yield False
        finally:
            if ray.is_initialized():  # a run that failed before Flower's backend stopped it
                ray.shutdown()
        return
    build, job = RayBackend.build, ray.get_runtime_context().get_job_id()

    def keep_build(backend: RayBackend, app_fn: Any) -> None:
        key = (job, json.dumps(backend.client_resources, sort_keys=True))
        if key in _KEPT:
            backend.pool, backend.app_fn = _KEPT[key], app_fn
            return
        release_actors()  # another Ray, or other resources: their CPUs are needed
        build(backend, app_fn)
        _KEPT[key] = backend.pool

    def keep_terminate(backend: RayBackend) -> None:  # Flower's stops the actors and Ray
        pool = backend.pool
        if pool is not None and len(pool.pool) != pool.num_actors:  # ended with actors busy
            release_actors()

    with (
        mock.patch.object(RayBackend, "build", keep_build),
        mock.patch.object(RayBackend, "terminate", keep_terminate),
    ):
        yield True


@contextlib.contextmanager
def quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's logger at ``ERROR`` for the block (its INFO lines, the round log and
    ``run_simulation``'s deprecation line hidden), unless ``verbose``."""
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    if not verbose:
        flwr_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        flwr_logger.setLevel(level)


def _check_run(fraction: float, dropout: float, secure_sum: Any, n_clients: int) -> None:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}.")
    if dropout:
        raise ValueError(
            f"dropout={dropout}: simulated dropout exists only in the in-process engine; a "
            "Flower node answers every message it gets (nodes of a deployment fail for "
            'real). Use engine="in-process" to simulate dropout.'
        )
    if secure_sum not in (None, False):
        raise ValueError(
            "flower-sim does not run secure sums; run them in process (run_simulation's "
            "secure_sum) or on a deployment (run config secure-sum, docs/secure_sums.md)."
        )
    if n_clients < 1:
        raise ValueError("clients is empty; give at least one client's rows.")


def run_flower_simulation(
    algorithm: FederatedAlgorithm,
    clients: Sequence[Tensor] | dict[int, Tensor],
    *,
    fraction: float = 1.0,
    dropout: float = 0.0,
    min_clients: int = 1,
    max_failed_rounds: int | None = None,
    random_state: int = 0,
    progress: bool | None = None,
    callbacks: Sequence[Callable[[RoundRecord], None]] = (),
    description: str | None = None,
    privacy: PrivacyPolicy | None = None,
    client_states: Mapping[int, Mapping[str, Tensor]] | None = None,
    ledgers: Mapping[int, PrivacyLedger] | None = None,
    secure_sum: Any = None,
    batch_clients: bool = True,
    client_resources: Mapping[str, float] | None = None,
    init_args: Mapping[str, Any] | None = None,
    gpu_memory: float = DEFAULT_GPU_MEMORY,
    round_timeout: float = ROUND_TIMEOUT,
    verbose: bool = False,
) -> SimulationResult:
    """Run ``algorithm`` to completion on Flower's Simulation Engine, one virtual SuperNode
    per client (module docstring).

    Args:
        algorithm, clients, fraction, min_clients, max_failed_rounds, random_state,
            progress, callbacks, description, privacy, client_states, ledgers: as
            :func:`fednovelty.runtime.run_simulation`'s (``random_state`` seeds the client
            sampling; callbacks run in the ServerApp's thread).
        dropout: must be 0 (refused otherwise). secure_sum: must be None (refused).
        batch_clients: no effect (each node runs its own client).
        client_resources: Ray's options of one ClientApp actor: ``num_cpus`` (default 1;
            also the actor's torch threads), ``num_gpus`` (default 0), ``memory``.
        init_args: ``ray.init`` arguments (default: this process's cores, no dashboard,
            warnings only); ignored, with a warning, when Ray is already running.
        gpu_memory: GiB one client needs on a GPU (its CUDA context included), to check
            that the actors ``num_gpus`` packs on one GPU fit its memory.
        round_timeout: seconds the server waits for one round's replies.
        verbose: show Flower's log lines (INFO and up).

    Returns:
        :class:`~fednovelty.runtime.simulation.SimulationResult`: the final state, one
        ``RoundRecord`` per round (their metrics add Flower's ``wire_bytes_down`` /
        ``wire_bytes_up``), every client's final state and its ledger (as given: no
        differential privacy runs here).

    Raises:
        ValueError: bad arguments, and what flower-sim refuses (module docstring).
        ClientDataError: unusable client data (names the client). FederationError:
            ``max_failed_rounds`` failed rounds in a row, or nodes that did not answer.
    """
    data = dict(enumerate(clients)) if not isinstance(clients, dict) else dict(clients)
    _check_run(fraction, dropout, secure_sum, len(data))
    labelled = bool(getattr(algorithm, "labelled", False))
    check_clients(data, labelled=labelled)
    asked = len(data) if fraction >= 1.0 else max(1, math.ceil(fraction * len(data)))
    if min_clients > asked:
        raise ValueError(
            f"min_clients={min_clients} but only {asked} of {len(data)} client(s) are asked "
            "each round; lower min_clients or raise fraction."
        )
    policy = PrivacyPolicy() if privacy is None else privacy
    if not isinstance(policy, PrivacyPolicy):
        raise TypeError(f"privacy must be a PrivacyPolicy or None, got {type(privacy).__name__}.")
    run_config = run_config_of(algorithm)
    node_keys = node_config_of(policy)
    table = client_table(data, client_states or {}, labelled)
    engine = EngineConfig(
        min_clients=min_clients,
        max_failed_rounds=failure_budget(0.0) if max_failed_rounds is None else max_failed_rounds,
        fraction=fraction,
        seed=int(random_state),
        round_timeout=round_timeout,
        num_nodes=len(data),
    )
    device = str(getattr(getattr(algorithm, "config", None), "device", "cpu")).split(":")[0]
    outbox: dict[str, Any] = {}
    server_app = make_sim_server_app(
        algorithm,
        engine,
        outbox,
        n_features=int(client_rows(data[table.client_ids[0]]).shape[1]),
        progress=progress,
        callbacks=callbacks,
        description=description or type(algorithm).__name__,
    )
    with quiet_flower(verbose):
        _simulate(server_app, table, run_config, node_keys, client_resources, init_args,
                  gpu_memory, device, not verbose)  # fmt: skip
    spent = ledgers or {}
    return SimulationResult(
        outbox["state"],
        outbox["history"],
        outbox["client_states"],
        {cid: spent.get(cid, PrivacyLedger()) for cid in table.client_ids},
    )


def _simulate(
    server_app: ServerApp,
    table: ClientTable,
    run_config: dict[str, Any],
    node_keys: dict[str, Any],
    client_resources: Mapping[str, float] | None,
    init_args: Mapping[str, Any] | None,
    gpu_memory: float,
    device: str,
    quiet: bool,
) -> None:
    """Check the resources, start Ray (or use the running one), put the client table in
    its object store and run Flower's simulation to the end."""
    import ray
    from flwr.simulation import run_simulation as flower_run_simulation

    running = ray.is_initialized()
    cluster = ray.cluster_resources() if running else {}
    if running and len(ray.nodes()) > 1:
        raise ValueError(
            "flower-sim holds the clients' rows in this machine's object store; the running "
            "Ray cluster has several nodes, whose actors would read rows from elsewhere. "
            "Give each node its own files (a deployment, data-path)."
        )
    resources, args, _ = check_resources(
        client_resources,
        init_args,
        ray_running=running,
        ray_cpus=cluster.get("CPU"),
        ray_gpus=cluster.get("GPU", 0.0) if running else None,
        gpu_memory=gpu_memory,
        device=device,
    )
    with ray_session(args):
        reference = ray.put(table)
        settings = NodeSettings(
            key=uuid.uuid4().hex,
            reference=reference,
            run_config=run_config,
            node_config=node_keys,
            threads=actor_threads(resources["num_cpus"]),
            quiet=quiet,
        )
        try:
            flower_run_simulation(
                server_app=server_app,
                client_app=make_sim_client_app(settings),
                num_supernodes=len(table.client_ids),
                backend_name="ray",
                backend_config={"client_resources": resources, "init_args": args},
            )
        finally:
            del reference


def run_with_engine(engine: str, algorithm: FederatedAlgorithm, clients: Any, **options: Any):
    """``run_simulation`` (``engine="in-process"``) or :func:`run_flower_simulation`
    (``"flower-sim"``) with the same arguments.

    Raises:
        ValueError: an unknown engine.
    """
    if engine == "in-process":
        from fednovelty.runtime.simulation import run_simulation

        return run_simulation(algorithm, clients, **options)
    if engine == "flower-sim":
        return run_flower_simulation(algorithm, clients, **options)
    raise ValueError(f"engine must be one of {list(ENGINES)}; got {engine!r}.")
