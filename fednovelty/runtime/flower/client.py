"""The node side: a ClientApp that runs an algorithm's client step on the node's own rows.

Flower starts a fresh ClientApp process for every message, so nothing survives in Python
between two rounds. What must survive, the client's ``ClientContext.state`` (e.g. its
personal mixture weights), is kept in the node's ``context.state``, which the SuperNode
stores per run and hands to the next ClientApp process. The algorithm is rebuilt from the
run's configuration for every message (cheap), and the node's rows are read again.

Two message types are answered:

``train`` (one round)
    the decoded fednovelty message goes through ``algorithm.client_step``; the reply goes
    back encoded, tagged with the client id (``partition-id``) and the row width. In a
    secure-sum run (run config ``secure-sum``) the message also carries the protocol's
    relayed shares, and the released reply goes back masked
    (:func:`~fednovelty.runtime.flower.secure_node.mask_reply`). A node whose DP mode is
    ``"distributed"`` answers a round without them with a skipped reply (its reply alone
    would carry ``1/m`` of the noise variance;
    :func:`~fednovelty.runtime.flower.secure_node.plain_round_refusal`).
``query`` (registration, only when the server samples clients)
    the client id, row count and row width of the node's data.

and, in a secure-sum run, the protocol's other steps (``query.secagg_keys``,
``query.secagg_shares``, ``query.secagg_reveal``: :mod:`fednovelty.runtime.flower.secure_node`),
whose secrets the node keeps in its ``context.state`` between messages; the least threshold
and fewest senders it takes part with are its own node config's (``secure-threshold``,
``secure-min-senders``), never the server's.

The node enforces its own privacy policy in every client step, whatever the server asks:
:func:`policy_from_node_config` reads it from the node's ``node_config`` (``privacy-min-rows``,
``privacy-allow-raw-rows``, ``privacy-max-clusters``; set by whoever starts the SuperNode),
never from the server's run config (``docs/privacy.md``).

Where the rows come from is a function of the Flower ``Context`` (:func:`load_node_data` by
default: ``node_config`` ``data-path``, or a shared ``run_config`` ``data-path`` split by
``partition-id``); pass your own to :func:`make_client_app`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fednovelty.exceptions import ClientDataError
from fednovelty.federated import Message as FedMessage
from fednovelty.federated.core.base import skipped_reply
from fednovelty.federated.trust.dp import DPPolicy
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.federated.trust.dp_sgd import DPSGDSettings, calibrate_learning, release_blocks
from fednovelty.federated.trust.gate import client_context, terms_of
from fednovelty.federated.trust.privacy import PrivacyPolicy
from fednovelty.runtime.clients import check_clients, client_rows
from fednovelty.runtime.flower._compat import ClientApp, Context, Message
from fednovelty.runtime.flower.codec import (
    SECAGG,
    decode_message,
    encode_message,
    load_client_state,
    store_client_state,
)
from fednovelty.runtime.flower.config import algorithm_from_run_config
from fednovelty.runtime.flower.ledger import dataset_key, load_node_ledger, store_node_ledger
from fednovelty.runtime.flower.secure_node import (
    KEYS_ACTION,
    REVEAL_ACTION,
    SHARES_ACTION,
    handle_keys,
    handle_reveal,
    handle_shares,
    mask_reply,
    plain_round_refusal,
)
from fednovelty.runtime.threads import run_client_step

#: what a data loader returns: ``(client_id, rows)`` with rows a numpy array
#: (n_samples, n_features), or ``(rows, labels)`` for the joint model.
NodeData = tuple[int, Any]
DataLoader = Callable[[Context], NodeData]


def read_rows(path: str | os.PathLike, label_column: str = "") -> Any:
    """Rows of one file: ``.npy`` (2-D), ``.npz`` (``X`` and optional ``y``) or ``.csv``.

    A CSV has a header row; every column is a feature except ``label_column`` (if given),
    which becomes the labels. Returns ``X`` (n_samples, n_features), or ``(X, y)`` when the
    file has labels.

    Raises:
        FileNotFoundError: no such file. ClientDataError: unknown extension or not 2-D.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"node data file {str(path)!r} does not exist.")
    labels = None
    if path.suffix == ".npy":
        rows = np.load(path, allow_pickle=False)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            if "X" not in archive:
                raise ClientDataError(f"{path}: an .npz node file needs an array named 'X'.")
            rows = archive["X"]
            labels = archive["y"] if "y" in archive else None
    elif path.suffix == ".csv":
        import pandas as pd

        frame = pd.read_csv(path)
        if label_column:
            if label_column not in frame:
                raise ClientDataError(f"{path}: no label column {label_column!r}.")
            labels = frame.pop(label_column).to_numpy()
        rows = frame.to_numpy(dtype=np.float64)
    else:
        raise ClientDataError(f"{path}: node data must be .npy, .npz or .csv, not {path.suffix!r}.")
    if rows.ndim != 2:
        raise ClientDataError(
            f"{path}: rows must be 2-D (n_samples, n_features), got {rows.shape}."
        )
    return rows if labels is None else (rows, labels)


