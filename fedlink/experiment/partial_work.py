"""Systems heterogeneity in simulation: stragglers that do only part of the work they were asked.

FedProx (Li et al., 2020, section 5.2) models devices that cannot finish a task in time by
letting a share of the selected devices run only ``x`` of the ``E`` local epochs, ``x`` drawn
uniformly at random; FedAvg drops those devices, FedProx keeps their partial updates. A
``[partial_work]`` table turns this on for ``fedlink simulate``::

    [partial_work]
    fraction = 0.9      # each task is a straggler's with this probability
    seed = 7            # optional; default: the run's seed

On each task a client draws, from its own seeded stream, whether it straggles (probability
``fraction``) and, if it does, its amount of work ``w`` uniformly in ``{1, ..., E}``: epochs
when the task counts epochs (``E = local_epochs``), steps when it counts steps
(``E = local_steps``). It then trains ``w`` epochs (or steps) and reports
``steps_completed < steps_planned``, the planned count being the full task's. A straggler that
draws ``w = E`` does the full task. The coordinator then either weights the partial update by
its work fraction (the default) or refuses it (``[coordinator] drop_partial = true``).

This is not ``[network.speed]``: a speed multiplier makes a client slower at the full task
(its update arrives late); partial work makes it do less (its update arrives with less in it).
Both can be combined. Draws depend only on (seed, client index, task count of that client),
so two runs that differ only in how the coordinator treats partial work see the same
stragglers doing the same amounts of work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from fedlink.client import Trainer, TrainPlan, TrainResult
from fedlink.client.base import TrainerWrapper
from fedlink.client.evaluation import wrapped_evaluate
from fedlink.config import changed_fields, check_fields, require

_STREAM = 0x5EED_57A6  # tells this module's seed streams apart from others of the same seed


@dataclass(frozen=True)
class PartialWorkSection:
    """``[partial_work]``: the share of tasks done only in part (0: none), and its seed.

    ``seed < 0`` (the default) means the run's seed; a seed set with ``fraction = 0`` is
    refused (nothing is drawn). It wraps the clients' real trainers, so
    it applies to ``[run] mode = "grpc"`` runs; a virtual run refuses it (its clock charges
    every step of a task; the fleet's ``speed`` makes stragglers there), as does a task of a
    single epoch or step, which cannot be done in part. In a secure run
    (``[coordinator.secure]``) a partial update weighs as much as a full one: the coordinator
    sees only its group's sum, and the work a member reports is its record.
    """

    fraction: float = 0.0
    seed: int = -1

    def __post_init__(self) -> None:
        check_fields(self, "partial_work")
        require(0.0 <= self.fraction <= 1.0, "partial_work.fraction",
                f"must be a number in [0, 1], got {self.fraction!r}")
        require(self.enabled or "seed" not in changed_fields(self), "partial_work.seed",
                "seeds the stragglers' draws, and with partial_work.fraction = 0 no task "
                "straggles: set fraction > 0, or remove seed")

    @property
    def enabled(self) -> bool:
        """Whether any task may be done in part."""
        return self.fraction > 0

    def trainer(self, trainer: Trainer, index: int, run_seed: int) -> Trainer:
        """``trainer`` of client ``index``, wrapped to straggle (unchanged when disabled)."""
        if not self.enabled:
            return trainer
        seed = run_seed if self.seed < 0 else self.seed
        rng = np.random.default_rng(np.random.SeedSequence([_STREAM, seed, index]))
        return PartialWorkTrainer(trainer, self.fraction, rng)


class PartialWorkTrainer(TrainerWrapper):
    """Wraps a ``Trainer``: with probability ``fraction`` a task is done only in part.

    See the module docstring for the draw. The wrapped trainer runs a shortened plan; the
    result reports the full plan's step count as ``steps_planned`` (scaled from the shortened
    plan's, exact for trainers whose epochs all have the same number of steps).
    """

    def __init__(self, trainer: Trainer, fraction: float, rng: np.random.Generator) -> None:
        require(0.0 <= fraction <= 1.0, "partial_work.fraction",
                f"must be in [0, 1], got {fraction}")
        self.trainer = trainer
        self.fraction = fraction
        self._rng = rng
        self.partial_tasks = 0
        self.tasks = 0

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        """Train the full plan, or, as a straggler, a random part of it."""
        full = plan.local_steps if plan.uses_steps else plan.local_epochs
        # Both draws on every task, so the stream stays aligned whatever each draw gives.
        straggles = bool(self._rng.random() < self.fraction)
        work = int(self._rng.integers(1, max(1, full) + 1))
        self.tasks += 1
        if not straggles or work >= full:
            return self.trainer.train(params, plan)
        self.partial_tasks += 1
        short = (dataclasses.replace(plan, local_steps=work) if plan.uses_steps
                 else dataclasses.replace(plan, local_epochs=work))
        result = self.trainer.train(params, short)
        planned = round(result.steps_planned * full / work)
        return dataclasses.replace(result, steps_planned=max(planned, result.steps_completed))

    @property
    def evaluate(self) -> Callable[[np.ndarray], Mapping[str, float]]:
        """The wrapped trainer's ``evaluate``, in full: straggling is about training
        (``AttributeError`` when it has none: ``fedlink.client.evaluation.wrapped_evaluate``)."""
        return wrapped_evaluate(self.trainer)
