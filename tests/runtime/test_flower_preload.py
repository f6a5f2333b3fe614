"""The preload server (``runtime/flower/preload.py``) with a stand-in command
(``_preload_fake.py``): what the shim is started with reaches a fresh forked child, and what
the child does (exit code, output, signals) reaches the shim's caller. The Flower end-to-end
tests run every ClientApp and ServerApp through it (``LocalFederation(preload=True)``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fednovelty.runtime.flower.preload import write_shims

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork and SCM_RIGHTS: Linux")

HERE = Path(__file__).resolve().parent


@pytest.fixture
def server(tmp_path):
    """A preload server for ``fake-app`` and its shim folder; stopped with SIGTERM."""
    sock = tmp_path / "s"
    command = [sys.executable, "-m", "fednovelty.runtime.flower.preload", str(sock)]
    command += ["--command", "fake-app=_preload_fake:main", "--preload", "json"]
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the preload server did not listen within 60 s"
        time.sleep(0.05)
    shims = write_shims(tmp_path / "bin", sock, {"fake-app": "/nonexistent/fake-app"})
    yield process, shims
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0  # its exit unloads torch: seconds on a busy machine
    assert not sock.exists()  # the server removes its socket


def run_shim(shims: Path, *args: str, cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRELOAD_TEST_MARKER": "from-the-shim"}
    return subprocess.run(
        [str(shims / "fake-app"), *args], cwd=cwd, env=env, capture_output=True, **kwargs
    )


def test_the_child_gets_the_shims_arguments_environment_folder_and_streams(server, tmp_path):
    process, shims = server
    work = tmp_path / "work"
    work.mkdir()
    first = run_shim(shims, "report", "3", cwd=work, timeout=30)
    second = run_shim(shims, "report", "0", cwd=work, timeout=30)
    assert (first.returncode, second.returncode) == (3, 0)
    got = [json.loads(done.stdout) for done in (first, second)]
    assert got[0]["argv"] == [str(shims / "fake-app"), "report", "3"]
    assert {r["cwd"] for r in got} == {str(work)}
    assert {r["marker"] for r in got} == {"from-the-shim"}  # not the server's environment
    assert first.stderr.decode().strip() == "to stderr"
    # Two fresh processes, neither the server, and no module state carried between them.
    assert len({got[0]["pid"], got[1]["pid"], process.pid}) == 3
    assert [r["starts"] for r in got] == [1, 1]


def test_sigterm_to_the_shim_reaches_the_child(server, tmp_path):
    _, shims = server
    env = {**os.environ, "PRELOAD_TEST_MARKER": "x"}
    shim = subprocess.Popen(
        [str(shims / "fake-app"), "wait"], cwd=tmp_path, env=env, stdout=subprocess.PIPE
    )
    assert shim.stdout.readline().decode().strip() == "waiting"
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=30) == 7
    assert shim.stdout.read().decode().strip() == f"got signal {int(signal.SIGTERM)}"


def test_without_a_server_the_shim_starts_the_real_command_and_says_so(tmp_path):
    real = tmp_path / "real-app"
    real.write_text('#!/bin/sh\necho real "$@"\nexit 5\n')
    real.chmod(0o755)
    shims = write_shims(tmp_path / "bin", tmp_path / "no-socket", {"fake-app": str(real)})
    done = run_shim(shims, "a", "b", cwd=tmp_path, timeout=30)
    assert done.returncode == 5
    assert done.stdout.decode().strip() == "real a b"
    assert "no preload server at" in done.stderr.decode()


def test_an_unknown_command_is_refused_and_the_server_goes_on(server, tmp_path):
    process, shims = server
    write_shims(shims, tmp_path / "s", {"other-app": "/nonexistent/other-app"})
    refused = subprocess.run([str(shims / "other-app")], capture_output=True, timeout=30)
    assert refused.returncode != 0
    assert "closed the connection" in refused.stderr.decode()
    assert run_shim(shims, "report", "0", cwd=tmp_path, timeout=30).returncode == 0
    assert process.poll() is None


def test_a_killed_shim_takes_its_child_with_it(server, tmp_path):
    """SIGKILL cannot be forwarded: the server sees the shim's connection close and kills
    the child, as killing a SuperNode's process group kills its ClientApp."""
    _, shims = server
    shim = subprocess.Popen(
        [str(shims / "fake-app"), "report-pid-and-wait"], cwd=tmp_path, stdout=subprocess.PIPE
    )
    child = int(shim.stdout.readline())
    shim.kill()
    shim.wait(timeout=10)
    deadline = time.monotonic() + 30
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its shim by 30 s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has ended; its parent reaps it
