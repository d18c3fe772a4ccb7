"""Contracts of aggregation: folding client deltas into one step of the global model.

- ``Accumulator``: folds weighted client deltas as they arrive (memory independent of how many).
- ``StalenessWeight``: discounts an update by how many versions old its base model is.
- ``ServerOptimizer``: turns the aggregated pseudo-gradient into the next global model, with a
  checkpointable ``state_dict``.

Each kind has a registry so configs name implementations (``server_optimizer = "fedavgm"``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from fedlink.registry import Registry


class Accumulator(ABC):
    """Folds weighted deltas; ``mean()`` is their weighted average."""

    @abstractmethod
    def add(self, delta: np.ndarray, weight: float) -> None:
        """Fold in one client's delta with its (positive) weight."""

    @abstractmethod
    def mean(self) -> np.ndarray:
        """The weighted mean of the deltas folded in since the last reset."""

    @abstractmethod
    def reset(self) -> None:
        """Forget everything folded in so far."""

    @property
    @abstractmethod
    def count(self) -> int:
        """Number of deltas folded in since the last reset."""


class StalenessWeight(ABC):
    """``weight(tau)``: the factor applied to an update ``tau`` versions old (1 at tau=0)."""

    @abstractmethod
    def __call__(self, tau: int) -> float:
        """The factor for staleness ``tau`` >= 0."""


class ServerOptimizer(ABC):
    """Applies an aggregated pseudo-gradient (mean client delta) to the global model."""

    @abstractmethod
    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """The next global model (a new array; ``model`` is left unchanged)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this optimizer."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


ACCUMULATORS: Registry[Accumulator] = Registry("accumulator")
STALENESS_WEIGHTS: Registry[StalenessWeight] = Registry("staleness weight")
SERVER_OPTIMIZERS: Registry[ServerOptimizer] = Registry("server optimizer")
