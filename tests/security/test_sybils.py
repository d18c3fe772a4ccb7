"""Finding 6: Join floods, id hoarding, clients that never go, and heartbeating place holders.

``Join`` is rate-limited per peer address and per token, a per-client token holds a bounded
number of live ids, a silent client expires (and gives back what it held), and a task not
delivered within ``max_task_s`` stops holding a cohort place even while its client heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import numpy as np
import pytest
from _hostile import FP32, Raw, answer_of, events_of
from conftest import CoordinatorFactory, run_async, wait_until

from fedlink.coordinator import CoordinatorConfig, FlushRule, LimitsConfig
from fedlink.coordinator.auth import issue_token
from fedlink.coordinator.config import AuthConfig
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.wire import pack

pytestmark = pytest.mark.timeout(60)

X0 = np.zeros(8, np.float32)
SECRET = b"0123456789abcdef0123456789abcdef"


def test_a_join_flood_from_one_peer_is_refused_with_a_retry_hint(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=LimitsConfig(join_burst_per_peer=5,
                                                   join_per_peer_per_s=0.1))

    async def scenario() -> list[str]:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            answers = [await raw.join(f"sybil{i}") for i in range(8)]
            assert answers[-1].retry_delay is not None
            assert len(server.service.registry) == 5
            return [a.code for a in answers]
    assert run_async(scenario()) == ["OK"] * 5 + ["RESOURCE_EXHAUSTED"] * 3


def test_one_token_holds_a_bounded_number_of_live_ids(
        coordinator: CoordinatorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDLINK_TEST_SECRET", SECRET.decode())
    config = CoordinatorConfig(auth=AuthConfig(secret_env="FEDLINK_TEST_SECRET"),
                               limits=LimitsConfig(max_ids_per_token=2))
    bearer = (("authorization", f"Bearer {issue_token(SECRET, 'edge-1', 600)}"),)

    async def scenario() -> list[str]:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            stub = Raw(channel).stub
            codes = []
            for _ in range(3):
                answer = await answer_of(stub.Join(pb.JoinRequest(num_examples=1),
                                                   metadata=bearer, timeout=10))
                codes.append(answer.code)
            return codes
    assert run_async(scenario()) == ["OK", "OK", "RESOURCE_EXHAUSTED"]


def test_a_silent_client_expires(coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(limits=LimitsConfig(client_ttl_s=1.0, heartbeat_interval_s=0.5))

    async def scenario() -> None:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            gone = await raw.client("gone")
            await raw.task(gone)
            await wait_until(lambda: len(server.service.registry) == 0, what="expiry")
            assert [e["client_id"] for e in events_of(server, "client_expired")] == [gone]
            late = await answer_of(raw.stub.Heartbeat(pb.HeartbeatRequest(client_id=gone),
                                                      timeout=10))
            assert late.code == "UNAUTHENTICATED"  # the SDK joins again on this
    run_async(scenario())


async def heartbeat_forever(raw: Raw, client_id: str, task_id: str) -> None:
    while True:
        await raw.stub.Heartbeat(pb.HeartbeatRequest(client_id=client_id, task_id=task_id),
                                 timeout=10)
        await asyncio.sleep(0.1)


async def task_when_free(raw: Raw, client_id: str) -> pb.Task:
    while True:
        reply = await raw.stub.GetTask(pb.GetTaskRequest(client_id=client_id, held_version=-1),
                                       timeout=10)
        if reply.HasField("task"):
            return reply.task


def test_heartbeating_place_holders_cannot_stall_a_sync_run(
        coordinator: CoordinatorFactory) -> None:
    config = CoordinatorConfig(rounds=1, flush=FlushRule.from_preset("sync", goal=2),
                               limits=LimitsConfig(max_task_s=1.0, long_poll_s=0.5))

    async def scenario() -> None:
        async with (coordinator(config, X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            raw = Raw(channel)
            holders = []
            for name in ("holder1", "holder2"):
                client_id = await raw.client(name)
                task = await raw.task(client_id)
                holders.append(asyncio.create_task(
                    heartbeat_forever(raw, client_id, task.task_id)))
            try:
                for i in range(2):
                    honest = await raw.client(f"honest{i}")
                    task = await task_when_free(raw, honest)
                    answer = await raw.commit(honest, task, pack(np.ones(8, np.float32),
                                                                 FP32),
                                              10, f"honest{i}-up", inline=True)
                    assert answer.code == "OK", answer
                await server.wait_finished()
            finally:
                for holder in holders:
                    holder.cancel()
                    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                        await holder
    run_async(scenario())


def test_what_one_join_makes_the_registry_keep_is_bounded(
        coordinator: CoordinatorFactory) -> None:
    """64 entries of 1,000 characters each (about 153 KiB of RSS a client before)."""
    async def scenario() -> tuple[str, str]:
        async with (coordinator(CoordinatorConfig(), X0) as server,
                    grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel):
            answer = await Raw(channel).join(
                "fat", metadata=[(f"k{i:02d}", "v" * 1000) for i in range(64)])
            assert len(server.service.registry) == 0
            return answer.code, answer.detail
    code, detail = run_async(scenario())
    assert code == "INVALID_ARGUMENT" and "limit is 4096" in detail
