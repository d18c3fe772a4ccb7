"""Delta download over real gRPC: a client holding version v downloads an exact delta."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async, target_of

from fedlink.compress import get_codec
from fedlink.compress.delta import DELTA_ENCODING, apply_delta
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule, LimitsConfig
from fedlink.messages import CommitRequest
from fedlink.metrics import summarize
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import checksum, from_proto, pack, to_proto, unpack

pytestmark = pytest.mark.timeout(60)

DIM = 20_000
X0 = np.random.default_rng(7).normal(size=DIM).astype(np.float32)
FP32 = get_codec("fp32")


def config(delta_history: int = 4) -> CoordinatorConfig:
    return CoordinatorConfig(rounds=10, flush=FlushRule(goal=1, deadline_s=None),
                             limits=LimitsConfig(chunk_bytes=16 << 10, long_poll_s=0.2,
                                                 delta_history=delta_history))


def sparse_step(version: int) -> np.ndarray:
    """A small update touching one value in eight (what a fine-tuning round looks like)."""
    delta = np.zeros(DIM, np.float32)
    delta[version % 8::8] = 0.01 * (version + 1)
    return delta


@dataclass
class RawClient:
    """A third-party client speaking the protocol through a raw stub."""

    stub: pb_grpc.CoordinatorStub
    client_id: str

    async def task(self, held_version: int = -1) -> pb.Task:
        reply = await self.stub.GetTask(pb.GetTaskRequest(
            client_id=self.client_id, held_version=held_version), timeout=5)
        assert reply.WhichOneof("outcome") == "task", reply
        return reply.task

    async def download(self, task: pb.Task, delta: bool, offset: int = 0) -> bytes:
        request = pb.DownloadRequest(client_id=self.client_id, task_id=task.task_id,
                                     offset=offset, delta=delta)
        return b"".join([c.data async for c in self.stub.Download(request, timeout=10)])

    async def deliver(self, task: pb.Task, update: np.ndarray) -> None:
        payload = pack(update, FP32)
        upload_id = f"{self.client_id}-{task.task_id}"
        chunk = pb.UploadChunk(client_id=self.client_id, upload_id=upload_id, offset=0,
                               data=payload.data)
        await self.stub.Upload(iter([chunk]), timeout=10)
        await self.stub.Commit(to_proto(CommitRequest(
            client_id=self.client_id, upload_id=upload_id, task_id=task.task_id,
            base_version=task.model_version, num_examples=1, steps_completed=1,
            steps_planned=1, update=payload.header)), timeout=10)


async def joined(server: CoordinatorServer, channel: grpc.aio.Channel) -> RawClient:
    stub = pb_grpc.CoordinatorStub(channel)
    reply = await stub.Join(pb.JoinRequest(client_name="raw", num_examples=1), timeout=5)
    return RawClient(stub, reply.client_id)


async def advance(client: RawClient, versions: int) -> None:
    """Flush ``versions`` small updates (goal 1: each commit is a new version)."""
    for _ in range(versions):
        task = await client.task()
        await client.deliver(task, sparse_step(task.model_version))


def test_held_version_gets_a_delta_that_rebuilds_the_exact_model(
        coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(config(), X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            client = await joined(server, channel)
            first = await client.task()
            assert not first.HasField("delta") and first.delta_base_version == -1
            v0 = unpack(from_proto(first.model), await client.download(first, delta=False),
                        DIM)
            await client.deliver(first, sparse_step(0))
            await advance(client, 1)  # the client still holds v0; the model is at v2

            task = await client.task(held_version=0)
            assert task.model_version == 2 and task.delta_base_version == 0
            header = from_proto(task.delta)
            assert (header.encoding, header.shape, header.dtype) == (DELTA_ENCODING, (DIM,),
                                                                     "float32")
            data = await client.download(task, delta=True)
            assert len(data) == header.num_bytes < task.model.num_bytes
            assert checksum(data) == header.checksum
            rebuilt = apply_delta(v0, data)
            assert rebuilt.tobytes() == server.service.engine.model.tobytes()
            # resuming a delta download from an offset gives the rest of the same bytes
            assert await client.download(task, delta=True, offset=1000) == data[1000:]
            await client.deliver(task, sparse_step(2))  # the commit shows it has the bytes

        # every stream counts what it sent; each accepted commit used one whole payload
        sent = server.events.of_kind("download_finished")
        assert [(e["task_id"], e["delta"], e["bytes"]) for e in sent] == [
            (first.task_id, False, first.model.num_bytes),
            (task.task_id, True, header.num_bytes),
            (task.task_id, True, header.num_bytes - 1000)]
        full, delta = server.events.of_kind("download_used")
        assert full["delta"] is False and full["bytes_saved"] == 0 and full["wasted"] == 0
        assert delta["delta"] and delta["base_version"] == 0
        assert delta["bytes"] == header.num_bytes
        assert delta["wasted"] == header.num_bytes - 1000  # the second, resumed stream
        saved = task.model.num_bytes - header.num_bytes
        assert saved > 0 and delta["bytes_saved"] == saved
        summary = summarize(server.events.events, {})
        assert summary["delta_bytes_saved"] == saved
        assert summary["bytes_down"] == first.model.num_bytes + 2 * header.num_bytes - 1000
        assert summary["bytes_down_delta"] == 2 * header.num_bytes - 1000
        assert summary["bytes_down_wasted"] == header.num_bytes - 1000

    run_async(main())


def test_unknown_or_expired_held_version_gets_no_delta(coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(config(delta_history=2), X0) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            client = await joined(server, channel)
            await advance(client, 3)  # at v3; v2 and v3 are kept, v0 and v1 are not
            for held in (0, 1, -1):
                task = await client.task(held_version=held)
                assert not task.HasField("delta") and task.delta_base_version == -1, held
            with pytest.raises(grpc.aio.AioRpcError) as future:  # a version never published
                await client.task(held_version=7)
            assert future.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.download(task, delta=True)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            assert "download the full model" in str(refused.value.details())
            # the full model is always there
            full = await client.download(task, delta=False)
            assert unpack(from_proto(task.model), full, DIM).tobytes() == \
                server.service.engine.model.tobytes()
            kept = await client.task(held_version=2)
            assert kept.HasField("delta") and kept.delta_base_version == 2

    run_async(main())
