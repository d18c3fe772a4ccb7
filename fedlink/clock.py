"""The one clock contract: ``now``, ``sleep`` and ``call_at``.

``RealClock`` reads ``time.monotonic``; ``ManualClock`` is a discrete-event clock whose time
moves only when its owner says so (``advance``) or when the next scheduled event is run
(``run_next``): the virtual-clock simulation (``fedlink.sim.virtual``) and tests drive it, so
hours of model time pass in milliseconds of wall time. ``sleep_on(clock, s)`` waits on any
clock from async code. A leaf module: it imports nothing of fedlink.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

Callback = Callable[[], None]


@runtime_checkable
class Clock(Protocol):
    """What reads and waits on time (seconds, from an arbitrary origin)."""

    def now(self) -> float:
        """The current time in seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        ...

    def call_at(self, when: float, callback: Callback) -> Cancellable:
        """Run ``callback`` once the time reaches ``when``."""
        ...


class Cancellable(Protocol):
    """A scheduled call that may still be withdrawn."""

    def cancel(self) -> None:
        """Withdraw the call (a no-op once it ran)."""
        ...


class RealClock:
    """Wall time: ``time.monotonic``, ``time.sleep``, and ``call_at`` on the calling thread's
    event loop (a timer thread where none runs)."""

    def now(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """``time.sleep`` (nothing for a non-positive duration)."""
        if seconds > 0:
            time.sleep(seconds)

    def call_at(self, when: float, callback: Callback) -> Cancellable:
        """Run ``callback`` at ``when`` (at once when it is past).

        From inside a running event loop the loop's own timer carries it (its time is
        ``time.monotonic`` too): a coordinator re-arms its alarm on every change, and a thread
        per wake-up would cost a thread start each time. Elsewhere a daemon
        ``threading.Timer`` does.
        """
        delay = max(0.0, when - self.now())
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            return loop.call_later(delay, callback)
        timer = threading.Timer(delay, callback)
        timer.daemon = True
        timer.start()
        return timer


async def real_sleep(seconds: float) -> None:
    """Wait ``seconds`` of wall time on the running event loop (the default async sleep of
    whatever waits in real time: retry backoff, pace steering)."""
    await asyncio.sleep(max(0.0, seconds))


async def sleep_on(clock: Clock, seconds: float) -> None:
    """Let ``seconds`` of ``clock``'s time pass without blocking the event loop.

    The real clock waits on the event loop's own timer; any other clock wakes the waiter from
    ``clock.call_at`` (a ``ManualClock``'s owner moves time on, from any thread), so heartbeats
    and other periodic work run in model time under a manual or virtual clock.
    """
    if isinstance(clock, RealClock):
        await real_sleep(seconds)
        return
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(_resolve, woken)

    pending = clock.call_at(clock.now() + max(0.0, seconds), wake)
    try:
        await woken
    finally:
        pending.cancel()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass
class _Event:
    when: float
    callback: Callback | None

    def cancel(self) -> None:
        self.callback = None


class ManualClock:
    """Discrete-event time: a heap of scheduled calls, run in time order (ties: in the order
    they were scheduled), so that the same schedule always replays the same way.

    ``now`` moves only forward, to each event's time as it runs (``run_next``) or by
    ``advance``/``sleep``, which run every event falling due on the way.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        # (when, order, event): ordered by tuple comparison in C (a simulation pushes and pops
        # a dozen comparisons per client task), ties by the order of scheduling
        self._queue: list[tuple[float, int, _Event]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """The model time."""
        return self._now

    def call_at(self, when: float, callback: Callback) -> Cancellable:
        """Schedule ``callback`` at ``when`` (a past time runs at the current time)."""
        event = _Event(max(float(when), self._now), callback)
        heapq.heappush(self._queue, (event.when, next(self._order), event))
        return event

    def call_later(self, delay: float, callback: Callback) -> Cancellable:
        """Schedule ``callback`` ``delay`` seconds from now."""
        return self.call_at(self._now + delay, callback)

    def pending(self) -> int:
        """How many scheduled calls have not run (withdrawn ones included until skipped)."""
        return len(self._queue)

    def scheduled(self) -> Iterator[tuple[float, Callback]]:
        """The calls still to run, ``(when, callback)``, in no particular order."""
        return ((when, event.callback) for when, _, event in self._queue
                if event.callback is not None)

    def next_time(self) -> float | None:
        """When the next live event is due (``None``: nothing scheduled)."""
        self._drop_cancelled()
        return self._queue[0][0] if self._queue else None

    def run_next(self) -> bool:
        """Move to the next event's time and run it; ``False`` when nothing is scheduled."""
        self._drop_cancelled()
        if not self._queue:
            return False
        event = heapq.heappop(self._queue)[2]
        self._now = event.when
        callback, event.callback = event.callback, None
        assert callback is not None
        callback()
        return True

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` of model time pass, running every event due meanwhile."""
        until = self._now + max(0.0, seconds)
        while (due := self.next_time()) is not None and due <= until:
            self.run_next()
        self._now = until

    def sleep(self, seconds: float) -> None:
        """``advance`` (a sleeper in model time lets the world move on)."""
        self.advance(seconds)

    def _drop_cancelled(self) -> None:
        while self._queue and self._queue[0][2].callback is None:
            heapq.heappop(self._queue)


VirtualClock = ManualClock
"""The simulation's name for the discrete-event clock."""

TimeSource: TypeAlias = "Clock | Callable[[], float]"
"""What a part that only reads the time accepts: a ``Clock``, or a function returning seconds
(the ``now`` of a clock, or a test's hand-moved fake)."""


def reader(source: TimeSource) -> Callable[[], float]:
    """The function that reads ``source``'s time."""
    return source.now if isinstance(source, Clock) else source
