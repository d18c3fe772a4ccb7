"""How a real-gRPC simulation's clients arrive and wait: a bounded ramp of Joins, and waits that
end with the run.

Every simulated client lives in the one process that also runs the coordinator, on one event
loop. Started together, 10,000 sessions send 10,000 ``Join`` calls at once: the loop serves
them one after another, the last ones pass their 30 s deadline, retry, and add to the queue
until their retry budgets run out. ``start_in_waves`` starts at most ``window`` sessions ahead
of the coordinator's ``client_joined`` events (a real fleet does not arrive in one
millisecond either). ``RunOverSleep`` is the sessions' wait ("come back in N s", a retry's
backoff) that also ends when the run does: a paced client told to come back in a minute
hears ``Finished`` at once instead of after the coordinator stopped answering.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fedlink.metrics import EventLog, kinds

T = TypeVar("T")

JOIN_WINDOW = 256
"""Sessions started ahead of the Joins the coordinator has recorded."""


async def start_in_waves(runs: Sequence[Callable[[], Awaitable[T]]], events: EventLog,
                         window: int = JOIN_WINDOW,
                         over: asyncio.Event | None = None) -> list[T | None]:
    """Run every ``runs[i]()`` to its end (results in order), starting the next one each time
    the coordinator records a join, with at most ``window`` started ahead of them.

    A run that ends (done, or failed before it joined) frees its place too; once one has
    failed, no more are started and its error is raised. Once ``over`` is set (the run
    finished: a large population's first arrivals may already have done all its rounds), no
    more are started either; those left out are ``None`` in the results.
    """
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(window)

    def joined(_: kinds.ClientJoined) -> None:  # on the log's writer thread
        loop.call_soon_threadsafe(slots.release)

    unsubscribe = events.subscribe(kinds.ClientJoined, joined)
    try:
        started: list[asyncio.Task[T]] = []
        for run in runs:
            await slots.acquire()
            if any(_failed(task) for task in started) or (over is not None and over.is_set()):
                break
            task = asyncio.ensure_future(run())
            task.add_done_callback(lambda _: slots.release())
            started.append(task)
        done: list[T | None] = list(await asyncio.gather(*started))
        return done + [None] * (len(runs) - len(done))
    finally:
        unsubscribe()


def _failed(task: asyncio.Task[T]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


class RunOverSleep:
    """A wait of ``seconds`` that ends early once the run has finished (``run_finished``)."""

    def __init__(self, events: EventLog) -> None:
        self._over = asyncio.Event()
        loop = asyncio.get_running_loop()

        def finished(_: kinds.RunFinished) -> None:  # on the log's writer thread
            loop.call_soon_threadsafe(self._over.set)

        self._unsubscribe = events.subscribe(kinds.RunFinished, finished)

    async def __call__(self, seconds: float) -> None:
        """Wait ``seconds``, or less if the run ends meanwhile."""
        if self._over.is_set() or seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._over.wait(), timeout=seconds)

    @property
    def over(self) -> asyncio.Event:
        """Set once the run has finished."""
        return self._over

    def close(self) -> None:
        """Stop listening for the run's end."""
        self._unsubscribe()
