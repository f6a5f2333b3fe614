"""Progress bars, shown only where someone watches them.

Every progress bar the package prints (a federation's rounds, a benchmark's cells, a stream's
windows, the demo's methods) is made by :func:`progress_bar`. Its ``enabled`` is a tri-state:
``None``, the default of every runner, shows the bar only when standard error is a terminal
(:func:`show_progress`), so CI logs, pipes and files get no bar lines (a redrawn tqdm bar
written to a file is one line per update); ``True`` or ``False`` force it.

Choices, and why:

- Standard error, as tqdm writes there: a run whose output is piped keeps its bars when its
  stderr is still the terminal.
- A closed or replaced ``sys.stderr`` without ``isatty`` (some notebook and test harnesses)
  counts as not a terminal.
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm

__all__ = ["progress_bar", "show_progress"]


def show_progress(enabled: bool | None = None) -> bool:
    """Whether to draw a progress bar: ``enabled`` when given, else whether ``sys.stderr``
    is a terminal."""
    if enabled is not None:
        return bool(enabled)
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(
    *, total: int | None, desc: str, unit: str, enabled: bool | None = None, **options
):
    """A tqdm bar of ``total`` steps labelled ``desc``, counted in ``unit``, drawn only if
    :func:`show_progress` of ``enabled``; ``options`` go to tqdm (e.g. ``leave=False``)."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not show_progress(enabled), **options)
