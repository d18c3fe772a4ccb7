"""``processes`` (the default): ``[virtual] workers`` spawned worker processes on this machine.

Each worker builds the population once from the run's config (its data, its model), pays its
one-time costs while it starts, and then does whichever client's job it is sent (``do_job``:
training and the update pipeline). A worker keeps the global model it last trained from, so
the loop sends a model to each worker once per version; a task is otherwise the client's
``ClientJob``, and only its ``ClientUpload`` (the encoded update) comes back. One pipe per
worker; a thread in the loop's process reads results and hands each free worker the most
urgent waiting task (``schedule.Scheduler``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
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
    reusable,
    warmed,
)
from fedlink.sim.virtual.backends.schedule import Scheduler

if TYPE_CHECKING:
    from fedlink.sim.virtual.population import Population

READY_TIMEOUT_S = 600.0  # building a population may load a large data set
STOP_TIMEOUT_S = 30.0  # an idle worker exits at once when told to stop


class _Worker:
    """The loop's end of one worker process: its pipe, and what it holds."""

    def __init__(self, number: int, process: BaseProcess, pipe: Connection) -> None:
        self.number = number
        self.process = process
        self.pipe = pipe
        self.version: int | None = None  # the model version the worker holds
        self.tasks: deque[Future[ClientUpload]] = deque()  # sent, in the order it trains them

    def wait_ready(self) -> None:
        """Block until the worker has built its population (its error if it could not)."""
        if not self.pipe.poll(READY_TIMEOUT_S):
            raise TrainingWorkerError(f"training worker {self.number} was not ready after "
                                      f"{READY_TIMEOUT_S:.0f} s")
        kind, value = self.receive()
        if kind != "ready":
            raise TrainingWorkerError(f"training worker {self.number} could not start: "
                                      f"{value}") from value

    def receive(self) -> tuple[str, Any]:
        """The worker's next message (``TrainingWorkerError`` once it has exited)."""
        try:
            message: tuple[str, Any] = self.pipe.recv()
        except (EOFError, OSError):
            raise TrainingWorkerError(f"training worker {self.number} (pid "
                                      f"{self.process.pid}) exited") from None
        return message


