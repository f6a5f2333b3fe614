"""A Flower node's privacy ledger, kept by the node for the dataset it serves.

What a node has released under differential privacy (:class:`~fednovelty.federated.trust.ledger.
PrivacyLedger`) is the node's, not the run's: it is keyed by a SHA-256 digest of the node's
rows (:func:`dataset_key`), kept in the node's ``context.state`` outside the run's client
state (a new attempt of the run, which the server's header announces, starts the algorithm's
state afresh but never the ledger), and saved to a file in the node's ledger folder, so
that a new run on the same rows starts from what was already spent. The folder is the
node's own setting ``dp-ledger-dir`` (``--node-config``), by default ``<data-path>.ledger``
beside the node's data file; a node with neither keeps the ledger for the run only and
warns (:class:`LedgerNotPersistedWarning`).

A ledger only grows: on load the node takes, entry by entry, the larger of what its state
and its file hold, and a damaged file stops the node (it is never read as an empty ledger).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from flwr.app import Context
from safetensors.torch import load_file, save_file
from torch import Tensor

from fednovelty.exceptions import ClientDataError
from fednovelty.federated.trust.ledger import PrivacyLedger, ledger_from_tensors, ledger_to_tensors
from fednovelty.runtime.flower.codec import record_to_tensors, tensors_to_record

#: the prefix of the ledger's record in the node's ``context.state``.
LEDGER_RECORD = "fednovelty.ledger."


class LedgerNotPersistedWarning(UserWarning):
    """A node under differential privacy has nowhere to save its ledger (no
    ``dp-ledger-dir`` and no ``data-path``): it is kept for this run only, and a new run on
    the same rows starts from zero."""


def dataset_key(data: Any) -> str:
    """A SHA-256 hex digest of a client's data: its rows, or every tensor of a labelled
    tuple, with their shapes and dtypes."""
    digest = hashlib.sha256()
    parts = data if isinstance(data, tuple | list) else (data,)
    for part in parts:
        tensor = torch.as_tensor(part).detach().cpu().contiguous()
        digest.update(f"{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def ledger_dir(node_config: Mapping[str, Any]) -> Path | None:
    """The node's ledger folder: ``dp-ledger-dir``, else ``<data-path>.ledger``, else
    ``None``."""
    folder = str(node_config.get("dp-ledger-dir", ""))
    if folder:
        return Path(folder)
    data = str(node_config.get("data-path", ""))
    return Path(data + ".ledger") if data else None


def _larger(a: PrivacyLedger, b: PrivacyLedger) -> PrivacyLedger:
    """Entry by entry the larger of two records of one ledger."""
    steps = dict(a.sgd)
    for key, count in b.sgd.items():
        steps[key] = max(steps.get(key, 0), count)
    return PrivacyLedger(max(a.gaussian, b.gaussian), steps, max(a.releases, b.releases))


def _read_file(path: Path) -> PrivacyLedger | None:
    if not path.exists():
        return None
    try:
        return ledger_from_tensors(load_file(str(path)))
    except Exception as error:  # a damaged ledger is never read as an empty one
        raise ClientDataError(
            f"this node's privacy ledger {str(path)!r} cannot be read ({error}); restore it "
            "from a backup. Deleting it would forget what the node has released."
        ) from None


def load_node_ledger(context: Context, key: str) -> PrivacyLedger:
    """The node's ledger for the dataset ``key``: the larger of its state's and its file's.

    Raises:
        ClientDataError: a damaged ledger in the state or the file.
    """
    ledger = PrivacyLedger()
    name = LEDGER_RECORD + key
    if name in context.state.array_records:
        tensors: dict[str, Tensor] = record_to_tensors(context.state.array_records[name])
        try:
            ledger = ledger_from_tensors(tensors)
        except ValueError as error:
            raise ClientDataError(f"this node's privacy ledger is damaged: {error}") from None
    folder = ledger_dir(context.node_config)
    if folder is not None:
        stored = _read_file(folder / f"{key}.safetensors")
        if stored is not None:
            ledger = _larger(ledger, stored)
    return ledger


def store_node_ledger(context: Context, key: str, ledger: PrivacyLedger) -> None:
    """Keep ``ledger`` in the node's state and, where the node has a ledger folder, in its
    file (written to a temporary file and renamed, so a crash leaves the old one)."""
    tensors = ledger_to_tensors(ledger)
    context.state[LEDGER_RECORD + key] = tensors_to_record(tensors)
    folder = ledger_dir(context.node_config)
    if folder is None:
        warnings.warn(
            "this node releases under differential privacy but has no dp-ledger-dir or "
            "data-path: its privacy ledger is kept for this run only.",
            LedgerNotPersistedWarning,
            stacklevel=2,
        )
        return
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.safetensors"
    temporary = folder / f".{key}.{os.getpid()}.tmp"
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(temporary))
    os.replace(temporary, path)


__all__ = [
    "LEDGER_RECORD",
    "LedgerNotPersistedWarning",
    "dataset_key",
    "ledger_dir",
    "load_node_ledger",
    "store_node_ledger",
]
