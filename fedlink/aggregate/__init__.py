"""Streaming aggregation, staleness weights and server optimizers, each in a registry."""

from fedlink.aggregate import optimizers as _optimizers  # noqa: F401  (registers)
from fedlink.aggregate import staleness as _staleness  # noqa: F401  (registers)
from fedlink.aggregate.base import (
    ACCUMULATORS,
    SERVER_OPTIMIZERS,
    STALENESS_WEIGHTS,
    Accumulator,
    Registry,
    ServerOptimizer,
    StalenessWeight,
)
from fedlink.aggregate.streaming import StreamingMean

__all__ = [
    "ACCUMULATORS",
    "SERVER_OPTIMIZERS",
    "STALENESS_WEIGHTS",
    "Accumulator",
    "Registry",
    "ServerOptimizer",
    "StalenessWeight",
    "StreamingMean",
]
