"""Hands queued training tasks to free workers, earliest due first (shared by the process-pool
and Ray backends).

The loop submits a round's tasks in a burst and then takes their results in model-time
order. Handing them out in that order (``TrainingTask.due``), rather than as submitted, means
the result the loop waits for next is the one being trained, and the loop's own work on each
result overlaps the workers' training of the next ones. Each worker holds ``DEPTH`` tasks (its
next one already sent while it trains the current one), so it does not sit idle while its
result travels back and the next task comes: on a loaded machine those hand-overs wait for
the scheduler, and with one task at a time two workers were slower than none.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from fedlink.client import TrainResult
from fedlink.sim.virtual.backends.base import TrainingTask

W = TypeVar("W")
DEPTH = 2
"""Tasks a worker holds: the one it trains and the next."""


def slots(workers: Sequence[W], depth: int = DEPTH) -> list[W]:
    """Each worker ``depth`` times, interleaved (the first tasks go one to each worker)."""
    return [worker for _ in range(depth) for worker in workers]


Start = Callable[[W, TrainingTask, "Future[TrainResult]"], None]


class Scheduler(Generic[W]):
    """Free workers and waiting tasks; thread-safe (workers finish on other threads).

    ``start(worker, task, future)`` sends ``task`` to ``worker``; whoever sees the worker
    finish resolves ``future`` and calls ``free(worker)``.
    """

    def __init__(self, workers: Iterable[W], start: Start[W]) -> None:
        self._free: deque[W] = deque(workers)
        self._waiting: list[tuple[float, int, TrainingTask, Future[TrainResult]]] = []
        self._order = itertools.count()  # ties in due time keep submission order
        self._lock = threading.Lock()
        self._start = start
        self._closed = False

    def submit(self, task: TrainingTask) -> Future[TrainResult]:
        """Queue ``task``; it starts now if a worker is free."""
        future: Future[TrainResult] = Future()
        with self._lock:
            heapq.heappush(self._waiting, (task.due, next(self._order), task, future))
            starts = self._assign()
        self._launch(starts)
        return future

    def free(self, worker: W) -> None:
        """``worker`` has finished its task: give it the most urgent waiting one."""
        with self._lock:
            self._free.append(worker)
            starts = self._assign()
        self._launch(starts)

    def fail_waiting(self, error: BaseException) -> None:
        """No worker is left: every waiting task fails with ``error``."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, _, _, future in waiting:
            if future.set_running_or_notify_cancel():
                future.set_exception(error)

    def close(self) -> None:
        """Start nothing more; waiting tasks are cancelled."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, []
        for _, _, _, future in waiting:
            future.cancel()

    def _assign(self) -> list[tuple[W, TrainingTask, Future[TrainResult]]]:
        """Pair free workers with the most urgent waiting tasks (under the lock)."""
        starts = []
        while self._free and self._waiting and not self._closed:
            _, _, task, future = heapq.heappop(self._waiting)
            if future.set_running_or_notify_cancel():
                starts.append((self._free.popleft(), task, future))
        return starts

    def _launch(self, starts: list[tuple[W, TrainingTask, Future[TrainResult]]]) -> None:
        """Send each task to its worker, outside the lock (a send may copy a model)."""
        for worker, task, future in starts:
            try:
                self._start(worker, task, future)
            except BaseException as exc:  # the worker is gone: the task fails, not the loop
                future.set_exception(exc)