def _split(data: Any, part: int, n_parts: int) -> Any:
    """Partition ``part`` of ``n_parts`` contiguous, near-equal blocks of rows
    (``numpy.array_split``) of ``X`` or ``(X, y)``."""
    if isinstance(data, tuple):
        return tuple(_split(d, part, n_parts) for d in data)
    return np.array_split(data, n_parts)[part]


def load_node_data(context: Context) -> NodeData:
    """The default loader: ``(client_id, rows)`` of this node from its configuration.

    The client id is ``node_config["partition-id"]`` (Flower's convention; the simulation's
    client index, which seeds the client's randomness). The rows come from
    ``node_config["data-path"]`` (this node's own file) if set, else from
    ``run_config["data-path"]`` (one shared file) split into ``num-partitions`` contiguous
    blocks (``numpy.array_split``), block ``partition-id``. Files are read by
    :func:`read_rows`; ``run_config["label-column"]`` names a CSV's label column.

    Raises:
        ClientDataError: no ``partition-id``, or no data path anywhere.
    """
    node, run = context.node_config, context.run_config
    if "partition-id" not in node:
        raise ClientDataError(
            "this node has no 'partition-id' in its node config; start it with "
            'flower-supernode ... --node-config "partition-id=0 data-path=/path/rows.npy".'
        )
    client_id = int(node["partition-id"])
    label_column = str(run.get("label-column", ""))
    if str(node.get("data-path", "")):
        return client_id, read_rows(str(node["data-path"]), label_column)
    if str(run.get("data-path", "")):
        if "num-partitions" not in node:
            raise ClientDataError(
                "a shared run_config 'data-path' is split by 'partition-id' and "
                "'num-partitions'; this node's config has no 'num-partitions'."
            )
        data = read_rows(str(run["data-path"]), label_column)
        return client_id, _split(data, client_id, int(node["num-partitions"]))
    raise ClientDataError(
        f"client {client_id}: no data; set 'data-path' in the node config (this node's file) "
        "or in the run config (one file split by partition-id)."
    )


