"""Liveness: a task whose client went silent is released to another client, on a fake clock."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.coordinator.registry import ClientRegistry
from fedlink.errors import ConfigError
from fedlink.messages import Task, Wait
from fedlink.metrics import EventLog

DIM = 4
X0 = np.zeros(DIM, dtype=np.float32)
TIMEOUT = 10.0


class World:
    """An engine and a registry on one fake clock, the way the service wires them."""

    def __init__(self, clock: FakeClock, timeout: float | None = TIMEOUT, **flush: object):
        rule = FlushRule(**{"goal": 1, "deadline_s": None, **flush})  # type: ignore[arg-type]
        limits = LimitsConfig(heartbeat_interval_s=2.0, long_poll_s=3.0,
                              liveness_timeout_s=timeout, max_task_s=0)
        config = CoordinatorConfig(rounds=5, flush=rule, limits=limits)
        self.clock = clock
        self.engine = RoundEngine(config, X0.copy(), EventLog(None), clock=clock)
        self.registry = ClientRegistry(clock=clock)
        self.ids: dict[str, str] = {}

    def join(self, name: str) -> str:
        self.ids[name] = self.registry.join(name, 10, {}).client_id
        return self.ids[name]

    def get_task(self, name: str) -> Task | Wait:
        self.registry.touch(self.ids[name])
        reply = self.engine.issue(self.ids[name])
        assert isinstance(reply, Task | Wait), reply
        return reply

    def heartbeat(self, name: str) -> None:
        self.registry.touch(self.ids[name])

    def check(self) -> list[str]:
        released = self.engine.release_silent(self.registry.last_seen)
        return [r.client_id for r in released]

    def deliver(self, name: str, task: Task, value: float) -> None:
        self.registry.touch(self.ids[name])
        self.engine.submit(ReceivedUpdate(
            client_id=self.ids[name], task_id=task.task_id, base_version=task.model_version,
            delta=np.full(DIM, value, np.float32), num_examples=10, steps_completed=1,
            steps_planned=1, bytes_up=4 * DIM))

    def timeouts(self) -> list[dict[str, object]]:
        return self.engine.events.of_kind("client_timeout")


def test_silent_client_is_released_and_its_place_goes_to_a_waiting_one(
        fake_clock: FakeClock) -> None:
    world = World(fake_clock)
    world.join("dead"), world.join("waiting")
    task = world.get_task("dead")
    assert isinstance(task, Task)
    assert isinstance(world.get_task("waiting"), Wait)  # cohort of 1 is full

    fake_clock.advance(TIMEOUT)
    assert world.check() == []  # exactly the timeout is not yet "longer than"
    world.heartbeat("waiting")  # a waiting client's calls do not keep the silent one alive
    fake_clock.advance(0.5)
    assert world.check() == [world.ids["dead"]]
    (event,) = world.timeouts()
    assert event["client_id"] == world.ids["dead"] and event["task_id"] == task.task_id
    assert event["reason"] == "no heartbeat for 10.5 s"

    fresh = world.get_task("waiting")
    assert isinstance(fresh, Task) and fresh.model_version == 0
    assert world.check() == []  # released once only


def test_heartbeats_keep_a_slow_client_its_place(fake_clock: FakeClock) -> None:
    world = World(fake_clock)
    world.join("slow"), world.join("waiting")
    task = world.get_task("slow")
    assert isinstance(task, Task)
    for _ in range(10):  # 40 s of training, well past the timeout, heartbeating every 4 s
        fake_clock.advance(4.0)
        world.heartbeat("slow")
        assert world.check() == []
    assert isinstance(world.get_task("waiting"), Wait)
    world.deliver("slow", task, 1.0)
    assert world.engine.version == 1 and world.timeouts() == []


def test_released_task_may_still_deliver(fake_clock: FakeClock) -> None:
    world = World(fake_clock, goal=2)
    for name in ("a", "b", "c"):
        world.join(name)
    task_a = world.get_task("a")
    task_b = world.get_task("b")
    assert isinstance(task_a, Task) and isinstance(task_b, Task)
    fake_clock.advance(TIMEOUT + 1)
    world.heartbeat("b")
    assert world.check() == [world.ids["a"]]
    task_c = world.get_task("c")
    assert isinstance(task_c, Task)
    # "a" was only slow: its update still counts (same version, within staleness)
    world.deliver("a", task_a, 1.0)
    world.deliver("c", task_c, 1.5)  # within the flush guard's norm bound (2x the lower median)
    assert world.engine.version == 1
    np.testing.assert_allclose(world.engine.model, np.full(DIM, 1.25))


def test_a_client_that_is_gone_is_released(fake_clock: FakeClock) -> None:
    world = World(fake_clock)
    world.join("a")
    assert isinstance(world.get_task("a"), Task)
    world.registry.remove(world.ids["a"])
    assert world.check() == [world.ids["a"]]
    assert world.timeouts()[0]["reason"] == "the client is no longer registered"


def test_zero_disables_the_check(fake_clock: FakeClock) -> None:
    world = World(fake_clock, timeout=0)
    world.join("a")
    assert isinstance(world.get_task("a"), Task)
    fake_clock.advance(1e6)
    assert world.check() == []


def test_deadline_and_liveness_share_one_release(fake_clock: FakeClock) -> None:
    """A task released by one rule is not released again by the other."""
    world = World(fake_clock, goal=2, min_updates=2, deadline_s=5.0)
    world.join("a"), world.join("b")
    assert isinstance(world.get_task("a"), Task)
    fake_clock.advance(5.5)
    assert world.engine.poll() is None  # deadline, below min: released
    fake_clock.advance(TIMEOUT)
    assert world.check() == []
    reasons = [e["reason"] for e in world.timeouts()]
    assert reasons == ["deadline passed with 0 of min_updates 2 updates in"]


def test_default_timeout_and_validation() -> None:
    limits = LimitsConfig(heartbeat_interval_s=5.0, long_poll_s=10.0)
    assert limits.liveness_timeout == pytest.approx(25.0)
    assert LimitsConfig(liveness_timeout_s=0).liveness_timeout is None
    assert LimitsConfig(liveness_timeout_s=7.5).liveness_timeout == 7.5
    with pytest.raises(ConfigError, match="liveness_timeout_s"):
        LimitsConfig(heartbeat_interval_s=5.0, liveness_timeout_s=4.0)
    with pytest.raises(ConfigError, match="liveness_timeout_s"):
        LimitsConfig(liveness_timeout_s=-1.0)
    parsed = CoordinatorConfig.from_dict({"limits": {"liveness_timeout_s": 30}})
    assert parsed.limits.liveness_timeout == 30
