"""Engine layer: runs an algorithm's rounds. ``simulation`` is in-process (the default);
both it and Flower's ServerApp run the one round loop of ``loop``."""

from fednovelty.runtime.loop import RoundRecord
from fednovelty.runtime.secure_rounds import SecureSum
from fednovelty.runtime.simulation import SimulationResult, run_simulation

__all__ = ["RoundRecord", "SecureSum", "SimulationResult", "run_simulation"]
