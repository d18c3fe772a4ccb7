"""The coordinator: round engine, client registry, upload store and the gRPC server.

Must not import torch: evaluation of the global model is a callback the caller provides.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedlink.coordinator.config import CoordinatorConfig, FlushRule, LimitsConfig, TrainingConfig
from fedlink.coordinator.engine import RoundEngine

if TYPE_CHECKING:
    from fedlink.coordinator.server import CoordinatorServer, serve_until_done
    from fedlink.coordinator.service import CoordinatorService, Evaluator

_SERVING = {"CoordinatorServer": "fedlink.coordinator.server",
            "serve_until_done": "fedlink.coordinator.server",
            "CoordinatorService": "fedlink.coordinator.service",
            "Evaluator": "fedlink.coordinator.service"}
"""The gRPC service's names, imported when first used: grpc and the token machinery take a
good part of a second to import, which a virtual simulation (the engine, no server) skips."""


def __getattr__(name: str) -> Any:
    """One of ``_SERVING``'s names, from its module (imported now)."""
    module = _SERVING.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

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
