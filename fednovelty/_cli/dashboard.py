"""``fednovelty app``: find the installed dashboard and serve it with ``streamlit run``.

The repository's ``app/`` folder (``Home.py``, ``pages/``, ``fednovelty_app/``) installs as the
package ``fednovelty.dashboard`` in the same layout (``pyproject.toml``). Run from a source
tree (an editable install, or ``PYTHONPATH`` pointing at a checkout), the command serves that
tree's ``app/``; installed from a wheel, it serves the installed package's files.
``streamlit run`` puts the folder of ``Home.py`` on ``sys.path``, which is how the pages
import ``fednovelty_app``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from fednovelty._cli.files import UsageError

PACKAGE = "fednovelty.dashboard"
SCRIPT = "Home.py"
#: Python packages of the ``app`` extra (``pip install 'fednovelty[app]'``).
EXTRAS = ("streamlit", "plotly")
#: The folder that holds the ``fednovelty`` package: a source tree if ``pyproject.toml`` and
#: ``app/`` are in it, else (an installed wheel) site-packages.
SOURCE_TREE = Path(__file__).resolve().parents[2]


def _source_tree_script() -> Path | None:
    """``app/Home.py`` of the source tree this ``fednovelty`` runs from; None if installed."""
    script = SOURCE_TREE / "app" / SCRIPT
    return script if (SOURCE_TREE / "pyproject.toml").is_file() and script.is_file() else None


def _installed_script() -> Path | None:
    """``Home.py`` of the installed ``fednovelty.dashboard``; None if it is not installed."""
    try:
        return Path(str(importlib.resources.files(PACKAGE) / SCRIPT))
    except ModuleNotFoundError:
        return None


def dashboard_script() -> Path:
    """The dashboard's first page (``pages/`` beside it): ``app/Home.py`` of the source tree
    this ``fednovelty`` runs from, else ``Home.py`` of the installed ``fednovelty.dashboard``.

    Raises:
        UsageError: neither is there, or its ``pages/`` folder is missing (an installation
            without the dashboard's files).
    """
    script = _source_tree_script() or _installed_script()
    if script is not None and script.is_file() and (script.parent / "pages").is_dir():
        return script
    where = f"{script} or its pages/ folder is missing" if script else f"{PACKAGE} is missing"
    raise UsageError(
        f"no dashboard found ({where}); reinstall fednovelty: "
        "pip install --force-reinstall 'fednovelty[app]'."
    )


def missing_extras() -> list[str]:
    """The packages of the ``app`` extra that cannot be imported (checked without importing)."""
    return [name for name in EXTRAS if importlib.util.find_spec(name) is None]


def app_command(args: argparse.Namespace, script: Path | None = None) -> list[str]:
    """The ``streamlit run`` command line that serves ``script`` (default: the dashboard)
    with ``args.address``, ``args.port`` and ``args.headless``."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script or dashboard_script()),
        "--server.address",
        args.address,
        "--server.port",
        str(args.port),
        "--server.headless",
        "true" if args.headless else "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",
    ]


@contextlib.contextmanager
def serving_app(
    log_path: Path, timeout: float = 60.0, script: Path | None = None
) -> Iterator[tuple[str, float]]:
    """Serve ``script`` (default: the dashboard) headless on 127.0.0.1 and a free port while
    the block runs.

    Yields the URL and the seconds from launch until Streamlit's health check answered; the
    server's output goes to ``log_path``. Raises ``RuntimeError`` if the server exits and
    ``TimeoutError`` if it is not healthy within ``timeout`` seconds (both with the log's end).
    The server is stopped on exit (SIGTERM, SIGKILL after 10 s).
    """
    from fednovelty.runtime.flower.deploy import free_port, wait_for_http

    port = free_port()
    options = argparse.Namespace(address="127.0.0.1", port=port, headless=True)
    url = f"http://127.0.0.1:{port}"
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            app_command(options, script), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        wait_for_http(f"{url}/_stcore/health", timeout, process, log_path)
        yield url, time.perf_counter() - started
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def run(args: argparse.Namespace) -> int:
    """Run the dashboard: this process becomes ``streamlit run`` (``os.execv``), so SIGTERM
    or Ctrl-C stops the server itself and no server outlives the command.

    Raises:
        UsageError: a package of the ``app`` extra or the dashboard's files are missing
            (checked first, without importing Streamlit).
    """
    missing = missing_extras()
    if missing:
        raise UsageError(
            f"the dashboard needs Streamlit and Plotly ({', '.join(missing)} not installed): "
            "pip install 'fednovelty[app]'"
        )
    command = app_command(args, dashboard_script())
    if args.address not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: serving on {args.address}: the dashboard has no login of its own, so "
            "anyone who reaches this port can use it; beyond localhost put it behind a "
            "reverse proxy with TLS and authentication (docs/app.md).",
            file=sys.stderr,
        )
    print(f"fednovelty dashboard: http://{args.address}:{args.port}", flush=True)
    if os.name != "posix":  # no exec there: Streamlit runs as a child of this process
        return subprocess.call(command)
    sys.stderr.flush()
    os.execv(command[0], command)  # never returns: Streamlit becomes this process


def port_number(text: str) -> int:
    """An argparse type: a TCP port, an integer in 0-65535 (0: one the system picks)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value}")
    return value


def add_parser(sub) -> None:
    """Add ``app`` and its options to the subcommands ``sub`` (argparse's subparsers)."""
    app = sub.add_parser("app", help="start the Streamlit dashboard (fednovelty[app])")
    app.add_argument(
        "--port", type=port_number, default=8501, help="TCP port, 0-65535 (default 8501)"
    )
    app.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to serve on (default: this machine only; 0.0.0.0: all interfaces, "
        "with no login: see docs/app.md)",
    )
    app.add_argument("--headless", action="store_true", help="do not open a browser")
    app.set_defaults(func=run)
