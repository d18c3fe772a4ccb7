"""A real coordinator on loopback answers bad input with clear status codes, model untouched.

Each test drives the coordinator through a raw gRPC stub, the way a third-party client
would, so what is checked is exactly what travels on the wire.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, CoordinatorServer, FlushRule
from fedlink.messages import CommitRequest, TensorHeader
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import Payload, checksum, pack, to_proto

pytestmark = pytest.mark.timeout(60)

DIM = 32
X0 = np.linspace(-1.0, 1.0, DIM, dtype=np.float32)
CONFIG = CoordinatorConfig(rounds=3, flush=FlushRule(goal=2, deadline_s=None))
FP32 = get_codec("fp32")


@dataclass
class Raw:
    """A joined raw client holding a task."""

    stub: pb_grpc.CoordinatorStub
    client_id: str
    task: pb.Task
    server: CoordinatorServer

    async def upload(self, upload_id: str, data: bytes) -> pb.UploadReply:
        chunks = [pb.UploadChunk(client_id=self.client_id, upload_id=upload_id, offset=0,
                                 data=data)]
        return await self.stub.Upload(iter(chunks), timeout=10)

    def commit_request(self, upload_id: str, header: TensorHeader) -> pb.CommitRequest:
        return to_proto(CommitRequest(
            client_id=self.client_id, upload_id=upload_id, task_id=self.task.task_id,
            base_version=self.task.model_version, num_examples=10, steps_completed=1,
            steps_planned=1, update=header))

    async def deliver(self, upload_id: str, payload: Payload,
                      data: bytes | None = None) -> pb.CommitReply:
        await self.upload(upload_id, payload.data if data is None else data)
        return await self.stub.Commit(self.commit_request(upload_id, payload.header), timeout=10)


Scenario = Callable[[Raw], Awaitable[None]]


def with_raw_client(coordinator: CoordinatorFactory, scenario: Scenario,
                    config: CoordinatorConfig = CONFIG) -> CoordinatorServer:
    async def main() -> CoordinatorServer:
        async with coordinator(config, X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            joined = await stub.Join(pb.JoinRequest(client_name="raw", num_examples=10),
                                     timeout=10)
            reply = await stub.GetTask(pb.GetTaskRequest(client_id=joined.client_id),
                                       timeout=10)
            assert reply.WhichOneof("outcome") == "task"
            await scenario(Raw(stub, joined.client_id, reply.task, server))
        return server

    return run_async(main())


async def expect_error(call: Awaitable[object], code: grpc.StatusCode,
                       *phrases: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, (err.value.code(), err.value.details())
    detail = err.value.details() or ""
    assert "Traceback" not in detail and 'File "' not in detail
    for phrase in phrases:
        assert phrase in detail, f"{phrase!r} not in {detail!r}"
    return detail


def assert_model_unchanged(server: CoordinatorServer) -> None:
    engine = server.service.engine
    assert engine.version == 0
    np.testing.assert_array_equal(engine.model, X0)
    assert server.events.of_kind("update_accepted") == []


def bad_vector_case(vector: np.ndarray, *phrases: str) -> Scenario:
    async def scenario(raw: Raw) -> None:
        payload = pack(vector, FP32)
        await expect_error(raw.deliver("u-1", payload), grpc.StatusCode.INVALID_ARGUMENT,
                           *phrases)
        # the same commit again gets the same answer
        await expect_error(raw.stub.Commit(raw.commit_request("u-1", payload.header)),
                           grpc.StatusCode.INVALID_ARGUMENT, *phrases)

    return scenario


def with_value(value: float) -> np.ndarray:
    vector = np.full(DIM, 0.01, dtype=np.float32)
    vector[7] = value
    return vector


def test_wrong_vector_length(coordinator: CoordinatorFactory) -> None:
    scenario = bad_vector_case(np.zeros(DIM + 3, np.float32), "shape", f"[{DIM}]",
                               f"[{DIM + 3}]")
    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_nan_values(coordinator: CoordinatorFactory) -> None:
    scenario = bad_vector_case(with_value(float("nan")), "non-finite", "NaN")
    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_inf_values(coordinator: CoordinatorFactory) -> None:
    scenario = bad_vector_case(with_value(float("inf")), "non-finite", "Inf")
    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_unknown_encoding(coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        payload = pack(np.zeros(DIM, np.float32), FP32)
        header = dataclasses.replace(payload.header, encoding="brotli9000")
        await raw.upload("u-1", payload.data)
        await expect_error(raw.stub.Commit(raw.commit_request("u-1", header)),
                           grpc.StatusCode.INVALID_ARGUMENT, "unknown encoding", "brotli9000",
                           "fp32")

    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_unknown_client_id(coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        payload = pack(np.zeros(DIM, np.float32), FP32)
        await raw.upload("u-1", payload.data)
        request = raw.commit_request("u-1", payload.header)
        request.client_id = "c999"
        await expect_error(raw.stub.Commit(request), grpc.StatusCode.UNAUTHENTICATED,
                           "unknown client id", "c999", "Join")
        await expect_error(raw.stub.GetTask(pb.GetTaskRequest(client_id="")),
                           grpc.StatusCode.UNAUTHENTICATED, "unknown client id")

    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_checksum_mismatch(coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        payload = pack(np.ones(DIM, np.float32), FP32)
        corrupted = bytes([payload.data[0] ^ 0xFF]) + payload.data[1:]
        await expect_error(raw.deliver("u-1", payload, data=corrupted),
                           grpc.StatusCode.DATA_LOSS, "checksum mismatch",
                           payload.header.checksum, checksum(corrupted))

    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_commit_of_upload_never_made(coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        payload = pack(np.ones(DIM, np.float32), FP32)
        await expect_error(raw.stub.Commit(raw.commit_request("never-uploaded",
                                                              payload.header)),
                           grpc.StatusCode.NOT_FOUND, "unknown upload id", "never-uploaded")

    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_incomplete_upload_is_failed_precondition_and_resumable(
        coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        payload = pack(np.full(DIM, 0.5, np.float32), FP32)
        half = len(payload.data) // 2
        await raw.upload("u-1", payload.data[:half])
        request = raw.commit_request("u-1", payload.header)
        await expect_error(raw.stub.Commit(request), grpc.StatusCode.FAILED_PRECONDITION,
                           "incomplete", f"{half} of {len(payload.data)}")
        status = await raw.stub.UploadStatus(pb.UploadStatusRequest(
            client_id=raw.client_id, upload_id="u-1"))
        assert status.committed_offset == half
        rest = pb.UploadChunk(client_id=raw.client_id, upload_id="u-1", offset=half,
                              data=payload.data[half:])
        await raw.stub.Upload(iter([rest]))
        reply = await raw.stub.Commit(request)
        assert reply.upload_id == "u-1" and reply.staleness == 0

    server = with_raw_client(coordinator, scenario)
    assert len(server.events.of_kind("update_accepted")) == 1


def test_upload_gap_is_invalid_argument(coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        chunk = pb.UploadChunk(client_id=raw.client_id, upload_id="u-1", offset=64,
                               data=b"x" * 16)
        await expect_error(raw.stub.Upload(iter([chunk])), grpc.StatusCode.INVALID_ARGUMENT,
                           "gap", "offset 64")

    assert_model_unchanged(with_raw_client(coordinator, scenario))


def test_repeated_commit_gets_the_same_answer_and_counts_once(
        coordinator: CoordinatorFactory) -> None:
    async def scenario(raw: Raw) -> None:
        payload = pack(np.full(DIM, 0.25, np.float32), FP32)
        first = await raw.deliver("u-1", payload)
        request = raw.commit_request("u-1", payload.header)
        second = await raw.stub.Commit(request)
        third = await raw.stub.Commit(request)
        assert first == second == third
        assert first.upload_id == "u-1" and first.model_version == 0
        # goal is 2: had the repeats counted, the model would have moved
        assert raw.server.service.engine.version == 0

    server = with_raw_client(coordinator, scenario)
    assert len(server.events.of_kind("update_accepted")) == 1
    np.testing.assert_array_equal(server.service.engine.model, X0)


def test_health_check_serves(coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(CONFIG, X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "fedlink.v1.Coordinator"):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service),
                                           timeout=10)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING, service

    run_async(main())


def test_reflection_lists_the_coordinator(coordinator: CoordinatorFactory) -> None:
    async def main() -> None:
        async with coordinator(CONFIG, X0) as server, \
                grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            call = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
            names = set()
            async for response in call:
                names |= {s.name for s in response.list_services_response.service}
            assert "fedlink.v1.Coordinator" in names
            assert "grpc.health.v1.Health" in names

    run_async(main())
