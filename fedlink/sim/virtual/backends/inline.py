"""``inline``: train in the loop's own process, at once (what ``[virtual] workers = 0`` means)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING

from fedlink.client import TrainResult
from fedlink.sim.virtual.backends.base import BackendContext, TrainingTask, warmed

if TYPE_CHECKING:
    from fedlink.sim.virtual.population import Population


class InlineTraining:
    """Trains each task in this process when it is submitted."""

    def __init__(self, population: Population) -> None:
        self.population = population

    @classmethod
    def started(cls, context: BackendContext) -> InlineTraining:
        """Inline training on the context's population, its one-time costs paid now (as a
        worker pays them while it starts, so the run's loop time measures the same work)."""
        return cls(warmed(context.population))

    def submit(self, task: TrainingTask) -> Future[TrainResult]:
        """The trained result, already resolved."""
        done: Future[TrainResult] = Future()
        try:
            done.set_result(self.population.trainer(task.index).train(task.model, task.plan))
        except Exception as exc:  # the loop re-raises it where it takes the result
            done.set_exception(exc)
        return done

    def close(self) -> None:
        """Nothing to stop."""

    @property
    def processes(self) -> int:
        """One: this process."""
        return 1
