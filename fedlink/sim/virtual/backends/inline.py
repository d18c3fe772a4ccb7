"""``inline``: do each job in the loop's own process, at once (what ``[virtual] workers = 0``
means)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from fedlink.client.pipeline import UpdatePipeline
from fedlink.sim.virtual.backends.base import (
    BackendContext,
    ClientUpload,
    TrainingTask,
    do_job,
    reusable,
    warmed,
)

if TYPE_CHECKING:
    from fedlink.sim.virtual.population import Population


class InlineTraining:
    """Does each task's job in this process when it is submitted."""

    def __init__(self, population: Population,
                 pipeline: Callable[[], UpdatePipeline] = UpdatePipeline) -> None:
        self.population = population
        self.pipeline = reusable(pipeline)

    @classmethod
    def started(cls, context: BackendContext) -> InlineTraining:
        """Inline training on the context's population, its one-time costs paid now (as a
        worker pays them while it starts, so the run's loop time measures the same work)."""
        return cls(warmed(context.population), context.pipeline)

    def submit(self, task: TrainingTask) -> Future[ClientUpload]:
        """The job's result, already resolved."""
        done: Future[ClientUpload] = Future()
        try:
            done.set_result(do_job(self.population, self.pipeline, task.job, task.model))
        except Exception as exc:  # the loop re-raises it where it takes the result
            done.set_exception(exc)
        return done

    def close(self) -> None:
        """Nothing to stop."""

    @property
    def processes(self) -> int:
        """One: this process."""
        return 1
