"""Heartbeats judged against each client's own link, on a ``ManualClock``: the service's
handlers are called directly, its time keeper releases silent clients from ``Clock.call_at``,
and model time moves only when the test says.

A lossy link delays a client's heartbeats (TCP backing off under loss): one whose late
heartbeats have shown gaps of up to 20 s is not taken for dead after 25 s of silence, while a
client whose heartbeats came on time is, exactly as before; a lossy client that really dies is
still released, at a multiple of its gaps. A client with a transfer stream open is alive
(its chunks may take a minute each on a lossy link), up to the longest bound. A timeout whose
client delivers later is counted (``false_client_timeouts``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import numpy as np
import pytest
from conftest import run_async

from fedlink.clock import ManualClock
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorService, FlushRule, LimitsConfig
from fedlink.coordinator.heartbeat import GapWindow, silence_bound
from fedlink.errors import ConfigError
from fedlink.messages import (
    CommitRequest,
    DataChunk,
    DownloadRequest,
    GetTaskRequest,
    HeartbeatRequest,
    JoinRequest,
    Task,
    UploadChunk,
)
from fedlink.metrics import EventLog, summarize
from fedlink.refusals import RefusalCode
from fedlink.wire import pack

SIZE = 4
BASE_S = 25.0  # limits.liveness_timeout_s: what a clean link gets


class Coordinator:
    """A sync coordinator for two clients on a manual clock, its time keeper running."""

    def __init__(self, clock: ManualClock, **limits: Any) -> None:
        limits = {"heartbeat_interval_s": 5.0, "long_poll_s": 0.0,
                  "liveness_timeout_s": BASE_S, "stuck_after_s": 0, **limits}
        config = CoordinatorConfig(rounds=2, limits=LimitsConfig(**limits), flush=FlushRule(
            goal=2, min_updates=2, deadline_s=None))
        self.clock = clock
        self.events = EventLog(None)
        self.service = CoordinatorService(config, np.zeros(SIZE, np.float32), self.events,
                                          clock=clock)
        self.ids: dict[str, str] = {}
        self.tasks: dict[str, Task] = {}

    async def start(self, *names: str) -> None:
        """Join ``names`` and give each its task."""
        for name in names:
            self.ids[name] = (await self.service.join(JoinRequest(name, num_examples=10))).client_id
        for name in names:
            task = await self.service.get_task(GetTaskRequest(self.ids[name]))
            assert isinstance(task, Task), task
            self.tasks[name] = task

    async def after(self, seconds: float) -> None:
        """Move model time on by ``seconds``, letting the time keeper act on the way; the
        client named ``clean`` heartbeats on time, every 5 s, meanwhile."""
        while seconds > 0:
            step = min(seconds, 5.0)
            self.clock.advance(step)
            seconds -= step
            for _ in range(50):  # the alarm's wake-up and the poll run on the event loop
                await asyncio.sleep(0)
            if "clean" in self.tasks:
                await self.heartbeat("clean")

    async def heartbeat(self, name: str) -> None:
        await self.service.heartbeat(HeartbeatRequest(self.ids[name], self.tasks[name].task_id))

    async def upload(self, name: str, pieces: list[bytes], between_s: float) -> str:
        """Upload ``pieces`` as one stream, ``between_s`` of model time apart."""
        upload_id = f"up-{self.tasks[name].task_id}"

        async def chunks() -> AsyncIterator[UploadChunk]:
            offset = 0
            for i, piece in enumerate(pieces):
                if i:
                    await self.after(between_s)
                yield UploadChunk(self.ids[name], upload_id, offset, piece)
                offset += len(piece)

        await self.service.upload(chunks())
        return upload_id

    async def commit(self, name: str, upload_id: str | None = None) -> None:
        task = self.tasks[name]
        payload = pack(np.full(SIZE, 1.0, np.float32), get_codec("fp32"))
        reply = await self.service.commit(CommitRequest(
            self.ids[name], upload_id or f"up-{task.task_id}", task.task_id,
            task.model_version, num_examples=10, steps_completed=1, steps_planned=1,
            update=payload.header, update_data=b"" if upload_id else payload.data))
        assert reply.refusal == RefusalCode.NONE, reply

    def timed_out(self) -> list[str]:
        """Names of the clients whose task was released for silence."""
        by_id = {v: k for k, v in self.ids.items()}
        return [by_id[e["client_id"]] for e in self.events.of_kind("client_timeout")]


def scenario(clock: ManualClock, body: Any, **limits: Any) -> Coordinator:
    """Run ``body(coordinator)`` with the time keeper running; the coordinator after it."""
    world = Coordinator(clock, **limits)

    async def run() -> None:
        keeper = asyncio.create_task(world.service.keep_time())
        await asyncio.sleep(0)
        try:
            await body(world)
        finally:
            keeper.cancel()

    run_async(run())
    return world


def test_a_lossy_client_whose_heartbeats_come_late_is_not_timed_out() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("lossy", "clean")
        for gap in (5.0, 9.0, 14.0, 20.0, 12.0):  # heartbeats delayed by TCP's backoff
            await world.after(gap)
            await world.heartbeat("lossy")
        await world.after(30.0)  # 30 s of silence: beyond the base 25 s, within 3 x 20 s
        assert world.timed_out() == []
        await world.heartbeat("lossy")
        await world.commit("lossy")

    world = scenario(ManualClock(start=100.0), body)
    summary = summarize(world.events.events, {})
    assert summary["client_timeouts"] == 0 and summary["false_client_timeouts"] == 0


def test_a_client_whose_heartbeats_came_on_time_is_released_after_the_base_timeout() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("dead", "clean")
        for _ in range(5):
            await world.after(5.0)
            await world.heartbeat("dead")
        await world.after(25.0)  # "dead" says nothing more
        assert world.timed_out() == []  # 25 s: not beyond the bound yet
        await world.after(1.0)
        assert world.timed_out() == ["dead"]

    world = scenario(ManualClock(start=100.0), body)
    (event,) = world.events.of_kind("client_timeout")
    assert event["cause"] == "silent" and event["reason"] == "no heartbeat for 26.0 s"


def test_a_lossy_client_that_dies_is_released_at_a_multiple_of_its_gaps() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("lossy", "clean")
        for gap in (5.0, 20.0, 5.0):
            await world.after(gap)
            await world.heartbeat("lossy")
        await world.after(60.0)  # 3 x its p99 gap of 20 s
        assert world.timed_out() == []
        await world.after(0.5)
        assert world.timed_out() == ["lossy"]

    scenario(ManualClock(start=100.0), body)


def test_the_bound_is_capped_by_max_liveness_timeout() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("lossy", "clean")
        for gap in (24.0, 24.0):
            await world.after(gap)
            await world.heartbeat("lossy")
        await world.after(40.5)  # 3 x 24 s would be 72 s; the cap is 40 s
        assert world.timed_out() == ["lossy"]

    scenario(ManualClock(start=100.0), body, max_liveness_timeout_s=40.0)


def test_an_open_upload_stream_is_a_sign_of_life() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("uploading", "clean")
        data = pack(np.full(SIZE, 1.0, np.float32), get_codec("fp32")).data
        pieces = [data[:4], data[4:8], data[8:]]
        # no heartbeat at all: a lossy uplink takes a minute to carry each further chunk
        upload_id = await world.upload("uploading", pieces, between_s=60.0)
        # ("clean" holds a task and moves no bytes for two minutes: a stalled task, released)
        assert "uploading" not in world.timed_out()
        await world.commit("uploading", upload_id)

    scenario(ManualClock(start=100.0), body)


def test_an_open_download_stream_is_a_sign_of_life_until_it_ends() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("downloading", "clean")
        stream = cast(AsyncGenerator[DataChunk, None], world.service.download(DownloadRequest(
            world.ids["downloading"], world.tasks["downloading"].task_id, max_chunk_bytes=4)))
        await anext(stream)  # the first chunk is on its way; the rest waits on the link
        await world.after(100.0)
        # ("clean" holds a task and moves no bytes: a stalled task, released; not the subject)
        assert "downloading" not in world.timed_out()
        await stream.aclose()  # the stream ends (the client cancelled, or its link died)
        await world.after(25.0)
        assert "downloading" not in world.timed_out()  # seen when its stream ended, 25 s ago
        await world.after(1.0)
        assert "downloading" in world.timed_out()

    scenario(ManualClock(start=100.0), body)


def test_a_client_silent_in_an_open_stream_is_released_at_the_longest_bound() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("stuck", "clean")
        stream = cast(AsyncGenerator[DataChunk, None], world.service.download(DownloadRequest(
            world.ids["stuck"], world.tasks["stuck"].task_id, max_chunk_bytes=4)))
        await anext(stream)
        await world.after(40.0)
        assert world.timed_out() == []
        await world.after(1.0)  # max_liveness_timeout_s: a stream does not hold a place forever
        assert world.timed_out() == ["stuck"]
        await stream.aclose()

    scenario(ManualClock(start=100.0), body, max_liveness_timeout_s=40.0)


def test_a_wait_the_client_was_told_to_take_does_not_widen_its_bound() -> None:
    async def body(world: Coordinator) -> None:
        joined = await world.service.join(JoinRequest("waiter", num_examples=10))
        world.ids["waiter"] = joined.client_id
        await world.start("a", "b")  # the cohort of two is full: "waiter" is told to wait
        await world.service.get_task(GetTaskRequest(world.ids["waiter"]))
        await world.after(100.0)  # away by choice
        await world.service.get_task(GetTaskRequest(world.ids["waiter"]))
        assert world.service.registry.gaps.samples(world.ids["waiter"]) == 0

    scenario(ManualClock(start=100.0), body, liveness_timeout_s=0)


def test_a_timed_out_client_that_delivers_counts_as_a_false_timeout() -> None:
    async def body(world: Coordinator) -> None:
        await world.start("late", "clean")
        await world.after(26.0)
        assert world.timed_out() == ["late"]
        await world.commit("late")  # it was alive after all

    world = scenario(ManualClock(start=100.0), body)
    summary = summarize(world.events.events, {})
    assert summary["client_timeouts"] == 1 and summary["false_client_timeouts"] == 1


def test_silence_bound_and_p99() -> None:
    window = GapWindow()
    assert window.p99() == 0.0
    for gap in range(1, 201):
        window.add(float(gap))
    # the last 128 gaps (73..200): nearest-rank p99 is the 127th of them
    assert window.p99() == 199.0
    assert silence_bound(0.0, 25.0, 3.0, 250.0) == 25.0
    assert silence_bound(20.0, 25.0, 3.0, 250.0) == 60.0
    assert silence_bound(200.0, 25.0, 3.0, 250.0) == 250.0


@pytest.mark.parametrize(("limits", "key"), [
    ({"liveness_gap_multiple": 0.5}, "liveness_gap_multiple"),
    ({"max_liveness_timeout_s": 10.0}, "max_liveness_timeout_s"),
    ({"liveness_timeout_s": 0, "max_liveness_timeout_s": 100.0}, "max_liveness_timeout_s"),
])
def test_settings_that_cannot_take_effect_are_refused(limits: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        LimitsConfig(liveness_timeout_s=limits.pop("liveness_timeout_s", BASE_S), **limits)
