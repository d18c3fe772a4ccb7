"""The gRPC servicer: converts messages and status codes, nothing else.

Every call is handed to ``CoordinatorService``. A ``RemoteError`` becomes its status code and
detail; any other exception is logged with its traceback and answered ``INTERNAL`` with a short
message, so no Python traceback ever travels on the wire.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message

from fedlink.coordinator.probe import ProbeDesk
from fedlink.coordinator.service import CoordinatorService
from fedlink.errors import RemoteError
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc
from fedlink.wire import from_proto, task_reply_to_proto, to_proto
from fedlink.wire.refusal import refusal_details
from fedlink.wire.status import rich_status

log = logging.getLogger(__name__)

def _forget_frames(exc: BaseException) -> None:
    """Drop the tracebacks of ``exc`` and the exceptions chained to it.

    The handler's frame holds ``exc`` and ``exc``'s traceback holds the handler's frame (and
    every frame below, with the request in their locals): a reference cycle that only the
    garbage collector frees, which runs on counts of objects, not bytes. A burst of refused
    multi-megabyte requests was kept alive that way; with the frames forgotten, a refused
    request is freed as soon as its call ends.
    """
    seen: set[int] = set()
    pending: BaseException | None = exc
    while pending is not None and id(pending) not in seen:
        seen.add(id(pending))
        pending.__traceback__ = None
        pending = pending.__cause__ or pending.__context__


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, call: str) -> NoReturn:
    if isinstance(exc, RemoteError):
        _forget_frames(exc)
        details = refusal_details(exc, call)  # the refusal's code, beside status and text
        if details or exc.retry_after_s is not None:  # overload: RetryInfo says how long
            await context.abort_with_status(
                rich_status(exc.code, exc.detail, details, exc.retry_after_s))
        await context.abort(grpc.StatusCode[exc.code], exc.detail)
    log.exception("unexpected error in %s", call, exc_info=exc)
    _forget_frames(exc)
    await context.abort(grpc.StatusCode.INTERNAL,
                        f"internal error in {call}; the coordinator log has the details")
    raise AssertionError("unreachable")  # context.abort always raises


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """``fedlink.v1.Coordinator`` over ``grpc.aio``, delegating to a ``CoordinatorService``."""

    def __init__(self, service: CoordinatorService) -> None:
        self.service = service
        self.probes = ProbeDesk(service.config.netcheck, 4 * service.engine.num_parameters)

    async def _unary(self, context: grpc.aio.ServicerContext, call: str,
                     handler: Callable[[Any], Awaitable[Any]], request: Message,
                     convert: Callable[[Any], Message] = to_proto) -> Message:
        try:
            return convert(await handler(from_proto(request)))
        except Exception as exc:  # translated, never leaked
            await _abort(context, exc, call)

    async def Join(self, request: pb.JoinRequest, context: Any) -> Message:
        """See ``CoordinatorService.join``."""
        return await self._unary(context, "Join", self.service.join, request)

    async def GetTask(self, request: pb.GetTaskRequest, context: Any) -> Message:
        """See ``CoordinatorService.get_task``."""
        return await self._unary(context, "GetTask", self.service.get_task, request,
                                 task_reply_to_proto)

    async def UploadStatus(self, request: pb.UploadStatusRequest, context: Any) -> Message:
        """See ``CoordinatorService.upload_status``."""
        return await self._unary(context, "UploadStatus", self.service.upload_status, request)

    async def Commit(self, request: pb.CommitRequest, context: Any) -> Message:
        """See ``CoordinatorService.commit``."""
        return await self._unary(context, "Commit", self.service.commit, request)

    async def ReportEvaluation(self, request: pb.EvaluationReport, context: Any) -> Message:
        """See ``CoordinatorService.report_evaluation``."""
        return await self._unary(context, "ReportEvaluation", self.service.report_evaluation,
                                 request)

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> Message:
        """See ``CoordinatorService.heartbeat``."""
        return await self._unary(context, "Heartbeat", self.service.heartbeat, request)

    async def Leave(self, request: pb.LeaveRequest, context: Any) -> Message:
        """See ``CoordinatorService.leave``."""
        return await self._unary(context, "Leave", self.service.leave, request)

    async def SecureAdvertise(self, request: pb.SecureAdvertiseRequest,
                              context: Any) -> Message:
        """See ``SecureCalls.advertise``."""
        return await self._unary(context, "SecureAdvertise", self.service.secure_calls.advertise,
                                 request)

    async def SecureShare(self, request: pb.SecureShareRequest, context: Any) -> Message:
        """See ``SecureCalls.share``."""
        return await self._unary(context, "SecureShare", self.service.secure_calls.share, request)

    async def SecureMasked(self, request: pb.SecureMaskedRequest, context: Any) -> Message:
        """See ``SecureCalls.masked``."""
        return await self._unary(context, "SecureMasked", self.service.secure_calls.masked, request)

    async def SecureUnmask(self, request: pb.SecureUnmaskRequest, context: Any) -> Message:
        """See ``SecureCalls.unmask``."""
        return await self._unary(context, "SecureUnmask", self.service.secure_calls.unmask, request)

    async def Probe(self, request: pb.ProbeRequest, context: Any) -> Message:
        """See ``ProbeDesk.answer`` (``fedlink netcheck``)."""
        try:
            answer = self.probes.answer(len(request.payload), request.reply_bytes)
        except Exception as exc:
            await _abort(context, exc, "Probe")
        return pb.ProbeReply(payload=answer.payload, received_bytes=answer.received_bytes,
                             model_bytes=answer.model_bytes, max_bytes=answer.max_bytes)

    async def Download(self, request: pb.DownloadRequest,
                       context: Any) -> AsyncIterator[Message]:
        """See ``CoordinatorService.download``."""
        try:
            async for chunk in self.service.download(from_proto(request)):
                yield to_proto(chunk)
        except Exception as exc:
            await _abort(context, exc, "Download")

    async def Upload(self, request_iterator: AsyncIterator[pb.UploadChunk],
                     context: Any) -> Message:
        """See ``CoordinatorService.upload``."""

        async def chunks() -> AsyncIterator[Any]:
            async for message in request_iterator:
                yield from_proto(message)

        try:
            return to_proto(await self.service.upload(chunks()))
        except Exception as exc:
            await _abort(context, exc, "Upload")
