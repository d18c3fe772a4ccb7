"""Finding 5: two ids that heartbeat and never train must not hold a ``sync`` run.

They held it for ``max_task_s`` (1,800 s by default): heartbeats kept their tasks, and a task
lost its place only that long after it was issued. Now a task that shows no progress (no
bytes of its model down, none of its update up) loses its place after a bound taken from the
run itself: a few times the quiet stretch (the training) of the tasks it saw delivered, at
least the liveness timeout, and before any delivery a few liveness timeouts. A client whose
bytes are moving, however slowly, keeps its place.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.coordinator import CoordinatorConfig, LimitsConfig, RoundEngine
from fedlink.coordinator.config import FLUSH_PRESETS, FlushRule
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.coordinator.registry import ClientRegistry
from fedlink.messages import Task, Wait
from fedlink.metrics import EventLog

DIM = 4
LIVENESS = 3 * 5.0 + 10.0  # the default liveness timeout: 3 heartbeats + a long poll


class Sync:
    """A ``sync`` run of cohort 2 with default limits, on a fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        rule = FlushRule(**FLUSH_PRESETS.create("sync").fields(goal=2))
        self.clock = clock
        self.engine = RoundEngine(CoordinatorConfig(rounds=10, flush=rule, limits=LimitsConfig()),
                                  np.zeros(DIM, np.float32), EventLog(None), clock=clock)
        self.registry = ClientRegistry(clock=clock)
        self.ids: dict[str, str] = {}

    def join(self, *names: str) -> None:
        for name in names:
            self.ids[name] = self.registry.join(name, 10, {}).client_id

    def ask(self, name: str) -> Task | Wait:
        self.registry.touch(self.ids[name])
        reply = self.engine.issue(self.ids[name])
        assert isinstance(reply, Task | Wait), reply
        return reply

    def heartbeat(self, *names: str) -> None:
        for name in names:
            self.registry.touch(self.ids[name])

    def progress(self, name: str) -> None:
        self.registry.touch(self.ids[name])
        self.engine.progressed(self.ids[name])  # what each chunk down or up does

    def deliver(self, name: str, task: Task) -> None:
        self.registry.touch(self.ids[name])
        self.engine.submit(ReceivedUpdate(
            client_id=self.ids[name], task_id=task.task_id, base_version=task.model_version,
            delta=np.full(DIM, 0.1, np.float32), num_examples=10, steps_completed=1,
            steps_planned=1, bytes_up=4 * DIM))

    def released(self) -> set[str]:
        names = {v: k for k, v in self.ids.items()}
        return {names[r.client_id] for r in self.engine.release_silent(self.registry.last_seen)}

    def run_for(self, seconds: float, heartbeating: tuple[str, ...], step: float = 5.0) -> set[str]:
        """Let ``seconds`` pass with ``heartbeating`` clients heartbeating; who was released."""
        released: set[str] = set()
        waited = 0.0
        while waited < seconds:
            self.clock.advance(step)
            waited += step
            self.heartbeat(*heartbeating)
            released |= self.released()
        return released


def test_two_heartbeating_ids_that_never_train_lose_the_sync_round_to_honest_clients(
        fake_clock: FakeClock) -> None:
    run = Sync(fake_clock)
    run.join("liar1", "liar2", "honest1", "honest2")
    first = run.ask("liar1")
    assert isinstance(first, Task) and isinstance(run.ask("liar2"), Task)
    assert isinstance(run.ask("honest1"), Wait)  # the cohort is full
    released = run.run_for(5 * LIVENESS, heartbeating=("liar1", "liar2", "honest1", "honest2"))
    assert released == {"liar1", "liar2"}  # minutes, not max_task_s (1,800 s)
    again = run.ask("liar1")  # its old task, which holds no place now: no new one
    assert isinstance(again, Task) and again.task_id == first.task_id
    tasks = [run.ask("honest1"), run.ask("honest2")]
    for name, task in zip(("honest1", "honest2"), tasks, strict=True):
        assert isinstance(task, Task)
        run.deliver(name, task)
    assert run.engine.version == 1  # the run moved on without the liars
    (timeout, *_) = run.engine.events.of_kind("client_timeout")
    assert "no progress" in str(timeout["reason"])


def test_after_honest_rounds_a_quiet_task_gets_a_few_training_times(
        fake_clock: FakeClock) -> None:
    run = Sync(fake_clock)
    run.join("a", "b", "liar")
    for _ in range(2):  # two rounds in which training takes 10 s
        tasks = {name: run.ask(name) for name in ("a", "b")}
        fake_clock.advance(10.0)
        for name, task in tasks.items():
            assert isinstance(task, Task)
            run.progress(name)
            run.deliver(name, task)
    assert isinstance(run.ask("liar"), Task)
    assert isinstance(run.ask("a"), Task)
    assert run.run_for(LIVENESS, heartbeating=("liar", "a")) == set()  # the floor
    assert run.run_for(4 * 10.0, heartbeating=("liar", "a"), step=1.0) >= {"liar"}


def test_a_slow_client_whose_bytes_move_keeps_its_place(fake_clock: FakeClock) -> None:
    run = Sync(fake_clock)
    run.join("slow", "other")
    assert isinstance(run.ask("slow"), Task)
    for _ in range(100):  # 1,000 s of a slow download, a chunk every 10 s
        fake_clock.advance(10.0)
        run.progress("slow")
        assert run.released() == set()


@pytest.mark.parametrize("multiple", [0.0])
def test_the_quiet_bound_can_be_turned_off(fake_clock: FakeClock, multiple: float) -> None:
    limits = LimitsConfig(task_quiet_multiple=multiple)
    rule = FlushRule(**FLUSH_PRESETS.create("sync").fields(goal=1))
    engine = RoundEngine(CoordinatorConfig(flush=rule, limits=limits), np.zeros(DIM, np.float32),
                         EventLog(None), clock=fake_clock)
    registry = ClientRegistry(clock=fake_clock)
    client = registry.join("x", 10, {}).client_id
    assert isinstance(engine.issue(client), Task)
    fake_clock.advance(1000.0)
    registry.touch(client)
    assert engine.release_silent(registry.last_seen) == []
