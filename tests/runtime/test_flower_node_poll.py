"""The SuperNode launcher of ``LocalFederation`` (``runtime/flower/node_poll.py``): Flower's
waits in the SuperNode loop capped, nothing else touched, and a LocalFederation's processes
started with it and with the SuperExec's poll interval."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fednovelty.runtime.flower import deploy, node_poll


def test_capped_sleep_waits_at_most_the_poll() -> None:
    waited: list[float] = []
    wait = node_poll.capped_sleep(0.1, waited.append)
    wait(3)
    wait(0.5)
    wait(0.02)
    assert waited == [0.1, 0.1, 0.02]


def test_the_patch_reaches_the_supernode_loop_only(monkeypatch) -> None:
    from flwr.supernode import start_client_internal

    monkeypatch.setattr(start_client_internal, "time", start_client_internal.time)
    node_poll.patch_node_waits(0.05)
    start = time.monotonic()
    start_client_internal.time.sleep(3)  # Flower's idle wait for a message
    assert time.monotonic() - start < 1.0
    assert time.sleep is not start_client_internal.time.sleep
    assert start_client_internal.time.monotonic is time.monotonic


@pytest.mark.parametrize("arg", ["soon", "-1"])
def test_a_bad_poll_is_refused_by_name(arg) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fednovelty.runtime.flower.node_poll", arg, "--help"],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode != 0 and b"SECONDS must be" in done.stderr


def test_a_local_federation_starts_its_processes_with_the_poll(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", raising=False)
    federation = deploy.LocalFederation([{"partition-id": 0}], workdir=tmp_path, poll=0.2)
    assert federation.env()["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] == "0.2"
    plain = deploy.LocalFederation([{"partition-id": 0}], workdir=tmp_path, poll=None)
    assert "FLWR_SUPEREXEC_TASK_POLL_INTERVAL" not in plain.env()


def test_stopping_signals_every_group_before_waiting(tmp_path) -> None:
    """Three processes that take 1 s to end after SIGTERM end in about 1 s together, not 3."""
    script = "import signal, sys, time\n"
    script += "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1.0), sys.exit(0)))\n"
    script += "time.sleep(60)\n"
    processes = [
        subprocess.Popen([sys.executable, "-c", script], start_new_session=True) for _ in range(3)
    ]
    time.sleep(1.5)  # the handlers are installed
    start = time.monotonic()
    deploy._terminate_groups(processes, grace=10.0)
    assert all(p.poll() is not None for p in processes)
    assert time.monotonic() - start < 2.5
