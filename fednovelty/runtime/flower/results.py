"""The result of a Flower run as a file: written by the ServerApp, read by the caller.

Flower runs the ServerApp in a process of its own (started by the SuperLink), so its result
cannot be returned as a Python object: ``save_result`` writes it to one ``.safetensors``
file and ``load_result`` reads it back as a :class:`FlowerResult`, a ``SimulationResult``
with the algorithm's registry name and settings (their JSON form,
:func:`~fednovelty.federated.registry.algorithm_settings`). The final server state (a state
class of the registry: ``EMState``, ``JointState``, ``FedGenState``, ``PCAState``,
``FactorEMState``) is stored field by field: tensors in safetensors, the rest (numbers,
lists, dicts keyed by client id, mixtures, mixtures of factor analysers, covariance priors,
PCA projections) in a JSON document in the file's metadata. Loading parses JSON and reads
raw tensors; it runs no code from the file. A field a later version dropped from a state
class is ignored on loading.

Nothing here imports Flower: a result file can be loaded where Flower is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from fednovelty.exceptions import ModelFormatError
from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.mixtures.accelerate import Squarem
from fednovelty.federated.mixtures.pca import PCAProjection, PCAState
from fednovelty.federated.registry import STATES, algorithm_settings
from fednovelty.mixture import CovariancePrior, MixtureParams, SufficientStats
from fednovelty.mixture.factor import FactorParams
from fednovelty.mixture.variational import VBPosterior
from fednovelty.mixture.vb_prior import VBPrior
from fednovelty.runtime.simulation import RoundRecord, SimulationResult

FORMAT_TAG = "fednovelty-flower-result"
FORMAT_VERSION = 1
_METADATA_KEY = "fednovelty"
#: dataclasses a state field may hold, stored field by field (``{"__dataclass__": name}``).
VALUES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        CovariancePrior,
        FactorParams,
        PCAProjection,
        PCAState,
        Squarem,
        SufficientStats,
        VBPrior,
        VBPosterior,
    )
}


@dataclass
class FlowerResult(SimulationResult):
    """A ``SimulationResult`` from a Flower run, plus what the run was.

    Attributes:
        state, history, client_states: as ``SimulationResult`` (``client_states`` is empty:
            on Flower they stay on the nodes).
        algorithm: the algorithm's registry name.
        config: its settings as JSON (``algorithm.config.to_json()``: e.g.
            ``n_components``, ``covariance_type``, ``dtype`` as ``"float64"``);
            ``Detector.from_model`` takes its constructor defaults from them.
        dropped: replies not used, one dict per reply (round, client_id, node_id, reason).
    """

    algorithm: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    dropped: list[dict[str, Any]] = field(default_factory=list)


def algorithm_config(algorithm: FederatedAlgorithm) -> dict[str, Any]:
    """An algorithm's settings as JSON (its config's ``to_json()``: dtypes as ``"float64"``,
    devices as ``"cpu"``, tuples and tensors as lists, a learner factory by name)."""
    return algorithm_settings(algorithm)


def encode_value(value: Any, key: str, tensors: dict[str, Tensor]) -> Any:
    """A state value as JSON, its tensors moved into ``tensors`` under names from ``key``.

    Handles None, bool, int, float, str, tensors, ``MixtureParams``, lists, tuples and dicts
    (int keys kept as ints). Raises ``TypeError`` for anything else.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Tensor):
        tensors[key] = value.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(value, MixtureParams):
        parts = {n: encode_value(t, f"{key}.{n}", tensors) for n, t in value.tensors().items()}
        return {"__mixture__": value.covariance_type, "tensors": parts}
    if type(value).__name__ in VALUES and type(value) is VALUES[type(value).__name__]:
        parts = {
            f.name: encode_value(getattr(value, f.name), f"{key}.{f.name}", tensors)
            for f in dataclasses.fields(value)
        }
        return {"__dataclass__": type(value).__name__, "fields": parts}
    if isinstance(value, list | tuple):
        return [encode_value(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        items = [[k, encode_value(v, f"{key}.{k}", tensors)] for k, v in value.items()]
        if all(isinstance(k, int) and not isinstance(k, bool) for k in value):
            return {"__intdict__": items}
        if all(isinstance(k, str) for k in value):
            return {"__dict__": dict(items)}
    raise TypeError(f"cannot store {key!r} of type {type(value).__name__} in a result file.")


def decode_value(value: Any, tensors: dict[str, Tensor]) -> Any:
    """Inverse of :func:`encode_value`."""
    if isinstance(value, list):
        return [decode_value(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "__tensor__" in value:
        return tensors[value["__tensor__"]]
    if "__mixture__" in value:
        parts = {n: decode_value(v, tensors) for n, v in value["tensors"].items()}
        return MixtureParams(
            parts["weights"], parts["means"], parts["precisions_cholesky"], value["__mixture__"]
        )
    if "__dataclass__" in value:
        cls = VALUES.get(value["__dataclass__"])
        if cls is None:
            name = value["__dataclass__"]
            raise ModelFormatError(f"unknown value class {name!r} in result file.")
        return _build(cls, {k: decode_value(v, tensors) for k, v in value["fields"].items()})
    if "__intdict__" in value:
        return {int(k): decode_value(v, tensors) for k, v in value["__intdict__"]}
    if "__dict__" in value:
        return {k: decode_value(v, tensors) for k, v in value["__dict__"].items()}
    raise ModelFormatError(f"unreadable value in a result file: {sorted(value)}.")


def encode_state(state: Any, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """A server-state dataclass (one of ``STATES``) as JSON plus tensors."""
    name = type(state).__name__
    if name not in STATES:
        raise TypeError(f"cannot store a {name} state; storable states: {sorted(STATES)}.")
    fields = {
        f.name: encode_value(getattr(state, f.name), f"state.{f.name}", tensors)
        for f in dataclasses.fields(state)
    }
    return {"class": name, "fields": fields}


def _build(cls: type, values: dict[str, Any]) -> Any:
    """``cls(**values)`` without the fields ``cls`` no longer has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def decode_state(document: dict[str, Any], tensors: dict[str, Tensor]) -> Any:
    """Inverse of :func:`encode_state`."""
    cls = STATES.get(document.get("class"))
    if cls is None:
        raise ModelFormatError(f"unknown state class {document.get('class')!r} in result file.")
    return _build(cls, {k: decode_value(v, tensors) for k, v in document["fields"].items()})


def _record_to_json(record: RoundRecord) -> dict[str, Any]:
    return {**dataclasses.asdict(record), "sampled": list(record.sampled)}


def _record_from_json(data: dict[str, Any]) -> RoundRecord:
    return RoundRecord(
        **{
            **data,
            "sampled": tuple(data["sampled"]),
            "replied": tuple(data["replied"]),
            "dropped": tuple((int(c), str(why)) for c, why in data.get("dropped", ())),
            "skipped": tuple((int(c), str(why)) for c, why in data.get("skipped", ())),
        }
    )


def save_result(result: FlowerResult, path: str | os.PathLike) -> None:
    """Write ``result`` to ``path`` (safetensors + JSON metadata; no pickle)."""
    tensors: dict[str, Tensor] = {}
    document = {
        "format": FORMAT_TAG,
        "format_version": FORMAT_VERSION,
        "algorithm": result.algorithm,
        "config": result.config,
        "state": encode_state(result.state, tensors),
        "history": [_record_to_json(r) for r in result.history],
        "client_states": encode_value(result.client_states, "client_states", tensors),
        "dropped": result.dropped,
    }
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_file(tensors, path, metadata={_METADATA_KEY: json.dumps(document)})


def load_result(path: str | os.PathLike) -> FlowerResult:
    """Read a result written by :func:`save_result` (e.g. by the fednovelty ServerApp).

    Raises:
        FileNotFoundError: no file at ``path``.
        ModelFormatError: the file is not a fednovelty Flower result.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No Flower result at {path!r}; did the run finish?")
    try:
        with safe_open(path, framework="pt") as handle:
            document = json.loads((handle.metadata() or {}).get(_METADATA_KEY, "null"))
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFormatError(f"{path!r} is not a fednovelty Flower result: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT_TAG:
        raise ModelFormatError(f"{path!r} is not a fednovelty Flower result (no format tag).")
    if int(document.get("format_version", 0)) > FORMAT_VERSION:
        raise ModelFormatError(f"{path!r} was written by a newer fednovelty; upgrade to read it.")
    return FlowerResult(
        state=decode_state(document["state"], tensors),
        history=[_record_from_json(r) for r in document["history"]],
        client_states=decode_value(document["client_states"], tensors),
        algorithm=document["algorithm"],
        config=document["config"],
        dropped=document["dropped"],
    )
