"""``RealClock.call_at``: on the calling loop's timer inside an event loop (no thread per
wake-up), on a timer thread elsewhere; withdrawn calls never run."""

from __future__ import annotations

import asyncio
import threading

from conftest import run_async

from fedlink.clock import RealClock


def test_call_at_inside_a_loop_runs_on_the_loop_thread_without_a_new_thread() -> None:
    clock = RealClock()

    async def scenario() -> None:
        ran: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        threads_before = threading.active_count()
        clock.call_at(clock.now(), lambda: ran.set_result(threading.current_thread().name))
        assert threading.active_count() == threads_before  # no timer thread started
        assert await asyncio.wait_for(ran, 30) == threading.current_thread().name

    run_async(scenario())


def test_a_cancelled_call_inside_a_loop_never_runs() -> None:
    clock = RealClock()

    async def scenario() -> None:
        seen: list[str] = []
        loop = asyncio.get_running_loop()
        withdrawn = clock.call_at(clock.now(), lambda: seen.append("withdrawn"))
        withdrawn.cancel()
        later: asyncio.Future[None] = loop.create_future()
        clock.call_at(clock.now(), lambda: later.set_result(None))  # runs after the first
        await asyncio.wait_for(later, 30)
        assert seen == []

    run_async(scenario())


def test_call_at_outside_a_loop_fires_from_a_timer_thread() -> None:
    clock = RealClock()
    fired = threading.Event()
    where: list[str] = []

    def callback() -> None:
        where.append(threading.current_thread().name)
        fired.set()

    clock.call_at(clock.now(), callback)
    assert fired.wait(30)
    assert where != [threading.current_thread().name]
