"""The client's connection to a coordinator: fedlink messages in, fedlink messages out.

This is the client side's only grpc-aware module. It converts through ``fedlink.wire`` and
turns ``grpc.aio.AioRpcError`` into ``fedlink.errors.RemoteError`` subclasses, so the session
and user code never see a grpc type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from fedlink.errors import RemoteError, remote_error
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    GetTaskRequest,
    HeartbeatReply,
    HeartbeatRequest,
    JoinReply,
    JoinRequest,
    LeaveReply,
    LeaveRequest,
    TaskReply,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import from_proto, task_reply_from_proto, to_proto
from fedlink.wire.options import client_channel_options


@dataclass(frozen=True)
class Timeouts:
    """Per-call deadlines in seconds (``GetTask`` adds the coordinator's long-poll time)."""

    unary_s: float = 30.0
    transfer_s: float = 600.0
    long_poll_s: float = 15.0


CORE_FAILURE = "Internal error from Core"
"""What gRPC's client core says (as ``INTERNAL``) when a connection reset breaks a call in
flight: a network failure, retried like ``UNAVAILABLE``, not a coordinator error."""


def translate(exc: grpc.aio.AioRpcError) -> RemoteError:
    """The fedlink error for a failed gRPC call."""
    code, detail = exc.code().name, exc.details() or exc.code().name
    if code == "INTERNAL" and detail == CORE_FAILURE:
        code = "UNAVAILABLE"
    return remote_error(code, detail)


class Transport:
    """An open channel to one coordinator. Use ``async with Transport(target) as t``."""

    def __init__(self, target: str, timeouts: Timeouts | None = None) -> None:
        self.target = target
        self.timeouts = timeouts or Timeouts()
        self._channel = grpc.aio.insecure_channel(target, options=client_channel_options())
        self._stub = pb_grpc.CoordinatorStub(self._channel)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, method: Any, request: Any, timeout: float) -> Any:
        try:
            return await method(to_proto(request), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc) from None

    async def join(self, request: JoinRequest) -> JoinReply:
        """Call ``Join``."""
        reply: JoinReply = from_proto(await self._unary(self._stub.Join, request,
                                                        self.timeouts.unary_s))
        return reply

    async def get_task(self, request: GetTaskRequest) -> TaskReply:
        """Call ``GetTask`` (long-polls on the coordinator)."""
        timeout = self.timeouts.unary_s + self.timeouts.long_poll_s
        return task_reply_from_proto(await self._unary(self._stub.GetTask, request, timeout))

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        """Call ``UploadStatus``."""
        reply: UploadReply = from_proto(await self._unary(self._stub.UploadStatus, request,
                                                          self.timeouts.unary_s))
        return reply

    async def commit(self, request: CommitRequest) -> CommitReply:
        """Call ``Commit``."""
        reply: CommitReply = from_proto(await self._unary(self._stub.Commit, request,
                                                          self.timeouts.unary_s))
        return reply

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        """Call ``Heartbeat``."""
        reply: HeartbeatReply = from_proto(await self._unary(self._stub.Heartbeat, request,
                                                             self.timeouts.unary_s))
        return reply

    async def leave(self, request: LeaveRequest) -> LeaveReply:
        """Call ``Leave``."""
        reply: LeaveReply = from_proto(await self._unary(self._stub.Leave, request,
                                                         self.timeouts.unary_s))
        return reply

    async def download(self, request: DownloadRequest) -> AsyncIterator[DataChunk]:
        """Stream ``Download``; chunks arrive as they come (an error may cut the stream)."""
        call = self._stub.Download(to_proto(request), timeout=self.timeouts.transfer_s)
        try:
            async for message in call:
                yield from_proto(message)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc) from None
        finally:
            call.cancel()

    async def upload(self, chunks: Iterable[UploadChunk]) -> UploadReply:
        """Stream ``Upload`` with ``chunks``; the reply says how many bytes are held."""

        async def messages() -> AsyncIterator[Any]:
            for chunk in chunks:
                yield to_proto(chunk)

        try:
            reply = await self._stub.Upload(messages(), timeout=self.timeouts.transfer_s)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc) from None
        result: UploadReply = from_proto(reply)
        return result
