"""Plain configuration -> the algorithm object both halves of a Flower run construct.

The ServerApp and every ClientApp run in different processes (on different machines), so
they cannot share a Python object: each builds *the same* ``FederatedAlgorithm`` (the same
settings dataclass, ``algorithm.config``) from the run's configuration, the ``run_config``
Flower hands to both. The algorithm is named as in the algorithm registry
(:data:`fednovelty.federated.registry.ALGORITHMS`, ``algorithm = "FedGenGMM"``) and its
settings are one JSON object in the settings' JSON form (``algorithm-params =
'{"n_components": 3}'``; :meth:`~fednovelty.federated.core.config.Settings.to_json`): Flower's
run-config values are scalars only, and one JSON string carries lists (``k_range``,
``means_init``) and keeps the set of keys the same whatever the algorithm (Flower refuses
``--run-config`` overrides of keys the app's ``pyproject.toml`` does not declare).

A setting that depends on the width of the rows may be ``"auto"`` (:data:`WIDTH_AUTO`:
``"prior_strength": "auto"`` is ``n_features + 2`` pseudo-rows, the detectors' ``Prior``
default): a node resolves it with its own rows' width, the server with the federation's
(:func:`needs_width`; the ServerApp asks the nodes for it before the first round).

Engine settings (``min-clients``, ``fraction``, timeouts, where to write the result) are
separate keys, read into :class:`EngineConfig`. Secure-sum rounds
(:mod:`fednovelty.runtime.flower.secure`) are switched on by ``secure-sum = true`` and set by
the ``secure-*`` keys of :data:`SECURE_KEYS`, read into a
:class:`~fednovelty.runtime.secure_rounds.SecureSum` by :func:`secure_from_run_config`: the
server and every node read the same keys, so both sides compute the same ring and public
clipping ranges. What protects a node is not read here: its least threshold and fewest
senders come from its own ``node_config``
(:func:`~fednovelty.runtime.flower.secure_node.secure_from_node_config`), and nothing of the
run config seeds its randomness. Nothing here imports Flower or names an algorithm.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fednovelty.federated import registry
from fednovelty.federated.core.base import FederatedAlgorithm
from fednovelty.federated.registry import ALGORITHMS
from fednovelty.runtime.secure_rounds import SecureSum

#: run-config keys read by the ServerApp and the ClientApp.
ALGORITHM_KEY = "algorithm"
PARAMS_KEY = "algorithm-params"
SEED_KEY = "seed"
#: run-config key that switches secure-sum rounds on (``true``/``false``).
SECURE_KEY = "secure-sum"
#: run-config keys of the secure sum -> the ``SecureSum`` field each sets (module docstring).
SECURE_KEYS: dict[str, str] = {
    "secure-threshold": "threshold",
    "secure-bits": "bits",
    "secure-max-rows": "max_rows",
    "secure-noise-margin": "noise_margin",
    "secure-prg": "prg",
}
#: run-config keys refused, each with the reason (a value the server knows protects nothing).
REFUSED_SECURE_KEYS: dict[str, str] = {
    "secure-seed": "the nodes' stochastic rounding comes from their own os.urandom; a seed "
    "the server knows would let it re-draw the rounding",
}

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_KEY",
    "PARAMS_KEY",
    "REFUSED_SECURE_KEYS",
    "SECURE_KEY",
    "SECURE_KEYS",
    "SEED_KEY",
    "WIDTH_AUTO",
    "EngineConfig",
    "algorithm_from_run_config",
    "build_algorithm",
    "needs_width",
    "parse_params",
    "resolve_width",
    "secure_from_run_config",
]


def parse_params(text: str) -> dict[str, Any]:
    """The JSON object of ``algorithm-params`` as a dict.

    Raises:
        ValueError: ``text`` is not JSON, or not a JSON object.
    """
    try:
        params = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        raise ValueError(
            f"run_config '{PARAMS_KEY}' must be a JSON object such as "
            f"'{{\"n_components\": 3}}'; could not parse {text!r}: {error}."
        ) from None
    if not isinstance(params, dict):
        raise ValueError(
            f"run_config '{PARAMS_KEY}' must be a JSON object, got {type(params).__name__}."
        )
    return params


def build_algorithm(name: str, params: Mapping[str, Any]) -> FederatedAlgorithm:
    """Algorithm ``name`` of the registry with the settings of a JSON object (dtypes as
    ``"float64"``, lists for tuples and tensors, ``"learner": "mlp"``).

    Raises:
        ValueError: unknown name, or settings the algorithm does not take or accept, named
            with the run-config key they came from.
    """
    try:
        return registry.build_algorithm(name, params)
    except ValueError as error:
        key = PARAMS_KEY if name in ALGORITHMS else ALGORITHM_KEY
        raise ValueError(f"run_config '{key}': {error}") from None


#: ``algorithm-params`` settings that may be ``"auto"``: the value for rows of
#: ``n_features`` columns (the detectors' own resolution: ``Prior(strength="auto")`` is
#: ``n_features + 2`` pseudo-rows, tested against them).
WIDTH_AUTO: dict[str, Callable[[int], Any]] = {
    "prior_strength": lambda n_features: n_features + 2.0,
}


def needs_width(run_config: Mapping[str, Any]) -> bool:
    """Whether the run's ``algorithm-params`` hold an ``"auto"`` of :data:`WIDTH_AUTO`, which
    only the rows' width resolves."""
    params = parse_params(str(run_config.get(PARAMS_KEY, "{}")))
    return any(params.get(key) == "auto" for key in WIDTH_AUTO)


