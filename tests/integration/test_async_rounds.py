"""Asynchronous (FedBuff) rounds over real gRPC: a continuous stream of tasks on the latest
model, stale updates counted with their staleness weight, too-stale ones refused with a reason.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import (
    CoordinatorFactory,
    TowardTrainer,
    block_until,
    gather_bounded,
    run_async,
    target_of,
)

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig

pytestmark = pytest.mark.timeout(60)

DIM = 16
X0 = np.zeros(DIM, np.float32)
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)


def test_fedbuff_stream_with_stale_and_too_stale_clients(coordinator: CoordinatorFactory) -> None:
    rounds, goal = 20, 2
    config = CoordinatorConfig(
        rounds=rounds,
        flush=FlushRule.from_preset("async", goal=goal, over_selection=2.0, max_staleness=3),
        staleness_weight="polynomial", staleness_weight_options={"a": 1.0},
        limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05))
    rng = np.random.default_rng(3)
    targets = [rng.normal(size=DIM).astype(np.float32) for _ in range(4)]
    holder: dict[str, CoordinatorServer] = {}

    def version() -> int:
        return holder["server"].service.engine.version

    def issued() -> int:
        return len(holder["server"].events.of_kind("task_issued"))

    def gate(first: object) -> object:
        """Hold the first task until ``first()`` holds (later tasks run at once)."""
        return lambda call: block_until(first, 20) if call == 0 else None  # type: ignore[operator]

    trainers = [
        TowardTrainer(targets[0], before_train=gate(lambda: issued() >= 4)),  # type: ignore[arg-type]
        TowardTrainer(targets[1], before_train=gate(lambda: issued() >= 4)),  # type: ignore[arg-type]
        TowardTrainer(targets[2], before_train=gate(lambda: version() >= 1)),  # type: ignore[arg-type]
        TowardTrainer(targets[3], before_train=gate(lambda: version() >= 5)),  # type: ignore[arg-type]
    ]

    async def scenario() -> list[ClientSession]:
        async with coordinator(config, X0) as server:
            holder["server"] = server
            sessions = [ClientSession(target_of(server), t,
                                      ClientOptions(name=n, retry=FAST_RETRY))
                        for n, t in zip(("fast0", "fast1", "mid", "slow"), trainers,
                                        strict=True)]
            await gather_bounded(*(s.run() for s in sessions), timeout=40)
            await asyncio.wait_for(server.wait_finished(), 10)
        return sessions

    sessions = run_async(scenario(), timeout=50)
    server = holder["server"]
    accepted = server.events.of_kind("update_accepted")
    flushes = server.events.of_kind("flush")
    assert server.service.engine.version == rounds
    assert [f["num_updates"] for f in flushes] == [goal] * rounds
    assert len(accepted) == rounds * goal
    # the first four tasks were all on version 0: cohort = ceil(2 x 2.0) tasks in flight
    first_four = server.events.of_kind("task_issued")[:4]
    assert {e["model_version"] for e in first_four} == {0}
    # the mid client's first update arrived after a flush: accepted, stale, discounted
    mid_id = sessions[2].client_id
    mid_first = next(e for e in accepted if e["client_id"] == mid_id)
    assert 1 <= mid_first["staleness"] <= 3
    assert mid_first["weight"] == pytest.approx(10 / (1 + mid_first["staleness"]))
    # the slow client's first update was more than max_staleness versions old: refused, and
    # the client logged why, then took a fresh task on the latest model
    slow = sessions[3]
    assert slow.stats.refused >= 1
    assert any("too stale" in reason for reason in slow.stats.refusals), slow.stats.refusals
    assert slow.stats.tasks >= 2
    # fast clients kept training: more tasks than flushes between them
    assert sum(s.stats.tasks for s in sessions[:2]) > rounds
