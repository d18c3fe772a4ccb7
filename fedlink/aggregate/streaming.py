"""Streaming weighted mean: one model-sized buffer, whatever the number of clients."""

from __future__ import annotations

import numpy as np

from fedlink.aggregate.base import ACCUMULATORS, Accumulator


@ACCUMULATORS.register("mean")
class StreamingMean(Accumulator):
    """Weighted mean of deltas, folded in as they arrive.

    Sums in float64 so that the order updates arrive in barely changes the result.
    """

    def __init__(self) -> None:
        self._sum: np.ndarray | None = None
        self._total_weight = 0.0
        self._count = 0

    def add(self, delta: np.ndarray, weight: float) -> None:
        """Fold in ``weight * delta``."""
        if not weight > 0:
            raise ValueError(f"weight must be positive, got {weight}")
        if self._sum is None:
            self._sum = np.zeros(delta.shape, dtype=np.float64)
        elif delta.shape != self._sum.shape:
            raise ValueError(f"delta shape {delta.shape} != accumulated {self._sum.shape}")
        self._sum += weight * delta.astype(np.float64, copy=False)
        self._total_weight += weight
        self._count += 1

    def mean(self) -> np.ndarray:
        """Weighted mean as float32 (``ValueError`` when nothing was added)."""
        if self._sum is None or self._count == 0:
            raise ValueError("no updates to average")
        return (self._sum / self._total_weight).astype(np.float32)

    def reset(self) -> None:
        """Drop the buffer contents (the buffer itself is reused)."""
        if self._sum is not None:
            self._sum.fill(0.0)
        self._total_weight = 0.0
        self._count = 0

    @property
    def count(self) -> int:
        """Deltas folded in since the last reset."""
        return self._count

    @property
    def total_weight(self) -> float:
        """Sum of the weights folded in since the last reset."""
        return self._total_weight
