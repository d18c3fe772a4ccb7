"""Hands queued training tasks to free workers, earliest due first (shared by the process-pool
and Ray backends).

The loop submits a round's tasks in a burst and then takes their results in model-time
order. Handing them out in that order (``TrainingTask.due``), rather than as submitted, means
the result the loop waits for next is the one being trained, and the loop's own work on each
result overlaps the workers' training of the next ones. Each worker holds up to ``DEPTH``
tasks (its next one already sent while it trains the current one), so it does not sit idle
while its result travels back and the next task comes: on a loaded machine those hand-overs
wait for the scheduler, and with one task at a time two workers were slower than none.

A worker is given a task to hold only while there are enough waiting for every worker that
has room: the last task of a burst waits for whichever worker frees up first, rather than
queueing behind one that has just started a task while another is about to finish. Held
blindly, it cost a synchronous round up to one task's time with one worker idle.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Generic, TypeVar

from fedlink.sim.virtual.backends.base import ClientUpload, TrainingTask

W = TypeVar("W")
DEPTH = 2
"""Tasks a worker holds at most: the one it trains and the next."""

Start = Callable[[W, TrainingTask, "Future[ClientUpload]"], None]


class Scheduler(Generic[W]):
    """Free workers and waiting tasks; thread-safe (workers finish on other threads).

    ``start(worker, task, future)`` sends ``task`` to ``worker``; whoever sees the worker
    finish resolves ``future`` and calls ``free(worker)``.
    """

    def __init__(self, workers: Iterable[W], start: Start[W], depth: int = DEPTH) -> None:
        self._held: dict[W, int] = dict.fromkeys(workers, 0)  # tasks sent, not finished
        self._depth = depth
        self._waiting: list[tuple[float, int, TrainingTask, Future[ClientUpload]]] = []
        self._order = itertools.count()  # ties in due time keep submission order
        self._lock = threading.Lock()
        self._start = start
        self._closed = False

    def submit(self, task: TrainingTask) -> Future[ClientUpload]:
        """Queue ``task``; it starts now if a worker is free."""
        future: Future[ClientUpload] = Future()
        with self._lock:
            heapq.heappush(self._waiting, (task.due, next(self._order), task, future))
            starts = self._assign()
        self._launch(starts)
        return future

    def free(self, worker: W) -> None:
        """``worker`` has finished a task: give the most urgent waiting ones out again."""
        with self._lock:
            self._held[worker] -= 1
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

    def _assign(self) -> list[tuple[W, TrainingTask, Future[ClientUpload]]]:
        """Pair workers with the most urgent waiting tasks (under the lock)."""
        starts = []
        while self._waiting and not self._closed:
            worker = self._next_worker()
            if worker is None:
                break
            _, _, task, future = heapq.heappop(self._waiting)
            if future.set_running_or_notify_cancel():
                self._held[worker] += 1
                starts.append((worker, task, future))
        return starts

    def _next_worker(self) -> W | None:
        """An idle worker; else one with room, if there are waiting tasks for every worker
        with room (else the next task waits for whichever worker frees up first)."""
        roomy = [w for w, held in self._held.items() if held < self._depth]
        idle = [w for w in roomy if self._held[w] == 0]
        if idle:
            return idle[0]
        if roomy and len(self._waiting) >= len(roomy):
            return min(roomy, key=self._held.__getitem__)
        return None

    def _launch(self, starts: list[tuple[W, TrainingTask, Future[ClientUpload]]]) -> None:
        """Send each task to its worker, outside the lock (a send may copy a model)."""
        for worker, task, future in starts:
            try:
                self._start(worker, task, future)
            except BaseException as exc:  # the worker is gone: the task fails, not the loop
                future.set_exception(exc)