def resolve_width(params: Mapping[str, Any], n_features: int | None) -> dict[str, Any]:
    """``params`` with every ``"auto"`` of :data:`WIDTH_AUTO` replaced by its value for rows of
    ``n_features`` columns.

    Raises:
        ValueError: an ``"auto"`` and no ``n_features``.
    """
    resolved = dict(params)
    for key, value_for in WIDTH_AUTO.items():
        if resolved.get(key) != "auto":
            continue
        if n_features is None:
            raise ValueError(
                f"run_config '{PARAMS_KEY}': {key}=\"auto\" depends on the rows' width; "
                "build the algorithm with n_features (the ClientApp and ServerApp do), or "
                f"give {key} a number."
            )
        resolved[key] = value_for(int(n_features))
    return resolved


def algorithm_from_run_config(
    run_config: Mapping[str, Any], n_features: int | None = None
) -> FederatedAlgorithm:
    """The algorithm a run's configuration describes (same object on server and nodes).

    ``run_config[SEED_KEY]`` (default 0) is the algorithm's ``random_state`` unless
    ``algorithm-params`` sets one (for algorithms that have one). ``n_features``, the width
    of the rows, resolves the ``"auto"`` settings of :data:`WIDTH_AUTO` (:func:`resolve_width`).
    """
    if ALGORITHM_KEY not in run_config:
        raise ValueError(
            f"run_config has no '{ALGORITHM_KEY}' key; set it in [tool.flwr.app.config] of the "
            f'app\'s pyproject.toml, e.g. {ALGORITHM_KEY} = "FedGenGMM".'
        )
    name = str(run_config[ALGORITHM_KEY])
    params = resolve_width(parse_params(str(run_config.get(PARAMS_KEY, "{}"))), n_features)
    config_class = getattr(ALGORITHMS.get(name), "config_class", None)
    if config_class is not None and "random_state" in config_class.__dataclass_fields__:
        params.setdefault("random_state", int(run_config.get(SEED_KEY, 0)))
    return build_algorithm(name, params)


