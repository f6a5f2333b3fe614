"""``flwr run .`` on Flower's local simulation, as a Flower user runs it first: the app
``fednovelty flower new`` writes, unchanged but for the data and result paths and the seed,
on two simulated SuperNodes (Flower's Ray backend), each taking its ``partition-id`` block of
one file (ADBench Pima's training inliers). The model equals ``FedGenGMMDetector.fit`` on the
same blocks, to float64 round-off.

What the user does, so what the test does: the virtualenv's ``bin`` first on ``PATH`` (flwr
starts ``flower-superlink`` and ``flower-superexec`` from it), ``FLWR_DISABLE_RUNTIME_
DEPENDENCY_INSTALLATION=1`` (fednovelty is already installed; the SuperLink would otherwise
``uv sync`` the app's dependencies into a fresh environment from the package index), and
``flwr run . --federation-config "num-supernodes=2"``. ``flwr`` starts a local SuperLink in
simulation mode in the background and leaves it running; here it has a ``FLWR_HOME`` and
ports of its own and is stopped (its process group and its SuperExec's, found by the
test's own ports) when the test ends. Marked slow: about 20-40 s on the 2-core test machine.

Beside it, the same app as written on a SuperLink and three SuperNodes on 127.0.0.1
(``LocalFederation``, ClientApps forked from a preloaded process), each node given
``partition-id`` and ``num-partitions`` as the simulation gives them: the same model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray", reason="Flower's simulation needs flwr[simulation] (Ray)")

from test_flower_app_template import assert_same_detector, pima

from fednovelty import FedGenGMMDetector
from fednovelty.cli import main
from fednovelty.detectors._fit_state import seed_from
from fednovelty.runtime.flower import load_result
from fednovelty.runtime.flower.deploy import FLOWER_ENV, free_port

pytestmark = pytest.mark.slow
N_NODES = 2


def processes_naming(marks: list[str]) -> list[int]:
    """Ids of this user's processes whose command line holds one of ``marks``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if any(mark in command for mark in marks):
            found.append(int(entry.name))
    return found


def stop_local_superlink(marks: list[str], grace: float = 30.0) -> None:
    """SIGTERM the process groups of the local SuperLink and SuperExec that ``flwr run``
    started (found by ``marks``: this test's FLWR_HOME and ports), SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        groups = set()
        for pid in processes_naming(marks):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                continue
        for group in groups:
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                continue
        deadline = time.monotonic() + grace
        while processes_naming(marks) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not processes_naming(marks):
            return


def new_app_on_pima(folder: Path) -> tuple[np.ndarray, Path]:
    """Pima's training rows (saved as ``folder/train.npy``) and the app ``fednovelty
    flower new`` writes into ``folder/my-app``."""
    X_train, _, _ = pima()
    np.save(folder / "train.npy", X_train)
    app = folder / "my-app"
    assert main(["flower", "new", str(app)]) == 0
    return X_train, app


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flwr_run_on_the_local_simulation_gives_the_detectors_model(tmp_path):
    X_train, app = new_app_on_pima(tmp_path)
    home, http, control = tmp_path / "flwr-home", free_port(), free_port()
    env = {
        **os.environ,
        **FLOWER_ENV,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }
    result_path = tmp_path / "model.safetensors"
    overrides = (
        f'data-path="{tmp_path / "train.npy"}" result-path="{result_path}" seed={seed_from(0)}'
    )
    command = ["flwr", "run", ".", "--stream", "--federation-config",
               f"num-supernodes={N_NODES}", "--run-config", overrides]  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=app, env=env, capture_output=True, text=True, timeout=600
        )  # a wait, not a budget
    finally:
        seconds = time.monotonic() - started
        stop_local_superlink([str(home), f"127.0.0.1:{http}"])
    log = done.stdout + done.stderr
    print(f"flwr run on the local simulation: {seconds:.1f} s", log[-3000:], sep="\n")
    assert done.returncode == 0, log[-3000:]
    assert f"({N_NODES} simulated SuperNodes)" in log
    assert "rows of 8 features" in log
    assert f"round 1 (local_fit): {N_NODES}/{N_NODES} replied validly" in log
    result = load_result(result_path)
    blocks = np.array_split(X_train, N_NODES)
    groups = np.concatenate([np.full(len(b), c) for c, b in enumerate(blocks)])
    in_process = FedGenGMMDetector(random_state=0).fit(X_train, groups=groups)
    assert_same_detector(FedGenGMMDetector.from_model(result, X_train), in_process)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_app_on_superlink_and_supernodes_gives_the_detectors_model(tmp_path):
    from fednovelty.runtime.flower.deploy import LocalFederation

    X_train, app = new_app_on_pima(tmp_path)
    n_nodes = 3
    configs = [{"partition-id": i, "num-partitions": n_nodes} for i in range(n_nodes)]
    run_config = {"data-path": str(tmp_path / "train.npy"), "num-nodes": n_nodes,
                  "seed": seed_from(0)}  # fmt: skip
    with LocalFederation(configs, workdir=tmp_path / "deployment", preload=True) as federation:
        result = federation.run_app(app, run_config, timeout=600)  # a wait, not a budget
        log = federation.run_log().read_text()
    assert "rows of 8 features" in log
    assert [(r.kind, r.replied) for r in result.history] == [("local_fit", (0, 1, 2))]
    blocks = np.array_split(X_train, n_nodes)
    groups = np.concatenate([np.full(len(b), c) for c, b in enumerate(blocks)])
    in_process = FedGenGMMDetector(random_state=0).fit(X_train, groups=groups)
    assert_same_detector(FedGenGMMDetector.from_model(result, X_train), in_process)
