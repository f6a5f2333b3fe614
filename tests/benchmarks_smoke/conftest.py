"""The benchmark scripts are the modules of the ``benchmarks`` package: import one by name.

A test imports its script through :func:`benchmark_script` when it runs rather than at
collection, because some scripts set process-wide state on import (``poisoning`` sets
``OMP_NUM_THREADS``, the plotting scripts pick matplotlib's backend).
"""

import importlib

import pytest


@pytest.fixture(scope="session")
def benchmark_script():
    """``load(name)``: the module ``benchmarks.<name>``, imported as any module."""
    return lambda name: importlib.import_module(f"benchmarks.{name}")
