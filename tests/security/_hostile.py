"""What the security tests share: a raw-gRPC client that can say anything, and a few probes.

A hostile client does not use the SDK: it speaks ``fedlink.v1`` directly and lies where it
likes. ``Raw`` wraps a stub with the handful of calls the tests need; every helper answers the
gRPC error rather than raising it, so a test reads as "the coordinator said X".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
import numpy as np

from fedlink.compress import get_codec
from fedlink.messages import CommitRequest, TensorHeader
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import Payload, pack, to_proto
from fedlink.wire.status import retry_delay

FP32 = get_codec("fp32")
TIMEOUT = 10.0


@dataclass
class Answer:
    """A call's outcome: ``code`` is ``OK`` or the status name; ``reply`` on success."""

    code: str
    detail: str = ""
    reply: object = None
    trailing: tuple[tuple[str, str], ...] = ()
    retry_delay: float | None = None
    """The ``google.rpc.RetryInfo`` delay of a refusal, in seconds (``None``: none sent)."""


async def answer_of(call: object) -> Answer:
    """Await a unary call and describe how it ended."""
    try:
        reply = await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as err:
        trailing = tuple((k, str(v)) for k, v in (err.trailing_metadata() or ()))
        return Answer(err.code().name, err.details() or "", None, trailing, retry_delay(err))
    return Answer("OK", "", reply)


class Raw:
    """A hostile client on one channel: calls with whatever fields it likes."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.stub = pb_grpc.CoordinatorStub(channel)

    async def join(self, name: str = "x", examples: int = 10, token: str = "",
                   metadata: Iterable[tuple[str, str]] = ()) -> Answer:
        """``Join``; ``reply.client_id`` on success."""
        request = pb.JoinRequest(client_name=name, num_examples=examples, token=token,
                                 metadata=dict(metadata))
        return await answer_of(self.stub.Join(request, timeout=TIMEOUT))

    async def client(self, name: str = "x", examples: int = 10, token: str = "") -> str:
        """A joined client id (the join must succeed)."""
        answer = await self.join(name, examples, token)
        assert answer.code == "OK", answer
        return str(answer.reply.client_id)  # type: ignore[attr-defined]

    async def task(self, client_id: str) -> pb.Task:
        """The client's task (it must get one)."""
        reply = await self.stub.GetTask(pb.GetTaskRequest(client_id=client_id,
                                                          held_version=-1), timeout=TIMEOUT)
        assert reply.HasField("task"), reply
        return reply.task

    async def upload(self, client_id: str, upload_id: str, data: bytes,
                     offset: int = 0) -> Answer:
        """One ``Upload`` stream of one chunk."""
        chunk = pb.UploadChunk(client_id=client_id, upload_id=upload_id, offset=offset,
                               data=data)
        return await answer_of(self.stub.Upload(iter([chunk]), timeout=TIMEOUT))

    async def commit(self, client_id: str, task: pb.Task, payload: Payload, examples: int,
                     upload_id: str, header: TensorHeader | None = None,
                     inline: bool = False) -> Answer:
        """``Commit`` an update (inline, or after an ``Upload`` of its bytes)."""
        if not inline:
            sent = await self.upload(client_id, upload_id, payload.data)
            if sent.code != "OK":
                return sent
        request = CommitRequest(
            client_id=client_id, upload_id=upload_id, task_id=task.task_id,
            base_version=task.model_version, num_examples=examples, steps_completed=1,
            steps_planned=1, update=header or payload.header,
            update_data=payload.data if inline else b"")
        return await answer_of(self.stub.Commit(to_proto(request), timeout=TIMEOUT))

    async def deliver(self, delta: np.ndarray, name: str = "x", examples: int = 10,
                      claimed: int | None = None) -> Answer:
        """Join, take a task and commit ``delta`` claiming ``claimed`` examples."""
        client_id = await self.client(name, examples)
        task = await self.task(client_id)
        return await self.commit(client_id, task, pack(delta, FP32),
                                 examples if claimed is None else claimed,
                                 f"{name}-up", inline=True)


def open_fds(suffix: str = "") -> list[str]:
    """What this process's descriptors point at (those ending in ``suffix``)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(suffix):
            targets.append(target)
    return targets


def events_of(server: object, kind: str) -> list[dict[str, object]]:
    """The events of ``kind`` a test coordinator logged (its ``EventLog`` in memory)."""
    return [e for e in server.events.events if e["kind"] == kind]  # type: ignore[attr-defined]


Delivery = tuple[str, np.ndarray, int]
"""One client of a flush: its name, its delta and the example count it declares (and claims)."""


def run_flushes(coordinator: object, config: object, initial: np.ndarray,
                flushes: list[list[Delivery]]) -> tuple[list[np.ndarray], object]:
    """Deliver each flush's updates in order, one raw client each (a new client per update);
    the model after each flush, and the server (for its events)."""
    from conftest import run_async

    async def scenario() -> tuple[list[np.ndarray], object]:
        async with coordinator(config, initial) as server:  # type: ignore[operator]
            models = []
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                raw = Raw(channel)
                for version, flush in enumerate(flushes):
                    for name, delta, declared in flush:
                        answer = await raw.deliver(delta, f"{name}-v{version}", declared)
                        assert answer.code == "OK", answer
                    models.append(server.service.engine.model.copy())
            await server.wait_finished()
            return models, server
    return run_async(scenario())


def step_norm(after: np.ndarray, before: np.ndarray) -> float:
    """``||after - before||`` in float64."""
    return float(np.linalg.norm(after.astype(np.float64) - before.astype(np.float64)))
