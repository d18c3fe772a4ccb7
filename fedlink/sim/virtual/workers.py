"""Where a virtual run's clients train: in the loop's process, or in a pool of worker processes.

The loop hands each selected client's training to a ``TrainingPool`` the moment its download
ends (model time), and takes the result only when the client's training ends in model time.
Between the two the loop goes on with other clients' events, so with ``[virtual] workers = N``
up to ``N`` clients train at once while the loop keeps the engine, the pipelines and the
clock in one process (pfl-research's design: one model per worker, clients trained in place).

- ``InlineTraining`` (``workers = 0``, the default): trains at once in this process.
- ``ProcessTraining``: a ``ProcessPoolExecutor`` of ``spawn``ed workers; each builds the
  population once from the run's config (its data, its model) and then trains whichever
  client it is sent. Only the model vector and the plan travel to a worker and only the
  ``TrainResult`` comes back.

Both give the same numbers: a worker trains the same client from the same model with the same
plan (and seed) as the loop's process would, and results are taken in model-time order.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedlink.client import TrainPlan, TrainResult
from fedlink.errors import ConfigError

if TYPE_CHECKING:
    from fedlink.sim.config import ExperimentConfig
    from fedlink.sim.virtual.population import Population


class TrainingPool(Protocol):
    """Trains one client's task; the result is a future the loop waits on when it needs it."""

    def submit(self, index: int, model: np.ndarray, plan: TrainPlan) -> Future[TrainResult]:
        """Train client ``index`` from ``model`` with ``plan``."""
        ...

    def close(self) -> None:
        """Stop the pool's workers (nothing for the inline pool)."""
        ...

    @property
    def processes(self) -> int:
        """How many distinct processes have trained clients so far."""
        ...


class InlineTraining:
    """Trains in the loop's own process, at once (``[virtual] workers = 0``)."""

    def __init__(self, population: Population) -> None:
        self.population = population

    def submit(self, index: int, model: np.ndarray, plan: TrainPlan) -> Future[TrainResult]:
        """The trained result, already resolved."""
        done: Future[TrainResult] = Future()
        try:
            done.set_result(self.population.trainer(index).train(model, plan))
        except Exception as exc:  # the loop re-raises it where it takes the result
            done.set_exception(exc)
        return done

    def close(self) -> None:
        """Nothing to stop."""

    @property
    def processes(self) -> int:
        """One: this process."""
        return 1


class ProcessTraining:
    """``workers`` spawned processes, each holding the population ``build`` makes once."""

    def __init__(self, workers: int, build: Callable[[], Population]) -> None:
        if workers < 1:
            raise ConfigError(f"virtual.workers: a process pool needs >= 1 worker, got {workers}")
        # spawn, not fork: the loop's process has torch's thread pools running already
        context = multiprocessing.get_context("spawn")
        everyone = context.Barrier(workers)
        self._pool = ProcessPoolExecutor(workers, mp_context=context,
                                         initializer=_start_worker, initargs=(build, everyone))
        self._pids: set[int] = set()
        self._start_all(workers)

    def _start_all(self, workers: int) -> None:
        """Wait until every worker has built its population (the pool spawns on demand).

        One call per worker, each held at a barrier until all have arrived, so each lands on
        a worker of its own; otherwise the first worker up would train everything while
        the others were still loading their data.
        """
        for ready in [self._pool.submit(_wait_for_everyone) for _ in range(workers)]:
            ready.result()

    def submit(self, index: int, model: np.ndarray, plan: TrainPlan) -> Future[TrainResult]:
        """Send client ``index``'s task to a free worker."""
        trained: Future[TrainResult] = Future()
        sent = self._pool.submit(_train_in_worker, index, model, plan)
        sent.add_done_callback(lambda done: self._settle(done, trained))
        return trained

    def _settle(self, done: Future[tuple[int, TrainResult]],
                trained: Future[TrainResult]) -> None:
        try:
            pid, result = done.result()
        except BaseException as exc:  # a worker's error (or its death) surfaces in the loop
            trained.set_exception(exc)
            return
        self._pids.add(pid)
        trained.set_result(result)

    def close(self) -> None:
        """Stop the workers, dropping tasks not started (a finished run needs none of them)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    @property
    def processes(self) -> int:
        """Worker processes that have returned a trained client."""
        return len(self._pids)


class ConfigPopulation:
    """Picklable: builds a virtual run's population from its config, in a worker process."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config

    def __call__(self) -> Population:
        """The population ``run_virtual`` builds for ``config`` (data and trainers included)."""
        from fedlink.sim.virtual.runner import build_population

        return build_population(self.config)


def training_pool(workers: int, population: Population,
                  build: Callable[[], Population]) -> TrainingPool:
    """Inline training on ``population`` for ``workers = 0``, else that many worker processes,
    each holding the population ``build`` makes."""
    return InlineTraining(population) if workers == 0 else ProcessTraining(workers, build)


# Per worker process, not per fedlink process: what a worker built at start-up.
_worker_population: list[Population] = []
_worker_barrier: list[Any] = []
READY_TIMEOUT_S = 600.0  # building a population may load a large data set


def _start_worker(build: Callable[[], Population], everyone: Any) -> None:
    _worker_population.append(build())
    _worker_barrier.append(everyone)


def _wait_for_everyone() -> None:
    _worker_barrier[0].wait(READY_TIMEOUT_S)


def _train_in_worker(index: int, model: np.ndarray, plan: TrainPlan) -> tuple[int, TrainResult]:
    return os.getpid(), _worker_population[0].trainer(index).train(model, plan)