def _as_tensors(data: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """Rows as the algorithm's dtype/device; labels (joint model) as int64 codes."""
    if isinstance(data, tuple):
        X, y = data[0], data[1]
        return (_as_tensors(X, dtype, device), torch.as_tensor(np.asarray(y), device=device).long())
    return torch.as_tensor(np.asarray(data, dtype=np.float64)).to(device=device, dtype=dtype)


def node_inputs(context: Context, load_data: DataLoader):
    """``(algorithm, client_id, client data as tensors)`` for one message on this node. The
    algorithm's ``"auto"`` settings are resolved with the width of the node's rows
    (:func:`~fednovelty.runtime.flower.config.resolve_width`).

    Raises:
        ClientDataError: the rows are not finite 2-D numbers.
    """
    client_id, raw = load_data(context)
    rows = np.asarray(raw[0] if isinstance(raw, tuple) else raw)
    if rows.ndim != 2:
        raise ClientDataError(
            f"client {client_id}: rows must be 2-D (n_samples, n_features), got shape "
            f"{rows.shape}; check the node's data loader."
        )
    algorithm = algorithm_from_run_config(context.run_config, n_features=int(rows.shape[1]))
    dtype = getattr(algorithm, "dtype", torch.float64)
    device = getattr(algorithm, "device", torch.device("cpu"))
    labelled = bool(getattr(algorithm, "labelled", False))
    if labelled and not isinstance(raw, tuple):
        raise ClientDataError(
            f"client {client_id}: {type(algorithm).__name__} needs labels; give an .npz with "
            "'X' and 'y' or a CSV with run_config 'label-column'."
        )
    data = _as_tensors(raw, dtype, device)
    check_clients({client_id: data}, labelled=labelled)
    return algorithm, int(client_id), data


#: node_config keys of the node's privacy policy (the node owner's setting, never the
#: server's run config) and the ``PrivacyPolicy`` field each sets.
PRIVACY_KEYS: dict[str, str] = {
    "privacy-min-rows": "min_rows",
    "privacy-allow-raw-rows": "allow_raw_rows",
    "privacy-max-clusters": "max_clusters",
}


def _config_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ClientDataError(f"node config {key!r} must be true or false, got {value!r}.")


def _config_int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise ClientDataError(f"node config {key!r} must be a positive integer, got {value!r}.")


def policy_from_node_config(node_config: Mapping[str, Any]) -> PrivacyPolicy:
    """This node's privacy policy from its ``node_config`` (``PRIVACY_KEYS``; a key not set
    keeps ``PrivacyPolicy``'s default: 5 rows behind every statistic, no raw rows, at most
    64 local clusters). Set by the node's owner, e.g. ``flower-supernode ... --node-config
    "partition-id=0 data-path='rows.npy' privacy-min-rows=10"``.

    Raises:
        ClientDataError: a value of the wrong type or out of range, naming the key.
    """
    fields: dict[str, Any] = {}
    for key, name in PRIVACY_KEYS.items():
        if key in node_config:
            value = node_config[key]
            parse = _config_bool if name == "allow_raw_rows" else _config_int
            fields[name] = parse(key, value)
    try:
        dp, sgd = _node_dp(node_config)
        return PrivacyPolicy(**fields, dp=dp, dp_sgd=sgd)
    except (TypeError, ValueError) as error:
        raise ClientDataError(f"this node's privacy settings are invalid: {error}") from None


#: node_config keys of the node's differential-privacy policy (``DP_KEYS`` required together).
DP_KEYS = ("dp-epsilon", "dp-releases", "dp-clip")
#: node_config keys of the node's DP-SGD for learners it sends (``dp-sgd-steps`` switches it
#: on; the others have defaults).
DP_SGD_KEYS = ("dp-sgd-steps", "dp-sample-rate", "dp-sgd-clip", "dp-learner-rounds")


def dp_from_node_config(node_config: Mapping[str, Any]) -> DPPolicy | None:
    """This node's differential-privacy policy (``None`` without ``dp-epsilon``): the node
    calibrates its own noise from its budget (``dp-epsilon``, ``dp-delta`` default 1e-5) over
    the most rounds it will answer (``dp-releases``), clips rows to ``dp-clip`` and adds the
    noise of ``dp-mode`` (``"local"`` default; ``"distributed"`` with ``dp-clients``), e.g.
    ``--node-config "... dp-epsilon=1.0 dp-releases=44 dp-clip=4.7"``. The server's run
    config must carry the same ``dp_mode`` and clipping (its settings). The node's ledger
    charges every release by its cost and refuses the one that would take it past
    ``dp-epsilon``, whatever the server asks (more rounds than planned, costlier rounds, a
    new attempt or run). ``dp-insecure-seed`` (tests only) draws the noise from a seed,
    reproducible by whoever knows it: such a node has no privacy guarantee.

    Raises:
        ClientDataError: a key missing beside the others or a value out of range.
    """
    return _node_dp(node_config)[0]


def _node_dp(node_config: Mapping[str, Any]) -> tuple[DPPolicy | None, DPSGDSettings | None]:
    """:func:`dp_from_node_config` and, with ``dp-sgd-steps`` (the steps of one round), the
    node's DP-SGD for the learners it sends: Poisson rate ``dp-sample-rate`` (default 0.05),
    gradient clip ``dp-sgd-clip`` (1.0), public divisor of a step's noisy sum
    ``dp-sgd-batch`` (32), over ``dp-learner-rounds`` of its releases (default all),
    ``dp-learner-share`` of the budget (0.5); ``z`` and ``sigma`` are then calibrated together
    (:func:`~fednovelty.federated.trust.dp_sgd.calibrate_learning`)."""
    if not any(key.startswith("dp-") for key in node_config):
        return None, None
    missing = [key for key in DP_KEYS if key not in node_config]
    if missing:
        raise ClientDataError(f"this node's differential privacy needs {missing} too.")
    try:
        epsilon = float(node_config["dp-epsilon"])
        delta = float(node_config.get("dp-delta", 1e-5))
        clip = float(node_config["dp-clip"])
    except (TypeError, ValueError):
        raise ClientDataError("dp-epsilon, dp-delta and dp-clip must be numbers.") from None
    releases = _config_int("dp-releases", node_config["dp-releases"])
    clients = _config_int("dp-clients", node_config.get("dp-clients", 1))
    seed = node_config.get("dp-insecure-seed")
    sgd = None
    if "dp-sgd-steps" in node_config:
        steps = _config_int("dp-sgd-steps", node_config["dp-sgd-steps"])
        rounds = _config_int("dp-learner-rounds", node_config.get("dp-learner-rounds", releases))
        try:
            rate = float(node_config.get("dp-sample-rate", 0.05))
            sgd_clip = float(node_config.get("dp-sgd-clip", 1.0))
            share = 1.0 - float(node_config.get("dp-learner-share", 0.5))
        except (TypeError, ValueError):
            raise ClientDataError(
                "dp-sample-rate, dp-sgd-clip and dp-learner-share must be numbers."
            ) from None
        blocks = release_blocks(releases, rounds)
        z, sigma = calibrate_learning(epsilon, delta, blocks, rounds * steps, rate, share)
        batch = float(node_config.get("dp-sgd-batch", 32.0))  # the public divisor
        sgd = DPSGDSettings(sigma, sgd_clip, rate, steps, expected_batch=batch)
    else:
        z = calibrate_noise(epsilon, delta, releases)
    dp = DPPolicy(
        z,
        clip,
        str(node_config.get("dp-mode", "local")),
        clients,
        epsilon=epsilon,
        delta=delta,
        insecure_seed=None if seed is None else _config_int("dp-insecure-seed", seed),
    )
    return dp, sgd


def handle_train(message: Message, context: Context, load_data: DataLoader = load_node_data):
    """Run one client step on this node's rows; persist its state; reply (a skipped reply,
    the step not run, for a round its DP mode refuses outside a secure sum)."""
    algorithm, client_id, data = node_inputs(context, load_data)
    request, header = decode_message(message.content)
    attempt = int(header.get("attempt", 0))  # a restarted run starts from empty states
    policy = policy_from_node_config(context.node_config)
    refusal = plain_round_refusal(policy.dp, message.content)
    if refusal is not None:  # nothing computed, nothing charged
        reply = skipped_reply(request.kind, refusal)
        header = {"client_id": client_id, "n_features": int(client_rows(data).shape[1])}
        return Message(encode_message(reply, **header), reply_to=message)
    key = dataset_key(data) if policy.dp is not None else ""
    # the node's ledger, not the run's: no attempt or run resets it
    ledger = load_node_ledger(context, key) if policy.dp is not None else None
    state = load_client_state(context.state, attempt)
    client = client_context(client_id, state, policy, wire=True, ledger=ledger)
    reply = run_client_step(algorithm, data, request, client)
    store_client_state(context.state, client.state, attempt)
    if policy.dp is not None:
        store_node_ledger(context, key, terms_of(client).ledger)
    if SECAGG in message.content.config_records:  # a secure-sum round: reply masked
        reply = mask_reply(algorithm, request, reply, message.content, context)
    header = {"client_id": client_id, "n_features": int(client_rows(data).shape[1])}
    return Message(encode_message(reply, **header), reply_to=message)


def handle_query(message: Message, context: Context, load_data: DataLoader = load_node_data):
    """Register: reply this node's client id, row count and row width."""
    _, client_id, data = node_inputs(context, load_data)
    X = client_rows(data)
    info = FedMessage(
        "describe",
        scalars={"n_samples": int(X.shape[0]), "n_features": int(X.shape[1])},
    )
    return Message(encode_message(info, client_id=client_id), reply_to=message)


def make_client_app(load_data: DataLoader = load_node_data) -> ClientApp:
    """A ClientApp answering fednovelty's ``train`` and ``query`` messages and the
    secure-sum protocol's queries (:data:`~fednovelty.runtime.flower.secure.ACTIONS`).

    Args:
        load_data: ``Context -> (client_id, rows)`` (rows: numpy (n_samples, n_features), or
            ``(X, y)`` for an algorithm whose ``labelled`` is true, e.g. ``JointFedGMM``);
            default :func:`load_node_data`.
    """
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        return handle_train(message, context, load_data)

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return handle_query(message, context, load_data)

    @app.query(KEYS_ACTION)
    def secure_keys(message: Message, context: Context) -> Message:
        return handle_keys(message, context, load_data(context)[0])

    @app.query(SHARES_ACTION)
    def secure_shares(message: Message, context: Context) -> Message:
        return handle_shares(message, context)

    @app.query(REVEAL_ACTION)
    def secure_reveal(message: Message, context: Context) -> Message:
        return handle_reveal(message, context)

    return app
