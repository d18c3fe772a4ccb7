"""The client side runs on one clock: the session's deadlines, heartbeats and waits, the
trainer's deadline check and simulated stragglers all follow an injected ``fedlink.clock``
clock, so a manual clock drives them with no real sleeping."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, target_of, wait_until

from fedlink.client import ClientOptions, ClientSession, TrainPlan, TrainResult, Transport
from fedlink.clock import ManualClock, sleep_on
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.messages import HeartbeatReply, HeartbeatRequest
from fedlink.sim.stragglers import SlowedTrainer

START = 1e9
"""Where the manual clocks start: far from any ``time.monotonic()`` reading."""


def test_sleep_on_a_manual_clock_wakes_when_its_time_is_reached() -> None:
    clock = ManualClock(start=10.0)

    async def scenario() -> None:
        sleeper = asyncio.create_task(sleep_on(clock, 5.0))
        await asyncio.sleep(0)  # let it schedule its wake-up
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not sleeper.done()
        clock.advance(0.1)
        await asyncio.wait_for(sleeper, 5)
        assert clock.now() == pytest.approx(15.0)
        assert clock.next_time() is None  # nothing left behind

    run_async(scenario())


def test_a_cancelled_sleep_withdraws_its_wake_up() -> None:
    clock = ManualClock()

    async def scenario() -> None:
        sleeper = asyncio.create_task(sleep_on(clock, 60.0))
        await asyncio.sleep(0)
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert clock.next_time() is None

    run_async(scenario())


class _Working:
    """Moves a manual clock on by ``seconds`` while it "trains"."""

    def __init__(self, clock: ManualClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def num_examples(self) -> int:
        return 1

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        self.clock.advance(self.seconds)
        return TrainResult(params, 1, 1, 1)


def test_a_straggler_waits_on_its_clock() -> None:
    clock = ManualClock(start=0.0)
    SlowedTrainer(_Working(clock, 2.0), speed=3.0, clock=clock).train(
        np.zeros(2, np.float32), TrainPlan())
    assert clock.now() == pytest.approx(6.0)  # 2 s of work, then (3 - 1) x 2 s more


def _config(heartbeat_interval_s: float = 5.0) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=1, flush=FlushRule(goal=1, deadline_s=30.0),
                             limits=LimitsConfig(long_poll_s=1.0, retry_after_s=0.05,
                                                 heartbeat_interval_s=heartbeat_interval_s,
                                                 client_ttl_s=0))


def test_the_train_plan_deadline_is_on_the_session_clock(
        coordinator: CoordinatorFactory) -> None:
    clock = ManualClock(start=START)
    plans: list[TrainPlan] = []

    class Recording(TowardTrainer):
        def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
            plans.append(plan)
            return super().train(params, plan)

    async def waits(seconds: float) -> None:  # "come back later" passes in model time
        clock.advance(seconds)
        await asyncio.sleep(0)

    async def scenario() -> None:
        async with coordinator(_config(), np.zeros(4, np.float32)) as server:
            session = ClientSession(target_of(server), Recording(np.ones(4, np.float32)),
                                    ClientOptions(name="dev"), sleep=waits, clock=clock)
            await asyncio.wait_for(session.run(), 20)

    run_async(scenario())
    (plan,) = plans
    assert plan.deadline is not None
    assert START < plan.deadline <= START + 30.0  # the task's deadline, on the manual clock


def test_heartbeats_sleep_on_the_session_clock(coordinator: CoordinatorFactory,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    clock = ManualClock(start=START)
    beats: list[float] = []
    training = threading.Event()
    release = threading.Event()
    real_heartbeat = Transport.heartbeat

    async def heartbeat(self: Transport, request: HeartbeatRequest) -> HeartbeatReply:
        beats.append(clock.now())
        return await real_heartbeat(self, request)

    monkeypatch.setattr(Transport, "heartbeat", heartbeat)

    def hold(_: int) -> None:  # in the training thread: wait until the test saw a heartbeat
        training.set()
        assert release.wait(20), "the test never released training"

    async def scenario() -> None:
        # an hour between heartbeats: in real time none would come during the test
        async with coordinator(_config(heartbeat_interval_s=3600.0),
                               np.zeros(4, np.float32)) as server:
            trainer = TowardTrainer(np.ones(4, np.float32), before_train=hold)
            session = ClientSession(target_of(server), trainer, ClientOptions(name="dev"),
                                    clock=clock)
            running = asyncio.create_task(session.run())
            try:
                await wait_until(training.is_set, what="training started")
                # the heartbeat task may take its first step only after training started (an
                # inline download leaves the loop no turn between the two): move the clock
                # once its wake-up is scheduled, or it would sleep from the advanced time
                await wait_until(lambda: clock.next_time() is not None,
                                 what="the heartbeat's wake-up")
                assert clock.next_time() == START + 3600.0
                assert beats == []
                clock.advance(3600.0)
                await wait_until(lambda: len(beats) == 1, what="a heartbeat")
                assert beats == [START + 3600.0]
            finally:
                release.set()
            await asyncio.wait_for(running, 20)

    run_async(scenario())
