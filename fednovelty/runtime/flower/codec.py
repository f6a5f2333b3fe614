"""Codec between fednovelty ``Message`` objects and Flower ``RecordDict`` records.

A fednovelty message becomes three records of one ``RecordDict``:

- ``fednovelty.tensors``: an ``ArrayRecord``, one ``Array`` per tensor. Arrays travel as
  NumPy ``.npy`` bytes (Flower's own serialisation, ``allow_pickle=False``), so every dtype
  NumPy knows crosses bit for bit: float64 statistics arrive exactly as sent, which is what
  makes a Flower run equal the in-process simulation to the last bit of round-off.
- ``fednovelty.scalars``: a ``ConfigRecord`` of the message's bool/int/float/str scalars
  (Flower's protobuf keeps the four types apart).
- ``fednovelty.header``: a ``ConfigRecord`` with the message ``kind``, the codec version and
  engine fields (the replying client's id, the round).

Round messages arrive here packed (:mod:`fednovelty.federated.core.wire`: the loop packs each
broadcast, the client's ``answer`` its reply; the wire description is one more string
scalar) and are encoded as they are.

A client's persistent state (``ClientContext.state``, tensors by name) is stored in the
node's ``context.state`` as one ``ArrayRecord`` the same way.

The secure-sum protocol's messages (:mod:`fednovelty.runtime.flower.secure`) carry bytes
(public keys, encrypted and revealed shares) and client-id lists: one ``ConfigRecord``
``fednovelty.secagg`` of ``int``/``bytes`` values and lists (:func:`encode_fields`,
:func:`decode_fields`), beside the header; a masked vector travels as ``uint8`` arrays of
``ceil(bits / 8)`` little-endian bytes a value (:func:`pack_ring`, :func:`unpack_ring`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from fednovelty.federated.core.base import Message, Scalar
from fednovelty.runtime.flower._compat import Array, ArrayRecord, ConfigRecord, RecordDict

TENSORS = "fednovelty.tensors"
SCALARS = "fednovelty.scalars"
HEADER = "fednovelty.header"
#: the node's ``context.state`` record of the run attempt its client state belongs to.
CLIENT_ATTEMPT = "fednovelty.client_attempt"
CLIENT_STATE = "fednovelty.client_state"
#: the secure-sum protocol's fields in a message, and a node's protocol state.
SECAGG = "fednovelty.secagg"
SECAGG_STATE = "fednovelty.secagg_state"
CODEC_VERSION = 1

#: what a protocol field holds.
Field = int | bytes | list[int] | list[bytes]


class CodecError(ValueError):
    """A Flower record is not a fednovelty message (missing record, wrong version)."""


def tensor_to_array(tensor: Tensor) -> Array:
    """A torch tensor (any shape, on any device) as a Flower ``Array`` of the same dtype."""
    if tensor.dtype == torch.bfloat16:
        raise ValueError("bfloat16 tensors have no NumPy dtype; cast to float32 first.")
    return Array(tensor.detach().cpu().contiguous().numpy())  # ascontiguousarray makes 0-d 1-d


def array_to_tensor(array: Array) -> Tensor:
    """A Flower ``Array`` as a CPU torch tensor of the same dtype and shape."""
    return torch.from_numpy(np.array(array.numpy(), copy=True))


def tensors_to_record(tensors: Mapping[str, Tensor]) -> ArrayRecord:
    """Named tensors as one ``ArrayRecord`` (names kept, order kept)."""
    return ArrayRecord({name: tensor_to_array(value) for name, value in tensors.items()})


def record_to_tensors(record: ArrayRecord) -> dict[str, Tensor]:
    """Inverse of :func:`tensors_to_record`."""
    return {name: array_to_tensor(array) for name, array in record.items()}


def _check_scalars(scalars: Mapping[str, Scalar]) -> None:
    for name, value in scalars.items():
        if not isinstance(value, bool | int | float | str):
            raise TypeError(
                f"message scalar {name!r} is a {type(value).__name__}; messages carry only "
                "bool, int, float and str scalars (put arrays in tensors)."
            )


def encode_message(message: Message, **header: Scalar) -> RecordDict:
    """A fednovelty ``Message`` as a Flower ``RecordDict``.

    Args:
        message: the message to send.
        header: engine fields sent beside it (e.g. ``client_id=3``, ``round=2``).

    Raises:
        TypeError: a scalar is not bool, int, float or str.
    """
    _check_scalars(message.scalars)
    _check_scalars(header)
    return RecordDict(
        {
            TENSORS: tensors_to_record(message.tensors),
            SCALARS: ConfigRecord(dict(message.scalars)),
            HEADER: ConfigRecord({**header, "kind": message.kind, "version": CODEC_VERSION}),
        }
    )


def decode_message(content: RecordDict) -> tuple[Message, dict[str, Scalar]]:
    """A Flower ``RecordDict`` back as ``(Message, header)``; tensors land on the CPU.

    Raises:
        CodecError: a record is missing, or the codec version is newer than this one.
    """
    missing = [
        name
        for name, records in (
            (TENSORS, content.array_records),
            (SCALARS, content.config_records),
            (HEADER, content.config_records),
        )
        if name not in records
    ]
    if missing:
        raise CodecError(f"not a fednovelty message: records {missing} are missing.")
    header = dict(content.config_records[HEADER])
    version = int(header.pop("version", 0))
    if version > CODEC_VERSION or "kind" not in header:
        raise CodecError(
            f"fednovelty message codec version {version} is not readable by version "
            f"{CODEC_VERSION}; use the same fednovelty on the server and the nodes."
        )
    kind = str(header.pop("kind"))
    tensors = record_to_tensors(content.array_records[TENSORS])
    scalars = dict(content.config_records[SCALARS])
    return Message(kind, tensors, scalars), header


def wire_nbytes(content: RecordDict) -> int:
    """Bytes of a ``RecordDict``'s payload as Flower counts them (``.npy`` headers and key
    names included); compare ``Message.nbytes()``, the raw tensor and scalar bytes."""
    records = (*content.array_records.values(), *content.config_records.values())
    return sum(record.count_bytes() for record in records)


def load_client_state(state: RecordDict, attempt: int = 0) -> dict[str, Tensor]:
    """A client's persistent tensors from a node's ``context.state`` (empty at first, and
    empty when they were stored in another ``attempt`` of the run: the server restarted it,
    ``fednovelty.runtime.loop``)."""
    if CLIENT_STATE not in state.array_records:
        return {}
    stored = state.config_records.get(CLIENT_ATTEMPT)
    if int(stored["attempt"] if stored is not None else 0) != int(attempt):
        return {}
    return record_to_tensors(state.array_records[CLIENT_STATE])


def store_client_state(state: RecordDict, tensors: Mapping[str, Tensor], attempt: int = 0) -> None:
    """Keep a client's tensors in the node's ``context.state`` for its next message, with
    the ``attempt`` of the run they belong to."""
    state[CLIENT_STATE] = tensors_to_record(tensors)
    state[CLIENT_ATTEMPT] = ConfigRecord({"attempt": int(attempt)})


def encode_fields(fields: Mapping[str, Field], **header: Scalar) -> RecordDict:
    """A secure-sum protocol message: ``fields`` (ints, bytes and lists of them) in the
    ``fednovelty.secagg`` record and ``header`` (engine fields, e.g. ``client_id``). Empty
    lists are left out (Flower cannot count their bytes): a reader takes a missing list
    field as empty."""
    _check_scalars(header)
    return RecordDict(
        {
            SECAGG: fields_record(fields),
            HEADER: ConfigRecord({**header, "version": CODEC_VERSION}),
        }
    )


def fields_record(fields: Mapping[str, Field]) -> ConfigRecord:
    """``fields`` as a ``ConfigRecord``, empty lists left out (:func:`encode_fields`)."""
    return ConfigRecord({k: v for k, v in fields.items() if not (isinstance(v, list) and not v)})


def decode_fields(content: RecordDict) -> tuple[dict[str, Field], dict[str, Scalar]]:
    """``(fields, header)`` of a protocol message (:func:`encode_fields`), or of a round's
    message that carries protocol fields beside its fednovelty message.

    Raises:
        CodecError: no ``fednovelty.secagg`` or header record, or a newer codec version.
    """
    records = content.config_records
    missing = [name for name in (SECAGG, HEADER) if name not in records]
    if missing:
        raise CodecError(f"not a fednovelty secure-sum message: records {missing} are missing.")
    header = dict(records[HEADER])
    version = int(header.pop("version", 0))
    if version > CODEC_VERSION:
        raise CodecError(
            f"fednovelty message codec version {version} is not readable by version "
            f"{CODEC_VERSION}; use the same fednovelty on the server and the nodes."
        )
    return dict(records[SECAGG]), header


def ring_width(bits: int) -> int:
    """Bytes a value of the ring ``Z mod 2**bits`` takes on the wire: ``ceil(bits / 8)``."""
    return -(-int(bits) // 8)


def pack_ring(values: np.ndarray, bits: int) -> np.ndarray:
    """Ring values (n,) uint64 below ``2**bits`` as their low ``ceil(bits / 8)`` bytes,
    little-endian: (n, width) uint8.

    Raises:
        ValueError: a value at or above ``2**bits``.
    """
    values = np.asarray(values, dtype=np.uint64).reshape(-1)
    if values.size and int(values.max()) >= 2**bits:
        raise ValueError(f"ring values must be below 2**{bits}; got {int(values.max())}.")
    raw = values.astype("<u8").view(np.uint8).reshape(-1, 8)
    return np.ascontiguousarray(raw[:, : ring_width(bits)])


def unpack_ring(packed: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of :func:`pack_ring`: (n, width) uint8 -> (n,) uint64.

    Raises:
        ValueError: not (n, ceil(bits / 8)) uint8, or a value at or above ``2**bits``.
    """
    width = ring_width(bits)
    packed = np.asarray(packed)
    if packed.dtype != np.uint8 or packed.ndim != 2 or packed.shape[1] != width:
        raise ValueError(
            f"packed ring values must be (n, {width}) uint8 for {bits} bits; got "
            f"{packed.shape} {packed.dtype}."
        )
    raw = np.zeros((packed.shape[0], 8), dtype=np.uint8)
    raw[:, :width] = packed
    values = raw.view("<u8").reshape(-1).astype(np.uint64)
    if values.size and int(values.max()) >= 2**bits:
        raise ValueError(f"ring values must be below 2**{bits}; got {int(values.max())}.")
    return values
