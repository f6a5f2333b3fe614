"""``fednovelty app`` as a user runs it: a real server, stopped by SIGTERM.

The command is started as a process of its own (``python -m fednovelty.cli app``, in a new
session so that anything it leaves behind can be found and cleaned up), waited on until
Streamlit's health check answers, then sent SIGTERM as a service manager would. Nothing may
outlive it: the process exits, no process of its group remains, the port is free again. While
it serves, the only listening socket on its port is 127.0.0.1 (read from ``/proc/net``, never
by sending traffic to another address).
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("streamlit", reason="the dashboard needs fednovelty[app]")

from fednovelty.runtime.flower.deploy import free_port, wait_for_http

pytestmark = pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux /proc/net"
)

#: seconds to wait for the server, and for it to be gone (limits, not budgets).
START_LIMIT = 180.0
STOP_LIMIT = 60.0
LISTEN = "0A"  # TCP state in /proc/net/tcp*


def decode_address(hex_address: str) -> str:
    """``/proc/net/tcp*`` local address (little-endian 32-bit words in hex) -> IP text."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_addresses(port: int) -> set[str]:
    """IP addresses with a socket listening on TCP ``port`` on this machine."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == LISTEN and int(hex_port, 16) == port:
                found.add(decode_address(address))
    return found


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_until(condition, limit: float) -> bool:
    """Poll ``condition()`` until true or ``limit`` seconds passed; its last value."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.2)
    return True


def test_decode_address_reads_proc_net_format():
    assert decode_address("0100007F") == "127.0.0.1"
    assert decode_address("00000000") == "0.0.0.0"
    assert decode_address("00000000000000000000000001000000") == "::1"
    assert decode_address("00000000000000000000000000000000") == "::"


def test_sigterm_stops_the_server_and_leaves_nothing_behind(tmp_path):
    port = free_port()
    log_path = tmp_path / "app.log"
    command = [sys.executable, "-m", "fednovelty.cli", "app", "--port", str(port), "--headless"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/_stcore/health", START_LIMIT, process, log_path)
        assert listening_addresses(port) == {"127.0.0.1"}  # this machine only, by default
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=STOP_LIMIT)
        assert wait_until(lambda: not group_alive(process.pid), STOP_LIMIT), (
            "a process of `fednovelty app` outlived SIGTERM"
        )
        assert listening_addresses(port) == set()
    finally:
        if group_alive(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=STOP_LIMIT)
