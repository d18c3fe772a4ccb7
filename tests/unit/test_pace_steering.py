"""Pace steering and the simulation's arrivals: a waiting client is told to come back late
enough that the population's idle check-ins stay near ``limits.checkins_per_s``; a large
simulated population starts in waves behind the coordinator's recorded joins, and its waits end
when the run does."""

from __future__ import annotations

import asyncio

import numpy as np
from conftest import run_async, wait_until

from fedlink.clock import ManualClock
from fedlink.coordinator import CoordinatorConfig, CoordinatorService, FlushRule, LimitsConfig
from fedlink.messages import GetTaskRequest, JoinRequest, Task, Wait
from fedlink.metrics import EventLog, kinds
from fedlink.sim.arrivals import RunOverSleep, start_in_waves
from fedlink.sim.capacity import PACED_FROM_CLIENTS, SIM_CHECKINS_PER_S, for_population


def _service(checkins_per_s: float) -> CoordinatorService:
    limits = LimitsConfig(long_poll_s=0.0, retry_after_s=1.0, checkins_per_s=checkins_per_s)
    config = CoordinatorConfig(rounds=3, flush=FlushRule(goal=1, deadline_s=None), limits=limits)
    return CoordinatorService(config, np.zeros(4, np.float32), EventLog(None),
                              clock=ManualClock())


def _waits_for(checkins_per_s: float, clients: int) -> float:
    svc = _service(checkins_per_s)

    async def scenario() -> float:
        ids = [(await svc.join(JoinRequest(f"c{i}", num_examples=1))).client_id
               for i in range(clients)]
        assert isinstance(await svc.get_task(GetTaskRequest(ids[0])), Task)  # the one place
        reply = await svc.get_task(GetTaskRequest(ids[1]))
        assert isinstance(reply, Wait)
        return reply.retry_after_s

    return run_async(scenario())


def test_a_wait_spreads_the_population_over_the_check_in_rate() -> None:
    assert _waits_for(checkins_per_s=2.0, clients=40) == 20.0  # 40 clients / 2 per s
    assert _waits_for(checkins_per_s=100.0, clients=40) == 1.0  # never below retry_after_s
    assert _waits_for(checkins_per_s=0.0, clients=40) == 1.0  # off: the plain retry_after_s


def test_a_large_simulated_population_is_paced_and_a_small_one_is_not() -> None:
    config = CoordinatorConfig()
    assert for_population(config, 50).limits.checkins_per_s == 0.0
    paced = for_population(config, PACED_FROM_CLIENTS)
    assert paced.limits.checkins_per_s == SIM_CHECKINS_PER_S
    chosen = CoordinatorConfig(limits=LimitsConfig(checkins_per_s=7.0))
    assert for_population(chosen, 10 * PACED_FROM_CLIENTS).limits.checkins_per_s == 7.0


def _joined(events: EventLog, name: str) -> None:
    events.emit(kinds.ClientJoined.build(client_id=name, name=name, num_examples=1))


def test_sessions_start_in_waves_behind_the_recorded_joins() -> None:
    events = EventLog(None)

    async def scenario() -> list[int]:
        started: list[int] = []
        release = asyncio.Event()

        def session(i: int):  # type: ignore[no-untyped-def]
            async def run() -> int:
                started.append(i)
                await release.wait()
                return i
            return run

        waves = asyncio.ensure_future(start_in_waves([session(i) for i in range(6)], events,
                                                     window=2))
        await wait_until(lambda: len(started) == 2)
        await asyncio.sleep(0)  # nothing else may start before a join is recorded
        assert started == [0, 1]
        _joined(events, "a")
        await wait_until(lambda: len(started) == 3)
        release.set()  # runs that end free their places too
        return await asyncio.wait_for(waves, 30)

    assert run_async(scenario()) == list(range(6))


def test_a_wait_ends_when_the_run_finishes() -> None:
    events = EventLog(None)

    async def scenario() -> None:
        sleep = RunOverSleep(events)
        waiting = asyncio.ensure_future(sleep(3600.0))
        await asyncio.sleep(0)
        assert not waiting.done()
        events.emit(kinds.RunFinished.build(reason="done", model_version=3))
        await asyncio.wait_for(waiting, 30)
        await asyncio.wait_for(sleep(3600.0), 30)  # after the end, a wait returns at once
        sleep.close()

    run_async(scenario())


def test_no_session_starts_once_the_run_is_over() -> None:
    events = EventLog(None)

    async def scenario() -> list[int | None]:
        over = asyncio.Event()

        def session(i: int):  # type: ignore[no-untyped-def]
            async def run() -> int:
                if i == 1:  # the second arrival's run ends the run (its rounds are done)
                    over.set()
                return i
            return run

        return await asyncio.wait_for(
            start_in_waves([session(i) for i in range(5)], events, window=1, over=over), 30)

    assert run_async(scenario()) == [0, 1, None, None, None]
