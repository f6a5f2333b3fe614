"""The scripts of ``benchmarks/`` are scripts, not a package: load one as a module."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="session")
def benchmark_script():
    """``load(name)``: ``benchmarks/<name>.py`` as a module (loaded once per session)."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(
                f"{name}_bench", BENCHMARKS / f"{name}.py"
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses look their module up there
            spec.loader.exec_module(module)
            loaded[name] = module
        return loaded[name]

    return load
