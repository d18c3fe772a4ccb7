"""Stragglers in simulation: a trainer that computes ``speed`` times slower than it really does.

A fleet (``fedlink.netem.fleet``) gives each simulated client a compute-speed multiplier; a
multiplier of 2 means the client takes twice as long. ``SlowedTrainer`` realises it by
sleeping ``(speed - 1)`` times the training time after training, in the training thread, both
measured and slept on its clock (``fedlink.clock``; real by default, a manual clock in tests),
so a slow client's update really arrives late and the coordinator's flush rule has to cope
(its deadline, ``min_updates`` and over-selection). The update itself holds the full work:
the sleep is not checked against the task deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from fedlink.client import Trainer, TrainPlan, TrainResult
from fedlink.client.evaluation import wrapped_evaluate
from fedlink.clock import Clock, RealClock
from fedlink.errors import ConfigError


class SlowedTrainer:
    """Wraps a ``Trainer`` so that each ``train`` call takes ``speed`` times as long."""

    def __init__(self, trainer: Trainer, speed: float, clock: Clock | None = None) -> None:
        if not speed >= 1.0:
            raise ConfigError(f"speed multiplier must be >= 1 to slow a trainer, got {speed}")
        self.trainer = trainer
        self.speed = speed
        self.clock = clock or RealClock()

    def num_examples(self) -> int:
        """The wrapped trainer's example count."""
        return self.trainer.num_examples()

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train, then wait out the rest of the slowed-down compute time."""
        started = self.clock.now()
        result = self.trainer.train(params, plan)
        self.clock.sleep((self.speed - 1.0) * (self.clock.now() - started))
        return result

    @property
    def evaluate(self) -> Callable[[np.ndarray], Mapping[str, float]]:
        """The wrapped trainer's ``evaluate``, slowed down like ``train`` (``AttributeError``
        when it has none: ``fedlink.client.evaluation.wrapped_evaluate``)."""
        score = wrapped_evaluate(self.trainer)

        def slowed(params: np.ndarray) -> Mapping[str, float]:
            started = self.clock.now()
            scores = score(params)
            self.clock.sleep((self.speed - 1.0) * (self.clock.now() - started))
            return scores

        return slowed
