"""How long the ``fednovelty`` command takes to print its help and version, and the first
detector import beside torch's and PyOD's own.

Each command runs in a fresh Python process (the ``fednovelty`` console script as installed
beside this interpreter, else ``python -m fednovelty.cli``); the wall time of the process is
measured from start to exit. ``cold`` is the first run of each command in this script (the
operating system may already hold the files in its cache: dropping the cache needs root),
``warm`` the median of the ``--repeats`` runs after it. The reference is
``python -c "import torch"`` measured the same way, and each time is also given as a ratio to
the reference's time of the same kind (cold or warm) from this one run. The first detector
import (``from fednovelty import FedGMMDetector``) is measured beside ``import torch,
pyod.models.base`` (what every detector builds on), its own floor.

Run::

    .venv/bin/python -m benchmarks.cli_startup
    .venv/bin/python -m benchmarks.cli_startup --repeats 10 --out benchmarks/results/cli_startup.md
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import add_out, command_line, emit_report, markdown_table, report_header


def fednovelty_command() -> list[str]:
    """The ``fednovelty`` console script beside this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("fednovelty")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("fednovelty")
    return [found] if found else [sys.executable, "-m", "fednovelty.cli"]


def commands() -> dict[str, list[str]]:
    """The timed command lines by label, the reference first."""
    cli = fednovelty_command()
    return {
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "fednovelty --help": [*cli, "--help"],
        "fednovelty --version": [*cli, "--version"],
        "fednovelty fit --help": [*cli, "fit", "--help"],
        "fednovelty bench --help": [*cli, "bench", "--help"],
        'python -c "import torch, pyod.models.base"': [
            sys.executable,
            "-c",
            "import torch, pyod.models.base",
        ],
        'python -c "from fednovelty import FedGMMDetector"': [
            sys.executable,
            "-c",
            "from fednovelty import FedGMMDetector",
        ],
    }


def wall_time(argv: list[str]) -> float:
    """Seconds from starting ``argv`` to its exit (its output discarded; it must exit 0)."""
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure(repeats: int) -> dict[str, tuple[float, float]]:
    """``(cold, warm)`` seconds of each command: its first run, then the median of
    ``repeats`` runs (the commands interleaved, so that load falls on all alike)."""
    lines = commands()
    cold = {label: wall_time(argv) for label, argv in lines.items()}
    runs: dict[str, list[float]] = {label: [] for label in lines}
    for _ in range(repeats):
        for label, argv in lines.items():
            runs[label].append(wall_time(argv))
    return {label: (cold[label], statistics.median(runs[label])) for label in lines}


def report(times: dict[str, tuple[float, float]], repeats: int, seconds: float) -> str:
    """The markdown report: header, one row per command with its ratios to the reference."""
    reference = next(iter(times.values()))
    rows = [
        [
            label,
            f"{cold:.2f}",
            f"{cold / reference[0]:.2f}",
            f"{warm:.2f}",
            f"{warm / reference[1]:.2f}",
        ]
        for label, (cold, warm) in times.items()
    ]
    table = markdown_table(
        ["command", "cold (s)", "cold / torch", f"warm, median of {repeats} (s)", "warm / torch"],
        rows,
    )
    header = report_header(
        "fednovelty command start-up", command_line("cli_startup"), False, seconds
    )
    return f"{header}\n- cpu affinity: {len(os.sched_getaffinity(0))} cores\n\n{table}\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm runs per command (5)")
    add_out(parser, help="also write the report here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    times = measure(args.repeats)
    return emit_report(report(times, args.repeats, time.perf_counter() - started), args.out)


if __name__ == "__main__":
    main()
