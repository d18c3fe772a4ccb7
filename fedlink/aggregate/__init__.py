"""Streaming and robust aggregation, staleness weights and server optimizers, each in a registry."""

from fedlink.aggregate import optimizers as _optimizers  # noqa: F401  (registers)
from fedlink.aggregate import robust as _robust  # noqa: F401  (registers)
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
from fedlink.aggregate.flushguard import FlushGuard, GuardRules, RobustConfig
from fedlink.aggregate.robust import CoordinateMedian, NormBounded, TrimmedMean
from fedlink.aggregate.streaming import FedNovaMean, StreamingMean

__all__ = [
    "ACCUMULATORS",
    "FLUSH_HOOKS",
    "SERVER_OPTIMIZERS",
    "STALENESS_WEIGHTS",
    "Accumulator",
    "CoordinateMedian",
    "FedNovaMean",
    "FlushGuard",
    "FlushHook",
    "FlushInfo",
    "GuardRules",
    "NormBounded",
    "Registry",
    "RobustConfig",
    "ServerOptimizer",
    "StalenessWeight",
    "StreamingMean",
    "TrimmedMean",
    "UpdateInfo",
]