@dataclass(frozen=True)
class EngineConfig:
    """Server-side settings of a Flower run (the engine's, not the algorithm's).

    Attributes:
        min_clients: fewest valid replies a round may go on with (``min-clients``); a
            round with fewer is recorded as failed and asked again.
        max_failed_rounds: failed rounds in a row after which the run stops
            (``max-failed-rounds``).
        fraction: share of clients asked each round, sampled as ``run_simulation`` does
            (``fraction``).
        seed: seed of the client sampling (``seed``).
        round_timeout: seconds to wait for the replies of one round (``round-timeout``).
        nodes_timeout: seconds to wait for nodes to connect (``nodes-timeout``).
        num_nodes: nodes to wait for before the first round; 0 waits for ``min_clients``
            (``num-nodes``).
        result_path: where the ServerApp writes the result (``result-path``).
    """

    min_clients: int = 1
    max_failed_rounds: int = 5
    fraction: float = 1.0
    seed: int = 0
    round_timeout: float = 600.0
    nodes_timeout: float = 120.0
    num_nodes: int = 0
    result_path: str = "fednovelty-result.safetensors"

    def __post_init__(self) -> None:
        if self.min_clients < 1:
            raise ValueError(f"min-clients must be >= 1, got {self.min_clients}.")
        if self.max_failed_rounds < 1:
            raise ValueError(f"max-failed-rounds must be >= 1, got {self.max_failed_rounds}.")
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}.")
        if self.round_timeout <= 0 or self.nodes_timeout <= 0:
            raise ValueError(
                f"round-timeout and nodes-timeout must be > 0 seconds, got "
                f"{self.round_timeout} and {self.nodes_timeout}."
            )
        if self.num_nodes < 0:
            raise ValueError(f"num-nodes must be >= 0, got {self.num_nodes}.")

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> EngineConfig:
        """Read the engine keys of ``run_config``; missing keys keep their defaults."""
        keys = {
            "min_clients": ("min-clients", int),
            "max_failed_rounds": ("max-failed-rounds", int),
            "fraction": ("fraction", float),
            "seed": (SEED_KEY, int),
            "round_timeout": ("round-timeout", float),
            "nodes_timeout": ("nodes-timeout", float),
            "num_nodes": ("num-nodes", int),
            "result_path": ("result-path", str),
        }
        return cls(**{f: kind(run_config[k]) for f, (k, kind) in keys.items() if k in run_config})


def _secure_on(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"run_config '{SECURE_KEY}' must be true or false; got {value!r}.")


def secure_from_run_config(run_config: Mapping[str, Any]) -> SecureSum | None:
    """The secure-sum settings of a run, ``None`` unless ``secure-sum`` is true.

    Keys (:data:`SECURE_KEYS`): ``secure-max-rows`` (required: the public bound on a node's
    rows, agreed before the first round; it scales the clipping ranges), ``secure-threshold``
    (default 0.5: the server asks a majority of a round's key holders to unmask; a node whose
    own floor is higher refuses), ``secure-bits`` (48), ``secure-noise-margin`` (10),
    ``secure-prg`` (``"aes-ctr"``, the only generator).

    Raises:
        ValueError: ``secure-sum`` not a boolean, ``secure-max-rows`` missing, a refused key
            (:data:`REFUSED_SECURE_KEYS`) or a value out of range, naming the key.
    """
    if not _secure_on(run_config.get(SECURE_KEY, False)):
        return None
    if "secure-max-rows" not in run_config:
        raise ValueError(
            "run_config 'secure-max-rows' is required with 'secure-sum': the public bound on "
            "any node's row count, agreed before the first round (it scales the public "
            "clipping ranges of the secure sums); set it to at least the largest node's rows."
        )
    refused = [key for key in REFUSED_SECURE_KEYS if key in run_config]
    if refused:
        key = refused[0]
        raise ValueError(f"run_config {key!r} is refused: {REFUSED_SECURE_KEYS[key]}.")
    kinds = {"threshold": float, "bits": int, "max_rows": int, "noise_margin": float,
             "prg": str}  # fmt: skip
    fields: dict[str, Any] = {}
    for key, name in SECURE_KEYS.items():
        if key not in run_config:
            continue
        value = run_config[key]
        if kinds[name] is str:
            fields[name] = str(value)
        elif isinstance(value, bool | str) or (
            kinds[name] is int and not float(value).is_integer()
        ):
            what = "an integer" if kinds[name] is int else "a number"
            raise ValueError(f"run_config '{key}' must be {what}; got {value!r}.")
        else:
            fields[name] = kinds[name](value)
    try:
        return SecureSum(**fields)
    except ValueError as error:
        message = str(error)
        for key, name in SECURE_KEYS.items():
            message = message.replace(f"SecureSum.{name}", f"run_config '{key}'")
        raise type(error)(message) from None  # InsecurePRGError stays one
