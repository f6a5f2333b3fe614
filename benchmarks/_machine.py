"""What the benchmarks share around their figures: the machine facts, and writing the report."""

from __future__ import annotations

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


def emit_report(report: str, out: Path | None) -> str:
    """Print ``report``, also write it to ``out`` (its folder made) when given; return it."""
    print()
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
    return report