class ProcessTraining:
    """``workers`` spawned processes, each holding the population ``build`` makes once and
    making each job's pipeline with ``pipeline``."""

    def __init__(self, workers: int, build: Callable[[], Population],
                 pipeline: Callable[[], UpdatePipeline] = UpdatePipeline,
                 build_for: Callable[[int], Callable[[], Population]] | None = None) -> None:
        own = build_for or (lambda number: build)  # worker number -> what it builds
        if workers < 1:
            raise ConfigError(f"virtual.workers: a process pool needs >= 1 worker, got {workers}")
        # spawn, not fork: the loop's process has torch's thread pools running already
        spawn = multiprocessing.get_context("spawn")
        self._workers: list[_Worker] = []
        self._pids: set[int] = set()
        self._reader: threading.Thread | None = None
        try:
            for number in range(workers):
                here, there = spawn.Pipe()
                process = spawn.Process(target=_serve, args=(own(number), pipeline, there),
                                        daemon=True, name=f"fedlink-training-{number}")
                with _environment(ONE_THREAD):  # read by the new process's libraries as they load
                    process.start()
                there.close()
                self._workers.append(_Worker(number, process, here))
            for worker in self._workers:  # all start at once; wait for each
                worker.wait_ready()
        except BaseException:
            self._stop(at_once=True)
            raise
        self._scheduler = Scheduler(self._workers, self._start)
        self._reader = threading.Thread(target=self._read, name="fedlink-training-results",
                                        daemon=True)
        self._reader.start()

    @classmethod
    def started(cls, context: BackendContext) -> ProcessTraining:
        """The registered factory: ``context.workers`` processes building ``context.build``."""
        return cls(context.workers, context.build, context.pipeline, context.build_for)

    def submit(self, task: TrainingTask) -> Future[ClientUpload]:
        """Queue client ``task.job.index``'s job for the next free worker."""
        return self._scheduler.submit(task)

    def _start(self, worker: _Worker, task: TrainingTask, future: Future[ClientUpload]) -> None:
        """Send ``task``, with its model only if the worker does not hold that version."""
        fresh = task.version < 0 or worker.version != task.version
        worker.tasks.append(future)
        worker.pipe.send((task.job, task.model if fresh else None))
        worker.version = task.version

    def _read(self) -> None:
        """The results thread: settle each finished task and hand its worker the next one."""
        live = {worker.pipe: worker for worker in self._workers}
        while live:
            for pipe in wait(list(live)):
                worker = live[pipe]  # type: ignore[index]
                try:
                    kind, value = worker.receive()
                except TrainingWorkerError as exc:
                    del live[pipe]  # type: ignore[arg-type]
                    self._lost(worker, exc, any_left=bool(live))
                    continue
                self._settle(worker, kind, value)

    def _settle(self, worker: _Worker, kind: str, value: Any) -> None:
        future = worker.tasks.popleft() if worker.tasks else None
        if future is not None:
            if kind == "done":
                pid, result = value
                self._pids.add(pid)
                future.set_result(result)
            else:
                future.set_exception(value)
        self._scheduler.free(worker)

    def _lost(self, worker: _Worker, error: TrainingWorkerError, any_left: bool) -> None:
        """A worker died: its task fails, and every waiting one if none is left."""
        for task in worker.tasks:
            if not task.done():
                task.set_exception(error)
        if not any_left:
            self._scheduler.fail_waiting(error)

    def close(self) -> None:
        """Stop the workers: idle ones exit when told, busy ones (results no longer needed,
        the run is over) are terminated; tasks not started are cancelled."""
        scheduler = getattr(self, "_scheduler", None)
        if scheduler is not None:
            scheduler.close()
        self._stop(at_once=False)

    def _stop(self, at_once: bool) -> None:
        """End every worker (``at_once``: terminate them all, as when one failed to start)."""
        for worker in self._workers:
            if at_once or any(not task.done() for task in worker.tasks):
                worker.process.terminate()
                continue
            with contextlib.suppress(OSError):  # already gone
                worker.pipe.send(None)
        for worker in self._workers:
            worker.process.join(STOP_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        if self._reader is not None:
            self._reader.join()
        for worker in self._workers:
            worker.pipe.close()

    @property
    def processes(self) -> int:
        """Worker processes that have returned a trained client."""
        return len(self._pids)


@contextlib.contextmanager
def _environment(defaults: Mapping[str, str]) -> Iterator[None]:
    """``defaults`` in ``os.environ`` (a value the user set wins) while a worker is spawned:
    a spawned process starts with this process's environment, and there is no other way to
    give it one of its own."""
    added = {k: v for k, v in defaults.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _serve(build: Callable[[], Population], pipeline: Callable[[], UpdatePipeline],
           pipe: Connection) -> None:
    """A worker process: build the population, then do the jobs that come until told to
    stop."""
    try:
        population = warmed(build())
        pipeline = reusable(pipeline)
    except BaseException as exc:
        pipe.send(("error", _sendable(exc)))
        return
    pipe.send(("ready", os.getpid()))
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_receive_all, args=(pipe, inbox), daemon=True).start()
    model = None
    while (message := inbox.get()) is not None:
        job, sent = message
        if sent is not None:  # a new version: kept for the tasks after this one, read-only
            model = sent
            model.flags.writeable = False
        pipe.send(_work(population, pipeline, job, model))


def _receive_all(pipe: Connection, inbox: queue.SimpleQueue[Any]) -> None:
    """A worker's reader thread: the loop's next task waits here, already received, while the
    current one trains (and a model sent meanwhile never blocks the loop's process)."""
    while True:
        try:
            message = pipe.recv()
        except EOFError:  # the loop's process is gone
            message = None
        inbox.put(message)
        if message is None:
            return


def _work(population: Population, pipeline: Callable[[], UpdatePipeline], job: ClientJob,
          model: Any) -> tuple[str, Any]:
    try:
        return "done", (os.getpid(), do_job(population, pipeline, job, model))
    except Exception as exc:  # the loop re-raises it where it takes the result
        return "error", _sendable(exc)


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a ``TrainingWorkerError`` saying what it was."""
    import pickle

    try:
        pickle.dumps(exc)
    except Exception:
        return TrainingWorkerError(f"{type(exc).__name__}: {exc}")
    return exc
