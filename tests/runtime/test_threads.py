"""``fednovelty.runtime.threads``: the thread count of every step, its override, and that the
caller's own ``torch.get_num_threads()`` survives every fit.

Each test records ``torch.get_num_threads()`` inside the steps. Free cores are pinned with
``monkeypatch`` where a test needs a large kernel to get more than one thread (the real probe
reads the machine's momentary load, which the test suite itself changes).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from fednovelty.detectors import FedGMMDetector
from fednovelty.federated import FederatedAlgorithm, Message
from fednovelty.federated.core.declarations import ReplySpec
from fednovelty.federated.joint_models.joint import JointFedGMM
from fednovelty.federated.trust.backing import client_backing
from fednovelty.runtime import run_simulation
from fednovelty.runtime import threads as threads_module
from fednovelty.runtime.threads import (
    ENV_VAR,
    client_threads,
    client_work,
    free_cores,
    server_work,
    thread_setting,
    threads_for_work,
    torch_threads,
)

#: what torch would use on this machine when nobody sets a count (at least 2, so that "more
#: than one thread" is observable even on a one-core machine, where torch still allows it).
MANY = max(2, os.cpu_count() or 1)


@pytest.fixture
def caller_threads():
    """The caller's setting is ``MANY`` threads during the test; restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(MANY)
    yield MANY
    torch.set_num_threads(before)


@pytest.fixture
def no_override(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def small_crossover(monkeypatch):
    """A crossover of 1e6 work units, so that a "large" client is 8 MB, not gigabytes."""
    monkeypatch.setattr(threads_module, "PARALLEL_WORK", 1e6)


@pytest.fixture
def idle_machine(monkeypatch):
    """The free-core probe reports every core free."""
    monkeypatch.setattr(threads_module, "free_cores", lambda: MANY)


class RecordingAlgorithm(FederatedAlgorithm):
    """Two rounds; each client step and server step records ``torch.get_num_threads()``.
    The broadcast names ``n_components`` components (``means`` of shape (K, 1)) with full
    covariances, so a client's work is rows x K x features^2. ``fail_in`` raises inside the
    named step."""

    def __init__(self, n_components: int = 2, kind: str = "work", fail_in: str = "") -> None:
        self.n_components, self.kind, self.fail_in = n_components, kind, fail_in
        self.max_rounds = 2
        self.client_threads: list[int] = []
        self.server_threads: list[int] = []

    def reply_spec(self, kind: str) -> ReplySpec:
        rows = {"n_samples": "client"}
        return ReplySpec(kind, shapes=lambda b, d: {"n_samples": ()}, backing=rows)

    def start(self) -> dict:
        return {"round": 0}

    def configure(self, state: dict) -> Message:
        means = torch.zeros(self.n_components, 1, dtype=torch.float64)
        return Message(self.kind, {"means": means}, {"covariance_type": "full"})

    def client_step(self, X, message, context) -> Message:
        self.client_threads.append(torch.get_num_threads())
        if self.fail_in == "client":
            raise RuntimeError("client step failed")
        tensors = {"n_samples": torch.tensor(float(X.shape[0]))}
        return Message(self.kind, tensors, backing=client_backing(tensors, X.shape[0]))

    def server_step(self, state, replies):
        self.server_threads.append(torch.get_num_threads())
        if self.fail_in == "server":
            raise RuntimeError("server step failed")
        return {"round": state["round"] + 1}, {}

    def finished(self, state) -> bool:
        return state["round"] >= 2


def small_clients(n_clients: int = 3, rows: int = 20, width: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(rows, width, dtype=torch.float64, generator=gen) for _ in range(n_clients)]


def large_client(n_components: int, width: int = 10) -> torch.Tensor:
    """Rows enough that rows x K x width^2 reaches ``PARALLEL_WORK``."""
    rows = int(np.ceil(threads_module.PARALLEL_WORK / (n_components * width**2)))
    return torch.zeros(rows, width, dtype=torch.float64)


# ----------------------------------------------------------------------------- the context
def test_torch_threads_sets_the_body_and_restores_on_exit_and_on_error(caller_threads) -> None:
    with torch_threads(1):
        assert torch.get_num_threads() == 1
        with torch_threads(3):
            assert torch.get_num_threads() == 3
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == caller_threads
    with pytest.raises(KeyError), torch_threads(1):
        raise KeyError("inside")
    assert torch.get_num_threads() == caller_threads
    with torch_threads(None):
        assert torch.get_num_threads() == caller_threads


# ----------------------------------------------------------------------------- the override
def test_setting_comes_from_argument_then_environment_then_auto(monkeypatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert thread_setting() == "auto"
    monkeypatch.setenv(ENV_VAR, "3")
    assert thread_setting() == 3
    assert thread_setting(2) == 2
    assert thread_setting("auto") == "auto"
    monkeypatch.setenv(ENV_VAR, " AUTO ")
    assert thread_setting() == "auto"


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", ""])
def test_bad_environment_value_is_named(monkeypatch, bad) -> None:
    monkeypatch.setenv(ENV_VAR, bad)
    if bad == "":
        assert thread_setting() == "auto"  # an empty variable counts as unset
        return
    with pytest.raises(ValueError, match=f"{ENV_VAR} must be 'auto' or a positive integer"):
        thread_setting()


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "x"])
def test_bad_argument_is_named(bad) -> None:
    with pytest.raises(ValueError, match="threads must be 'auto' or a positive integer"):
        thread_setting(bad)


