"""``flower-supernode`` with a shorter wait between its polls for messages.

Flower 1.41's SuperNode asks the SuperLink for a message, and when there is none it sleeps
3 s before asking again (``flwr.supernode.start_client_internal``; its waits for a reply to
push, 0.5 s). A round's message mostly arrives while the node sleeps, so on one machine a
round costs about 3 s of waiting whatever its work. ``python -m
fednovelty.runtime.flower.node_poll SECONDS [flower-supernode arguments...]`` runs the same
SuperNode with every one of those waits capped at ``SECONDS``: nothing else changes (the
messages, the ClientApp processes, the node's authentication), only how soon the node asks
again. :class:`~fednovelty.runtime.flower.deploy.LocalFederation` starts its nodes this way
(``poll``); a real deployment runs Flower's own ``flower-supernode``.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable


def capped_sleep(poll: float, sleep: Callable[[float], None] = time.sleep) -> Callable:
    """``sleep`` that waits at most ``poll`` seconds (a non-negative float)."""

    def wait(seconds: float) -> None:
        sleep(min(float(seconds), poll))

    return wait


def patch_node_waits(poll: float) -> None:
    """Cap the waits of Flower's SuperNode loop (the ``time`` module it reads) at ``poll``
    seconds; other modules keep the real ``time.sleep``."""
    from flwr.supernode import start_client_internal

    shim = types.ModuleType("time")
    shim.__dict__.update(time.__dict__)
    shim.sleep = capped_sleep(poll)
    start_client_internal.time = shim


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m fednovelty.runtime.flower.node_poll SECONDS [args]")
    try:
        poll = float(args[0])
    except ValueError:
        raise SystemExit(f"node_poll: SECONDS must be a number, got {args[0]!r}") from None
    if not poll >= 0.0:
        raise SystemExit(f"node_poll: SECONDS must be >= 0, got {poll}")
    patch_node_waits(poll)
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *args[1:]]
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
