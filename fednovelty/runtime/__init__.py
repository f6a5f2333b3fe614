"""Engine layer: runs an algorithm's rounds. ``simulation`` is in-process (the default);
both it and Flower's ServerApp run the one round loop of ``loop``."""

from fednovelty.runtime.loop import RoundRecord
from fednovelty.runtime.simulation import SimulationResult, run_simulation

__all__ = ["RoundRecord", "SimulationResult", "run_simulation"]
