"""A coordinator on a ``state_dir`` restarts where it stopped: nothing acknowledged is lost,
nothing is counted twice, and the model it goes on to make is the one it would have made."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_async

from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorService, FlushRule
from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.state import SqliteStore
from fedlink.coordinator.state.base import Checkpoint
from fedlink.coordinator.state.checkpoint import (
    read_checkpoint,
    saved_versions,
    write_checkpoint,
)
from fedlink.errors import ConfigError, UpdateRefused
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    GetTaskRequest,
    JoinRequest,
    Task,
    UploadChunk,
)
from fedlink.metrics import EventLog
from fedlink.refusals import RefusalCode
from fedlink.wire import pack

SIZE = 6


def config(state_dir: Path | str, **fields: Any) -> CoordinatorConfig:
    rule = FlushRule(goal=2, over_selection=1.5, max_staleness=1, deadline_s=None)
    base: dict[str, Any] = {"rounds": 4, "flush": rule, "state_dir": str(state_dir)}
    base.update(fields)
    return CoordinatorConfig(**base)


class Coordinator:
    """One coordinator process, driven through its call handlers (no gRPC needed here)."""

    def __init__(self, cfg: CoordinatorConfig, faults: FaultPlan = NO_FAULTS) -> None:
        self.events = EventLog(None)
        self.service = CoordinatorService(cfg, np.zeros(SIZE, np.float32), self.events,
                                          faults=faults)

    def join(self, name: str) -> str:
        return run_async(self.service.join(JoinRequest(name, num_examples=10))).client_id

    def task(self, client_id: str) -> Task:
        reply = run_async(self.service.get_task(GetTaskRequest(client_id)))
        assert isinstance(reply, Task), reply
        return reply

    def deliver(self, client_id: str, task: Task, delta: np.ndarray,
                upload_id: str = "", steps: tuple[int, int] = (1, 1)) -> CommitReply:
        payload = pack(delta, get_codec("fp32"))
        upload_id = upload_id or f"up-{task.task_id}"

        async def stream():  # type: ignore[no-untyped-def]
            yield UploadChunk(client_id, upload_id, 0, payload.data)

        run_async(self.service.upload(stream()))
        return run_async(self.service.commit(CommitRequest(
            client_id, upload_id, task.task_id, task.model_version, 10, *steps, payload.header)))

    def crash(self) -> None:
        """What SIGKILL leaves: every durable byte, nothing else (no orderly close)."""
        self.service.state.close()


def delta(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=SIZE).astype(np.float32)


def uninterrupted(cfg: CoordinatorConfig, deltas: list[np.ndarray]) -> np.ndarray:
    """The model one process makes from ``deltas`` delivered by clients a, b, a, b, ..."""
    coordinator = Coordinator(dataclasses.replace(cfg, state_dir=""))
    ids = [coordinator.join("a"), coordinator.join("b")]
    for i, d in enumerate(deltas):
        who = ids[i % 2]
        coordinator.deliver(who, coordinator.task(who), d)
    return coordinator.service.engine.model.copy()


def test_a_restart_keeps_accepted_updates_clients_and_tasks(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = Coordinator(cfg)
    a, b = first.join("a"), first.join("b")
    task_a, task_b = first.task(a), first.task(b)
    first.deliver(a, task_a, delta(1))  # accepted, not yet flushed (goal 2)
    first.crash()

    second = Coordinator(cfg)
    assert second.service.engine.version == 0
    assert second.service.registry.ids() == {a, b}
    second.deliver(b, task_b, delta(2))  # the task issued before the crash is still valid
    assert second.service.engine.version == 1
    np.testing.assert_array_equal(second.service.engine.model,
                                  uninterrupted(cfg, [delta(1), delta(2)]))


def test_a_repeated_commit_after_a_restart_gets_the_same_answer_and_counts_once(
        tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = Coordinator(cfg)
    a = first.join("a")
    task = first.task(a)
    answer = first.deliver(a, task, delta(1), upload_id="up-x")
    first.crash()

    second = Coordinator(cfg)
    payload = pack(delta(1), get_codec("fp32"))
    again = run_async(second.service.commit(CommitRequest(
        a, "up-x", task.task_id, 0, 10, 1, 1, payload.header)))
    assert again == answer
    assert second.service.engine._accumulator.count == 1


def test_a_refusal_is_remembered_across_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = Coordinator(cfg)
    a = first.join("a")
    task = first.task(a)
    first.deliver(a, task, delta(1), upload_id="up-1")
    with pytest.raises(UpdateRefused, match="already has an accepted update") as refused:
        first.deliver(a, task, delta(2), upload_id="up-2")
    assert refused.value.reason is RefusalCode.ALREADY_ACCEPTED
    first.crash()
    second = Coordinator(cfg)
    payload = pack(delta(2), get_codec("fp32"))
    with pytest.raises(UpdateRefused, match="already has an accepted update") as again:
        run_async(second.service.commit(CommitRequest(
            a, "up-2", task.task_id, 0, 10, 1, 1, payload.header)))
    assert again.value.reason is RefusalCode.ALREADY_ACCEPTED  # the code is remembered too


@pytest.mark.parametrize("flush", [FlushRule(goal=2, min_updates=2, deadline_s=None),
                                   FlushRule.from_preset("async", goal=2)])
def test_a_refused_answer_still_counts_towards_the_goal_after_a_restart(
        tmp_path: Path, flush: FlushRule) -> None:
    """An update with no work answers for its place; a restart must not forget it, or the
    round (or the buffer) would wait for one answer more."""
    cfg = config(tmp_path, flush=flush)
    first = Coordinator(cfg)
    a, b = first.join("a"), first.join("b")
    task_a, task_b = first.task(a), first.task(b)
    with pytest.raises(UpdateRefused) as refused:
        first.deliver(a, task_a, delta(1), steps=(0, 5))
    assert refused.value.reason is RefusalCode.NO_WORK
    first.crash()
    second = Coordinator(cfg)
    assert second.deliver(b, task_b, delta(2)).flushed_version == 1


@pytest.mark.parametrize("optimizer,options", [("fedadam", {"lr": 0.05}),
                                                ("fedavgm", {"momentum": 0.9})])
def test_server_optimizer_state_survives_restarts(tmp_path: Path, optimizer: str,
                                                  options: dict[str, Any]) -> None:
    cfg = config(tmp_path, server_optimizer=optimizer, server_optimizer_options=options)
    deltas = [delta(i) for i in range(8)]
    ids: list[str] = []
    for i, d in enumerate(deltas):  # a new process for every single update
        coordinator = Coordinator(cfg)
        if not ids:
            ids = [coordinator.join("a"), coordinator.join("b")]
        who = ids[i % 2]
        coordinator.deliver(who, coordinator.task(who), d)
        coordinator.crash()
    final = Coordinator(cfg).service.engine
    assert final.version == 4 and final.finished
    np.testing.assert_array_equal(final.model, uninterrupted(cfg, deltas))


def test_dp_noise_after_a_restart_is_the_noise_an_uninterrupted_run_adds(
        tmp_path: Path) -> None:
    hooks = ({"name": "dp_fedavg", "clip_norm": 1.0, "noise_multiplier": 0.5,
              "population": 10, "cohort": 3, "seed": 3},)
    cfg = config(tmp_path, hooks=hooks)
    deltas = [delta(i) for i in range(4)]
    ids: list[str] = []
    for i, d in enumerate(deltas):
        coordinator = Coordinator(cfg)
        if not ids:
            ids = [coordinator.join("a"), coordinator.join("b")]
        coordinator.deliver(ids[i % 2], coordinator.task(ids[i % 2]), d)
        coordinator.crash()
    np.testing.assert_array_equal(Coordinator(cfg).service.engine.model,
                                  uninterrupted(cfg, deltas))


def test_a_checkpoint_whose_flush_never_committed_is_discarded(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = Coordinator(cfg)
    a = first.join("a")
    first.deliver(a, first.task(a), delta(1))
    first.crash()
    # A flush that wrote its checkpoint and died before its batch committed:
    write_checkpoint(tmp_path / "checkpoints", Checkpoint(1, np.full(SIZE, 9, np.float32),
                                                          {"optimizer": {}, "hooks": []}))
    second = Coordinator(cfg)
    assert second.service.engine.version == 0
    assert saved_versions(tmp_path / "checkpoints") == [0]
    assert second.service.engine._accumulator.count == 1


def test_old_checkpoints_are_deleted_once_no_client_can_need_them(tmp_path: Path) -> None:
    cfg = config(tmp_path, rounds=10)
    coordinator = Coordinator(cfg)
    a, b = coordinator.join("a"), coordinator.join("b")
    for i in range(5):
        coordinator.deliver(a, coordinator.task(a), delta(i))
        coordinator.deliver(b, coordinator.task(b), delta(i + 10))
    kept = saved_versions(tmp_path / "checkpoints")
    assert kept[-1] == 5 and len(kept) <= 1 + cfg.limits.delta_history
    np.testing.assert_array_equal(read_checkpoint(tmp_path / "checkpoints", 5).model,
                                  coordinator.service.engine.model)


def test_a_finished_run_stays_finished_but_a_signal_stop_does_not(tmp_path: Path) -> None:
    stopped = Coordinator(config(tmp_path / "stopped"))
    stopped.service.engine.finish("stopped by signal", durable=False)
    stopped.crash()
    assert not Coordinator(config(tmp_path / "stopped")).service.engine.finished

    ended = Coordinator(config(tmp_path / "ended"))
    run_async(_end(ended.service))
    ended.crash()
    assert Coordinator(config(tmp_path / "ended")).service.engine.finished_reason == "enough"


async def _end(service: CoordinatorService) -> None:
    service.lifecycle.end("enough")


def test_a_state_dir_of_another_model_is_refused(tmp_path: Path) -> None:
    Coordinator(config(tmp_path)).crash()
    with pytest.raises(ConfigError, match="holds a run of a model with 6 parameters"):
        CoordinatorService(config(tmp_path), np.zeros(SIZE + 1, np.float32), EventLog(None))


def test_events_of_an_update_are_written_only_once_it_is_durable(tmp_path: Path) -> None:
    coordinator = Coordinator(config(tmp_path))
    a = coordinator.join("a")
    task = coordinator.task(a)
    seen_in_db: list[int] = []
    service = coordinator.service
    emit = coordinator.events._record

    def record(event: dict[str, Any]) -> None:
        if event["kind"] == "update_accepted":
            with sqlite3.connect(tmp_path / "state.sqlite") as db:
                seen_in_db.append(db.execute("SELECT COUNT(*) FROM pending").fetchone()[0])
        emit(event)

    coordinator.events._record = record  # type: ignore[method-assign]
    coordinator.deliver(a, task, delta(1))
    assert seen_in_db == [1]  # the update was durable before its event was written
    assert isinstance(service.state, SqliteStore)


class Killed(BaseException):
    """Stands in for SIGKILL at a crash point: nothing after it runs."""


class KillBeforeCommit(FaultPlan):
    """Dies (``Killed``) at every batch commit once armed."""

    armed = False

    def reached(self, moment: str) -> None:
        if self.armed and moment == "batch.before_commit":
            raise Killed


def test_an_upload_whose_commit_was_not_durable_can_be_committed_after_a_restart(
        tmp_path: Path) -> None:
    cfg = config(tmp_path)
    faults = KillBeforeCommit()
    first = Coordinator(cfg, faults)
    a = first.join("a")
    task = first.task(a)

    faults.armed = True
    with pytest.raises(Killed):
        first.deliver(a, task, delta(1), upload_id="up-1")  # folded in, never durable
    first.crash()

    second = Coordinator(cfg)
    assert second.service.engine._accumulator.count == 0
    payload = pack(delta(1), get_codec("fp32"))
    reply = run_async(second.service.commit(CommitRequest(  # the spool kept its bytes
        a, "up-1", task.task_id, 0, 10, 1, 1, payload.header)))
    assert reply.model_version == 0
    assert second.service.engine._accumulator.count == 1
