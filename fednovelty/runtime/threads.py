"""Torch threads for the library's own steps: one for small kernels, more only for large ones.

torch runs each operation over ``torch.get_num_threads()`` OpenMP threads (by default one per
core), and every parallel operation ends at a barrier that waits for its slowest thread. When
other work shares the cores, one of those threads is often off its core for a whole scheduler
time slice, so an operation of a fraction of a millisecond waits milliseconds, and the
waiting threads spin. The library's steps are mostly such operations: E-steps cut into
cache-sized blocks, k-means on a client's rows, learner SGD on batches of 32 rows.

The engines therefore run each client step and each server step, and the detectors their
scoring, inside :func:`torch_threads` with a count chosen here:

- ``"auto"`` (the default): one thread, unless the step's work (:func:`client_work`,
  :func:`server_work`: rows x components x features^2 for full covariances, x features
  otherwise) reaches :data:`PARALLEL_WORK` *and* the cores are free (:func:`free_cores`);
  then the caller's own ``torch.get_num_threads()``, capped by the free cores. A client
  step whose declaration says ``serial`` (learner SGD on small batches, e.g. ``joint_em``
  rounds) always runs on one thread: its batches are small at any size.
- an integer ``n >= 1``: every step runs with ``n`` threads (the ``threads`` argument, else
  the environment variable ``FEDNOVELTY_NUM_THREADS``).

The caller's setting is restored after every step (also when the step raises), so a fit
never changes the thread count of the program that runs it.

:data:`PARALLEL_WORK` is set from ``benchmarks/bench_threads.py`` (kernels and fits at one and
more threads, alone and under load); its measurements are in ``benchmarks/README.md``
("Threads under load").
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch

from fednovelty.federated.core.declarations import ReplySpec, UndeclaredReplyError, declared_spec
from fednovelty.federated.trust import gate
from fednovelty.runtime.clients import client_rows

#: environment variable that overrides the choice: ``auto`` or a positive integer.
ENV_VAR = "FEDNOVELTY_NUM_THREADS"
#: work units (rows x components x features^2, full covariances) from which a step may use
#: more than one thread (on free cores).
PARALLEL_WORK = 2e9


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(n)``; restore the previous count on exit.

    ``None`` leaves the count alone. Nestable; restores also when the body raises.
    """
    previous = torch.get_num_threads()
    if n is not None and n != previous:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def thread_setting(threads: int | str | None = None) -> int | str:
    """The override in force: ``threads`` if given, else ``$FEDNOVELTY_NUM_THREADS``, else
    ``"auto"``. Returns ``"auto"`` or a positive int.

    Raises:
        ValueError: the value is neither ``"auto"`` nor a positive integer (names its source).
    """
    source = "threads"
    if threads is None:
        threads, source = os.environ.get(ENV_VAR, "auto").strip() or "auto", ENV_VAR
    if isinstance(threads, str) and threads.lower() == "auto":
        return "auto"
    try:
        value = int(threads)
        valid = not isinstance(threads, bool) and value >= 1 and float(threads) == value
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise ValueError(
            f"{source} must be 'auto' or a positive integer number of torch threads, got "
            f"{threads!r}; e.g. {ENV_VAR}=1 for one thread per step."
        )
    return value


