"""Duplicate commits and replayed upload chunks, forced through real gRPC, count once.

The same two-client, two-round run is played twice: once cleanly, once with every kind of
duplicate a bad network produces (replayed and overlapping chunks, repeated and concurrent
commits, a commit from a fresh connection as after a client restart, a commit repeated after
the flush it caused). The final models must be bit-for-bit equal.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async, target_of

from fedlink.aggregate.flushguard import RobustConfig
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.messages import CommitRequest
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import Payload, pack, to_proto

pytestmark = pytest.mark.timeout(60)

DIM = 1000
X0 = np.random.default_rng(3).normal(size=DIM).astype(np.float32)
ROUNDS = 2
CHUNK = 1000  # 4000-byte updates travel in 4 chunks


def config(state_dir: str = "") -> CoordinatorConfig:
    # plain FedAvg: the flush guard is covered by tests/security and tests/unit/test_flush_guard.py
    return CoordinatorConfig(rounds=ROUNDS, flush=FlushRule(goal=2, deadline_s=None),
                             state_dir=state_dir, robust=RobustConfig(enabled=False))


def update_of(name: str, version: int) -> Payload:
    seed = {"a": 10, "b": 20}[name] + version
    return pack(np.random.default_rng(seed).normal(size=DIM).astype(np.float32),
                get_codec("fp32"))


@dataclass
class Raw:
    """A raw-stub client that can misbehave the way a bad network makes clients misbehave."""

    stub: pb_grpc.CoordinatorStub
    client_id: str
    examples: int

    def chunk(self, upload_id: str, data: bytes, start: int, end: int) -> pb.UploadChunk:
        return pb.UploadChunk(client_id=self.client_id, upload_id=upload_id, offset=start,
                              data=data[start:end])

    async def upload(self, upload_id: str, data: bytes, replay: bool) -> None:
        spans = [(0, CHUNK), (CHUNK, len(data))]
        if replay:  # overlapping and repeated chunks, as after reconnects
            spans = [(0, 1500), (500, 2500), (0, 1000), (2500, 3000), (1000, len(data))]
        pieces = [self.chunk(upload_id, data, start, min(end, start + CHUNK * 3))
                  for start, end in spans]
        reply = await self.stub.Upload(iter(pieces), timeout=10)
        assert reply.committed_offset == len(data)
        if replay:  # the whole upload once more, in a second stream
            await self.stub.Upload(iter([self.chunk(upload_id, data, 0, len(data))]),
                                   timeout=10)

    def commit_request(self, upload_id: str, task: pb.Task,
                       payload: Payload) -> pb.CommitRequest:
        return to_proto(CommitRequest(
            client_id=self.client_id, upload_id=upload_id, task_id=task.task_id,
            base_version=task.model_version, num_examples=self.examples, steps_completed=1,
            steps_planned=1, update=payload.header,
            metrics={"retries": 2.0, "resumed_bytes": 1500.0, "offline_seconds": 0.5}))


async def join(stub: pb_grpc.CoordinatorStub, name: str, examples: int) -> Raw:
    reply = await stub.Join(pb.JoinRequest(client_name=name, num_examples=examples), timeout=5)
    return Raw(stub, reply.client_id, examples)


async def play(coordinator: CoordinatorFactory, cfg: CoordinatorConfig,
               duplicates: bool) -> tuple[np.ndarray, list[dict[str, object]]]:
    async with coordinator(cfg, X0) as server, \
            grpc.aio.insecure_channel(target_of(server)) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        clients = {"a": await join(stub, "a", 10), "b": await join(stub, "b", 30)}
        for _ in range(ROUNDS):
            tasks = {}
            for name, client in clients.items():
                reply = await stub.GetTask(pb.GetTaskRequest(client_id=client.client_id),
                                           timeout=5)
                tasks[name] = reply.task
            for name, client in clients.items():
                await deliver(client, tasks[name], target_of(server), duplicates)
        await asyncio.wait_for(server.wait_finished(), 10)
    return server.service.engine.model.copy(), server.events.of_kind("update_accepted")


async def deliver(client: Raw, task: pb.Task, target: str, duplicates: bool) -> None:
    payload = update_of("a" if client.examples == 10 else "b", task.model_version)
    upload_id = f"{client.client_id}-{task.task_id}"
    await client.upload(upload_id, payload.data, replay=duplicates)
    request = client.commit_request(upload_id, task, payload)
    if not duplicates:
        await client.stub.Commit(request, timeout=10)
        return
    # three identical commits at once (a retry racing the original), then more in sequence
    replies = await asyncio.gather(*[client.stub.Commit(request, timeout=10)
                                     for _ in range(3)])
    again = await client.stub.Commit(request, timeout=10)
    assert all(r == replies[0] for r in [*replies, again])
    # a restarted client, on a fresh connection, finds nothing left to send and commits again
    async with grpc.aio.insecure_channel(target) as fresh:
        stub = pb_grpc.CoordinatorStub(fresh)
        status = await stub.UploadStatus(pb.UploadStatusRequest(
            client_id=client.client_id, upload_id=upload_id), timeout=5)
        assert status.committed_offset == len(payload.data)
        assert await stub.Commit(request, timeout=10) == replies[0]
    # a replayed chunk after the commit changes nothing
    with pytest.raises(grpc.aio.AioRpcError) as late:
        await client.stub.Upload(iter([client.chunk(upload_id, payload.data, 0, CHUNK)]),
                                 timeout=10)
    assert late.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("spool", ["memory", "files"])
def test_duplicates_count_once(coordinator: CoordinatorFactory, tmp_path: Path,
                               spool: str) -> None:
    clean_model, clean_accepted = run_async(play(coordinator, config(), duplicates=False))
    state_dir = str(tmp_path / "state") if spool == "files" else ""
    model, accepted = run_async(play(coordinator, config(state_dir), duplicates=True))

    assert model.tobytes() == clean_model.tobytes()
    assert len(accepted) == len(clean_accepted) == 2 * ROUNDS
    assert [e["weight"] for e in accepted] == [e["weight"] for e in clean_accepted]
    assert all(e["retries"] == 2 and e["resumed_bytes"] == 1500 for e in accepted)
    # hand-computed: each flush is the 10:30 weighted mean of the two updates
    expected = X0.astype(np.float32)
    for version in range(ROUNDS):
        a = np.frombuffer(update_of("a", version).data, "<f4")
        b = np.frombuffer(update_of("b", version).data, "<f4")
        expected = expected + ((10 * a.astype(np.float64) + 30 * b) / 40).astype(np.float32)
    np.testing.assert_allclose(model, expected, rtol=1e-5, atol=1e-6)
    if spool == "files":
        assert list((tmp_path / "state" / "uploads").glob("*/*.spool")) == []
