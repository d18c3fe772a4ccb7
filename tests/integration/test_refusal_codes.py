"""Refusal codes through real gRPC: a stale commit is refused with TOO_STALE beside its text,
the code survives the idempotent replay, reaches the client SDK and the run's summary."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async, target_of

from fedlink.client.transport import Transport
from fedlink.compress import get_codec
from fedlink.coordinator import CoordinatorConfig, FlushRule
from fedlink.errors import UpdateRefused
from fedlink.messages import CommitRequest, GetTaskRequest, JoinRequest, Task
from fedlink.metrics import summarize
from fedlink.metrics.kinds import UpdateRefused as RefusedEvent
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.refusals import RefusalCode
from fedlink.wire import from_proto, pack, to_proto
from fedlink.wire.refusal import refusal_from_call

pytestmark = pytest.mark.timeout(60)

DIM = 4
# Two places for version 0, a flush at the first update, no staleness allowed: the second
# client's update for version 0 arrives one version too late.
CONFIG = CoordinatorConfig(rounds=5, flush=FlushRule(goal=1, over_selection=2.0,
                                                     deadline_s=None, max_staleness=0))


def commit_of(client_id: str, task: Task, upload_id: str) -> CommitRequest:
    payload = pack(np.ones(DIM, np.float32), get_codec("fp32"))
    return CommitRequest(client_id=client_id, upload_id=upload_id, task_id=task.task_id,
                         base_version=task.model_version, num_examples=10, steps_completed=1,
                         steps_planned=1, update=payload.header, update_data=payload.data)


async def _task(transport: Transport, client_id: str) -> Task:
    task = await transport.get_task(GetTaskRequest(client_id=client_id))
    assert isinstance(task, Task)
    return task


def test_a_stale_commit_is_refused_with_its_code(coordinator: CoordinatorFactory) -> None:
    async def scenario() -> None:
        async with coordinator(CONFIG, np.zeros(DIM, np.float32)) as server, \
                Transport(target_of(server)) as transport:
            a = (await transport.join(JoinRequest(client_name="a", num_examples=10))).client_id
            b = (await transport.join(JoinRequest(client_name="b", num_examples=10))).client_id
            task_a, task_b = await _task(transport, a), await _task(transport, b)
            assert task_a.model_version == task_b.model_version == 0
            await transport.commit(commit_of(a, task_a, "up-a"))  # flushes version 1
            for attempt in range(2):  # the second: the remembered answer, replayed
                with pytest.raises(UpdateRefused, match="too stale") as refused:
                    await transport.commit(commit_of(b, task_b, "up-b"))
                assert refused.value.reason is RefusalCode.TOO_STALE, attempt
            # Over raw gRPC: the status is unchanged, the code rides in its details.
            async with grpc.aio.insecure_channel(target_of(server)) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as raw:
                    await pb_grpc.CoordinatorStub(channel).Commit(
                        to_proto(commit_of(b, task_b, "up-b")), timeout=10)
            assert raw.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert refusal_from_call(raw.value) is RefusalCode.TOO_STALE
            (event,) = server.events.of_kind(RefusedEvent)
            assert event.refusal is RefusalCode.TOO_STALE and event.code == "FAILED_PRECONDITION"
            summary = summarize(server.events.events, {})
            assert summary["refusals_by_code"] == {
                "too_stale": {"count": 1, "example": event.reason}}

    run_async(scenario())


def test_an_accepted_commit_has_no_refusal_and_other_errors_no_details(
        coordinator: CoordinatorFactory) -> None:
    async def scenario() -> None:
        async with coordinator(CONFIG, np.zeros(DIM, np.float32)) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            joined = await stub.Join(pb.JoinRequest(client_name="a", num_examples=10), timeout=5)
            reply = await stub.GetTask(pb.GetTaskRequest(client_id=joined.client_id), timeout=5)
            task = from_proto(reply.task)
            accepted = await stub.Commit(to_proto(commit_of(joined.client_id, task, "u1")),
                                         timeout=10)
            assert accepted.refusal == pb.REFUSAL_REASON_UNSPECIFIED
            assert accepted.refusal_detail == ""
            with pytest.raises(grpc.aio.AioRpcError) as unknown:  # not a refused update
                await stub.Heartbeat(pb.HeartbeatRequest(client_id="nobody"), timeout=5)
            assert refusal_from_call(unknown.value) is None

    run_async(scenario())
