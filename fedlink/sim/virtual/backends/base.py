"""The training-backend contract: where a virtual run's selected clients do their work.

The loop hands each selected client's work to a ``TrainingBackend`` the moment its download
ends (model time), and takes the result only when the client's training ends in model time.
Between the two the loop goes on with other clients' events, so a backend with ``N`` workers
works for up to ``N`` clients at once while the loop keeps the engine and the clock in one
process (pfl-research's design: one model per worker, clients trained in place).

A client's work is what a device does between download and upload (``do_job``): train, then
turn the change into its upload with the run's update pipeline (privacy, compression, error
feedback), with the client's own generator and residual, which travel with the job and come
back with the result. Only the encoded upload returns to the loop, so a worker parallelises
the clipping, noise and compression with the training, and a compressed update crosses the
process boundary compressed.

Implementations register by name in ``BACKENDS`` (``[run] backend``); each is made by a
factory ``(context: BackendContext) -> TrainingBackend``. ``[virtual] workers = 0`` always
trains inline, in the loop's process, whatever the backend. Every backend gives the same
numbers: a worker trains the same client from the same model with the same plan (and seed) as
the loop's process would, and the loop takes results in model-time order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fedlink.client import TrainPlan
from fedlink.client.pipeline import UpdatePipeline
from fedlink.errors import FedlinkError
from fedlink.privacy.base import NoPrivacy
from fedlink.registry import Registry
from fedlink.wire import Payload

if TYPE_CHECKING:
    from fedlink.experiment.config import ExperimentConfig
    from fedlink.sim.virtual.population import Population


@dataclass(frozen=True)
class ClientJob:
    """A selected client's work, without the model it starts from: train client ``index``
    with ``plan``, then encode the change with the run's pipeline configured with the task's
    ``options``, drawing from the client's generator ``rng`` (its state after the plan's seed
    was drawn) and starting from its error-feedback ``residual`` (``None``: none yet, or a
    codec without feedback)."""

    index: int
    plan: TrainPlan
    rng: np.random.Generator
    options: Mapping[str, str] = field(default_factory=dict)
    residual: np.ndarray | None = None
    trainer_state: Any = None
    """What the client's trainer kept from its earlier tasks (``client_state()``; DP-SGD's
    privacy accountant): a trainer is built per task here, while a device keeps one."""


@dataclass(frozen=True)
class ClientUpload:
    """A job's result: the encoded update and what the client reports with it, and the
    client's generator and residual as the job left them (the loop keeps them for the
    client's next task)."""

    payload: Payload
    privacy: Mapping[str, float]
    num_examples: int
    steps_completed: int
    rng: np.random.Generator
    residual: np.ndarray | None = None
    trainer_state: Any = None


def do_job(population: Population, pipeline: Callable[[], UpdatePipeline], job: ClientJob,
           model: np.ndarray) -> ClientUpload:
    """Client ``job.index``'s work from ``model`` (read-only), as its device does it: local
    training, then the delta through a pipeline of its own (stateless but for the residual)."""
    trainer = population.trainer(job.index)
    restore = getattr(trainer, "restore_client_state", None)
    if job.trainer_state is not None and restore is not None:
        restore(job.trainer_state)  # e.g. DP-SGD's accountant: epsilon spans all tasks
    result = trainer.train(model, job.plan)
    stages = pipeline()
    stages.configure(job.options)
    stages.bind(getattr(trainer, "spec", None))  # privacy acts on the trainable part
    if stages.feedback is not None:
        stages.feedback.residual = job.residual
    # the loop unpacks the update unverified (it crosses no wire): no checksums to compute
    payload = stages.process(result.params - model, job.rng, checksums=False)
    # what a session reports with a commit: the trainer's DP figures and the stage's
    reported = {**{k: v for k, v in result.metrics.items() if k.startswith("dp_")},
                **stages.privacy_metrics}
    keep = getattr(trainer, "client_state", None)
    return ClientUpload(payload, reported, result.num_examples, result.steps_completed,
                        job.rng, None if stages.feedback is None else stages.feedback.residual,
                        None if keep is None else keep())


def reusable(pipeline: Callable[[], UpdatePipeline]) -> Callable[[], UpdatePipeline]:
    """``pipeline``, or, when the pipelines it makes keep nothing from one update to the next
    (no privacy stage, no error feedback, no density policy: a pure encoding), a maker that
    hands every job the one pipeline it made: building a pipeline per job cost a small
    model's task more than encoding its update."""
    made = pipeline()
    if isinstance(made.privacy, NoPrivacy) and made.feedback is None and made.density is None:
        return lambda: made
    return pipeline


@dataclass(frozen=True)
class TrainingTask:
    """One client's work (``job``) from global model ``version`` (``model``).

    ``due`` is the model time at which the loop needs the result: a backend with more tasks
    than free workers starts the earliest due first, so the loop rarely waits on a task
    queued behind later ones. Workers keep the model of the version they last trained, so a
    backend sends ``model`` to a worker once per version, not once per task.
    """

    job: ClientJob
    version: int
    model: np.ndarray
    due: float = 0.0


class TrainingBackend(Protocol):
    """Does clients' jobs; each result is a future the loop waits on when it needs it."""

    def submit(self, task: TrainingTask) -> Future[ClientUpload]:
        """Do ``task``'s job with ``do_job`` (at once, or when a worker is free)."""
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
    ``pipeline`` (picklable) makes a client's update pipeline, one per job.
    """

    workers: int
    population: Population
    build: Callable[[], Population]
    address: str = ""
    pipeline: Callable[[], UpdatePipeline] = UpdatePipeline

    def build_for(self, worker: int) -> Callable[[], Population]:
        """``build`` for worker ``worker`` (0, 1, ...): the population a worker makes knows
        which worker it is (``[client] device`` gives each its own device) when ``build``
        has a ``for_worker(worker)``; else ``build`` itself."""
        for_worker = getattr(self.build, "for_worker", None)
        return self.build if for_worker is None else for_worker(worker)


ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
"""A worker's environment: it trains on one core, so its math libraries get one thread each
(what Ray gives a one-CPU actor). Left to their defaults, each worker's OpenMP and OpenBLAS
pools start a thread per core and the workers' threads fight over the cores: a task of the
sim_scale parallel workload took 156 ms in a worker against 59 ms with one thread each."""

BackendFactory = Callable[[BackendContext], TrainingBackend]

BACKENDS: Registry[TrainingBackend] = Registry("training backend")
"""``[run] backend`` names: ``inline``, ``processes`` (the default), ``ray``."""


class ConfigPopulation:
    """Picklable: builds a virtual run's population from its config, in worker process
    ``worker`` (which picks that worker's device, ``[client] device``)."""

    def __init__(self, config: ExperimentConfig, worker: int = 0) -> None:
        self.config = config
        self.worker = worker

    def for_worker(self, worker: int) -> ConfigPopulation:
        """The same population, built by worker ``worker``."""
        return ConfigPopulation(self.config, worker)

    def __call__(self) -> Population:
        """The population ``run_virtual`` builds for ``config`` (data and trainers included)."""
        from fedlink.sim.virtual.runner import build_population

        return build_population(self.config, self.worker)


def warmed(population: Population) -> Population:
    """``population``, with one client's trainer built once, so a worker's one-time costs
    (lazy imports such as torch's optimizer machinery, lazily loaded data) are paid while it
    starts rather than inside the run."""
    if population.size > 0:
        population.trainer(0)
    return population


class TrainingWorkerError(FedlinkError):
    """A training worker could not start, or exited while the run needed it."""
