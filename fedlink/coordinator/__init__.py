"""The coordinator: round engine, client registry, upload store and the gRPC server.

Must not import torch: evaluation of the global model is a callback the caller provides.
"""

from fedlink.coordinator.config import CoordinatorConfig, FlushRule, LimitsConfig, TrainingConfig
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.server import CoordinatorServer, serve_until_done
from fedlink.coordinator.service import CoordinatorService, Evaluator

__all__ = [
    "CoordinatorConfig",
    "CoordinatorServer",
    "CoordinatorService",
    "Evaluator",
    "FlushRule",
    "LimitsConfig",
    "RoundEngine",
    "TrainingConfig",
    "serve_until_done",
]
