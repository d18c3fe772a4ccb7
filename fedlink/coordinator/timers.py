"""Waking the coordinator's event loop at an instant of its ``Clock``.

The coordinator's rules that depend on time (a round's deadline, a silent client's release,
expiry, the stuck line, the drain after the run) are applied when they fall due, from
``Clock.call_at``, not from a periodic poll. ``call_at`` may run its callback on another thread
(``RealClock``'s timer) or inside ``ManualClock.advance`` (tests, on the loop's thread): either
way the callback only hands a wake-up to the event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from fedlink.clock import Cancellable, Clock


def strictly_after(now: float, when: float) -> float:
    """``when``, or the first instant after ``now`` when ``when`` is not later than ``now``.

    A rule checked with "longer than" (``now - seen > timeout``) still holds back at exactly
    its due time; asking to be woken again at that same instant would spin forever on a
    manual clock. Time moves forward with every wake-up this way.
    """
    return when if when > now else math.nextafter(now, math.inf)


class Alarm:
    """One pending wake-up at the earliest instant asked for (``arm``), delivered to a loop.

    Before ``start`` (a service built outside its event loop) ``arm`` only remembers the
    instant; ``start`` schedules it. ``wait`` returns once the instant came and disarms.
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rang = asyncio.Event()
        self._when = math.inf
        self._handle: Cancellable | None = None

    @property
    def armed_for(self) -> float | None:
        """The instant the alarm will ring (``None``: not armed)."""
        return None if self._when == math.inf else self._when

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver wake-ups to ``loop`` from now on (and schedule one asked for earlier)."""
        self._loop = loop
        if self._when != math.inf:
            self._schedule()

    def arm(self, when: float | None) -> None:
        """Ring at ``when`` unless the alarm already rings earlier (``None``: nothing)."""
        if when is None or when >= self._when:
            return
        self._when = when
        if self._loop is not None:
            self._schedule()

    async def wait(self) -> None:
        """Return once the alarm rang; it is then disarmed."""
        await self._rang.wait()
        self._rang.clear()

    def stop(self) -> None:
        """Withdraw the pending wake-up; the alarm no longer reaches the loop."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle, self._loop, self._when = None, None, math.inf

    def _schedule(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._clock.call_at(self._when, self._ring)

    def _ring(self) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(self._rang_now)

    def _rang_now(self) -> None:
        self._handle, self._when = None, math.inf
        self._rang.set()


async def wait_event_or(clock: Clock, event: asyncio.Event, when: float) -> None:
    """Return once ``event`` is set or ``clock`` reaches ``when``, whichever comes first."""
    loop = asyncio.get_running_loop()
    reached = asyncio.Event()

    def ring() -> None:
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(reached.set)

    handle = clock.call_at(when, ring)
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(reached.wait())]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        handle.cancel()
        for waiter in waiters:
            waiter.cancel()
