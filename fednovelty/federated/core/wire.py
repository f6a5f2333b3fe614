"""What crosses the wire: a message's tensors in their smallest exact form.

:func:`pack` rewrites a :class:`~fednovelty.federated.core.base.Message` for sending, :func:`unpack`
restores it on receipt; both are pure. The round loop packs every broadcast and unpacks every
reply; :meth:`~fednovelty.federated.core.base.FederatedAlgorithm.answer` unpacks the broadcast and,
where the engine says the reply crosses a wire (``ClientContext.wire``), packs the reply.

A floating tensor (..., d, d), d >= 2, that is *exactly* symmetric (``torch.equal`` with its
transpose) travels as its upper triangle (..., d(d+1)/2), row by row; one exactly upper- or
lower-triangular as that triangle; the other half comes back mirrored or zero. Nothing is
rounded: ``unpack(pack(m))`` equals ``m`` bit for bit. With ``wire_dtype="float32"`` (a
setting of :class:`~fednovelty.federated.core.config.TorchSettings`) float64 tensors travel as
float32 and the receiver casts them to its working dtype: half the bytes, values rounded.

A packed message says so in one more scalar, :data:`WIRE` (a name no algorithm's scalar
takes): compact JSON naming the tensors of each form, ``{"symmetric": [...], "upper": [...],
"lower": [...], "cast": [...]}`` (empty lists left out; none where nothing changed); its bytes
count in ``Message.nbytes()``. :func:`unpack` refuses a description :func:`pack` does not
write (not JSON, an unknown key, a name twice or of no tensor, a triangle whose length is not
d(d+1)/2, a cast tensor that is not floating) with a :class:`WireFormatError`, an
:class:`~fednovelty.federated.core.declarations.InvalidReplyError`: the loop drops such a reply with
its reason. The format, the bytes per round and the float32 cost: ``docs/wire.md``.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import torch
from torch import Tensor

from fednovelty.federated.core.base import Message
from fednovelty.federated.core.declarations import InvalidReplyError

__all__ = [
    "FORMS",
    "WIRE",
    "WIRE_DTYPES",
    "WireFormatError",
    "from_triangle",
    "matrix_form",
    "pack",
    "packed_side",
    "to_triangle",
    "travelled_narrower",
    "triangle_size",
    "unpack",
    "wire_dtype_of",
]

#: the scalar that describes a packed message (module docstring).
WIRE = "fednovelty.wire"
#: the forms a square tensor can travel in, in the order :func:`matrix_form` tries them.
FORMS: tuple[str, ...] = ("symmetric", "upper", "lower")
#: the narrower float types float64 tensors may travel as, by setting name.
WIRE_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32}


class WireFormatError(InvalidReplyError):
    """A message's wire description (:data:`WIRE`) is not one :func:`pack` writes."""


def triangle_size(d: int) -> int:
    """Entries of one triangle (diagonal included) of a (d, d) matrix: ``d (d + 1) / 2``."""
    return d * (d + 1) // 2


def packed_side(length: int) -> int | None:
    """``d`` such that ``triangle_size(d) == length``, or ``None`` if there is none."""
    if length < 1:
        return None
    d = (math.isqrt(8 * length + 1) - 1) // 2
    return d if triangle_size(d) == length else None


def matrix_form(tensor: Tensor) -> str | None:
    """The form a tensor travels in: ``"symmetric"``, ``"upper"`` or ``"lower"`` for a
    floating tensor (..., d, d), d >= 2, that is exactly so (checked in that order), else
    ``None`` (sent as it is)."""
    if tensor.ndim < 2 or not tensor.dtype.is_floating_point:
        return None
    d = tensor.shape[-1]
    if d < 2 or tensor.shape[-2] != d:
        return None
    if torch.equal(tensor, tensor.mT):
        return "symmetric"
    if torch.equal(tensor, tensor.triu()):
        return "upper"
    if torch.equal(tensor, tensor.tril()):
        return "lower"
    return None


