"""A Flower node decides what protects it, never the server: the secure sum's threshold and
fewest senders come from the node's own ``node_config`` (a server asking for less is refused
by name), a node in distributed-DP mode answers no round that does not come through a
secure sum, and a node's stochastic rounding comes from fresh OS entropy (the run config
seeds nothing of it).

Every node is a ClientApp call in this process (``_flower_grid.InProcessGrid``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from _flower_grid import InProcessGrid
from flwr.app import Context, RecordDict
from flwr.app import Message as FlowerMessage

from fednovelty.exceptions import FederationError
from fednovelty.federated.trust.dp_calibration import calibrate_noise
from fednovelty.runtime.flower.client import make_client_app
from fednovelty.runtime.flower.codec import decode_fields, decode_message, encode_fields
from fednovelty.runtime.flower.codec import encode_message as encode
from fednovelty.runtime.flower.config import (
    EngineConfig,
    algorithm_from_run_config,
    secure_from_run_config,
)
from fednovelty.runtime.flower.server import run_rounds
from fednovelty.runtime.secure_rounds import COMBINED_ID

EPSILON, RELEASES, CLIP, SEED, MAX_ROWS = 1.0, 10, 3.0, 3, 400
Z = calibrate_noise(EPSILON, 1e-5, RELEASES)
PARAMS = {
    "n_components": 2,
    "bounds": [[-6.0] * 3, [8.0] * 3],
    "standardize": True,  # a private moments round first
    "dp_mode": "distributed",
    "dp_noise_multiplier": Z,
    "dp_clip": CLIP,
    "max_iter": 1,
    "kmeans_rounds": 1,
    "random_state": 0,
}


@pytest.fixture(autouse=True, scope="module")
def task_identity():
    from flwr.supercore.task_identity import TaskIdentity

    with pytest.MonkeyPatch.context() as patch:
        for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
            patch.setattr(TaskIdentity, name, value)
        yield


def _parts(m: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(i, 1.0, (200 + 50 * i, 3)) for i in range(m)]


def _run_config(secure: bool = True, **keys) -> dict:
    config = {"algorithm": "FederatedEM", "algorithm-params": json.dumps(PARAMS)}
    if secure:
        config |= {"secure-sum": True, "secure-max-rows": MAX_ROWS}
    return {**config, **keys}


def _grid(run_config: dict, m: int = 3, mode: str = "distributed", **node) -> InProcessGrid:
    parts = _parts(m)

    def load(context):
        c = int(context.node_config["partition-id"])
        return c, parts[c]

    def config(c: int) -> dict:
        return {"partition-id": c, "dp-epsilon": EPSILON, "dp-releases": RELEASES,
                "dp-clip": CLIP, "dp-mode": mode, "dp-clients": m, "dp-insecure-seed": SEED,
                **node}  # fmt: skip

    contexts = {
        1000 + 7 * c: Context(1, 1000 + 7 * c, config(c), RecordDict(), run_config)
        for c in range(m)
    }
    return InProcessGrid(make_client_app(load), contexts)


def _ask(grid, node: int, message_type: str, content: RecordDict) -> FlowerMessage:
    message = FlowerMessage(content, dst_node_id=node, message_type=message_type, group_id="1")
    (i,) = grid.push_messages([message])
    (reply,) = grid.pull_messages([i])
    return reply


def _relay(grid, threshold: int) -> RecordDict:
    """Step 1 on every node of ``grid``; the step-2 relay of their keys asking for
    ``threshold``."""
    keys = {}
    for node in sorted(grid.contexts):
        reply = _ask(grid, node, "query.secagg_keys", encode_fields({}, round=1, attempt=0))
        fields, header = decode_fields(reply.content)
        keys[int(header["client_id"])] = fields
    clients = sorted(keys)
    relay = {
        "clients": clients,
        "mask_publics": [keys[c]["mask_public"] for c in clients],
        "encryption_publics": [keys[c]["encryption_public"] for c in clients],
        "threshold": threshold,
    }
    return encode_fields(relay, round=1, attempt=0)


def _refusal(reply) -> str:
    assert reply.has_error(), "the node answered where it must refuse"
    return reply.error.reason


# ----------------------------------------------------------------- the threshold
def test_a_node_refuses_a_threshold_below_a_majority_of_the_nodes_it_was_told_of():
    """Five nodes and a server run config asking ``secure-threshold = 0.01`` (t = 2): with
    t = 2 a server that tells the nodes different sender lists rebuilds every key but one
    node's and unmasks that node's reply alone; each node asks for a majority, 3 of 5."""
    grid = _grid(_run_config(**{"secure-threshold": 0.01}), m=5)
    relay = _relay(grid, threshold=2)
    for node in sorted(grid.contexts):
        reason = _refusal(_ask(grid, node, "query.secagg_shares", relay))
        assert "threshold-below-node-floor" in reason and "t=2" in reason and "3" in reason
    accepted = _ask(grid, 1000, "query.secagg_shares", _relay(grid, threshold=3))
    assert not accepted.has_error()


def test_a_node_config_threshold_and_fewest_senders_are_the_nodes_floor():
    grid = _grid(_run_config(), m=3, **{"secure-threshold": 0.9})
    reason = _refusal(_ask(grid, 1000, "query.secagg_shares", _relay(grid, threshold=2)))
    assert "threshold-below-node-floor" in reason
    grid = _grid(_run_config(), m=3, **{"secure-min-senders": 4})
    reason = _refusal(_ask(grid, 1000, "query.secagg_shares", _relay(grid, threshold=3)))
    assert "too-few-nodes" in reason


def test_a_run_whose_server_asks_less_than_the_nodes_floor_stops_with_their_reasons():
    run_config = _run_config(**{"secure-threshold": 0.01})
    grid = _grid(run_config, m=5)
    algorithm = algorithm_from_run_config(run_config)
    with pytest.raises(FederationError, match="threshold-below-node-floor"):
        run_rounds(
            grid,
            algorithm,
            EngineConfig(max_failed_rounds=1),
            secure=secure_from_run_config(run_config),
        )


# ----------------------------------------------------------------- distributed mode
def _plain_round(grid, node: int) -> FlowerMessage:
    algorithm = algorithm_from_run_config(next(iter(grid.contexts.values())).run_config)
    broadcast = algorithm.configure(algorithm.start())
    reply = _ask(grid, node, "train", encode(broadcast, round=1, attempt=0))
    assert not reply.has_error()
    message, _ = decode_message(reply.content)
    return message


def test_a_distributed_node_answers_no_round_outside_a_secure_sum():
    """A node that adds 1/m of the noise answers a plain round with a skipped reply: its
    reply alone would carry z / sqrt(m), not the z its budget was charged for."""
    grid = _grid(_run_config(secure=False), m=3)
    message = _plain_round(grid, 1000)
    assert message.scalars.get("skipped") is True and not message.tensors
    assert "plain-round-in-distributed-mode" in message.scalars["reason"]
    local = _grid(_run_config(secure=False), m=3, mode="local")
    assert not _plain_round(local, 1000).scalars.get("skipped", False)


def test_a_plain_run_of_distributed_nodes_stops_with_their_reason():
    run_config = _run_config(secure=False)
    grid = _grid(run_config, m=3)
    with pytest.raises(FederationError, match="plain-round-in-distributed-mode"):
        run_rounds(grid, algorithm_from_run_config(run_config), EngineConfig(max_failed_rounds=1))


# ----------------------------------------------------------------- rounding
def test_the_run_config_seeds_no_rounding():
    with pytest.raises(ValueError, match="secure-seed"):
        secure_from_run_config(_run_config(**{"secure-seed": 2}))
    combined = []
    for _ in range(2):  # the same run config (its seed 0 included), the same DP noise
        run_config = _run_config(**{"secure-bits": 16})
        grid = _grid(run_config, m=3)
        algorithm = algorithm_from_run_config(run_config)
        seen = []
        step = algorithm.server_step

        def server_step(state, replies, seen=seen, step=step):
            seen.append({k: v.clone() for k, v in replies[COMBINED_ID].tensors.items()})
            return step(state, replies)

        algorithm.server_step = server_step
        run_rounds(grid, algorithm, EngineConfig(), secure=secure_from_run_config(run_config))
        combined.append(seen[0])
    assert any(not torch.equal(combined[0][k], combined[1][k]) for k in combined[0])
