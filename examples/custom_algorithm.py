"""A published algorithm fedlink does not ship, in one user file: FedDyn (Acar et al., ICLR 2021).

    python examples/custom_algorithm.py [--output-dir runs]   (its folder is then on sys.path)

fedlink's extension point for an algorithm is three plug points, each named by an import string
(or passed as an object to ``run_simulation``), so the same file runs under ``fedlink simulate``,
``fedlink serve`` and ``fedlink client``:

1. the server side of a round, ``[coordinator] server_optimizer = "module:Class"``: a
   ``fedlink.aggregate.ServerOptimizer`` whose ``step(model, mean_delta)`` turns the weighted
   mean of the accepted client deltas into the next global model; its ``state_dict`` is
   checkpointed with every model version, so a restarted coordinator resumes it exactly;
2. what travels to clients, ``[coordinator.training] trainer_options``: strings every task
   carries in ``Task.options`` (a ``FlushHook.task_options`` can add more, flush by flush);
3. the client side, ``[client] trainer = "module:factory"``: here a ``TorchTrainer`` subclass
   that adds FedDyn's local terms in ``objective`` and keeps its per-client state in
   ``after_task``.

Updates still go through the client pipeline (privacy, compression, the outbox, resumable
uploads), and the run keeps its links, elastic rounds and report.

FedDyn, with ``alpha`` the regularisation weight and ``p`` the fraction of the ``m`` clients
that take part in a round. Client ``i`` holds ``g_i`` (initially 0) and, from the global
``w``, minimises ``L_i(theta) - <g_i, theta> + alpha / 2 * ||theta - w||^2``, then sets
``g_i <- g_i - alpha * (theta_i - w)``. The server holds ``h`` (initially 0)::

    h <- h - alpha * p * mean_delta          (mean_delta = mean over the round of theta_i - w)
    w <- w + mean_delta - h / alpha
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlink.aggregate import ServerOptimizer
from fedlink.client import TrainPlan
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.errors import ConfigError

ALPHA_OPTION = "feddyn_alpha"
"""The ``Task.options`` key that carries ``alpha`` to the clients."""


class FedDynServer(ServerOptimizer):
    """FedDyn's server step (see the module docstring); ``participation`` is ``p``."""

    def __init__(self, alpha: float = 0.01, participation: float = 1.0) -> None:
        if not alpha > 0 or not 0 < participation <= 1:
            raise ConfigError(f"feddyn: need alpha > 0 and participation in (0, 1], got "
                              f"{alpha}, {participation}")
        self.alpha, self.participation = float(alpha), float(participation)
        self._h: np.ndarray | None = None

    def step(self, model: np.ndarray, mean_delta: np.ndarray) -> np.ndarray:
        """``h`` moves against the round's mean delta; the model takes it and corrects by h."""
        delta = np.asarray(mean_delta, dtype=np.float64)
        if self._h is None:
            self._h = np.zeros_like(delta)
        self._h -= self.alpha * self.participation * delta
        return (model + delta - self._h / self.alpha).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        """Hyperparameters and ``h`` (a copy), checkpointed with each model version."""
        h = None if self._h is None else self._h.copy()
        return {"alpha": self.alpha, "participation": self.participation, "h": h}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.alpha, self.participation = float(state["alpha"]), float(state["participation"])
        self._h = None if state["h"] is None else np.array(state["h"], dtype=np.float64)


class FedDynTrainer(TorchTrainer):
    """Local training with FedDyn's linear and proximal terms; keeps ``g_i`` between tasks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._g = [torch.zeros_like(p) for p in self._params]

    @staticmethod
    def alpha(plan: TrainPlan) -> float:
        """``alpha`` from the task's options (``ConfigError`` when the coordinator sent none)."""
        if ALPHA_OPTION not in plan.options:
            raise ConfigError(f"FedDyn needs [coordinator.training] trainer_options = "
                              f"{{ {ALPHA_OPTION} = ... }}")
        return float(plan.options[ALPHA_OPTION])

    def objective(self, loss: torch.Tensor, anchor: list[torch.Tensor],
                  plan: TrainPlan) -> torch.Tensor:
        """``loss - <g, theta> + alpha / 2 ||theta - w||^2``."""
        alpha = self.alpha(plan)
        linear = sum((g * p).sum() for g, p in zip(self._g, self._params, strict=True))
        prox = sum(((p - a) ** 2).sum() for p, a in zip(self._params, anchor, strict=True))
        return loss - linear + alpha / 2 * prox

    def after_task(self, anchor: list[torch.Tensor], plan: TrainPlan) -> None:
        """``g <- g - alpha (theta - w)``."""
        alpha = self.alpha(plan)
        with torch.no_grad():
            for g, p, a in zip(self._g, self._params, anchor, strict=True):
                g -= alpha * (p - a)


def trainer(model: torch.nn.Module, data: Any, *, seed: int) -> FedDynTrainer:
    """``[client] trainer = "custom_algorithm:trainer"``."""
    return FedDynTrainer(model, data, seed=seed)


ALPHA = 0.01
CONFIG = {  # the same tables as an experiment TOML; the import strings need examples/ on the path
    "run": {"name": "feddyn-digits", "seed": 0},
    "data": {"dataset": "digits", "clients": 5, "partition": "dirichlet",
             "options": {"alpha": 0.5}},
    "model": {"name": "mlp", "options": {"hidden": [32]}},
    "client": {"trainer": "custom_algorithm:trainer"},
    "coordinator": {
        "rounds": 10,
        "server_optimizer": "custom_algorithm:FedDynServer",
        "server_optimizer_options": {"alpha": ALPHA, "participation": 1.0},
        "flush": {"goal": 5, "deadline_s": 60.0},
        "training": {"local_epochs": 2, "batch_size": 32, "learning_rate": 0.1,
                     "trainer_options": {ALPHA_OPTION: ALPHA}},
    },
}

if __name__ == "__main__":
    from fedlink.sim import ExperimentConfig, run_simulation

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=Path("runs"))
    args = parser.parse_args()
    result = run_simulation(ExperimentConfig.from_dict(CONFIG), args.output_dir, progress=False)
    print(f"FedDyn final accuracy: {result.summary['final_accuracy']:.3f}")
    print(f"report: {result.report}")
