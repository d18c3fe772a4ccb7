"""ClientSession against a real coordinator on loopback, with numpy trainers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

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

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.client import (
    ClientOptions,
    ClientSession,
    RetryPolicy,
    TrainPlan,
    TrainResult,
    Transport,
    run_client,
)
from fedlink.client.liveness import Progress
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.messages import DataChunk, DownloadRequest

pytestmark = pytest.mark.timeout(60)

DIM = 64
X0 = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)
LIMITS = LimitsConfig(chunk_bytes=100, long_poll_s=2.0, retry_after_s=0.05)


def options(name: str, **kwargs: object) -> ClientOptions:
    return ClientOptions(name=name, retry=FAST_RETRY, **kwargs)  # type: ignore[arg-type]


def fedavg(model: np.ndarray, trainers: list[TowardTrainer], rounds: int) -> np.ndarray:
    """Hand-computed synchronous FedAvg with every trainer in every round."""
    x = model.astype(np.float64)
    for _ in range(rounds):
        total = sum(t.examples for t in trainers)
        x = x + sum(t.examples * t.step(x) for t in trainers) / total
    return x


def test_clients_complete_rounds_with_fedavg_result(coordinator: CoordinatorFactory) -> None:
    rounds = 4
    # plain FedAvg: the flush guard is covered by tests/security and tests/unit/test_flush_guard.py
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=3, deadline_s=None),
                               limits=LIMITS, robust=RobustConfig(enabled=False))
    rng = np.random.default_rng(7)
    trainers = [TowardTrainer(rng.normal(size=DIM).astype(np.float32), examples=n)
                for n in (10, 25, 65)]

    async def main() -> tuple[CoordinatorServer, list[ClientSession]]:
        async with coordinator(config, X0) as server:
            sessions = [ClientSession(target_of(server), t, options(f"dev{i}"))
                        for i, t in enumerate(trainers)]
            await gather_bounded(*(s.run() for s in sessions))
            await asyncio.wait_for(server.wait_finished(), 10)
        return server, sessions

    server, sessions = run_async(main())
    payload_bytes = 4 * DIM
    for s in sessions:
        st = s.stats
        assert (st.tasks, st.accepted, st.refused, st.retries) == (rounds, rounds, 0, 0)
        assert st.refusals == []
        assert st.bytes_up == rounds * payload_bytes
        assert st.bytes_down == rounds * payload_bytes
        assert st.train_seconds == pytest.approx(rounds * 0.25)
    engine = server.service.engine
    assert engine.version == rounds and engine.finished
    np.testing.assert_allclose(engine.model, fedavg(X0, trainers, rounds), rtol=1e-5,
                               atol=1e-6)
    flushes = server.events.of_kind("flush")
    assert [f["num_updates"] for f in flushes] == [3] * rounds
    assert [f["total_weight"] for f in flushes] == [100.0] * rounds
    assert len({e["client_id"] for e in server.events.of_kind("client_left")}) == 3


def test_run_client_sync_facade(coordinator: CoordinatorFactory) -> None:
    """``run_client`` (sync) works from a thread while the coordinator runs elsewhere."""
    config = CoordinatorConfig(rounds=2, flush=FlushRule(goal=1, deadline_s=None),
                               limits=LIMITS)
    trainer = TowardTrainer(np.ones(DIM, np.float32), examples=5)

    async def main() -> CoordinatorServer:
        async with coordinator(config, X0) as server:
            stats = await asyncio.wait_for(asyncio.to_thread(
                run_client, target_of(server), trainer, options("sync")), 20)
            assert (stats.tasks, stats.accepted) == (2, 2)
            await asyncio.wait_for(server.wait_finished(), 10)
        return server

    server = run_async(main())
    np.testing.assert_allclose(server.service.engine.model, fedavg(X0, [trainer], 2),
                               rtol=1e-6)


def _three_issued(server: CoordinatorServer) -> bool:
    return len(server.events.of_kind("task_issued")) >= 3


@pytest.mark.parametrize("versions_behind", [1, 2])
def test_stale_update_is_counted_and_logged_not_raised(
        coordinator: CoordinatorFactory, caplog: pytest.LogCaptureFixture,
        versions_behind: int) -> None:
    """A slow client whose round moved on gets its update refused, and carries on."""
    rounds = versions_behind + 1
    config = CoordinatorConfig(
        rounds=rounds, flush=FlushRule(goal=2, over_selection=1.5, deadline_s=None),
        limits=LIMITS)
    server_box: list[CoordinatorServer] = []

    def fast_gate(call: int) -> None:
        server = server_box[0]
        if call == 0:  # wait until the slow client holds its version-0 task too
            block_until(lambda: _three_issued(server), 10, "three tasks")
        if call == versions_behind:  # do not end the run before the slow update arrives
            block_until(lambda: bool(server.events.of_kind("update_refused")), 10,
                        "the slow client's refusal")

    def slow_gate(call: int) -> None:
        block_until(lambda: server_box[0].service.engine.version >= versions_behind, 10,
                    f"version {versions_behind}")

    fast = [TowardTrainer(np.full(DIM, v, np.float32), examples=10, before_train=fast_gate)
            for v in (1.0, 2.0)]
    slow = TowardTrainer(np.full(DIM, 100.0, np.float32), examples=10, before_train=slow_gate)

    async def main() -> list[ClientSession]:
        async with coordinator(config, X0) as server:
            server_box.append(server)
            sessions = [ClientSession(target_of(server), t, options(f"fast{i}"))
                        for i, t in enumerate(fast)]
            sessions.append(ClientSession(target_of(server), slow,
                                          options("slow", max_tasks=1)))
            await gather_bounded(*(s.run() for s in sessions))
            await asyncio.wait_for(server.wait_finished(), 10)
        return sessions

    with caplog.at_level(logging.INFO, logger="fedlink.client.session"):
        sessions = run_async(main())
    *fast_sessions, slow_session = sessions
    assert (slow_session.stats.tasks, slow_session.stats.accepted,
            slow_session.stats.refused) == (1, 0, 1)
    (reason,) = slow_session.stats.refusals
    assert "stale" in reason
    assert any("refused" in r.getMessage() and "stale" in r.getMessage()
               for r in caplog.records)
    for s in fast_sessions:
        assert (s.stats.accepted, s.stats.refused) == (rounds, 0)
    server = server_box[0]
    assert len(server.events.of_kind("update_refused")) == 1
    # the refused update did not touch the model: only the fast clients count
    np.testing.assert_allclose(server.service.engine.model, fedavg(X0, fast, rounds),
                               rtol=1e-5)


def test_task_closed_before_download_is_refused_not_raised(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose task closes while it is still connecting drops it and carries on."""
    config = CoordinatorConfig(
        rounds=2, flush=FlushRule(goal=2, over_selection=1.5, deadline_s=None), limits=LIMITS)
    server_box: list[CoordinatorServer] = []
    delayed: list[str] = []
    original = Transport.download

    async def slow_download(self: Transport, request: DownloadRequest,
                            progress: Progress | None = None) -> AsyncIterator[DataChunk]:
        server = server_box[0]
        names = {e["client_id"]: e["name"] for e in server.events.of_kind("client_joined")}
        if names.get(request.client_id) == "slow" and not delayed:
            delayed.append(request.task_id)  # a slow link: the round moves on meanwhile
            engine = server.service.engine
            while engine.version < 1:
                await asyncio.sleep(0.01)
        async for chunk in original(self, request, progress):
            yield chunk

    monkeypatch.setattr(Transport, "download", slow_download)

    slow_box: list[ClientSession] = []

    def fast_gate(call: int) -> None:
        if call == 0:
            block_until(lambda: _three_issued(server_box[0]), 10, "three tasks")
        if call == 1:  # version 1 is out; the slow client hears "closed" before version 2
            block_until(lambda: slow_box[0].stats.refused == 1, 10, "the slow refusal")

    fast = [TowardTrainer(np.full(DIM, v, np.float32), examples=10, before_train=fast_gate)
            for v in (1.0, 2.0)]
    slow = TowardTrainer(np.full(DIM, 9.0, np.float32), examples=10)

    async def main() -> ClientSession:
        async with coordinator(config, X0) as server:
            server_box.append(server)
            sessions = [ClientSession(target_of(server), t, options(f"fast{i}"))
                        for i, t in enumerate(fast)]
            slow_session = ClientSession(target_of(server), slow, options("slow", max_tasks=1))
            slow_box.append(slow_session)
            await gather_bounded(slow_session.run(), *(s.run() for s in sessions))
            await asyncio.wait_for(server.wait_finished(), 10)
        return slow_session

    slow_session = run_async(main())
    assert len(delayed) == 1
    assert slow.calls == 0  # it never trained on a closed task
    assert (slow_session.stats.tasks, slow_session.stats.refused) == (1, 1)
    assert "closed" in slow_session.stats.refusals[0]


