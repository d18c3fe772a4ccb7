"""Liveness over real gRPC: a client that stops heartbeating loses its place to a waiting one
long before the round deadline; a slow client that keeps heartbeating keeps its place."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, TowardTrainer, run_async, target_of, wait_until

from fedlink.client import ClientOptions, ClientSession, RetryPolicy
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.messages import CommitRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import pack, to_proto

pytestmark = pytest.mark.timeout(60)

DIM = 8
X0 = np.zeros(DIM, dtype=np.float32)
DEADLINE_S = 30.0
HEARTBEAT_S = 0.2
LIVENESS_S = 1.0
CONFIG = CoordinatorConfig(
    rounds=1,
    flush=FlushRule(goal=1, min_updates=1, deadline_s=DEADLINE_S),
    limits=LimitsConfig(heartbeat_interval_s=HEARTBEAT_S, long_poll_s=0.5,
                        retry_after_s=0.05, liveness_timeout_s=LIVENESS_S))
FAST_RETRY = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.05, max_attempts=5)


async def join_and_take_task(stub: pb_grpc.CoordinatorStub, name: str) -> tuple[str, pb.Task]:
    joined = await stub.Join(pb.JoinRequest(client_name=name, num_examples=10), timeout=5)
    reply = await stub.GetTask(pb.GetTaskRequest(client_id=joined.client_id), timeout=5)
    assert reply.WhichOneof("outcome") == "task"
    return joined.client_id, reply.task


def test_silent_clients_place_goes_to_a_waiting_client_before_the_deadline(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(CONFIG, X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            silent_id, silent_task = await join_and_take_task(stub, "silent")
            loop = asyncio.get_running_loop()
            started = loop.time()
            # the cohort (1) is full: the waiting client long-polls until the place frees
            waiting = ClientSession(target_of(server),
                                    TowardTrainer(np.full(DIM, 2.0, np.float32)),
                                    ClientOptions(name="waiting", retry=FAST_RETRY))
            stats = await asyncio.wait_for(waiting.run(), 20)
            elapsed = loop.time() - started
            await asyncio.wait_for(server.wait_finished(), 10)

            assert stats.accepted == 1
            assert elapsed >= LIVENESS_S * 0.9  # not released before the liveness timeout
            # the released task is still open: its client may yet deliver within staleness
            beat = await stub.Heartbeat(pb.HeartbeatRequest(
                client_id=silent_id, task_id=silent_task.task_id), timeout=5)
            assert beat.model_version == 1

        (timeout,) = server.events.of_kind("client_timeout")
        assert timeout["client_id"] == silent_id
        assert timeout["task_id"] == silent_task.task_id
        assert timeout["reason"].startswith("no heartbeat for ")
        (flush,) = server.events.of_kind("flush")
        assert flush["num_updates"] == 1
        # the place went to the waiting client because the silent one timed out (the deadline
        # releases tasks without a client_timeout event): the timeout comes before its task
        kinds = [(e["kind"], e.get("client_id")) for e in server.events.events]
        waiting_task = next(i for i, (kind, client) in enumerate(kinds)
                            if kind == "task_issued" and client != silent_id)
        assert kinds.index(("client_timeout", silent_id)) < waiting_task
        np.testing.assert_allclose(server.service.engine.model, np.full(DIM, 1.0))

    run_async(main())


def test_heartbeating_slow_client_keeps_its_place(coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(CONFIG, X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            slow_id, task = await join_and_take_task(stub, "slow")
            other = await stub.Join(pb.JoinRequest(client_name="other"), timeout=5)

            async def beat() -> None:
                while True:
                    await stub.Heartbeat(pb.HeartbeatRequest(client_id=slow_id,
                                                             task_id=task.task_id), timeout=5)
                    await asyncio.sleep(HEARTBEAT_S)

            beating = asyncio.ensure_future(beat())
            try:  # "train" for two liveness timeouts; another client asks meanwhile
                give_up = asyncio.get_running_loop().time() + 2 * LIVENESS_S
                while asyncio.get_running_loop().time() < give_up:
                    reply = await stub.GetTask(pb.GetTaskRequest(client_id=other.client_id),
                                               timeout=5)
                    assert reply.WhichOneof("outcome") == "wait"
            finally:
                beating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beating
            payload = pack(np.full(DIM, 0.5, np.float32), get_codec("fp32"))
            await stub.Upload(iter([pb.UploadChunk(client_id=slow_id, upload_id="u1",
                                                   offset=0, data=payload.data)]), timeout=5)
            await stub.Commit(to_proto(CommitRequest(
                client_id=slow_id, upload_id="u1", task_id=task.task_id, base_version=0,
                num_examples=10, steps_completed=1, steps_planned=1,
                update=payload.header)), timeout=5)
            await wait_until(lambda: server.service.engine.version == 1, 5, "the flush")

        assert server.events.of_kind("client_timeout") == []
        np.testing.assert_allclose(server.service.engine.model, np.full(DIM, 0.5))

    run_async(main())
