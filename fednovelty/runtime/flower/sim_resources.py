"""What each virtual client of Flower's Simulation Engine may use, checked against the machine.

Flower's Ray backend starts a pool of ClientApp actors sized by the machine's resources and
``client_resources`` (``min(floor(CPUs / num_cpus), floor(GPUs / num_gpus))`` actors) and
hands each message to an idle one. Two known pitfalls of that sizing are checked here,
before Ray starts:

- **Too many actors on a GPU** (Flower, upstream issue #5855): ``num_gpus`` is a share of a GPU
  Ray uses for scheduling only; it does not divide the GPU's memory. ``num_gpus=0.05`` packs
  up to 20 actors on each GPU, each with a CUDA context of its own (about 0.5 GiB before any
  work) and its client's tensors: the GPU runs out of memory and the actors die. With
  ``num_gpus > 0`` the actors a GPU takes times ``gpu_memory`` (GiB one client needs, its
  context included) must fit the GPU's memory, or :func:`check_resources` refuses and says
  the least ``num_gpus`` that fits; a machine without a CUDA device is refused outright
  (Flower would stop with "ActorPool is empty"). An algorithm on ``cuda`` with
  ``num_gpus=0`` is refused too: Ray hides every GPU from an actor that asks for none.
- **``num_cpus`` not doing what it says** (Flower, upstream issue #3463): the machine's CPU count
  Ray schedules against is ``ray.init``'s ``num_cpus`` (``init_args``), not a ``num_cpus``
  next to ``client_resources`` (which Flower ignores), and Ray never pins an actor to its
  ``num_cpus``: an actor's torch uses as many threads as it likes. Here the CPU count is
  ``init_args["num_cpus"]`` (default: the cores this process may run on), a client asking
  for more CPUs than that is refused (no actor would fit), ``init_args["num_cpus"]`` above
  the machine's cores warns (more actors than cores), ``init_args`` given while Ray is
  already running warn (Ray ignores them: the running cluster's resources are used), and
  every actor runs torch with ``num_cpus`` threads (:func:`actor_threads`).

Nothing here imports Ray or Flower.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping
from numbers import Real
from typing import Any

#: the ``client_resources`` keys Ray's actor options take here.
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory")
#: GiB one client on a GPU is assumed to need when not told (its CUDA context included).
DEFAULT_GPU_MEMORY = 1.0
#: ``ray.init`` arguments the engine sets unless given: no dashboard, quiet logs.
QUIET_INIT = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": True}


class SimulationResourceWarning(UserWarning):
    """A resource setting of Flower's Simulation Engine that will not do what it seems to:
    more actors than cores, or ``init_args`` ignored by a Ray that is already running."""


def machine_cpus() -> int:
    """Cores this process may run on (its CPU affinity; ``os.cpu_count()`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def machine_gpus() -> list[float]:
    """Memory in GiB of each CUDA device torch sees (empty without one)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [
        torch.cuda.get_device_properties(i).total_memory / 2**30
        for i in range(torch.cuda.device_count())
    ]


def _number(key: str, value: Any, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"client_resources[{key!r}] must be a number; got {value!r}.")
    if value < minimum or (strict and value == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ValueError(f"client_resources[{key!r}] must be {bound}; got {value!r}.")
    return float(value)


def check_resources(
    client_resources: Mapping[str, Any] | None,
    init_args: Mapping[str, Any] | None,
    *,
    ray_running: bool = False,
    ray_cpus: float | None = None,
    ray_gpus: float | None = None,
    gpu_memory: float = DEFAULT_GPU_MEMORY,
    device: str = "cpu",
    cpus: int | None = None,
    gpus: list[float] | None = None,
) -> tuple[dict[str, float], dict[str, Any], int]:
    """Check one simulation's resources against the machine (module docstring).

    Args:
        client_resources: Ray actor options of one virtual client: ``num_cpus`` (default
            1), ``num_gpus`` (default 0), ``memory`` (bytes); other keys are refused.
        init_args: ``ray.init`` arguments (``num_cpus``, ``num_gpus``, ...); those of
            :data:`QUIET_INIT` are added unless given.
        ray_running: Ray is already initialised (its ``ray_cpus`` and ``ray_gpus`` are the
            cluster's); ``init_args`` are then ignored by Ray, which warns.
        gpu_memory: GiB one client on a GPU needs, its CUDA context included.
        device: the algorithm's torch device type (``"cuda"`` needs ``num_gpus > 0``).
        cpus, gpus: the machine's cores and its GPUs' memory in GiB (default:
            :func:`machine_cpus`, :func:`machine_gpus`; tests give their own).

    Returns:
        ``(client_resources, init_args, actors)``: the actor options with their defaults,
        the ``ray.init`` arguments, and how many ClientApp actors Flower will start.

    Raises:
        ValueError: an unknown key or a value out of range; a client that no actor slot
            fits (more CPUs than there are, a GPU where there is none); more actors on one
            GPU than its memory holds; ``device="cuda"`` with ``num_gpus=0``.
    """
    given = dict(client_resources or {})
    unknown = sorted(set(given) - set(RESOURCE_KEYS))
    if unknown:
        raise ValueError(
            f"client_resources takes {list(RESOURCE_KEYS)}; got {unknown}. Ray's own "
            "settings (the machine's num_cpus, num_gpus) go in init_args."
        )
    resources = {
        "num_cpus": _number("num_cpus", given.get("num_cpus", 1), 0.0, strict=True),
        "num_gpus": _number("num_gpus", given.get("num_gpus", 0), 0.0, strict=False),
    }
    if "memory" in given:
        resources["memory"] = _number("memory", given["memory"], 0.0, strict=True)
    if gpu_memory <= 0:
        raise ValueError(f"gpu_memory must be > 0 GiB; got {gpu_memory!r}.")
    args = {**QUIET_INIT, **dict(init_args or {})}
    cores = machine_cpus() if cpus is None else int(cpus)
    if ray_running:
        if init_args:
            warnings.warn(
                SimulationResourceWarning(
                    f"init_args {sorted(init_args)} are ignored: Ray is already running, "
                    "and the simulation uses its resources. Shut Ray down "
                    "(ray.shutdown()) to start it with these."
                ),
                stacklevel=3,
            )
        total_cpus = float(ray_cpus if ray_cpus is not None else cores)
    else:
        total_cpus = float(args.setdefault("num_cpus", cores))
        if total_cpus > cores:
            warnings.warn(
                SimulationResourceWarning(
                    f"init_args num_cpus={total_cpus:g} is more than this machine's {cores} "
                    "cores: Ray will run more ClientApp actors than there are cores, which "
                    "slows every round."
                ),
                stacklevel=3,
            )
    if resources["num_cpus"] > total_cpus:
        raise ValueError(
            f"client_resources num_cpus={resources['num_cpus']:g} is more than the "
            f"{total_cpus:g} CPUs Ray has: no ClientApp actor fits. Lower num_cpus, or "
            "raise init_args num_cpus."
        )
    actors = int(total_cpus / resources["num_cpus"])  # Flower's own count
    num_gpus = resources["num_gpus"]
    if device == "cuda" and num_gpus == 0:
        raise ValueError(
            "the algorithm runs on cuda but client_resources num_gpus=0: Ray hides every "
            "GPU from an actor that asks for none. Give each client a share of a GPU "
            '(e.g. {"num_gpus": 0.25}), or run the algorithm on cpu.'
        )
    if num_gpus > 0:
        memory = machine_gpus() if gpus is None else list(gpus)
        if ray_gpus is not None:
            memory = memory[: int(ray_gpus)]
        elif "num_gpus" in args:
            memory = memory[: int(args["num_gpus"])]
        if not memory:
            raise ValueError(
                f"client_resources num_gpus={num_gpus:g} but Ray sees no GPU here: no "
                "ClientApp actor fits. Set num_gpus=0 (the clients run on CPU)."
            )
        gpu_actors = int(len(memory) / num_gpus)  # Flower's own count
        if gpu_actors == 0:
            raise ValueError(
                f"client_resources num_gpus={num_gpus:g} is more than the {len(memory)} "
                "GPU(s) Ray sees: no ClientApp actor fits. Lower num_gpus."
            )
        per_gpu = min(max(1, int(1 / num_gpus)), actors)
        smallest = min(memory)
        if per_gpu * gpu_memory > smallest:
            fits = max(1, int(smallest / gpu_memory))
            raise ValueError(
                f"client_resources num_gpus={num_gpus:g} puts up to {per_gpu} ClientApp "
                f"actors on one GPU, each needing about {gpu_memory:g} GiB (gpu_memory), "
                f"more than the {smallest:.1f} GiB of the smallest GPU: the actors would run "
                f"out of GPU memory. Use num_gpus >= {1.0 / fits:.3g} ({fits} actors per "
                "GPU), or a smaller gpu_memory if one client needs less."
            )
        actors = min(actors, gpu_actors)
    return resources, args, max(actors, 1)


def actor_threads(num_cpus: float) -> int:
    """Torch threads of one ClientApp actor: its ``num_cpus``, at least one."""
    return max(1, int(num_cpus))
