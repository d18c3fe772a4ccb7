"""Server optimizers: FedAvg, FedAvgM, and the FedOpt family (FedAdagrad, FedAdam, FedYogi).

Each is registered in ``SERVER_OPTIMIZERS`` under its name (``server_optimizer = "fedadam"``) and
takes its hyperparameters as options (``server_optimizer_options = { lr = 0.01, tau = 1e-3 }``).
"""

from __future__ import annotations

from abc import abstractmethod
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
        """Move the model along the mean delta, writing into ``mean_delta`` when it is a
        float32 array of the model's shape (the contract allows it: no model-sized copy)."""
        if mean_delta.dtype != np.float32 or mean_delta.shape != model.shape:
            return (model + self.lr * mean_delta).astype(np.float32)
        if self.lr != 1.0:
            mean_delta *= np.float32(self.lr)
        mean_delta += model
        return mean_delta

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


class FedOpt(ServerOptimizer):
    """Adaptive server optimizers of Reddi et al. 2021, "Adaptive Federated Optimization".

    With the mean client delta ``d_t`` as the pseudo-gradient (Algorithm 2; no bias
    correction), ``m_(-1) = 0`` and ``v_(-1) = tau^2``::

        m_t = beta1 m_(t-1) + (1 - beta1) d_t
        v_t = second_moment(v_(t-1), d_t^2)            (Adagrad, Adam or Yogi, below)
        w   <- w + lr * m_t / (sqrt(v_t) + tau)

    ``tau`` (the "degree of adaptivity") keeps the step bounded where ``v`` is small. State:
    ``m`` and ``v``, each one float32 vector of the model's length.
    """

    def __init__(self, lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.99,
                 tau: float = 1e-3) -> None:
        self._configure(lr, beta1, beta2, tau)
        self._m: np.ndarray | None = None
        self._v: np.ndarray | None = None

    def _configure(self, lr: float, beta1: float, beta2: float, tau: float) -> None:
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0 <= beta < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {beta}")
        if not tau > 0:
            raise ConfigError(f"tau must be > 0, got {tau}")
        self.lr = _check_lr(lr)
        self.beta1, self.beta2, self.tau = float(beta1), float(beta2), float(tau)

    @abstractmethod
    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        """``v_t`` from ``v_(t-1)`` and the squared pseudo-gradient (in place allowed)."""

    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """Update the moments, then take the adaptive step."""
        d = np.asarray(mean_delta, dtype=np.float32)
        if self._m is None or self._v is None:
            self._m = np.zeros_like(d)
            self._v = np.full_like(d, self.tau ** 2)
        self._m *= self.beta1
        self._m += (1.0 - self.beta1) * d
        self._v = self._second_moment(self._v, d * d).astype(np.float32, copy=False)
        return (model + self.lr * self._m / (np.sqrt(self._v) + self.tau)).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters and copies of both moments (``None`` before the first step)."""
        return {"lr": self.lr, "beta1": self.beta1, "beta2": self.beta2, "tau": self.tau,
                "m": None if self._m is None else self._m.copy(),
                "v": None if self._v is None else self._v.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self._configure(state["lr"], state["beta1"], state["beta2"], state["tau"])
        self._m = None if state["m"] is None else np.array(state["m"], dtype=np.float32)
        self._v = None if state["v"] is None else np.array(state["v"], dtype=np.float32)


@SERVER_OPTIMIZERS.register("fedadagrad")
class FedAdagrad(FedOpt):
    """FedAdagrad: ``v_t = v_(t-1) + d_t^2`` (``beta2`` is not used)."""

    def __init__(self, lr: float = 0.1, beta1: float = 0.9, tau: float = 1e-3) -> None:
        super().__init__(lr=lr, beta1=beta1, beta2=0.0, tau=tau)

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        """``v + d^2``."""
        v += d2
        return v


@SERVER_OPTIMIZERS.register("fedadam")
class FedAdam(FedOpt):
    """FedAdam: ``v_t = beta2 v_(t-1) + (1 - beta2) d_t^2``."""

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        """Exponential moving average of ``d^2``."""
        v *= self.beta2
        v += (1.0 - self.beta2) * d2
        return v


@SERVER_OPTIMIZERS.register("fedyogi")
class FedYogi(FedOpt):
    """FedYogi: ``v_t = v_(t-1) - (1 - beta2) d_t^2 sign(v_(t-1) - d_t^2)``.

    Like Adam, but ``v`` moves toward ``d^2`` by an additive step, so it grows fast and shrinks
    slowly (Zaheer et al. 2018).
    """

    def _second_moment(self, v: np.ndarray, d2: np.ndarray) -> np.ndarray:
        """Additive move of ``v`` toward ``d^2``."""
        v -= (1.0 - self.beta2) * d2 * np.sign(v - d2)
        return v
