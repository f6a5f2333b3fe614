"""Flower engine: run fednovelty's federated algorithms on real Flower nodes.

``make_server_app()`` / ``make_client_app()`` give the ServerApp and ClientApp of a Flower
app (see ``examples/flower/``); ``run_rounds(grid, algorithm)`` is the server loop itself;
``load_result(path)`` reads what the ServerApp wrote, and ``Detector.from_model(result, X)``
turns it into a detector. ``LocalFederation`` (in ``deploy``) starts a SuperLink and
SuperNodes on 127.0.0.1 for tests and trials; ``make_certificates`` and ``make_node_key`` (in
``credentials``) write the TLS certificates and SuperNode key pairs it and real deployments use.

Flower (``flwr``) is an optional dependency: ``pip install 'fednovelty[flower]'``. Names that
need it are imported on first use, so ``load_result`` and the configuration helpers work
without it, and the rest raise an ``ImportError`` that says what to install.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ALGORITHMS": "config",
    "EngineConfig": "config",
    "algorithm_from_run_config": "config",
    "build_algorithm": "config",
    "FlowerResult": "results",
    "load_result": "results",
    "save_result": "results",
    "LocalFederation": "deploy",
    "Certificates": "credentials",
    "NodeKey": "credentials",
    "make_certificates": "credentials",
    "make_node_key": "credentials",
    "decode_message": "codec",
    "encode_message": "codec",
    "InvalidReplyError": "validation",
    "accept_replies": "validation",
    "check_reply": "validation",
    "load_node_data": "client",
    "make_client_app": "client",
    "FederationError": "validation",
    "make_server_app": "server",
    "run_rounds": "server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    return getattr(module, name)