@functools.lru_cache(maxsize=64)
def _kept(d: int, form: str, device: torch.device) -> Tensor:
    """Flat positions ``i * d + j`` of the triangle a form keeps, row by row: (d(d+1)/2,)."""
    make = torch.tril_indices if form == "lower" else torch.triu_indices
    rows, cols = make(d, d, device=device)
    return rows * d + cols


@functools.lru_cache(maxsize=64)
def _spread(d: int, form: str, device: torch.device) -> Tensor:
    """For each flat position of a (d, d) matrix, the entry of its packed triangle that fills
    it: (d * d,) int64; the other half of a triangular form points one past the triangle (a
    zero appended before the gather)."""
    kept = _kept(d, form, torch.device("cpu"))
    length = kept.numel()
    spread = torch.full((d * d,), length, dtype=torch.int64)
    spread[kept] = torch.arange(length)
    if form == "symmetric":
        mirrored = (kept % d) * d + kept // d
        spread[mirrored] = torch.arange(length)
    return spread.to(device)


#: most entries a cached flat gather index (:func:`_flat_kept`, :func:`_flat_spread`) spans;
#: larger tensors gather along their last dimension.
FLAT_INDEX_ENTRIES = 1 << 20


@functools.lru_cache(maxsize=64)
def _flat_kept(d: int, form: str, n_matrices: int, device: torch.device) -> Tensor:
    """:func:`_kept` of ``n_matrices`` (d, d) matrices stored one after another: flat
    positions (n_matrices * d(d+1)/2,). One gather over a flat tensor is several times
    faster than a gather along the last dimension of a (n_matrices, d * d) one."""
    kept = _kept(d, form, torch.device("cpu"))
    return (torch.arange(n_matrices).unsqueeze(1) * (d * d) + kept).reshape(-1).to(device)


@functools.lru_cache(maxsize=64)
def _flat_spread(d: int, form: str, n_matrices: int, width: int, device: torch.device) -> Tensor:
    """:func:`_spread` of ``n_matrices`` packed triangles of ``width`` entries each (the
    triangle, plus the appended zero of a triangular form) stored one after another: flat
    positions (n_matrices * d * d,)."""
    spread = _spread(d, form, torch.device("cpu"))
    return (torch.arange(n_matrices).unsqueeze(1) * width + spread).reshape(-1).to(device)


def to_triangle(tensor: Tensor, form: str) -> Tensor:
    """The triangle ``form`` keeps of ``tensor`` (..., d, d): (..., d(d+1)/2), contiguous."""
    d = tensor.shape[-1]
    lead = tensor.shape[:-2]
    n = math.prod(lead)
    if n * d * d <= FLAT_INDEX_ENTRIES:
        index = _flat_kept(d, form, n, tensor.device)
        return tensor.reshape(-1).index_select(0, index).view(*lead, triangle_size(d))
    flat = tensor.reshape(*lead, d * d)
    return flat.index_select(-1, _kept(d, form, tensor.device)).contiguous()


def from_triangle(packed: Tensor, form: str) -> Tensor:
    """Inverse of :func:`to_triangle`: (..., d(d+1)/2) -> (..., d, d), the other half
    mirrored (``"symmetric"``) or zero.

    Raises:
        WireFormatError: the last dimension is not ``d(d+1)/2`` for an integer ``d >= 2``.
    """
    length = packed.shape[-1] if packed.ndim else 0
    d = packed_side(length)
    if d is None or d < 2:
        raise WireFormatError(
            f"a packed {form} triangle has {length} entries in its last dimension; a triangle "
            "of a (d, d) matrix has d(d+1)/2 entries, d >= 2."
        )
    if form != "symmetric":  # the zero the other half points to
        packed = torch.cat([packed, packed.new_zeros((*packed.shape[:-1], 1))], dim=-1)
    lead = packed.shape[:-1]
    n = math.prod(lead)
    if n * d * d <= FLAT_INDEX_ENTRIES:
        index = _flat_spread(d, form, n, packed.shape[-1], packed.device)
        return packed.reshape(-1).index_select(0, index).view(*lead, d, d)
    full = packed.index_select(-1, _spread(d, form, packed.device))
    return full.view(*lead, d, d)


