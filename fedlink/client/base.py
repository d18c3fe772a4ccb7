"""Contracts of the client SDK: the ``Trainer`` a device plugs in, and what it is asked to do.

Nothing here imports torch: a device with its own trainer (numpy, ONNX, ...) implements
``Trainer`` on flat float32 parameter vectors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class TrainPlan:
    """How much local training one task asks for.

    ``local_steps`` > 0 means that many SGD steps; otherwise ``local_epochs`` passes over the
    local data. ``deadline`` is a ``time.monotonic()`` instant after which the trainer should
    stop early and report the work it did (``None``: no deadline).
    """

    local_steps: int = 0
    local_epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 0.05
    deadline: float | None = None
    seed: int = 0
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def uses_steps(self) -> bool:
        """True when the plan counts SGD steps rather than epochs."""
        return self.local_steps > 0


@dataclass(frozen=True)
class TrainResult:
    """What local training produced: the new local parameters and how much work was done."""

    params: np.ndarray
    num_examples: int
    steps_completed: int
    steps_planned: int
    metrics: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Trainer(Protocol):
    """Local training on a device, over flat float32 parameter vectors."""

    def num_examples(self) -> int:
        """Number of local training examples (used to weight this client's updates)."""
        ...

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train starting from ``params`` (not modified) as ``plan`` says."""
        ...
