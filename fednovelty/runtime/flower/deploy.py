"""A Flower deployment on one machine (127.0.0.1): SuperLink, SuperNodes, ``flwr run``.

For tests, trials and the docs' walkthrough: :class:`LocalFederation` starts a SuperLink and
one SuperNode per node configuration as child processes, runs a Flower app on them with
``flwr run`` and reads the result the fednovelty ServerApp wrote. These are the same
commands a real deployment uses (``docs/flower.md``), with every address on loopback:

    flower-superlink --insecure --host 127.0.0.1 --port P --disable-runtime-dependency-installation
    flower-supernode --insecure --superlink 127.0.0.1:P --host 127.0.0.1 --port Q \
        --node-config 'partition-id=0 data-path="/data/part0.npy"'
    flwr run APP_DIR local --stream --run-config overrides.toml   # FLWR_HOME/config.toml

Every process starts in a session of its own; :meth:`LocalFederation.stop` sends SIGTERM to
each process group (the nodes first, the SuperLink last; the ClientApp and ServerApp
processes they spawned are in those groups), then SIGKILL to any group still alive after a
grace period. Use it as a context manager so that happens on errors too. Nothing here
imports Flower; the executables are looked up beside the running Python first.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fednovelty.runtime.flower.results import FlowerResult, load_result

ConfigValue = bool | int | float | str
#: environment of every Flower process: no telemetry, no update check, no colour codes.
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "NO_COLOR": "1"}
CONNECTION = "local"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: ConfigValue) -> str:
    """A scalar as a TOML value (strings as basic strings; JSON escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"config values are bool, int, float or str; got {type(value).__name__}.")


def node_config_arg(config: Mapping[str, ConfigValue]) -> str:
    """``--node-config`` argument: space-separated ``key=value`` pairs, values in TOML."""
    return " ".join(f"{key}={toml_value(value)}" for key, value in config.items())


def flower_executable(name: str) -> str:
    """Path of a Flower command, preferring the one beside the running Python (a venv).

    Raises:
        FileNotFoundError: not installed (``pip install 'fednovelty[flower]'``).
    """
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name!r} not found beside {sys.executable} or on PATH; "
            "pip install 'fednovelty[flower]'."
        )
    return found


