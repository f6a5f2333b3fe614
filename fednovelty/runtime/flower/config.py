"""Plain configuration -> the algorithm object both halves of a Flower run construct.

The ServerApp and every ClientApp run in different processes (on different machines), so
they cannot share a Python object: each builds *the same* ``FederatedAlgorithm`` from the
run's configuration, the ``run_config`` Flower hands to both. The algorithm is named by its
class (``algorithm = "FedGenGMM"``) and its keyword arguments are one JSON object
(``algorithm-params = '{"n_components": 3}'``): Flower's run-config values are scalars
only, and one JSON string carries lists (``k_range``, ``means_init``) and keeps the set of
keys the same whatever the algorithm (Flower refuses ``--run-config`` overrides of keys the
app's ``pyproject.toml`` does not declare).

Engine settings (``min-clients``, ``fraction``, timeouts, where to write the result) are
separate keys, read into :class:`EngineConfig`. Nothing here imports Flower.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fednovelty.federated import FederatedAlgorithm, FederatedEM, FedGenGMM, LocalGMMs
from fednovelty.federated.joint import JointFedGMM, linear_learner, mlp_learner

#: run-config keys read by the ServerApp and the ClientApp.
ALGORITHM_KEY = "algorithm"
PARAMS_KEY = "algorithm-params"
SEED_KEY = "seed"

LEARNERS: dict[str, Callable] = {"linear": linear_learner, "mlp": mlp_learner}
DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32}


def _joint(params: dict[str, Any]) -> JointFedGMM:
    learner = params.pop("learner", "linear")
    if learner not in LEARNERS:
        raise ValueError(
            f"algorithm-params 'learner' must be one of {sorted(LEARNERS)} on Flower (a custom "
            f"factory is code, which a run config cannot carry); got {learner!r}."
        )
    return JointFedGMM(learner_factory=LEARNERS[learner], **params)


#: algorithm name (as written in ``run_config["algorithm"]``) -> constructor of keywords.
ALGORITHMS: dict[str, Callable[..., FederatedAlgorithm]] = {
    "FederatedEM": lambda params: FederatedEM(**params),
    "FedGenGMM": lambda params: FedGenGMM(**params),
    "LocalGMMs": lambda params: LocalGMMs(**params),
    "JointFedGMM": _joint,
}


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
    """Construct algorithm ``name`` from JSON-style keyword arguments.

    JSON types are mapped to what the constructors take: ``dtype`` ``"float64"`` /
    ``"float32"`` -> torch dtypes, ``k_range`` list -> tuple, ``learner`` ``"linear"`` /
    ``"mlp"`` -> the learner factory (``JointFedGMM``); nested lists (``means_init``, ...)
    are accepted by the constructors as they are.

    Args:
        name: one of ``ALGORITHMS`` (``FederatedEM``, ``FedGenGMM``, ``LocalGMMs``,
            ``JointFedGMM``).
        params: keyword arguments of that class.

    Raises:
        ValueError: unknown name, unknown dtype, or arguments the class does not take.
    """
    if name not in ALGORITHMS:
        raise ValueError(
            f"run_config '{ALGORITHM_KEY}' must be one of {sorted(ALGORITHMS)}; got {name!r}."
        )
    kwargs = dict(params)
    if "dtype" in kwargs:
        if kwargs["dtype"] not in DTYPES:
            raise ValueError(
                f"algorithm-params 'dtype' must be one of {sorted(DTYPES)}, got "
                f"{kwargs['dtype']!r}."
            )
        kwargs["dtype"] = DTYPES[kwargs["dtype"]]
    if "k_range" in kwargs:
        kwargs["k_range"] = tuple(kwargs["k_range"])
    try:
        return ALGORITHMS[name](kwargs)
    except TypeError as error:
        raise ValueError(f"algorithm-params do not fit {name}: {error}.") from None


def algorithm_from_run_config(run_config: Mapping[str, Any]) -> FederatedAlgorithm:
    """The algorithm a run's configuration describes (same object on server and nodes).

    ``run_config[SEED_KEY]`` (default 0) is the algorithm's ``random_state`` unless
    ``algorithm-params`` sets one.
    """
    if ALGORITHM_KEY not in run_config:
        raise ValueError(
            f"run_config has no '{ALGORITHM_KEY}' key; set it in [tool.flwr.app.config] of the "
            f'app\'s pyproject.toml, e.g. {ALGORITHM_KEY} = "FedGenGMM".'
        )
    params = parse_params(str(run_config.get(PARAMS_KEY, "{}")))
    params.setdefault("random_state", int(run_config.get(SEED_KEY, 0)))
    return build_algorithm(str(run_config[ALGORITHM_KEY]), params)


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
