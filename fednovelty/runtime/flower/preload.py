"""Start Flower's per-message processes by forking one that has already imported them.

A SuperExec starts a fresh ``flwr-clientapp`` process for every message a node answers (and
a fresh ``flwr-serverapp`` for every run); on one machine most of such a process's time is
spent importing Flower, torch and fednovelty (about 3.5 s of CPU on a 2-core runner, where
an EM round's own work takes milliseconds). :func:`serve` imports them once and waits on a
Unix socket; a *shim* of the command's name, first on the SuperExec's ``PATH``
(:func:`write_shims`), hands it the command line, environment, working folder and standard
streams; the server forks, the child runs the very function Flower's console script runs,
and the shim exits with the child's status. SIGTERM, SIGINT and SIGHUP sent to the shim reach
the child.

What stays as Flower does it: the SuperLink, SuperNodes and SuperExecs are Flower's own
processes, and every message still runs in a process of its own that starts from one that
never ran app code (the server only imports and forks), so nothing of one message survives
into the next. Privacy randomness is unaffected: it is drawn from ``os.urandom`` per call,
never from state made at import. Linux only (``fork``, file descriptors over the socket).

Protocol on the socket (one connection per start): the shim sends a 4-byte big-endian
length with its stdin, stdout and stderr attached (SCM_RIGHTS), then that many bytes of JSON
``{"command", "argv", "env", "cwd"}``; the server answers the child's pid (4 bytes) and,
when the child ends, its exit code (4 bytes, signed; ``-N`` for signal N).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["FLOWER_COMMANDS", "PRELOADED_MODULES", "serve", "write_shims"]

#: the per-message commands a SuperExec starts, as ``module:function`` of their console scripts.
FLOWER_COMMANDS = {
    "flwr-clientapp": "flwr.supernode.cli:flwr_clientapp",
    "flwr-serverapp": "flwr.superlink.cli:flwr_serverapp",
}
#: imported before the first fork, so that the children start with them loaded.
PRELOADED_MODULES = (
    "torch",
    "fednovelty.runtime.flower.client",
    "fednovelty.runtime.flower.server",
)

_SHIM = '''#!{python} -IS
"""{name}, started by forking fednovelty's preload server ({socket}); see
fednovelty.runtime.flower.preload. Starts {real} itself when the server is not there."""
import json, os, signal, socket, struct, sys

def main():
    child, pending = [], []  # a signal before the child's pid is known waits for it
    def forward(number, frame):
        os.kill(child[0], number) if child else pending.append(number)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect({socket!r})
    except OSError as error:
        print(f"{name}: no preload server at {socket} ({{error}}); starting {real}",
              file=sys.stderr, flush=True)
        os.execv({real!r}, [{real!r}, *sys.argv[1:]])
    body = json.dumps({{"command": {name!r}, "argv": sys.argv, "env": dict(os.environ),
                       "cwd": os.getcwd()}}).encode()
    socket.send_fds(conn, [struct.pack("!I", len(body))], [0, 1, 2])
    conn.sendall(body)
    child.append(struct.unpack("!i", _exactly(conn, 4))[0])
    for number in pending:
        os.kill(child[0], number)
    code = struct.unpack("!i", _exactly(conn, 4))[0]
    sys.exit(128 - code if code < 0 else code)

def _exactly(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            sys.exit(f"{name}: the preload server closed the connection")
        data += chunk
    return data

main()
'''


def write_shims(
    folder: str | os.PathLike, socket_path: str | os.PathLike, real: Mapping[str, str]
) -> Path:
    """Write one executable shim per command into ``folder``; put it first on ``PATH``.

    Args:
        folder: created if missing.
        socket_path: where :func:`serve` listens.
        real: command name -> the executable the shim starts when no server answers.

    Returns:
        ``folder`` as a Path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, executable in real.items():
        path = folder / name
        path.write_text(
            _SHIM.format(python=sys.executable, name=name, socket=str(socket_path), real=executable)
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def resolve(target: str) -> Callable[[], object]:
    """``"module:function"`` -> the function (importing the module)."""
    module, _, function = target.partition(":")
    if not module or not function:
        raise ValueError(f"a command's target is 'module:function'; got {target!r}.")
    return getattr(importlib.import_module(module), function)


def serve(
    socket_path: str | os.PathLike,
    commands: Mapping[str, str] = FLOWER_COMMANDS,
    preload: tuple[str, ...] = PRELOADED_MODULES,
) -> None:
    """Import ``commands``' functions and ``preload``, then fork one child per shim's start
    until SIGTERM. The socket file appears once the imports are done (wait for it)."""
    entries = {name: resolve(target) for name, target in commands.items()}
    for module in preload:
        importlib.import_module(module)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    path = str(socket_path)
    partial = path + ".binding"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(partial)
    listener.listen(64)
    os.replace(partial, path)  # the name appears only when it accepts
    waiting: dict[int, socket.socket | None] = {}  # child pid -> its shim
    try:
        while not stopping:
            ready, _, _ = select.select([listener, *filter(None, waiting.values())], [], [], 0.05)
            for sock in ready:
                if sock is listener:
                    conn, _ = listener.accept()
                    pid = _start(conn, listener, entries)
                    if pid is not None:
                        waiting[pid] = conn
                else:  # a shim sends nothing after its request: it is gone (killed)
                    _kill_orphan(waiting, sock)
            _reap(waiting)
    finally:
        listener.close()
        Path(path).unlink(missing_ok=True)


def _start(conn: socket.socket, listener: socket.socket, entries: Mapping) -> int | None:
    """Read one start request from ``conn`` and fork its child; the child's pid (sent back)."""
    conn.settimeout(10.0)
    fds: list[int] = []
    try:
        head, fds, _, _ = socket.recv_fds(conn, 4, 3)
        if len(fds) != 3:
            raise ValueError(f"expected stdin, stdout and stderr, got {len(fds)} descriptors")
        body = _exactly(conn, struct.unpack("!I", head)[0])
        request = json.loads(body)
        entry = entries[request["command"]]
    except (OSError, ValueError, KeyError, struct.error) as error:
        print(f"preload: refused a start request ({error!r})", file=sys.stderr, flush=True)
        for fd in fds:  # the caller's streams: holding them would keep its pipes open
            os.close(fd)
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns
        listener.close()
        conn.close()
        _run_child(entry, request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(struct.pack("!i", pid))
    return pid


def _run_child(entry: Callable[[], object], request: dict, fds: list[int]) -> None:
    """Become the command: its streams, folder, environment and argv; exit with its code."""
    code: object = 1
    try:
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a fresh Python's
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        code = entry()
    except SystemExit as done:
        code = done.code
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def _kill_orphan(waiting: dict[int, socket.socket | None], conn: socket.socket) -> None:
    """SIGKILL the child of a shim that went away, as a killed process group takes its
    ClientApp with it; its exit is reaped as any other."""
    for pid, sock in list(waiting.items()):
        if sock is conn:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            conn.close()
            waiting[pid] = None  # reaped later, nobody to tell


def _reap(waiting: dict[int, socket.socket | None]) -> None:
    """Send each ended child's exit code to its shim."""
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # the shim is gone (killed); nothing waits for the code
            conn.close()


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ValueError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fednovelty.runtime.flower.preload", description=__doc__.splitlines()[0]
    )
    parser.add_argument("socket", help="path of the Unix socket to listen on")
    parser.add_argument(
        "--command",
        action="append",
        metavar="NAME=MODULE:FUNCTION",
        help="a command to serve (default: flwr-clientapp and flwr-serverapp)",
    )
    parser.add_argument("--preload", action="append", metavar="MODULE", help="import first")
    args = parser.parse_args(argv)
    commands = dict(c.split("=", 1) for c in args.command) if args.command else FLOWER_COMMANDS
    preload = tuple(args.preload) if args.preload is not None else PRELOADED_MODULES
    serve(args.socket, commands, preload)


if __name__ == "__main__":
    main()