def wait_for_http(url: str, timeout: float, process: subprocess.Popen, log: Path) -> None:
    """Poll ``url`` until it answers 200; fail early if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}: {tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s: {tail(log)}")


def tail(path: Path, n_chars: int = 3000) -> str:
    """The end of a log file (for error messages)."""
    try:
        return path.read_text(errors="replace")[-n_chars:]
    except OSError:
        return "(no log)"


@dataclass
class LocalFederation:
    """SuperLink + SuperNodes on 127.0.0.1, each a child process in its own session.

    Args:
        node_configs: one ``node_config`` per SuperNode (e.g. ``{"partition-id": 0,
            "data-path": "/data/part0.npy"}``).
        workdir: folder for logs, ``FLWR_HOME``, run overrides and results.
        startup_timeout: seconds to wait for the SuperLink's health endpoint.
        grace: seconds between SIGTERM and SIGKILL in :meth:`stop`.

    Example::

        with LocalFederation([{"partition-id": i, "data-path": p} for i, p in enumerate(paths)],
                             workdir="/tmp/fed") as federation:
            result = federation.run_app("examples/flower", {"algorithm": "FedGenGMM"})
    """

    node_configs: Sequence[Mapping[str, ConfigValue]]
    workdir: str | os.PathLike
    startup_timeout: float = 60.0
    grace: float = 10.0
    port: int = 0
    _superlink: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _nodes: list[subprocess.Popen] = field(default_factory=list, init=False, repr=False)
    _logs: list = field(default_factory=list, init=False, repr=False)
    _runs: int = field(default=0, init=False, repr=False)

    @property
    def path(self) -> Path:
        return Path(self.workdir)

    def env(self) -> dict[str, str]:
        """Environment of the Flower processes: ``FLOWER_ENV``, ``FLWR_HOME`` in the workdir
        and the running Python's folder first on ``PATH`` (so the SuperLink and SuperNodes
        start ServerApp/ClientApp processes of the same installation)."""
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            **FLOWER_ENV,
            "FLWR_HOME": str(self.path / "flwr_home"),
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        }

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.path / f"{name}.log", "wb")  # closed in stop()
        self._logs.append(log)
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            cwd=self.path,
            start_new_session=True,
        )

    def start(self) -> LocalFederation:
        """Start the SuperLink, wait for its health endpoint, then start the SuperNodes."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        home = self.path / "flwr_home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self._superlink = self._spawn(
            [
                flower_executable("flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
            "superlink",
        )
        wait_for_http(
            f"http://127.0.0.1:{self.port}/health",
            self.startup_timeout,
            self._superlink,
            self.path / "superlink.log",
        )
        for i, config in enumerate(self.node_configs):
            args = [
                flower_executable("flower-supernode"),
                "--insecure",
                "--superlink",
                f"127.0.0.1:{self.port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--node-config",
                node_config_arg(config),
            ]
            self._nodes.append(self._spawn(args, f"supernode{i}"))
        return self

    def run_app(
        self,
        app_dir: str | os.PathLike,
        run_config: Mapping[str, ConfigValue],
        *,
        timeout: float = 600.0,
    ) -> FlowerResult:
        """``flwr run`` a fednovelty app on this federation and load its result.

        Args:
            app_dir: a Flower app folder (``pyproject.toml`` with the fednovelty
                ServerApp/ClientApp, e.g. ``examples/flower``).
            run_config: overrides of its ``[tool.flwr.app.config]`` (keys must exist there);
                ``result-path`` defaults to a fresh file in the workdir.
            timeout: seconds before ``flwr run`` is stopped.

        Raises:
            RuntimeError: ``flwr run`` failed or wrote no result (the message holds its
                output and the SuperLink log's end).
        """
        if self._superlink is None:
            raise RuntimeError("start() the federation before run_app().")
        self._runs += 1
        config = dict(run_config)
        config.setdefault("result-path", str(self.path / f"result{self._runs}.safetensors"))
        result_path = Path(str(config["result-path"]))
        result_path.unlink(missing_ok=True)
        overrides = self.path / f"run{self._runs}.toml"
        overrides.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in config.items()))
        args = [
            flower_executable("flwr"),
            "run",
            str(Path(app_dir).resolve()),
            CONNECTION,
            "--stream",
            "--run-config",
            str(overrides),
        ]
        process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            cwd=self.path,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _terminate_group(process, self.grace)
            output, _ = process.communicate()
            raise RuntimeError(
                f"flwr run did not finish within {timeout:.0f} s:\n{_text(output)[-3000:]}"
            ) from None
        (self.path / f"run{self._runs}.log").write_bytes(output)
        if process.returncode != 0 or not result_path.exists():
            raise RuntimeError(
                f"flwr run exited with {process.returncode} and "
                f"{'a' if result_path.exists() else 'no'} result at {result_path}:\n"
                f"{_text(output)[-3000:]}\n--- SuperLink log ---\n"
                f"{tail(self.path / 'superlink.log')}"
            )
        return load_result(result_path)

    def stop(self) -> None:
        """SIGTERM the SuperNodes' then the SuperLink's process groups; SIGKILL after
        ``grace`` seconds; close the logs. Safe to call twice."""
        for process in self._nodes:
            _terminate_group(process, self.grace)
        if self._superlink is not None:
            _terminate_group(self._superlink, self.grace)
        self._nodes, self._superlink = [], None
        for log in self._logs:
            log.close()
        self._logs = []

    def __enter__(self) -> LocalFederation:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _text(output: bytes | None) -> str:
    return (output or b"").decode(errors="replace")


def _terminate_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM ``process``'s group (it leads its own session), SIGKILL after ``grace``."""
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(process.pid, signal.SIGKILL)  # children that outlived their leader
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
