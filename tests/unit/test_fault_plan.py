"""Faults come from an object a test passes in: the coordinator tells its ``FaultPlan`` every
named moment it passes, and nothing in the environment makes it kill itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import run_async

from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorService, FlushRule
from fedlink.coordinator.faults import MOMENTS, NO_FAULTS, FaultPlan
from fedlink.messages import CommitRequest, GetTaskRequest, JoinRequest, Task
from fedlink.metrics import EventLog
from fedlink.wire import pack

SIZE = 4


class Recorder(FaultPlan):
    """Notes every moment reached."""

    def __init__(self) -> None:
        self.moments: list[str] = []

    def reached(self, moment: str) -> None:
        self.moments.append(moment)


def one_flush(tmp_path: Path, faults: FaultPlan = NO_FAULTS) -> CoordinatorService:
    config = CoordinatorConfig(rounds=2, flush=FlushRule(goal=1, deadline_s=None),
                               state_dir=str(tmp_path / "state"))
    svc = CoordinatorService(config, np.zeros(SIZE, np.float32), EventLog(None),
                             faults=faults)

    async def scenario() -> None:
        client = (await svc.join(JoinRequest("a", num_examples=10))).client_id
        task = await svc.get_task(GetTaskRequest(client))
        assert isinstance(task, Task)
        payload = pack(np.ones(SIZE, np.float32), get_codec("fp32"))
        await svc.commit(CommitRequest(client, "up-1", task.task_id, 0, 10, 1, 1,
                                       payload.header, update_data=payload.data))

    run_async(scenario())
    return svc


def test_the_plan_hears_every_moment_of_a_commit_and_its_flush(tmp_path: Path) -> None:
    plan = Recorder()
    svc = one_flush(tmp_path, plan)
    assert svc.engine.version == 1
    svc.close()
    assert set(plan.moments) == set(MOMENTS)
    accept = plan.moments.index("commit.before_accept")
    assert plan.moments[accept:accept + 3] == ["commit.before_accept", "flush.before_checkpoint",
                                               "flush.after_checkpoint"]


def test_no_environment_variable_makes_the_coordinator_kill_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLINK_CRASH_AT", "commit.before_accept")  # the old switch
    svc = one_flush(tmp_path)  # this test process would die here if it were obeyed
    assert svc.engine.version == 1
    svc.close()
