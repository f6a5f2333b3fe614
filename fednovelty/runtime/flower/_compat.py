"""Flower's names, imported in one place, and the error raised when Flower is missing.

Every module of the engine that needs Flower imports its names from here, so a missing
``flwr`` raises one ``ImportError`` that says what to install.
"""

from __future__ import annotations

INSTALL_HINT = "pip install 'fednovelty[flower]'"


def missing_flwr(error: ImportError) -> ImportError:
    """An ``ImportError`` naming the extra to install (raise it ``from error``)."""
    return ImportError(
        f"fednovelty's Flower engine needs the Flower framework (flwr 1.41): {INSTALL_HINT} "
        f"({error})"
    )


try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.supercore.primitives import asymmetric
except ImportError as error:  # pragma: no cover - depends on the installation
    raise missing_flwr(error) from error

__all__ = [
    "INSTALL_HINT",
    "Array",
    "ArrayRecord",
    "ClientApp",
    "ConfigRecord",
    "Context",
    "Grid",
    "Message",
    "MessageType",
    "RecordDict",
    "ServerApp",
    "asymmetric",
    "missing_flwr",
]
