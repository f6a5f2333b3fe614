"""A Flower node's privacy ledger (``fednovelty.runtime.flower.ledger``): kept by the node for
the rows it serves, across attempts (which the server's header announces) and runs, and never
read as empty when damaged."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.supercore.task_identity import TaskIdentity

from fednovelty.exceptions import ClientDataError
from fednovelty.federated.mixtures.em import FederatedEM
from fednovelty.federated.trust.ledger import PrivacyLedger
from fednovelty.runtime.flower.client import handle_train
from fednovelty.runtime.flower.codec import decode_message, encode_message
from fednovelty.runtime.flower.ledger import (
    LedgerNotPersistedWarning,
    dataset_key,
    load_node_ledger,
    store_node_ledger,
)

PARAMS = {
    "n_components": 2,
    "weights_init": [0.5, 0.5],
    "means_init": [[-1.0, 0.0], [1.0, 0.0]],
    "precisions_init": [np.eye(2).tolist()] * 2,
    "dp_mode": "local",
    "dp_noise_multiplier": 1.0,
    "dp_clip": 3.0,
}
ROWS = np.random.default_rng(0).normal(size=(40, 2))


@pytest.fixture
def identity(monkeypatch):
    for name, value in (("_run_id", 1), ("_node_id", 5), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _node(folder) -> dict:
    """A node whose budget is two releases of its calibration (dp-releases=2)."""
    return {
        "partition-id": 0,
        "dp-epsilon": 1.0,
        "dp-releases": 2,
        "dp-clip": 3.0,
        "dp-mode": "local",
        "dp-ledger-dir": str(folder),
    }


def _algorithm() -> FederatedEM:
    return FederatedEM(**{k: np.asarray(v) if k.endswith("init") else v for k, v in PARAMS.items()})


def _train(context: Context, attempt: int, rows: np.ndarray = ROWS):
    """The node's reply to the first EM round, in ``attempt`` of the run."""
    algorithm = _algorithm()
    broadcast = algorithm.configure(algorithm.start())
    message = FlowerMessage(
        encode_message(broadcast, attempt=attempt), dst_node_id=5, message_type="train"
    )
    message.metadata.__dict__["_message_id"] = f"m{attempt}"
    reply, _ = decode_message(handle_train(message, context, lambda _: (0, rows)).content)
    return reply


def _run_config() -> dict:
    return {"algorithm": "FederatedEM", "algorithm-params": json.dumps(PARAMS)}


def test_a_new_attempt_or_run_starts_from_what_the_node_spent(identity, tmp_path):
    """Two releases, then a new attempt of the run (the server's header) and a new run on
    the same rows: the node refuses the third release. Before, a new attempt loaded an empty
    state and released again."""
    context = Context(1, 5, _node(tmp_path), RecordDict(), _run_config())
    assert not _train(context, attempt=0).scalars.get("skipped")
    assert not _train(context, attempt=1).scalars.get("skipped")  # a restarted run
    refused = _train(context, attempt=2)
    assert refused.scalars["skipped"] and "budget is spent" in refused.scalars["reason"]
    fresh_run = Context(2, 5, _node(tmp_path), RecordDict(), _run_config())
    again = _train(fresh_run, attempt=0)
    assert again.scalars["skipped"] and "budget is spent" in again.scalars["reason"]
    other_rows = Context(3, 5, _node(tmp_path), RecordDict(), _run_config())
    assert not _train(other_rows, attempt=0, rows=ROWS + 1.0).scalars.get("skipped")


def test_the_ledger_only_grows_and_a_damaged_file_stops_the_node(tmp_path):
    key = dataset_key(np.zeros((3, 2)))
    assert key != dataset_key(np.ones((3, 2))) and len(key) == 64
    context = Context(1, 5, {"dp-ledger-dir": str(tmp_path)}, RecordDict(), {})
    spent = PrivacyLedger().after(0.5).after(0.25)
    store_node_ledger(context, key, spent)
    assert (
        load_node_ledger(Context(2, 5, {"dp-ledger-dir": str(tmp_path)}, RecordDict(), {}), key)
        == spent
    )
    # a state that lags the file (or the other way round) reads the larger record
    store_node_ledger(
        Context(3, 5, {"dp-ledger-dir": str(tmp_path)}, RecordDict(), {}),
        key,
        PrivacyLedger().after(0.1),
    )
    assert load_node_ledger(context, key).gaussian == pytest.approx(0.75)
    (tmp_path / f"{key}.safetensors").write_bytes(b"not a ledger")
    with pytest.raises(ClientDataError, match="cannot be read"):
        load_node_ledger(Context(4, 5, {"dp-ledger-dir": str(tmp_path)}, RecordDict(), {}), key)


def test_a_node_without_a_ledger_folder_warns(tmp_path):
    context = Context(1, 5, {}, RecordDict(), {})
    with pytest.warns(LedgerNotPersistedWarning, match="this run only"):
        store_node_ledger(context, "k", PrivacyLedger().after(0.5))
    assert load_node_ledger(context, "k").gaussian == 0.5
