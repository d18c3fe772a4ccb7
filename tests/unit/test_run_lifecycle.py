"""The run's lifecycle: one owner of its end, one ``run_finished``, and a stop rule that
ends the run on exactly the flush that met it, even when later flushes were already made."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from conftest import run_async

from fedlink.clock import ManualClock
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorService, FlushRule, LimitsConfig
from fedlink.coordinator.lifecycle import Phase, target_accuracy
from fedlink.messages import CommitRequest, Finished, GetTaskRequest, JoinRequest, Task
from fedlink.metrics import EventLog
from fedlink.wire import pack

SIZE = 4


def accuracy_of(model: np.ndarray) -> Mapping[str, float]:
    """Each update adds 1 to every weight: version v scores 0.3 v."""
    return {"accuracy": float(model[0]) * 0.3}


def service(rounds: int = 10, **kwargs: Any) -> CoordinatorService:
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LimitsConfig(long_poll_s=0.0))
    return CoordinatorService(config, np.zeros(SIZE, np.float32), EventLog(None),
                              clock=ManualClock(), **kwargs)


async def one_round(svc: CoordinatorService, client_id: str) -> None:
    task = await svc.get_task(GetTaskRequest(client_id))
    assert isinstance(task, Task)
    payload = pack(np.ones(SIZE, np.float32), get_codec("fp32"))
    await svc.commit(CommitRequest(client_id, f"up-{task.task_id}", task.task_id,
                                   task.model_version, 10, 1, 1, payload.header,
                                   update_data=payload.data))


def test_a_target_ends_the_run_on_the_flush_that_reached_it() -> None:
    svc = service(evaluator=accuracy_of, stop_rules=[target_accuracy(0.6)])

    async def scenario() -> None:
        client = (await svc.join(JoinRequest("a", num_examples=10))).client_id
        for _ in range(3):  # versions 1, 2, 3 are made before any is evaluated
            await one_round(svc, client)
        assert svc.engine.version == 3
        reporter = asyncio.create_task(svc.report_flushes())
        await asyncio.wait_for(svc.lifecycle.finished.wait(), 10)
        reporter.cancel()
        assert isinstance(await svc.get_task(GetTaskRequest(client)), Finished)

    run_async(scenario())
    flushes = svc.events.of_kind("flush")
    reached = [f["accuracy"] >= 0.6 for f in flushes]
    assert reached == [False, True]  # the last flush is the first to reach the target
    (finished,) = svc.events.of_kind("run_finished")
    assert finished["model_version"] == 2
    assert finished["reason"] == "reached the target accuracy 0.6"
    np.testing.assert_array_equal(svc.lifecycle.final_model, np.full(SIZE, 2.0))
    assert svc.lifecycle.phase is Phase.FINISHING
    svc.lifecycle.close()
    assert svc.lifecycle.phase is Phase.FINISHED
    svc.close()


@pytest.mark.parametrize("how", ["rounds", "end", "end twice"])
def test_run_finished_is_emitted_once_whatever_ends_the_run(how: str) -> None:
    svc = service(rounds=1 if how == "rounds" else 10)

    async def scenario() -> None:
        svc.lifecycle.begin(port=0)
        assert svc.lifecycle.phase is Phase.RUNNING
        reporter = asyncio.create_task(svc.report_flushes())
        client = (await svc.join(JoinRequest("a", num_examples=10))).client_id
        await one_round(svc, client)
        if how != "rounds":
            await asyncio.wait_for(_reported(svc, 1), 10)
            for _ in range({"end": 1, "end twice": 2}[how]):
                svc.lifecycle.end("operator's stop")
        await asyncio.wait_for(svc.lifecycle.finished.wait(), 10)
        reporter.cancel()

    run_async(scenario())
    (finished,) = svc.events.of_kind("run_finished")
    assert finished["model_version"] == 1
    assert finished["reason"] == ("completed 1 rounds" if how == "rounds" else "operator's stop")
    assert len(svc.events.of_kind("run_started")) == 1
    svc.close()


async def _reported(svc: CoordinatorService, flushes: int) -> None:
    while len(svc.events.of_kind("flush")) < flushes:
        await asyncio.sleep(0)
