"""A whole elastic round on a ``ManualClock``: the deadline fires from ``Clock.call_at``,
over-selection hands out more tasks than the goal, a stale update is accepted with its
staleness, a straggler's update that is too stale is refused. No socket, no real sleeping:
the service's handlers are called directly and model time moves only when the test says."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import run_async

from fedlink.clock import ManualClock
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorService, FlushRule, LimitsConfig
from fedlink.errors import UpdateRefused
from fedlink.messages import CommitReply, CommitRequest, GetTaskRequest, JoinRequest, Task, Wait
from fedlink.metrics import EventLog
from fedlink.wire import pack

SIZE = 4
DEADLINE_S = 10.0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the event loop run (no time passes) until ``condition`` holds."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


class Round:
    """A service on a manual clock, with its time keeper and flush reporter running."""

    def __init__(self, clock: ManualClock) -> None:
        rule = FlushRule(goal=3, over_selection=4 / 3, min_updates=2, deadline_s=DEADLINE_S,
                         max_staleness=1)
        limits = LimitsConfig(long_poll_s=0.0, liveness_timeout_s=0, stuck_after_s=0)
        config = CoordinatorConfig(rounds=3, flush=rule, limits=limits,
                                   staleness_weight="polynomial")
        self.clock = clock
        self.events = EventLog(None)
        self.service = CoordinatorService(config, np.zeros(SIZE, np.float32), self.events,
                                          clock=clock)
        self.ids: dict[str, str] = {}

    async def join(self, *names: str) -> None:
        for name in names:
            reply = await self.service.join(JoinRequest(name, num_examples=10))
            self.ids[name] = reply.client_id

    async def ask(self, name: str) -> Task | Any:
        return await self.service.get_task(GetTaskRequest(self.ids[name]))

    async def commit(self, name: str, task: Task) -> CommitReply:
        payload = pack(np.full(SIZE, 1.0, np.float32), get_codec("fp32"))
        return await self.service.commit(CommitRequest(
            self.ids[name], f"up-{task.task_id}", task.task_id, task.model_version,
            num_examples=10, steps_completed=1, steps_planned=1, update=payload.header,
            update_data=payload.data))

    def flushes(self) -> list[dict[str, Any]]:
        return self.events.of_kind("flush")


def test_an_elastic_round_runs_on_a_manual_clock() -> None:
    clock = ManualClock(start=100.0)
    world = Round(clock)

    async def scenario() -> None:
        keeper = asyncio.create_task(world.service.keep_time())
        reporter = asyncio.create_task(world.service.report_flushes())
        await asyncio.sleep(0)  # let both start (no time passes)
        await world.join("a", "b", "c", "d", "e")
        # over-selection: a cohort of 4 for a goal of 3; the fifth client waits
        tasks = {name: await world.ask(name) for name in "abcd"}
        assert all(isinstance(t, Task) and t.model_version == 0 for t in tasks.values())
        assert tasks["a"].deadline_s == pytest.approx(DEADLINE_S)
        assert isinstance(await world.ask("e"), Wait)

        clock.advance(2.0)
        await world.commit("a", tasks["a"])
        clock.advance(1.0)
        await world.commit("b", tasks["b"])
        clock.advance(6.9)  # 9.9 s into the round: no flush yet
        for _ in range(10):
            await asyncio.sleep(0)
        assert world.service.engine.version == 0

        clock.advance(0.1)  # the deadline, with 2 >= min_updates in: version 1 from a and b
        await until(lambda: world.service.engine.version == 1, "the deadline's flush")
        await until(lambda: len(world.flushes()) == 1, "the flush event")
        (first,) = world.flushes()
        assert first["num_updates"] == 2 and first["round_seconds"] == pytest.approx(10.0)

        # round 2: c and d still train on version 0 (they hold places), a and e get version 1
        second = {name: await world.ask(name) for name in "ae"}
        assert all(isinstance(t, Task) and t.model_version == 1 for t in second.values())
        assert isinstance(await world.ask("b"), Wait)  # cohort full
        clock.advance(2.0)
        late = await world.commit("c", tasks["c"])  # one version old: accepted as stale
        assert late.staleness == 1 and late.accepted_version == 1
        await world.commit("a", second["a"])
        clock.advance(DEADLINE_S)
        await until(lambda: world.service.engine.version == 2, "the second deadline's flush")

        # the straggler d trained on version 0; two versions later it is refused
        with pytest.raises(UpdateRefused, match="too stale"):
            await world.commit("d", tasks["d"])
        await until(lambda: len(world.flushes()) == 2, "the second flush event")
        accepted = world.events.of_kind("update_accepted")
        staleness = {e["client_id"]: e["staleness"] for e in accepted}
        assert staleness == {world.ids["a"]: 0, world.ids["b"]: 0, world.ids["c"]: 1}
        weights = sorted(e["weight"] for e in accepted)
        assert weights[0] < weights[-1]  # the stale update counts, discounted
        (refused,) = world.events.of_kind("update_refused")
        assert refused["client_id"] == world.ids["d"]
        assert world.flushes()[1]["num_updates"] == 2
        assert clock.now() == pytest.approx(122.0)  # 22 s of model time passed
        for task in (keeper, reporter):
            task.cancel()

    run_async(scenario(), timeout=10.0)
    world.service.close()
