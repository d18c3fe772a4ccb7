"""Stragglers in simulation: trainers that take a device's time, not this machine's.

A fleet (``fedlink.netem.fleet``) gives each simulated client a compute-speed multiplier; a
multiplier of 2 means the client takes twice as long. Two wrappers realise it, both sleeping
in the training thread on their clock (``fedlink.clock``; real by default, a manual clock in
tests), so a slow client's update really arrives late and the coordinator's flush rule has to
cope (its deadline, ``min_updates`` and over-selection):

- ``SlowedTrainer`` (the default): each task takes ``speed`` times as long as this machine
  took, speeds relative to the fastest client. The update holds the full work: the sleep is
  not checked against the task deadline.
- ``PacedTrainer`` (``[run] device_step_s > 0``): each local step takes ``step_s`` seconds
  (``device_step_s`` x the client's speed), however fast this machine trains, and the client
  stops at its task's deadline with the steps that fit, as virtual mode's clients do
  (``[virtual] step_cost_s``). A client that trains in milliseconds here then spends a
  device's time training, which is what hides work done beside training (a secure group's
  key exchange) on a real fleet.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from fedlink.client import Trainer, TrainPlan, TrainResult
from fedlink.client.base import TrainerWrapper, planned_steps, steps_that_fit
from fedlink.client.evaluation import wrapped_evaluate
from fedlink.clock import Clock, RealClock
from fedlink.errors import ConfigError


class SlowedTrainer(TrainerWrapper):
    """Wraps a ``Trainer`` so that each ``train`` call takes ``speed`` times as long."""

    def __init__(self, trainer: Trainer, speed: float, clock: Clock | None = None) -> None:
        if not speed >= 1.0:
            raise ConfigError(f"speed multiplier must be >= 1 to slow a trainer, got {speed}")
        self.trainer = trainer
        self.speed = speed
        self.clock = clock or RealClock()

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


class PacedTrainer(TrainerWrapper):
    """Wraps a ``Trainer`` so that it trains at a device's pace: ``step_s`` seconds per local
    step, stopping at the task's deadline with the steps that fit (see the module docstring).
    ``batch_size`` paces an evaluation: one step per batch of the client's examples."""

    def __init__(self, trainer: Trainer, step_s: float, batch_size: int,
                 clock: Clock | None = None) -> None:
        if not (math.isfinite(step_s) and step_s > 0):
            raise ConfigError(f"a device's step must take more than 0 s, got {step_s}")
        self.trainer = trainer
        self.step_s = step_s
        self.batch_size = batch_size
        self.clock = clock or RealClock()

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train the steps that fit before the deadline, then wait out their device time."""
        started = self.clock.now()
        steps = planned_steps(plan, self.trainer.num_examples())
        fits = steps_that_fit(plan.deadline, started, steps, self.step_s)
        if fits == 0 < steps:  # the device would not finish one step: no work
            self._wait_until(started if plan.deadline is None else plan.deadline)
            return TrainResult(params.copy(), self.trainer.num_examples(), 0, steps)
        result = self.trainer.train(
            params, plan if fits == steps else dataclasses.replace(plan, local_steps=fits))
        # the device's time for the steps done (a [partial_work] straggler stops early), which
        # the client reports as its training time
        self._wait_until(started + result.steps_completed * self.step_s)
        return dataclasses.replace(result, steps_planned=steps, metrics={
            **result.metrics, "train_seconds": result.steps_completed * self.step_s})

    @property
    def evaluate(self) -> Callable[[np.ndarray], Mapping[str, float]]:
        """The wrapped trainer's ``evaluate``, paced at one step per batch of examples
        (``AttributeError`` when it has none: ``fedlink.client.evaluation.wrapped_evaluate``)."""
        score = wrapped_evaluate(self.trainer)

        def paced(params: np.ndarray) -> Mapping[str, float]:
            started = self.clock.now()
            scores = score(params)
            batches = math.ceil(self.trainer.num_examples() / self.batch_size)
            self._wait_until(started + batches * self.step_s)
            return scores

        return paced

    def _wait_until(self, instant: float) -> None:
        self.clock.sleep(max(0.0, instant - self.clock.now()))