# ----------------------------------------------------------------------------- the choice
def test_auto_uses_one_thread_below_the_crossover_and_the_callers_count_above(
    caller_threads, no_override, idle_machine
) -> None:
    crossover = threads_module.PARALLEL_WORK
    assert threads_for_work(crossover / 10) == 1
    assert threads_for_work(crossover) == caller_threads
    torch.set_num_threads(1)  # a caller that asked for one thread never gets more
    assert threads_for_work(crossover * 10) == 1


def test_auto_takes_only_the_free_cores(caller_threads, no_override, monkeypatch) -> None:
    monkeypatch.setattr(threads_module, "free_cores", lambda: 0)
    crossover = threads_module.PARALLEL_WORK
    assert threads_for_work(crossover * 10) == 1
    monkeypatch.setattr(threads_module, "free_cores", lambda: None)  # unknown: trust the size
    assert threads_for_work(crossover * 10) == caller_threads


def test_free_cores_reads_the_runnable_count(tmp_path) -> None:
    loadavg = tmp_path / "loadavg"
    cores = os.cpu_count() or 1
    loadavg.write_text("0.50 0.40 0.30 1/200 12345\n")  # only the reader runs
    assert free_cores(str(loadavg)) == cores
    loadavg.write_text(f"9.0 8.0 7.0 {cores + 5}/300 12345\n")
    assert free_cores(str(loadavg)) == 0
    assert free_cores(str(tmp_path / "missing")) is None
    loadavg.write_text("garbage\n")
    assert free_cores(str(loadavg)) is None


def test_client_work_is_rows_times_components_times_features_squared() -> None:
    X = torch.zeros(100, 4)
    full = Message("em", {"means": torch.zeros(5, 4)}, {"covariance_type": "full"})
    diag = Message("em", {"means": torch.zeros(5, 4)}, {"covariance_type": "diag"})
    assert client_work(full, X) == 100 * 5 * 16
    assert client_work(diag, (X, torch.zeros(100))) == 100 * 5 * 4
    assert client_work(Message("centroids", scalars={"n_clusters": 7}), X) == 100 * 7 * 4
    local_fit = Message("local_fit", scalars={"candidates": "2,9,4", "covariance_type": "tied"})
    assert client_work(local_fit, X) == 100 * 9 * 16
    assert client_work(Message("moments"), X) == 100 * 4


def test_client_work_reads_k_and_the_covariance_type_from_the_algorithm() -> None:
    """A message that carries only what changes per round: K and the covariance type come
    from the algorithm's settings (its attributes, or its ``config``'s)."""

    class Settings:
        covariance_type, n_components, k_range, client_components = "full", 6, (1, 9), None

    class Configured:
        config = Settings()

    X = torch.zeros(100, 4)
    em = Message("em", {"means": torch.zeros(5, 4)})
    assert client_work(em, X) == 100 * 5 * 4
    assert client_work(em, X, Settings()) == client_work(em, X, Configured()) == 100 * 5 * 16
    assert client_work(Message("centroids"), X, Settings()) == 100 * 6 * 4
    assert client_work(Message("local_fit"), X, Settings()) == 100 * 9 * 16
    Settings.client_components = 3
    assert client_work(Message("local_fit"), X, Settings()) == 100 * 3 * 16
    assert client_work(Message("moments"), X, Settings()) == 100 * 4


def test_server_work_of_a_synthetic_fit_counts_the_drawn_rows() -> None:
    class Drawing:
        samples_per_component, n_components, k_range = 100, 6, (1, 8)

    def reply(k: int) -> Message:
        return Message("local_fit", {"weights": torch.ones(k), "means": torch.zeros(k, 5)})

    replies = {0: reply(3), 1: reply(4)}
    assert server_work(Drawing(), replies) == 100 * 7 * 8 * 25
    sums = {0: Message("em", {"counts": torch.ones(3), "sums": torch.zeros(3, 5)})}
    assert server_work(object(), sums) == 3 + 15


# ----------------------------------------------------------------------------- the engine
def test_small_clients_and_servers_run_on_one_thread(caller_threads, no_override) -> None:
    algorithm = RecordingAlgorithm()
    run_simulation(algorithm, small_clients())
    assert algorithm.client_threads == [1] * 6
    assert algorithm.server_threads == [1, 1]
    assert torch.get_num_threads() == caller_threads


def test_a_large_client_gets_the_callers_threads_on_free_cores(
    caller_threads, no_override, idle_machine, small_crossover
) -> None:
    algorithm = RecordingAlgorithm(n_components=10)
    clients = {0: small_clients(1, width=10)[0], 1: large_client(10)}
    run_simulation(algorithm, clients)
    assert algorithm.client_threads == [1, caller_threads] * 2
    assert torch.get_num_threads() == caller_threads


