"""Simulation drivers: a coordinator and many SDK clients in one process, over real gRPC."""

from fedlink.experiment.config import ExperimentConfig
from fedlink.sim.runner import SimulationResult, run_simulation

__all__ = ["ExperimentConfig", "SimulationResult", "run_simulation"]
