"""Builds what an experiment needs from its config: data, models, evaluator, trainers.

Shared by ``fedlink simulate`` (everything in one process), ``fedlink serve`` (initial model and
evaluator) and ``fedlink client`` (one client's trainer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedlink.client import Trainer
from fedlink.client.torch_trainer import TorchTrainer
from fedlink.data import Dataset, FederatedData, load_federated
from fedlink.metrics import EVENTS_FILENAME
from fedlink.models import Evaluator, build_model
from fedlink.params import to_vector
from fedlink.privacy.dp_sgd import DPSGDTrainer
from fedlink.private import private_dir
from fedlink.sim.config import ExperimentConfig

TRAINERS: dict[str, Callable[..., Trainer]] = {"torch": TorchTrainer, "dp_sgd": DPSGDTrainer}
"""``[client] trainer`` name -> trainer class (``(model, data, *, seed)``)."""


@dataclass(frozen=True)
class Experiment:
    """An experiment's data and model, built once from its config."""

    config: ExperimentConfig
    data: FederatedData

    @classmethod
    def build(cls, config: ExperimentConfig) -> Experiment:
        """Load and partition the data (seeded)."""
        section = config.data
        data = load_federated(section.dataset, section.clients, config.run.seed,
                              section.partition, **dict(section.options))
        return cls(config, data)

    def new_model(self) -> torch.nn.Module:
        """A freshly initialised model (the same weights on every call)."""
        return build_model(self.config.model.name, self.data.num_features,
                           self.data.num_classes, seed=self.config.run.seed,
                           **dict(self.config.model.options))

    def initial_vector(self) -> np.ndarray:
        """The global model at version 0, as a flat float32 vector."""
        return to_vector(self.new_model())

    def evaluator(self) -> Evaluator:
        """Scores a global model vector on the central test set.

        With ``[run] evaluate_train`` also on every client's training data, pooled.
        """
        train = pooled_train(self.data) if self.config.run.evaluate_train else None
        return Evaluator(self.new_model(), self.data.test, train=train)

    def trainer(self, index: int) -> Trainer:
        """The trainer of client ``index`` (``[client] trainer``), over its local data."""
        return TRAINERS[self.config.client.trainer](
            self.new_model(), self.data.clients[index], seed=self.config.run.seed * 7919 + index)


def pooled_train(data: FederatedData) -> Dataset:
    """Every client's training examples in one dataset (the federation's training set)."""
    return Dataset(x=np.concatenate([c.x for c in data.clients]),
                   y=np.concatenate([c.y for c in data.clients]),
                   num_classes=data.num_classes, num_features=data.num_features,
                   name=f"{data.name}-train")


def prepare_run_dir(config: ExperimentConfig, output_dir: Path | None,
                    keep_events: bool = False) -> Path:
    """Create ``<output_dir>/<run name>/``; a previous run's event log there is replaced.

    ``keep_events`` keeps it instead (a resumed run appends to its own log).
    """
    run_dir = private_dir(Path(output_dir or config.run.output_dir) / config.run.name)
    if not keep_events:
        (run_dir / EVENTS_FILENAME).unlink(missing_ok=True)
    return run_dir
