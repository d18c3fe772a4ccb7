"""``ray``: Ray actors train the selected clients (``[run] backend = "ray"``, the ``ray`` extra).

One actor per ``[virtual] workers`` (one CPU each), each holding the population ``build``
makes once (its data, its model) and doing whichever client's job it is sent: training in
place, then the update pipeline (pfl-research's design; Flower's Ray backend keeps a pool of
actors the same way). A model version is put in Ray's object store once and every actor
training from it reads it there (zero-copy on one machine), so the loop copies each version
once, not once per task.
Tasks go to free actors, earliest due first (``schedule.Scheduler``).

Ray: with ``[ray] address = ""`` (the default) a new local Ray is started for the run on
loopback only (``_node_ip_address = 127.0.0.1``, no dashboard, ``workers`` CPUs, usage
statistics off: ``RAY_USAGE_STATS_ENABLED=0``, actors' logs not copied to this process) and
shut down when the run ends, also on error; an ``address`` joins that cluster instead (the
caller's, left running). A Ray this process had already started is used as it is and left
running. ``ray`` is imported only here, and only when a run asks for this backend.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from fedlink.client.pipeline import UpdatePipeline
from fedlink.errors import ConfigError
from fedlink.sim.virtual.backends.base import (
    ONE_THREAD,
    BackendContext,
    ClientJob,
    ClientUpload,
    TrainingTask,
    TrainingWorkerError,
    do_job,
    warmed,
)
from fedlink.sim.virtual.backends.schedule import Scheduler

if TYPE_CHECKING:
    from fedlink.sim.virtual.population import Population

_Answer = tuple[int, "Future[tuple[int, ClientUpload]]", "Future[ClientUpload]"]

READY_TIMEOUT_S = 600.0  # starting actors and building each one's population
MODELS_KEPT = 4  # model versions kept in the object store (stale tasks may train from older)
LOOPBACK = "127.0.0.1"


SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Read by Ray when it is imported: ``0`` is Ray's single-machine mode (its default on macOS),
whose node address is 127.0.0.1. Without it Ray on Linux replaces a loopback
``_node_ip_address`` with the host's routable address and listens there."""


def start_ray(address: str, cpus: int) -> bool:
    """Make sure Ray is running for this process; ``True`` when this call started it (and the
    caller must ``ray.shutdown()`` it), ``False`` when it was already up.

    A local Ray (``address = ""``) comes up on 127.0.0.1 only, or not at all
    (``TrainingWorkerError`` when ``ray`` was imported before this set ``SINGLE_MACHINE``).
    """
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # before Ray starts: no telemetry, ever
    if not address:
        os.environ[SINGLE_MACHINE] = "0"
    import ray

    if ray.is_initialized():
        return False
    quiet: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                             "configure_logging": False}
    if address:
        ray.init(address=address, **quiet)
        return True
    # "local": a new Ray of our own, even if another runs on this machine
    ray.init(address="local", num_cpus=cpus, _node_ip_address=LOOPBACK, **quiet)
    node = ray.util.get_node_ip_address()
    if node != LOOPBACK:
        ray.shutdown()
        raise TrainingWorkerError(f"the local Ray came up on {node}, not {LOOPBACK}: ray was "
                                  f"imported before fedlink started it; set {SINGLE_MACHINE}=0 "
                                  f"before importing ray")
    return True


class TrainingActor:
    """A Ray actor's state: the population it built, trained in place, and the pipeline
    factory of its jobs."""

    def __init__(self, build: Callable[[], Population],
                 pipeline: Callable[[], UpdatePipeline]) -> None:
        self.population = warmed(build())
        self.pipeline = pipeline

    def ready(self) -> int:
        """This actor's process id, once its population is built."""
        return os.getpid()

    def work(self, job: ClientJob, model: Any) -> tuple[int, ClientUpload]:
        """Client ``job.index``'s job from ``model``; (this process's id, the result)."""
        return os.getpid(), do_job(self.population, self.pipeline, job, model)


