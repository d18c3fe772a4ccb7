"""Streaming aggregation, staleness weights and server optimizers, each in a registry."""

from fedlink.aggregate import optimizers as _optimizers  # noqa: F401  (registers)
from fedlink.aggregate import staleness as _staleness  # noqa: F401  (registers)
from fedlink.aggregate.base import (
    ACCUMULATORS,
    FLUSH_HOOKS,
    SERVER_OPTIMIZERS,
    STALENESS_WEIGHTS,
    Accumulator,
    FlushHook,
    FlushInfo,
    Registry,
    ServerOptimizer,
    StalenessWeight,
    UpdateInfo,
)
from fedlink.aggregate.streaming import StreamingMean

__all__ = [
    "ACCUMULATORS",
    "FLUSH_HOOKS",
    "SERVER_OPTIMIZERS",
    "STALENESS_WEIGHTS",
    "Accumulator",
    "FlushHook",
    "FlushInfo",
    "Registry",
    "ServerOptimizer",
    "StalenessWeight",
    "StreamingMean",
    "UpdateInfo",
]
