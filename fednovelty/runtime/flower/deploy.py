"""A Flower deployment on one machine (127.0.0.1): SuperLink, SuperNodes, ``flwr run``.

For tests, trials and the docs' walkthrough: :class:`LocalFederation` starts a SuperLink and
one SuperNode per node configuration as child processes, runs a Flower app on them with
``flwr run`` and reads the result the fednovelty ServerApp wrote. These are the same
commands a real deployment uses (``docs/flower.md``), with every address on loopback.

Secure (what a deployment across machines must use): TLS with certificates signed by a CA
of the federation's own (:func:`make_certificates`) and SuperNode authentication, each node
holding an ECDSA key pair whose public half the operator registered (:func:`make_node_key`)::

    flower-superlink --ssl-ca-certfile ca.pem --ssl-certfile server.pem \
        --ssl-keyfile server.key --enable-supernode-auth --host 127.0.0.1 --port P \
        --disable-runtime-dependency-installation
    flwr supernode register node0.pub local          # FLWR_HOME/config.toml: root-certificates
    flower-supernode --root-certificates ca.pem --auth-supernode-private-key node0.key \
        --superlink 127.0.0.1:P --host 127.0.0.1 --port Q \
        --node-config 'partition-id=0 data-path="/data/part0.npy"'
    flwr run APP_DIR local --stream --run-config overrides.toml

The certificates and keys come from :mod:`.credentials` (re-exported here). Without
certificates (``--insecure`` everywhere: plain HTTP, any node may join) it is a one-machine
trial only.

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
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from fednovelty.runtime.flower.credentials import (
    LOOPBACK_HOSTS,
    Certificates,
    NodeKey,
    make_certificates,
    make_node_key,
)
from fednovelty.runtime.flower.preload import FLOWER_COMMANDS, write_shims
from fednovelty.runtime.flower.results import FlowerResult, load_result

__all__ = [
    "CONNECTION",
    "FLOWER_ENV",
    "LOOPBACK_HOSTS",
    "Certificates",
    "LocalFederation",
    "NodeKey",
    "flower_executable",
    "free_port",
    "make_certificates",
    "make_node_key",
    "node_config_arg",
    "toml_value",
    "wait_for_http",
]

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


def wait_for_http(
    url: str,
    timeout: float,
    process: subprocess.Popen,
    log: Path,
    *,
    context: ssl.SSLContext | None = None,
) -> None:
    """Poll ``url`` until it answers 200; fail early if ``process`` exits.

    ``context`` verifies an ``https`` server (e.g. ``ssl.create_default_context(cafile=...)``).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode}: {tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=context) as response:
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
        port: the SuperLink's port (0: a free one).
        certificates: serve TLS with these (:func:`make_certificates` for ``127.0.0.1``);
            the nodes and ``flwr`` trust their CA. ``None``: ``--insecure`` everywhere (plain
            HTTP), for trials on one machine only.
        node_keys: one key pair per node configuration (:func:`make_node_key`): the
            SuperLink runs with ``--enable-supernode-auth``, :meth:`start` registers every
            public key, and each node signs with its private key. Needs ``certificates``.
        preload: start each message's ``flwr-clientapp`` (and each run's ``flwr-serverapp``)
            by forking a process that imported Flower, torch and fednovelty once
            (:mod:`.preload`; Linux). Every message still gets a fresh process, and the
            SuperLink, SuperNodes and SuperExecs are unchanged; a round costs milliseconds of
            CPU per node instead of seconds of imports. ``False``: Flower's own executables.
        poll: the most seconds a SuperNode waits before asking again for a message
            (:mod:`.node_poll`; Flower's own: 3 s) and a SuperExec between its checks for
            work (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``; Flower's own: 1 s). On one machine a
            round otherwise costs seconds of waiting; ``None``: Flower's own waits.

    Example::

        certs = make_certificates(tmp / "tls")
        keys = [make_node_key(tmp / "keys", f"node{i}") for i in range(len(paths))]
        with LocalFederation([{"partition-id": i, "data-path": p} for i, p in enumerate(paths)],
                             workdir=tmp / "fed", certificates=certs, node_keys=keys) as fed:
            result = fed.run_app("examples/flower", {"algorithm": "FedGenGMM"})
    """

    node_configs: Sequence[Mapping[str, ConfigValue]]
    workdir: str | os.PathLike
    startup_timeout: float = 60.0
    grace: float = 10.0
    port: int = 0
    certificates: Certificates | None = None
    node_keys: Sequence[NodeKey] | None = None
    preload: bool = False
    poll: float | None = 0.1
    _superlink: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _nodes: list[subprocess.Popen] = field(default_factory=list, init=False, repr=False)
    _logs: list = field(default_factory=list, init=False, repr=False)
    _runs: int = field(default=0, init=False, repr=False)
    _preloader: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _preload_dir: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.node_keys is not None:
            if self.certificates is None:
                raise ValueError(
                    "node_keys: SuperNode authentication needs TLS (Flower refuses "
                    "--enable-supernode-auth with --insecure); pass certificates= too."
                )
            if len(self.node_keys) != len(self.node_configs):
                raise ValueError(
                    f"node_keys: expected one key pair per node configuration "
                    f"({len(self.node_configs)}), got {len(self.node_keys)}."
                )

    @property
    def path(self) -> Path:
        return Path(self.workdir)

    @property
    def url(self) -> str:
        """The SuperLink's base URL (``https`` with certificates)."""
        scheme = "http" if self.certificates is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client TLS context that trusts the federation's CA (``None`` when insecure)."""
        if self.certificates is None:
            return None
        return ssl.create_default_context(cafile=str(self.certificates.ca_certfile))

    def env(self) -> dict[str, str]:
        """Environment of the Flower processes: ``FLOWER_ENV``, ``FLWR_HOME`` in the workdir
        and the running Python's folder first on ``PATH`` (so the SuperLink and SuperNodes
        start ServerApp/ClientApp processes of the same installation)."""
        folders = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
        if self._preload_dir is not None:  # the shims come first
            folders.insert(0, str(self._preload_dir / "bin"))
        env = {
            **os.environ,
            **FLOWER_ENV,
            "FLWR_HOME": str(self.path / "flwr_home"),
            "PATH": os.pathsep.join(folders),
        }
        if self.poll is not None:  # Flower's bounds for the SuperExec's interval: [0.01, 60]
            env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(min(max(self.poll, 0.01), 60.0))
        return env

    def _popen(self, args: list[str], log: IO[bytes]) -> subprocess.Popen:
        """``args`` started in the workdir with :meth:`env`, in a session of its own (so
        :func:`_terminate_group` reaches its children), stdout and stderr into ``log``."""
        return subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            cwd=self.path,
            start_new_session=True,
        )

    def _spawn(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.path / f"{name}.log", "wb")  # closed in stop()
        self._logs.append(log)
        return self._popen(args, log)

    def connection_toml(self) -> str:
        """``FLWR_HOME/config.toml``: where ``flwr`` finds the SuperLink and whom it trusts."""
        lines = [f"[superlink.{CONNECTION}]", f'address = "127.0.0.1:{self.port}"']
        if self.certificates is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {toml_value(str(self.certificates.ca_certfile))}")
        return "\n".join(lines) + "\n"

    def superlink_args(self) -> list[str]:
        """The ``flower-superlink`` command line."""
        security = (
            ["--insecure"] if self.certificates is None else self.certificates.superlink_args()
        )
        if self.node_keys is not None:
            security.append("--enable-supernode-auth")
        return [
            flower_executable("flower-superlink"),
            *security,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--disable-runtime-dependency-installation",
        ]

    def start(self) -> LocalFederation:
        """Start the SuperLink, wait for its health endpoint, register the node keys (if
        any), then start the SuperNodes."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        home = self.path / "flwr_home"
        home.mkdir(exist_ok=True)
        (home / "config.toml").write_text(self.connection_toml())
        if self.preload:
            self._start_preloader()
        self._superlink = self._spawn(self.superlink_args(), "superlink")
        wait_for_http(
            f"{self.url}/health",
            self.startup_timeout,
            self._superlink,
            self.path / "superlink.log",
            context=self.ssl_context(),
        )
        for key in self.node_keys or ():
            self.register_node(key)
        for i, config in enumerate(self.node_configs):
            key = None if self.node_keys is None else self.node_keys[i]
            self.start_node(config, key=key, name=f"supernode{i}")
        return self

    def _start_preloader(self) -> None:
        """Start :mod:`.preload`'s server and write its shims; wait until it listens."""
        # A short folder of its own: a Unix socket's path has at most 107 bytes.
        self._preload_dir = Path(tempfile.mkdtemp(prefix="fednovelty-preload-"))
        sock = self._preload_dir / "socket"
        real = {name: flower_executable(name) for name in FLOWER_COMMANDS}
        write_shims(self._preload_dir / "bin", sock, real)
        self._preloader = self._spawn(
            [sys.executable, "-m", "fednovelty.runtime.flower.preload", str(sock)], "preload"
        )
        deadline = time.monotonic() + self.startup_timeout
        while not sock.exists():
            if self._preloader.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the preload server did not start within {self.startup_timeout:.0f} s "
                    f"(exit code {self._preloader.poll()}):\n{tail(self.path / 'preload.log')}"
                )
            time.sleep(0.05)

    def start_node(
        self,
        config: Mapping[str, ConfigValue],
        *,
        key: NodeKey | None = None,
        trust_ca: bool = True,
        name: str | None = None,
    ) -> subprocess.Popen:
        """Start one more SuperNode (its log: ``workdir/<name>.log``).

        Args:
            config: its ``node_config``.
            key: sign with this key pair (``--auth-supernode-private-key``); the SuperLink
                accepts it only if the public key was registered (:meth:`register_node`).
            trust_ca: with certificates, pass the federation's CA as ``--root-certificates``;
                ``False`` leaves the node with the system's CAs only (it cannot verify the
                SuperLink).
            name: log name (default ``supernode<k>``, k counting the nodes started).
        """
        if self._superlink is None:
            raise RuntimeError("start() the federation before start_node().")
        if self.certificates is None:
            security = ["--insecure"]
        elif trust_ca:
            security = ["--root-certificates", str(self.certificates.ca_certfile)]
        else:
            security = []
        if key is not None:
            security += ["--auth-supernode-private-key", str(key.private_key)]
        if self.poll is None:
            command = [flower_executable("flower-supernode")]
        else:  # the same SuperNode, its waits for messages capped at ``poll``
            command = [sys.executable, "-m", "fednovelty.runtime.flower.node_poll", str(self.poll)]
        args = [
            *command,
            *security,
            "--superlink",
            f"127.0.0.1:{self.port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "--node-config",
            node_config_arg(config),
        ]
        process = self._spawn(args, name or f"supernode{len(self._nodes)}")
        self._nodes.append(process)
        return process

    def flwr(self, *args: str, timeout: float = 120.0) -> str:
        """Run ``flwr ARGS`` against this federation (its ``FLWR_HOME``); its output.

        Raises:
            RuntimeError: the command failed or did not finish within ``timeout`` seconds
                (the message holds its output).
        """
        try:
            done = subprocess.run(
                [flower_executable("flwr"), *args],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.path,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as error:
            raise RuntimeError(
                f"flwr {' '.join(args)} did not finish within {timeout:.0f} s"
            ) from error
        output = _text(done.stdout) + _text(done.stderr)
        if done.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} exited with {done.returncode}:\n{output}")
        return output

    def register_node(self, key: NodeKey) -> int:
        """Register a SuperNode's public key with the SuperLink (``flwr supernode register``);
        its node id."""
        output = self.flwr(
            "supernode", "register", str(key.public_key), CONNECTION, "--format", "json"
        )
        return int(_last_json(output)["node-id"])

    def node_status(self) -> dict[int, str]:
        """Node id -> status (``registered``, ``online``, ``offline``, ...) as the SuperLink
        reports it (``flwr supernode ls``)."""
        output = self.flwr("supernode", "ls", CONNECTION, "--format", "json")
        return {int(node["node-id"]): str(node["status"]) for node in _last_json(output)["nodes"]}

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

        The output of ``flwr run --stream`` (the ServerApp's log: one line per round,
        every dropped reply) is written to ``workdir/run<k>.log`` as it arrives, ``k``
        counting this federation's runs (:meth:`run_log`): tail it to follow a run.

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
        log = self.run_log()
        with open(log, "wb") as stream:
            process = self._popen(args, stream)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _terminate_group(process, self.grace)
                raise RuntimeError(
                    f"flwr run did not finish within {timeout:.0f} s:\n{tail(log)}"
                ) from None
        output = log.read_bytes()
        if process.returncode != 0 or not result_path.exists():
            raise RuntimeError(
                f"flwr run exited with {process.returncode} and "
                f"{'a' if result_path.exists() else 'no'} result at {result_path}:\n"
                f"{_text(output)[-3000:]}\n--- SuperLink log ---\n"
                f"{tail(self.path / 'superlink.log')}"
            )
        return load_result(result_path)

    def run_log(self, run: int | None = None) -> Path:
        """Where the output of run ``run`` (1-based; default the latest :meth:`run_app`)
        is written, as it arrives."""
        return self.path / f"run{self._runs if run is None else run}.log"

    def stop(self) -> None:
        """SIGTERM the process groups of the SuperNodes, the SuperLink and the preload
        server; SIGKILL after ``grace`` seconds; close the logs. Safe to call twice."""
        processes = [*self._nodes, self._superlink, self._preloader]  # the preloader's
        # group holds the forked ClientApps; all are signalled first, then awaited together
        _terminate_groups([p for p in processes if p is not None], self.grace)
        if self._preload_dir is not None:
            shutil.rmtree(self._preload_dir, ignore_errors=True)
        self._nodes, self._superlink = [], None
        self._preloader, self._preload_dir = None, None
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


def _last_json(output: str) -> dict:
    """The JSON object ``flwr ... --format json`` printed (after any other lines)."""
    start = output.rfind("\n{")
    try:
        return json.loads(output[start + 1 :] if start >= 0 else output)
    except json.JSONDecodeError as error:
        raise RuntimeError(f"expected a JSON object from flwr, got:\n{output}") from error


def _terminate_group(process: subprocess.Popen, grace: float) -> None:
    """SIGTERM ``process``'s group (it leads its own session), SIGKILL after ``grace``."""
    _terminate_groups([process], grace)


def _terminate_groups(processes: Sequence[subprocess.Popen], grace: float) -> None:
    """SIGTERM every process's group (each leads its own session), wait for them together
    up to ``grace`` seconds, then SIGKILL the groups (children that outlived their leader)."""
    for process in processes:
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:
        _signal_group(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
