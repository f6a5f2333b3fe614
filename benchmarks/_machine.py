"""What the benchmarks share around their figures: the machine facts, and writing the report."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import numpy as np
import sklearn
import torch


def machine_facts() -> str:
    """One line: library versions, torch threads, CPU model and count, load average."""
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"torch {torch.__version__} (threads={torch.get_num_threads()}), "
        f"scikit-learn {sklearn.__version__}, numpy {np.__version__}, "
        f"python {platform.python_version()}; CPUs={os.cpu_count()} ({cpu}); "
        f"load average {load}"
    )


def device_facts(device: str) -> str:
    """The device a benchmark fitted on: ``"cpu"``, or ``"cuda (<the GPU's name>)"``.

    Raises:
        ValueError: ``device`` is ``"cuda"`` and no CUDA device is seen.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be 'cpu' or 'cuda'; got {device!r}.")
    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device; use --device cpu.")
    return f"cuda ({torch.cuda.get_device_name(0)})"


def check_device(parser, device: str) -> None:
    """Stop ``parser`` with a usage error when ``--device cuda`` is asked and no GPU is seen."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; use --device cpu.")


def report_header(title: str, command: str, quick: bool, seconds: float) -> str:
    """A report's first lines: title, the command that ran, date, machine, runtime."""
    return "\n".join(
        [
            f"# {title}",
            "",
            f"- command: `{command.strip()}`" + (" (quick smoke run)" if quick else ""),
            f"- date: {datetime.date.today().isoformat()}",
            f"- {machine_facts()}",
            f"- total runtime: {seconds / 60:.1f} min; load average at the end "
            f"{os.getloadavg()[0]:.1f}",
        ]
    )


def emit_report(report: str, out: Path | None) -> str:
    """Print ``report``, also write it to ``out`` (its folder made) when given; return it."""
    print()
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
    return report
