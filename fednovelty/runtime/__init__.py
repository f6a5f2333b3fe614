"""Engine layer: runs an algorithm's rounds. ``simulation`` is in-process (the default)."""

from fednovelty.runtime.simulation import RoundRecord, SimulationResult, run_simulation

__all__ = ["RoundRecord", "SimulationResult", "run_simulation"]