class SeedRecorder(TowardTrainer):
    """A ``TowardTrainer`` that keeps each task's ``TrainPlan.seed``."""

    def __init__(self, target: np.ndarray) -> None:
        super().__init__(target)
        self.seeds: list[int] = []

    def train(self, params: np.ndarray, plan: TrainPlan) -> TrainResult:
        self.seeds.append(plan.seed)
        return super().train(params, plan)


def test_an_unseeded_client_draws_63_bit_plan_seeds_and_a_seeded_one_repeats_its_own(
        coordinator: CoordinatorFactory) -> None:
    # DP-SGD's noise comes from (trainer seed, plan seed): on a device (no seed) the plan's
    # seed is the secret part, too wide to search; a seeded client keeps virtual mode's 31 bits
    rounds = 4
    config = CoordinatorConfig(rounds=rounds, flush=FlushRule(goal=3, deadline_s=None),
                               limits=LIMITS)
    trainers = [SeedRecorder(np.full(DIM, float(i), np.float32)) for i in range(3)]

    async def main() -> None:
        async with coordinator(config, X0) as server:
            await gather_bounded(*(
                ClientSession(target_of(server), t, options(f"dev{i}", seed=seed)).run()
                for i, (t, seed) in enumerate(zip(trainers, (None, 5, 5), strict=True))))
            await asyncio.wait_for(server.wait_finished(), 10)

    run_async(main())
    unseeded, seeded, again = (t.seeds for t in trainers)
    assert len(unseeded) == len(seeded) == rounds
    # all four below 2**31 by chance: odds of 2**-128
    assert max(unseeded) >= 2**31 and max(unseeded) < 2**63
    assert seeded == again and max(seeded) < 2**31