class RayTraining:
    """``workers`` Ray actors, each holding the population ``build`` makes once."""

    def __init__(self, workers: int, build: Callable[[], Population], address: str = "",
                 pipeline: Callable[[], UpdatePipeline] = UpdatePipeline,
                 build_for: Callable[[int], Callable[[], Population]] | None = None) -> None:
        if workers < 1:
            raise ConfigError(f"virtual.workers: the Ray backend needs >= 1 actor, got {workers}")
        try:
            self._owned = start_ray(address, workers)
        except TrainingWorkerError:
            raise
        except Exception as exc:  # Ray's own errors, as fedlink's
            where = f"join {address!r}" if address else "start"
            raise TrainingWorkerError(f"Ray could not {where}: {exc}") from exc
        import ray

        self._ray = ray
        self._actors: list[Any] = []
        self._pids: set[int] = set()
        self._models: OrderedDict[int, Any] = OrderedDict()
        self._models_lock = threading.Lock()
        try:
            actor = ray.remote(num_cpus=1, runtime_env={"env_vars": dict(ONE_THREAD)})(
                TrainingActor)
            own = build_for or (lambda number: build)  # worker number -> what it builds
            self._actors = [actor.remote(own(number), pipeline) for number in range(workers)]
            ray.get([a.ready.remote() for a in self._actors], timeout=READY_TIMEOUT_S)
        except BaseException as exc:
            self.close()
            if isinstance(exc, ray.exceptions.RayError):
                raise TrainingWorkerError(f"Ray training actors could not start: "
                                          f"{_cause(exc)}") from exc
            raise
        self._scheduler = Scheduler(range(workers), self._start)
        self._answers: queue.SimpleQueue[_Answer | None] = queue.SimpleQueue()
        self._settler = threading.Thread(target=self._settle_answers, daemon=True,
                                         name="fedlink-ray-results")
        self._settler.start()

    @classmethod
    def started(cls, context: BackendContext) -> RayTraining:
        """The registered factory: ``context.workers`` actors, on ``context.address``."""
        return cls(context.workers, context.build, context.address, context.pipeline,
                   context.build_for)

    def submit(self, task: TrainingTask) -> Future[ClientUpload]:
        """Queue client ``task.job.index``'s job for the next free actor."""
        return self._scheduler.submit(task)

    def _start(self, number: int, task: TrainingTask, future: Future[ClientUpload]) -> None:
        """Call actor ``number``; settle ``future`` (and free the actor) when it answers."""
        done = self._actors[number].work.remote(task.job, self._model(task))
        # Ray calls back on its own I/O thread, where calling into Ray again (the next task)
        # could stall it: the answer goes to this backend's thread instead
        done.future().add_done_callback(lambda answer: self._answers.put((number, answer, future)))

    def _settle_answers(self) -> None:
        """The results thread: settle each answer and hand its actor the next task."""
        while (answer := self._answers.get()) is not None:
            self._settle(*answer)

    def _model(self, task: TrainingTask) -> Any:
        """The object-store reference of ``task``'s model, put there once per version."""
        if task.version < 0:
            return self._ray.put(task.model)
        with self._models_lock:
            held = self._models.get(task.version)
            if held is None:
                held = self._models[task.version] = self._ray.put(task.model)
                while len(self._models) > MODELS_KEPT:
                    self._models.popitem(last=False)
            return held

    def _settle(self, number: int, answer: Future[tuple[int, ClientUpload]],
                future: Future[ClientUpload]) -> None:
        try:
            pid, result = answer.result()
        except BaseException as exc:  # the client's own error, or the actor's death
            future.set_exception(_translated(self._ray, exc))
        else:
            self._pids.add(pid)
            future.set_result(result)
        self._scheduler.free(number)

    def close(self) -> None:
        """Stop the actors and, if this backend started Ray, Ray itself."""
        scheduler = getattr(self, "_scheduler", None)
        if scheduler is not None:
            scheduler.close()
            self._answers.put(None)
            self._settler.join()
        try:
            for actor in self._actors:
                self._ray.kill(actor)
            self._models.clear()
        finally:
            if self._owned:
                self._ray.shutdown()

    @property
    def processes(self) -> int:
        """Actor processes that have returned a trained client."""
        return len(self._pids)


def _cause(exc: BaseException) -> BaseException:
    """The error a Ray task raised inside the actor, if ``exc`` wraps one."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _translated(ray: Any, exc: BaseException) -> BaseException:
    """A client's own error as it was raised; Ray's own failures as fedlink errors."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        return _cause(exc)
    if isinstance(exc, ray.exceptions.RayError):
        return TrainingWorkerError(f"Ray training actor failed: {exc}")
    return exc
