"""``--no-progress``, the one progress option of every command that shows a bar.

Without it a command draws its bars only when standard error is a terminal
(:func:`fednovelty.runtime.progress.show_progress`); with it, never.
"""

from __future__ import annotations

import argparse

__all__ = ["add_progress_option", "progress_of"]


def add_progress_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress`` to a (sub)command's ``parser``."""
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (default: a bar only when stderr is a terminal)",
    )


def progress_of(args: argparse.Namespace) -> bool:
    """Whether the command draws progress bars: never with ``--no-progress``, else only when
    stderr is a terminal (imported here: printing help loads no torch)."""
    from fednovelty.runtime.progress import show_progress

    return show_progress(False if args.no_progress else None)
