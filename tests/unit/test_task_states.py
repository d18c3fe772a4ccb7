"""A task's state machine: the legal moves, what each state means to the engine, versions
read from data, and a schema-1 state folder (four flags a task) carried over."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import FakeClock

from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.records import ReceivedUpdate
from fedlink.coordinator.state import SqliteStore
from fedlink.coordinator.tasks import TRANSITIONS, IllegalTransition, TaskIds, TaskState
from fedlink.errors import NotFound, UpdateRefused
from fedlink.messages import Task, Wait
from fedlink.metrics import EventLog

DIM = 3


def engine(clock: FakeClock, **rule: object) -> RoundEngine:
    config = CoordinatorConfig(rounds=5, flush=FlushRule(**rule))  # type: ignore[arg-type]
    return RoundEngine(config, np.zeros(DIM, np.float32), EventLog(None), clock=clock)


def deliver(eng: RoundEngine, client: str, task: Task) -> None:
    eng.submit(ReceivedUpdate(client, task.task_id, task.model_version,
                              np.ones(DIM, np.float32), 10, 1, 1, 12))


def test_only_the_written_moves_are_legal() -> None:
    from fedlink.coordinator.records import TaskRecord

    for start, ends in TRANSITIONS.items():
        for to in TaskState:
            record = TaskRecord("t1-v0", "c", 0, 0.0, start)
            if to in ends:
                record.move(to)
                assert record.state is to
            else:
                with pytest.raises(IllegalTransition, match=f"{start.value} to {to.value}"):
                    record.move(to)
    ended = [s for s in TaskState if not s.deliverable and not s.evaluation]
    assert ended == [TaskState.DELIVERED, TaskState.DROPPED, TaskState.CLOSED]
    assert [s for s in TaskState if s.holds_place] == [TaskState.ISSUED]
    # an evaluation task holds no place and delivers no update, whatever its state
    assert not any(s.deliverable or s.holds_place for s in TaskState if s.evaluation)


def test_a_released_task_that_delivers_late_counts_as_its_clients_task(
        fake_clock: FakeClock) -> None:
    """Rounds give one task per client per version, a released task's included."""
    eng = engine(fake_clock, goal=2, min_updates=2, deadline_s=5.0)
    task = eng.issue("a")
    assert isinstance(task, Task)
    fake_clock.advance(6.0)
    assert eng.poll() is None  # the deadline passed below min_updates: released
    assert eng.task("a", task.task_id).state is TaskState.RELEASED
    assert eng.issue("a") == task  # its client gets its task back, not a second one
    deliver(eng, "a", task)
    assert eng.task("a", task.task_id).state is TaskState.DELIVERED
    again = eng.issue("a")
    assert isinstance(again, Wait) and "already trained on version 0" in again.reason


def test_a_forgotten_tasks_version_comes_from_the_table(fake_clock: FakeClock) -> None:
    eng = engine(fake_clock, goal=1, over_selection=2.0, deadline_s=None)
    slow = eng.issue("slow")
    assert isinstance(slow, Task)
    for _ in range(3):
        fast = eng.issue("fast")
        assert isinstance(fast, Task)
        deliver(eng, "fast", fast)
    with pytest.raises(UpdateRefused, match=f"task '{slow.task_id}' was for version 0"):
        eng.task("slow", slow.task_id)
    forged = TaskIds.make(1, 2)  # task 1 was issued for version 0: not an id it wrote
    with pytest.raises(NotFound, match="unknown task id"):
        eng.task("slow", forged)


def test_task_ids_read_only_what_they_wrote() -> None:
    ids = TaskIds()
    for number, version in ((1, 0), (2, 0), (3, 1)):
        ids.issued(number, version)
    assert [ids.version_of(TaskIds.make(n, v)) for n, v in ((1, 0), (2, 0), (3, 1))] == [0, 0, 1]
    for junk in ("t3-v0", "t-v0", "x3-v1", "t\uff13-v1", "t0-v0", "3"):
        assert ids.version_of(junk) is None
    restored = TaskIds.restored([("t9-v4", 4), ("t7-v3", 3)])
    assert restored.version_of("t9-v4") == 4 and restored.first_version == 3
    assert restored.predates("t2-v1") and not restored.predates("t7-v3")


def test_a_schema_1_state_folder_keeps_its_tasks(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "state.sqlite")
    db.execute("CREATE TABLE tasks (task_id TEXT PRIMARY KEY, client_id TEXT NOT NULL, "
               "version INTEGER NOT NULL, done INTEGER NOT NULL, expired INTEGER NOT NULL, "
               "delta_base INTEGER NOT NULL, holds_issue INTEGER NOT NULL, "
               "dropped INTEGER NOT NULL)")
    flags = {"t1-v0": (0, 0, 1, 0), "t2-v0": (0, 1, 0, 0), "t3-v0": (0, 1, 1, 0),
             "t4-v0": (1, 0, 1, 0), "t5-v0": (1, 0, 1, 1)}
    db.executemany("INSERT INTO tasks VALUES (?, 'c', 0, ?, ?, -1, ?, ?)",
                   [(tid, *f) for tid, f in flags.items()])
    db.commit()
    db.close()
    store = SqliteStore(tmp_path)
    states = {t.task_id: t.state for t in store._load_tasks()}
    store.close()
    assert states == {"t1-v0": TaskState.ISSUED, "t2-v0": TaskState.RELEASED,
                      "t3-v0": TaskState.OVERDUE, "t4-v0": TaskState.DELIVERED,
                      "t5-v0": TaskState.DROPPED}
