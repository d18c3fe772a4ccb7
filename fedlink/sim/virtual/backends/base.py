"""The training-backend contract: where a virtual run's selected clients train.

The loop hands each selected client's training to a ``TrainingBackend`` the moment its
download ends (model time), and takes the result only when the client's training ends in
model time. Between the two the loop goes on with other clients' events, so a backend with
``N`` workers trains up to ``N`` clients at once while the loop keeps the engine, the
pipelines and the clock in one process (pfl-research's design: one model per worker, clients
trained in place).

Implementations register by name in ``BACKENDS`` (``[run] backend``); each is made by a
factory ``(context: BackendContext) -> TrainingBackend``. ``[virtual] workers = 0`` always
trains inline, in the loop's process, whatever the backend. Every backend gives the same
numbers: a worker trains the same client from the same model with the same plan (and seed) as
the loop's process would, and the loop takes results in model-time order.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from fedlink.client import TrainPlan, TrainResult
from fedlink.errors import FedlinkError
from fedlink.registry import Registry

if TYPE_CHECKING:
    from fedlink.sim.config import ExperimentConfig
    from fedlink.sim.virtual.population import Population


@dataclass(frozen=True)
class TrainingTask:
    """One client's training: client ``index`` from global model ``version`` (``model``).

    ``due`` is the model time at which the loop needs the result: a backend with more tasks
    than free workers trains the earliest due first, so the loop rarely waits on a task
    queued behind later ones. Workers keep the model of the version they last trained, so a
    backend sends ``model`` to a worker once per version, not once per task.
    """

    index: int
    version: int
    model: np.ndarray
    plan: TrainPlan
    due: float = 0.0


class TrainingBackend(Protocol):
    """Trains clients' tasks; each result is a future the loop waits on when it needs it."""

    def submit(self, task: TrainingTask) -> Future[TrainResult]:
        """Train ``task`` (at once, or when a worker is free)."""
        ...

    def close(self) -> None:
        """Stop the backend's workers (also after an error; tasks not started are dropped)."""
        ...

    @property
    def processes(self) -> int:
        """How many distinct processes have trained clients so far."""
        ...


@dataclass(frozen=True)
class BackendContext:
    """What a backend factory is given.

    ``population`` is the loop's own (what inline training uses); ``build`` is picklable and
    makes the same population in a worker process (each worker calls it once). ``address`` is
    the cluster to join, for backends that have one (Ray; ``""``: start a local one).
    """

    workers: int
    population: Population
    build: Callable[[], Population]
    address: str = ""


ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""A worker's environment: it trains on one core, so its math libraries get one thread each
(what Ray gives a one-CPU actor). Left to their defaults, each worker's OpenMP and OpenBLAS
pools start a thread per core and the workers' threads fight over the cores: a task of the
sim_scale parallel workload took 156 ms in a worker against 59 ms with one thread each."""

BackendFactory = Callable[[BackendContext], TrainingBackend]

BACKENDS: Registry[TrainingBackend] = Registry("training backend")
"""``[run] backend`` names: ``inline``, ``processes`` (the default), ``ray``."""


class ConfigPopulation:
    """Picklable: builds a virtual run's population from its config, in a worker process."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config

    def __call__(self) -> Population:
        """The population ``run_virtual`` builds for ``config`` (data and trainers included)."""
        from fedlink.sim.virtual.runner import build_population

        return build_population(self.config)


def warmed(population: Population) -> Population:
    """``population``, with one client's trainer built once, so a worker's one-time costs
    (lazy imports such as torch's optimizer machinery, lazily loaded data) are paid while it
    starts rather than inside the run."""
    if population.size > 0:
        population.trainer(0)
    return population


class TrainingWorkerError(FedlinkError):
    """A training worker could not start, or exited while the run needed it."""
