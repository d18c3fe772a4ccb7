"""A client that takes a task and dies does not stall the run: the deadline rule moves on."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, target_of, wait_until

from fedlink.aggregate import RobustConfig
from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

DIM = 16
X0 = np.zeros(DIM, dtype=np.float32)
DEADLINE_S = 1.0
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)


async def take_task_and_die(stub: pb_grpc.CoordinatorStub) -> tuple[str, pb.Task]:
    """Join and take a task, then never commit (the process 'died')."""
    joined = await stub.Join(pb.JoinRequest(client_name="doomed", num_examples=10), timeout=5)
    reply = await stub.GetTask(pb.GetTaskRequest(client_id=joined.client_id), timeout=5)
    assert reply.WhichOneof("outcome") == "task"
    return joined.client_id, reply.task


def session(server: object, name: str, target: np.ndarray, examples: int) -> ClientSession:
    return ClientSession(target_of(server), TowardTrainer(target, examples=examples),  # type: ignore[arg-type]
                         ClientOptions(name=name, retry=FAST_RETRY))


def test_round_flushes_at_deadline_without_the_dead_client(
        coordinator: CoordinatorFactory) -> None:
    # plain weighted FedAvg, so the expected model is the arithmetic below: this test is about
    # the dead client's place (the flush guard has tests/security and test_flush_guard.py)
    config = CoordinatorConfig(
        rounds=2,
        flush=FlushRule(goal=3, min_updates=2, deadline_s=DEADLINE_S),
        limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05),
        robust=RobustConfig(enabled=False))

    async def main() -> None:
        async with coordinator(config, X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            dead_id, dead_task = await take_task_and_die(stub)
            loop = asyncio.get_running_loop()
            started = loop.time()
            a = session(server, "a", np.full(DIM, 1.0, np.float32), 10)
            b = session(server, "b", np.full(DIM, 3.0, np.float32), 30)
            runs = asyncio.gather(a.run(), b.run())

            # round 1 flushes at the deadline with the two live updates
            await wait_until(lambda: server.service.engine.version >= 1, 10, "round 1")
            assert loop.time() - started >= DEADLINE_S * 0.8
            # the dead client's place is released: a newcomer gets a version-1 task
            # beside the two live clients (cohort of 3)
            late = await stub.Join(pb.JoinRequest(client_name="late"), timeout=5)
            reply = await stub.GetTask(pb.GetTaskRequest(client_id=late.client_id),
                                       timeout=5)
            assert reply.WhichOneof("outcome") == "task"
            assert reply.task.model_version == 1
            beat = await stub.Heartbeat(pb.HeartbeatRequest(
                client_id=dead_id, task_id=dead_task.task_id), timeout=5)
            assert not beat.task_open

            stats = await asyncio.wait_for(runs, 20)
            await asyncio.wait_for(server.wait_finished(), 10)

        for s in stats:
            assert (s.tasks, s.accepted, s.refused) == (2, 2, 0)
        flushes = server.events.of_kind("flush")
        assert [f["num_updates"] for f in flushes] == [2, 2]
        assert all(f["round_seconds"] >= DEADLINE_S * 0.9 for f in flushes)
        assert server.events.of_kind("run_finished")
        accepted = {e["client_id"] for e in server.events.of_kind("update_accepted")}
        assert dead_id not in accepted and late.client_id not in accepted
        # both rounds are the weighted mean of the two live clients' half-steps
        model = X0.astype(np.float64)
        for _ in range(2):
            model = model + (10 * 0.5 * (1.0 - model) + 30 * 0.5 * (3.0 - model)) / 40
        np.testing.assert_allclose(server.service.engine.model, model, rtol=1e-5)

    run_async(main(), timeout=40)


def test_place_of_a_timed_out_client_goes_to_another(coordinator: CoordinatorFactory) -> None:
    """Deadline passes with fewer than ``min`` updates: the dead client's place is released."""
    config = CoordinatorConfig(
        rounds=1,
        flush=FlushRule(goal=2, min_updates=2, deadline_s=0.5),
        limits=LimitsConfig(long_poll_s=2.0, retry_after_s=0.05))

    async def main() -> None:
        async with coordinator(config, X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            dead_id, _ = await take_task_and_die(pb_grpc.CoordinatorStub(channel))
            a = session(server, "a", np.full(DIM, 2.0, np.float32), 10)
            a_run = asyncio.ensure_future(a.run())
            await wait_until(lambda: len(server.events.of_kind("update_accepted")) == 1,
                             10, "a's update")
            # the cohort (2) is full: the dead client's task and a's accepted update
            b = session(server, "b", np.full(DIM, 4.0, np.float32), 10)
            stats = await asyncio.wait_for(asyncio.gather(a_run, b.run()), 20)
            await asyncio.wait_for(server.wait_finished(), 10)

        timeouts = server.events.of_kind("client_timeout")
        assert [e["client_id"] for e in timeouts] == [dead_id]
        assert [s.accepted for s in stats] == [1, 1]
        (flush,) = server.events.of_kind("flush")
        assert flush["num_updates"] == 2
        np.testing.assert_allclose(server.service.engine.model, np.full(DIM, 1.5), rtol=1e-6)

    run_async(main(), timeout=40)
