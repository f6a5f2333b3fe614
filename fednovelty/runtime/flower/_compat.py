"""The error raised when Flower is missing, in one place: it says what to install."""

from __future__ import annotations

INSTALL_HINT = "pip install 'fednovelty[flower]'"


def missing_flwr(error: ImportError) -> ImportError:
    """An ``ImportError`` naming the extra to install (raise it ``from error``)."""
    return ImportError(
        f"fednovelty's Flower engine needs the Flower framework (flwr 1.41): {INSTALL_HINT} "
        f"({error})"
    )