def test_the_override_is_honoured_by_every_step(caller_threads, monkeypatch) -> None:
    monkeypatch.setenv(ENV_VAR, "3")
    algorithm = RecordingAlgorithm()
    run_simulation(algorithm, small_clients())
    assert set(algorithm.client_threads) == {3} and set(algorithm.server_threads) == {3}
    assert torch.get_num_threads() == caller_threads


@pytest.mark.parametrize("where", ["client", "server"])
def test_the_callers_threads_survive_a_failing_step(caller_threads, no_override, where) -> None:
    with pytest.raises(RuntimeError, match=f"{where} step failed"):
        run_simulation(RecordingAlgorithm(fail_in=where), small_clients())
    assert torch.get_num_threads() == caller_threads


def test_learner_sgd_runs_on_one_thread_at_any_size(
    caller_threads, no_override, idle_machine, monkeypatch
) -> None:
    """Every client step would get the caller's threads (crossover at 0 work), except learner
    SGD, one client's or a batched round's. (Server steps stay on one thread here: the test
    is about the clients.)"""
    monkeypatch.setattr(threads_module, "PARALLEL_WORK", 0.0)
    monkeypatch.setattr(threads_module, "server_work", lambda *_: -1.0)
    with client_threads(Message("joint_em"), large_client(10)):
        assert torch.get_num_threads() == 1
    with client_threads(Message("em", {"means": torch.zeros(10, 10)}), large_client(10)):
        assert torch.get_num_threads() == caller_threads
    seen: list[tuple[int, int]] = []
    original = JointFedGMM._local_sgd_many

    def recording(self, tasks):
        seen.append((len(tasks), torch.get_num_threads()))
        return original(self, tasks)

    monkeypatch.setattr(JointFedGMM, "_local_sgd_many", recording)
    clients = [(X, (X[:, 0] > 0).long()) for X in small_clients(2, rows=30, width=2)]
    algorithm = JointFedGMM(  # given initial parameters: joint rounds only
        2,
        1,
        2,
        weights_init=np.full(2, 0.5),
        means_init=np.array([[-1.0, 0.0], [1.0, 0.0]]),
        precisions_init=np.stack([np.eye(2)] * 2),
        max_iter=2,
    )
    run_simulation(algorithm, clients, batch_clients=False)
    assert seen == [(1, 1)] * 4  # 2 rounds x 2 clients x 1 learner, one at a time
    seen.clear()
    run_simulation(algorithm, clients)
    assert seen == [(2, 1)] * 2  # 2 rounds, both clients' learners at once
    assert torch.get_num_threads() == caller_threads


# ----------------------------------------------------------------------------- detectors
@pytest.mark.filterwarnings("ignore:Federated EM did not converge")
def test_detector_fit_and_scoring_leave_the_callers_threads(caller_threads, no_override) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(150, 3))
    model = FedGMMDetector(2, max_iter=3, random_state=0).fit(X, groups=np.arange(150) % 3)
    assert torch.get_num_threads() == caller_threads
    seen: list[int] = []
    original = model._log_density

    def recording(rows):
        seen.append(torch.get_num_threads())
        return original(rows)

    model._log_density = recording
    model.score_samples(X[:10])
    assert seen == [1]
    assert torch.get_num_threads() == caller_threads


def test_flower_client_step_runs_under_the_choice(caller_threads, monkeypatch) -> None:
    """``handle_train`` (one round on a Flower node): a small client on one thread, the
    override honoured, the node's own setting restored."""
    import json

    from flwr.app import Context, RecordDict
    from flwr.app import Message as FlowerMessage
    from flwr.supercore.task_identity import TaskIdentity

    from fednovelty.federated import FederatedEM
    from fednovelty.runtime.flower.client import handle_train
    from fednovelty.runtime.flower.codec import encode_message
    from fednovelty.runtime.flower.config import algorithm_from_run_config

    for name, value in (("_run_id", 1), ("_node_id", 5), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    seen: list[int] = []
    original = FederatedEM.client_steps  # what answer runs, one client or several

    def recording(self, *args, **kwargs):
        seen.append(torch.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FederatedEM, "client_steps", recording)
    params = {"n_components": 2, "max_iter": 2}
    run_config = {"algorithm": "FederatedEM", "algorithm-params": json.dumps(params), "seed": 0}
    algorithm = algorithm_from_run_config(run_config)
    broadcast = algorithm.configure(algorithm.start())
    rows = np.random.default_rng(0).normal(size=(40, 3))
    for override in (None, "3"):
        if override is None:
            monkeypatch.delenv(ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(ENV_VAR, override)
        message = FlowerMessage(encode_message(broadcast), dst_node_id=5, message_type="train")
        message.metadata.__dict__["_message_id"] = "m0"
        context = Context(1, 5, {"partition-id": 0}, RecordDict(), run_config)
        handle_train(message, context, lambda _: (0, rows))
        assert torch.get_num_threads() == caller_threads
    assert seen == [1, 3]
