"""Flush hooks: server-side stages around aggregation, configured by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import CoordinatorFactory, FakeClock, TowardTrainer, run_async, target_of

from fedlink.aggregate import FLUSH_HOOKS, FlushHook, FlushInfo, UpdateInfo
from fedlink.client import ClientSession
from fedlink.coordinator import CoordinatorConfig, FlushRule, RoundEngine
from fedlink.coordinator.engine import ReceivedUpdate
from fedlink.errors import ConfigError
from fedlink.messages import Finished, Task
from fedlink.metrics import EventLog


@FLUSH_HOOKS.register("test-halve-and-stop")
class HalveAndStop(FlushHook):
    """Halves every mean delta; asks to stop after ``flushes`` flushes."""

    def __init__(self, flushes: int = 1) -> None:
        self.flushes = flushes
        self.seen: list[UpdateInfo] = []
        self.done = 0

    def on_update(self, update: UpdateInfo) -> None:
        self.seen.append(update)

    def on_flush(self, mean_delta: np.ndarray, flush: FlushInfo) -> np.ndarray:
        self.done += 1
        return mean_delta * 0.5

    def stop_reason(self) -> str:
        return "budget spent" if self.done >= self.flushes else ""

    def report(self) -> dict[str, Any]:
        return {"halvings": self.done}


def _config(rounds: int, flushes: int) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=1, deadline_s=None),
                             hooks=({"name": "test-halve-and-stop", "flushes": flushes},))


def test_hook_post_processes_the_mean_and_stops_the_run(fake_clock: FakeClock) -> None:
    engine = RoundEngine(_config(rounds=5, flushes=1), np.zeros(3, np.float32), EventLog(None),
                         clock=fake_clock)
    task = engine.issue("a")
    assert isinstance(task, Task)
    update = ReceivedUpdate("a", task.task_id, 0, np.full(3, 2.0, np.float32), 4, 1, 1, 12,
                            {"train_loss": 0.5})

    acceptance = engine.submit(update)

    np.testing.assert_array_equal(engine.model, np.full(3, 1.0, np.float32))
    assert acceptance.flush is not None and acceptance.flush.hook_report["halvings"] == 1
    # beside the hook's fields, the flush guard's counts (a lone update limits nothing)
    assert {k: acceptance.flush.hook_report[k] for k in (
        "updates_clipped", "updates_downweighted", "updates_dropped")} == dict.fromkeys((
            "updates_clipped", "updates_downweighted", "updates_dropped"), 0)
    reply = engine.issue("a")
    assert isinstance(reply, Finished) and reply.reason == "budget spent"


def test_unknown_hook_or_bad_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="hooks\\[0\\]"):
        CoordinatorConfig(hooks=({"name": "no-such-hook"},))
    with pytest.raises(ConfigError, match="hooks\\[0\\]"):
        CoordinatorConfig(hooks=({"name": "test-halve-and-stop", "bogus": 1},))
    with pytest.raises(ConfigError, match="name"):
        CoordinatorConfig(hooks=({"flushes": 1},))


def test_a_run_stopped_by_a_hook_is_announced_and_clients_finish(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(_config(rounds=10, flushes=2), np.zeros(4, np.float32)) as server:
            client = ClientSession(target_of(server), TowardTrainer(np.ones(4, np.float32)))
            stats = await client.run()
            await server.wait_finished()
        assert stats.accepted == 2
        finished = server.events.of_kind("run_finished")
        assert [e["reason"] for e in finished] == ["budget spent"]
        assert [e["halvings"] for e in server.events.of_kind("flush")] == [1, 2]

    run_async(main(), timeout=30)
