"""A local Flower deployment for the end-to-end tests: a SuperLink and one SuperNode per node
config on 127.0.0.1, with a copy of ``examples/flower`` to run, stopped however the test ends.

Its ClientApp and ServerApp processes are forked from a preloaded one (``preload=True``:
each still a fresh process, without seconds of imports per message); ``test_flower_tls.py``
runs Flower's own executables."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "examples" / "flower"


def deployment(configs: list[dict], work: Path) -> Iterator[tuple[object, Path]]:
    """Yield ``(federation, app)`` for nodes of ``configs`` under the folder ``work``; a
    fixture's body (``yield from deployment(...)``)."""
    from fednovelty.runtime.flower.deploy import LocalFederation

    app = work / "app"
    shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__"))
    federation = LocalFederation(configs, workdir=work / "deployment", preload=True)
    try:
        federation.start()
        yield federation, app
    finally:
        federation.stop()