def wire_dtype_of(setting: Any) -> torch.dtype | None:
    """The dtype float64 tensors travel as under the setting ``wire_dtype`` (``None``: their
    own), from a name in :data:`WIRE_DTYPES`, that dtype, or ``None``.

    Raises:
        ValueError: anything else, naming ``wire_dtype``.
    """
    if setting is None:
        return None
    for name, dtype in WIRE_DTYPES.items():
        if setting in (name, dtype, f"torch.{name}"):
            return dtype
    raise ValueError(
        f"wire_dtype must be None (tensors travel in the working dtype) or one of "
        f"{sorted(WIRE_DTYPES)} (float64 tensors travel narrower); got {setting!r}."
    )


def pack(message: Message, wire_dtype: Any = None) -> Message:
    """``message`` as it crosses the wire (module docstring).

    Args:
        message: any message; one already packed (it carries :data:`WIRE`) is returned as it
            is.
        wire_dtype: ``None`` (tensors keep their dtype) or ``"float32"`` (float64 tensors
            travel as float32; :func:`wire_dtype_of`).

    Returns:
        a message of the same kind and scalars (plus :data:`WIRE` where a tensor changed):
        each exactly symmetric or triangular floating tensor (..., d, d) as its triangle
        (..., d(d+1)/2), float64 tensors in ``wire_dtype``; ``expect`` and ``backing``
        (never sent) left out.
    """
    if WIRE in message.scalars:
        return message
    narrow = wire_dtype_of(wire_dtype)
    tensors: dict[str, Tensor] = {}
    forms: dict[str, str | None] = {}
    for name, tensor in message.tensors.items():
        form = forms[name] = matrix_form(tensor)
        if form is not None:
            tensor = to_triangle(tensor, form)
        if narrow is not None and tensor.dtype == torch.float64:
            tensor = tensor.to(narrow)
        tensors[name] = tensor
    scalars = dict(message.scalars)
    description = _wire_scalar(forms, _cast_names(message.tensors, narrow))
    if description is not None:
        scalars[WIRE] = description
    return Message(message.kind, tensors, scalars)


def _cast_names(tensors: dict[str, Tensor], narrow: torch.dtype | None) -> list[str]:
    """The tensors :func:`pack` casts to ``narrow``: the float64 ones (their form keeps
    the dtype)."""
    if narrow is None:
        return []
    return [name for name, tensor in tensors.items() if tensor.dtype == torch.float64]


def _wire_scalar(forms: dict[str, str | None], cast: list[str]) -> str | None:
    """The :data:`WIRE` scalar of a message whose tensors travel in ``forms`` (name -> form
    or ``None``, in the message's order) with ``cast`` cast narrower; ``None`` where
    nothing changed."""
    described: dict[str, list[str]] = {form: [] for form in (*FORMS, "cast")}
    for name, form in forms.items():
        if form is not None:
            described[form].append(name)
    described["cast"] = list(cast)
    description = {key: names for key, names in described.items() if names}
    return json.dumps(description, separators=(",", ":")) if description else None


