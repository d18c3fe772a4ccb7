"""Server optimizers: FedAvg (plain averaging with a server learning rate) and FedAvgM."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlink.aggregate.base import SERVER_OPTIMIZERS, ServerOptimizer
from fedlink.errors import ConfigError


def _check_lr(lr: float) -> float:
    if not lr > 0:
        raise ConfigError(f"server learning rate must be > 0, got {lr}")
    return float(lr)


@SERVER_OPTIMIZERS.register("fedavg")
class FedAvg(ServerOptimizer):
    """``w <- w + lr * mean_delta``; with ``lr = 1`` the new model is the clients' average."""

    def __init__(self, lr: float = 1.0) -> None:
        self.lr = _check_lr(lr)

    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """Move the model along the mean delta."""
        return (model + self.lr * mean_delta).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """FedAvg keeps no state beyond its learning rate."""
        return {"lr": self.lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the learning rate."""
        self.lr = _check_lr(state["lr"])


@SERVER_OPTIMIZERS.register("fedavgm")
class FedAvgM(ServerOptimizer):
    """Server momentum (Hsu et al. 2019): ``m <- beta m + d``; ``w <- w + lr m``."""

    def __init__(self, lr: float = 1.0, momentum: float = 0.9) -> None:
        if not 0 <= momentum < 1:
            raise ConfigError(f"server momentum must be in [0, 1), got {momentum}")
        self.lr = _check_lr(lr)
        self.momentum = float(momentum)
        self._velocity: np.ndarray | None = None

    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """Accumulate momentum, then move the model along it."""
        if self._velocity is None:
            self._velocity = np.zeros_like(mean_delta, dtype=np.float32)
        self._velocity = self.momentum * self._velocity + mean_delta
        return (model + self.lr * self._velocity).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """Learning rate, momentum and the velocity buffer (a copy)."""
        velocity = None if self._velocity is None else self._velocity.copy()
        return {"lr": self.lr, "momentum": self.momentum, "velocity": velocity}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.lr = _check_lr(state["lr"])
        self.momentum = float(state["momentum"])
        velocity = state["velocity"]
        self._velocity = None if velocity is None else np.asarray(velocity, dtype=np.float32)