def free_cores(loadavg: str = "/proc/loadavg") -> int | None:
    """Cores not taken by other runnable threads right now, or ``None`` where unknown.

    Reads the runnable-thread count of ``loadavg`` (Linux's ``/proc/loadavg``, 4th field
    ``runnable/total``; it counts the reading thread itself): ``os.cpu_count() - (runnable
    - 1)``, at least 0. ``None`` where the file is missing or unreadable (not Linux).
    """
    try:
        with open(loadavg) as handle:
            runnable = int(handle.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None
    return max(0, (os.cpu_count() or 1) - (runnable - 1))


def threads_for_work(work: float, threads: int | str | None = None) -> int:
    """Thread count for a step of ``work`` units under the override ``threads``.

    ``"auto"``: 1 below :data:`PARALLEL_WORK`; above it the caller's
    ``torch.get_num_threads()`` capped by :func:`free_cores` (at least 1). An integer
    override is returned as is.
    """
    setting = thread_setting(threads)
    if setting != "auto":
        return int(setting)
    caller = torch.get_num_threads()
    if work < PARALLEL_WORK or caller <= 1:
        return 1
    free = free_cores()
    return caller if free is None else max(1, min(caller, free))


def _setting(algorithm: Any, name: str) -> Any:
    """An algorithm's setting: its attribute ``name``, else its ``config``'s; ``None``."""
    value = getattr(algorithm, name, None)
    if value is None:
        value = getattr(getattr(algorithm, "config", None), name, None)
    return value


def step_spec(message, algorithm: Any = None) -> ReplySpec | None:
    """The declaration of the step that answers ``message``: ``algorithm.reply_spec``,
    else the package's own declaration of the kind; ``None`` where none is known."""
    for find in (getattr(algorithm, "reply_spec", None), declared_spec):
        if find is None:
            continue
        try:
            return find(message.kind)
        except UndeclaredReplyError:
            continue
    return None


def _feature_power(message, algorithm: Any = None, spec: ReplySpec | None = None) -> int:
    """2 when the step's statistics have full (or tied) covariances, else 1: the message's
    ``covariance_type`` scalar, else the algorithm's setting where the step declares that
    it applies (``ReplySpec.covariance``)."""
    covariance_type = message.scalars.get("covariance_type")
    if covariance_type is None and spec is not None and spec.covariance:
        covariance_type = _setting(algorithm, "covariance_type")
    return 2 if covariance_type in ("full", "tied") else 1


def _n_components(message, algorithm: Any = None, spec: ReplySpec | None = None) -> int:
    """K a client step works with: from the message's fields (``means``/``centers`` rows,
    ``n_clusters``, ``candidates``), else from the algorithm's settings as the step
    declares (``ReplySpec.components``: k-means, local fits); 1 otherwise."""
    for name in ("means", "centers"):
        if name in message.tensors:
            return int(message.tensors[name].shape[0])
    if "n_clusters" in message.scalars:
        return max(1, int(message.scalars["n_clusters"]))
    candidates = str(message.scalars.get("candidates", ""))
    numbers = [int(part) for part in candidates.split(",") if part.strip().isdigit()]
    if numbers:
        return max(numbers)
    if spec is not None and spec.components is not None:
        return max(1, int(spec.components(lambda name: _setting(algorithm, name))))
    return 1


def client_work(message, data: Any, algorithm: Any = None) -> float:
    """Work units of one client step: rows x K x features^p (p = 2 with full covariances).

    Args:
        message: the broadcast ``Message``; data: the client's rows (n_samples, n_features)
            or a tuple whose first entry they are; algorithm: whose declaration of the
            message's kind (:func:`step_spec`) says whether its settings give K and the
            covariance type when the message does not carry them.
    """
    X = client_rows(data)
    n_rows, n_features = (int(X.shape[0]), int(X.shape[1])) if X.ndim == 2 else (0, 0)
    spec = step_spec(message, algorithm)
    k = _n_components(message, algorithm, spec)
    return float(n_rows) * k * float(n_features) ** _feature_power(message, algorithm, spec)


def server_work(algorithm: Any, replies: Mapping[int, Any]) -> float:
    """Work units of one server step.

    A server that fits a mixture on rows it draws from the clients' mixtures (an algorithm
    with ``samples_per_component``, e.g. FedGenGMM) works on ``samples_per_component x sum_c
    K_c`` rows with K up to ``n_components`` (its largest candidate); any other server step
    adds statistics and runs an M-step: total reply entries x features.
    """
    width = max((int(r.tensors["means"].shape[-1]) for r in _fitted(replies)), default=0)
    per_component = int(getattr(algorithm, "samples_per_component", 0) or 0)
    if per_component and width:
        n_rows = per_component * sum(int(r.tensors["weights"].shape[0]) for r in _fitted(replies))
        k_max = max(int(getattr(algorithm, "n_components", 0) or 0), *_k_range(algorithm))
        return float(n_rows) * max(1, k_max) * float(width) ** 2
    entries = sum(t.numel() for r in replies.values() for t in r.tensors.values())
    return float(entries) * max(1, width)


def _fitted(replies: Mapping[int, Any]) -> list:
    """Replies that carry a mixture (``weights`` and ``means``)."""
    return [r for r in replies.values() if "weights" in r.tensors and "means" in r.tensors]


def _k_range(algorithm: Any) -> tuple[int, ...]:
    k_range = getattr(algorithm, "k_range", None)
    return tuple(int(k) for k in k_range) if k_range else (0,)


def client_threads(message, data: Any, threads: int | str | None = None, algorithm: Any = None):
    """Context manager for one client step: :func:`torch_threads` with the count chosen for
    ``message`` (a step declared ``serial``, learner SGD: 1) on ``data`` under the override
    ``threads`` (:func:`client_work`, ``algorithm`` the step's)."""
    if thread_setting(threads) == "auto":
        spec = step_spec(message, algorithm)
        if spec is not None and spec.serial:
            return torch_threads(1)
    return torch_threads(threads_for_work(client_work(message, data, algorithm), threads))


def server_threads(algorithm: Any, replies: Mapping[int, Any], threads: int | str | None = None):
    """Context manager for one server step over ``replies`` (see :func:`server_work`)."""
    return torch_threads(threads_for_work(server_work(algorithm, replies), threads))


def scoring_threads(
    n_rows: int, n_features: int, n_components: int, threads: int | str | None = None
):
    """Context manager for scoring ``n_rows`` rows under a full-covariance mixture."""
    return torch_threads(threads_for_work(float(n_rows) * n_components * n_features**2, threads))


def run_client_step(algorithm: Any, data: Any, message, context, threads=None):
    """The client step, then the client gate (:func:`fednovelty.federated.trust.gate.
    answer`), under :func:`client_threads`: the one place every engine runs a client half."""
    with client_threads(message, data, threads, algorithm):
        return gate.answer(algorithm, data, message, context)


def run_client_steps(algorithm: Any, items, message, threads=None) -> list:
    """:func:`fednovelty.federated.trust.gate.answer_many`: the client steps of several in-process
    clients ``items`` (``(data, context)`` pairs) as one batched computation, each reply
    through its own client's gate; under :func:`client_threads` of the largest client (a
    ``serial`` step stays on one thread batched too: 100 FEMNIST writers' stacked learners
    trained 1.2x slower on two threads than on one, ``benchmarks/clients_parallel.py``)."""
    largest = max((data for data, _ in items), key=lambda d: int(client_rows(d).shape[0]))
    with client_threads(message, largest, threads, algorithm):
        return gate.answer_many(algorithm, items, message)


def run_server_step(algorithm: Any, state: Any, replies: Mapping[int, Any], threads=None):
    """``algorithm.server_step(state, replies)`` under :func:`server_threads`."""
    with server_threads(algorithm, replies, threads):
        return algorithm.server_step(state, replies)