@functools.lru_cache(maxsize=256)
def _parsed(raw: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The :data:`WIRE` string ``raw`` parsed (its keys known, each a list of names):
    ``((key, names), ...)`` in its order. A round's replies share a few such strings, so the
    parse is kept; the names are checked against each message's tensors by its caller."""
    try:
        description = json.loads(raw)
    except ValueError:
        description = None
    if not isinstance(description, dict):
        raise WireFormatError(f"the {WIRE!r} scalar is not a JSON object: {raw!r}.")
    unknown = sorted(set(description) - {*FORMS, "cast"})
    if unknown:
        raise WireFormatError(
            f"the {WIRE!r} scalar has unknown key(s) {unknown}; known: {[*FORMS, 'cast']}."
        )
    for key, names in description.items():
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise WireFormatError(f"the {WIRE!r} entry {key!r} must be a list of tensor names.")
    return tuple((key, tuple(names)) for key, names in description.items())


def _description(message: Message) -> dict[str, list[str]]:
    """The parsed :data:`WIRE` scalar of ``message``, checked against its tensors."""
    raw = message.scalars[WIRE]
    if not isinstance(raw, str):
        raise WireFormatError(f"the {WIRE!r} scalar is not a JSON object: {raw!r}.")
    description = {key: list(names) for key, names in _parsed(raw)}
    seen: set[str] = set()
    for key, names in description.items():
        missing = sorted(set(names) - set(message.tensors))
        if missing:
            raise WireFormatError(f"the {WIRE!r} entry {key!r} names no tensor: {missing}.")
        if len(set(names)) != len(names) or (key != "cast" and seen & set(names)):
            raise WireFormatError(f"the {WIRE!r} scalar lists a tensor twice in {key!r}.")
        if key != "cast":
            seen.update(names)
    return description


def travelled_narrower(message: Message) -> bool:
    """Whether a packed ``message`` holds tensors cast narrower on the wire (its
    :data:`WIRE` lists ``"cast"``): only then does :func:`unpack` with a ``dtype`` differ from
    :func:`unpack` without one. ``True`` where the description cannot be read (unpack it)."""
    raw = message.scalars.get(WIRE)
    if raw is None:
        return False
    try:
        return not isinstance(raw, str) or any(key == "cast" for key, _ in _parsed(raw))
    except WireFormatError:
        return True


def unpack(message: Message, dtype: torch.dtype | None = None) -> Message:
    """Inverse of :func:`pack`: ``message`` as its sender made it.

    Args:
        message: a received message; one without :data:`WIRE` is returned as it is.
        dtype: the receiver's working dtype: tensors sent narrower (``"cast"``) are cast to
            it; ``None`` leaves them in the dtype they travelled in.

    Returns:
        the message with every packed triangle (..., d(d+1)/2) back as (..., d, d) and
        without :data:`WIRE`.

    Raises:
        WireFormatError: the description is not one :func:`pack` writes (module docstring).
    """
    if WIRE not in message.scalars:
        return message
    if _LAST_UNPACKED[0] is message and _LAST_UNPACKED[1] == dtype:
        return _LAST_UNPACKED[2]  # one broadcast reaching every in-process client
    unpacked = _unpack(message, dtype)
    _LAST_UNPACKED[:] = [message, dtype, unpacked]
    return unpacked


#: the last message :func:`unpack` unpacked, the dtype asked and the result: the in-process
#: engine hands one broadcast object to every client, which need it unpacked once.
_LAST_UNPACKED: list = [None, None, None]


def _unpack(message: Message, dtype: torch.dtype | None) -> Message:
    """:func:`unpack` of a message that carries :data:`WIRE`."""
    description = _description(message)
    tensors = dict(message.tensors)
    for form in FORMS:
        for name in description.get(form, []):
            tensor = tensors[name]
            if not tensor.dtype.is_floating_point:
                raise WireFormatError(
                    f"packed tensor {name!r} is {tensor.dtype}; only floating tensors are packed."
                )
            try:
                tensors[name] = from_triangle(tensor, form)
            except WireFormatError as error:
                raise WireFormatError(f"tensor {name!r}: {error}") from None
    for name in description.get("cast", []):
        if not tensors[name].dtype.is_floating_point:
            raise WireFormatError(
                f"tensor {name!r} is listed as cast but is {tensors[name].dtype}, not floating."
            )
        if dtype is not None:
            tensors[name] = tensors[name].to(dtype)
    scalars = {key: value for key, value in message.scalars.items() if key != WIRE}
    return Message(message.kind, tensors, scalars)
