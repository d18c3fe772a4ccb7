"""The client's connection to a coordinator: fedlink messages in, fedlink messages out.

This is the client side's only grpc-aware module. It converts through ``fedlink.wire`` and
turns ``grpc.aio.AioRpcError`` into ``fedlink.errors.RemoteError`` subclasses, so the session
and user code never see a grpc type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from fedlink.errors import ConfigError, RemoteError, remote_error
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


RETRY_AFTER_KEY = "retry-after-ms"
"""Trailing metadata the coordinator sets on an overload refusal (milliseconds to wait)."""


def retry_after_hint(exc: grpc.aio.AioRpcError) -> float | None:
    """The coordinator's ``retry-after-ms`` hint in seconds, if the call carried a valid one."""
    for key, value in exc.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                ms = float(value)
            except (TypeError, ValueError):
                return None
            return ms / 1000.0 if 0 <= ms < float("inf") else None
    return None


def translate(exc: grpc.aio.AioRpcError) -> RemoteError:
    """The fedlink error for a failed gRPC call (with the retry-after hint, if any)."""
    code, detail = exc.code().name, exc.details() or exc.code().name
    if code == "INTERNAL" and detail == CORE_FAILURE:
        code = "UNAVAILABLE"
    return remote_error(code, detail, retry_after_hint(exc))


@dataclass(frozen=True)
class TLSOptions:
    """TLS to the coordinator: PEM file paths.

    ``ca_file``: the CA that signed the coordinator's certificate (empty: the system's trusted
    roots). ``cert_file`` + ``key_file``: this client's certificate and key, for a coordinator
    that requires mutual TLS (both or neither).
    """

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("tls: cert_file and key_file go together: set both or neither")

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files (``ConfigError`` if one is unreadable)."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "ca_file"),
            private_key=_read(self.key_file, "key_file"),
            certificate_chain=_read(self.cert_file, "cert_file"))


def _read(path: str, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"tls.{what} {path}: {exc.strerror}") from None


class Transport:
    """An open channel to one coordinator. Use ``async with Transport(target) as t``.

    ``tls``: connect over TLS (else plaintext). ``token``: sent as ``authorization: Bearer``
    metadata on every call, for a coordinator with per-client tokens.
    """

    def __init__(self, target: str, timeouts: Timeouts | None = None,
                 tls: TLSOptions | None = None, token: str = "") -> None:
        self.target = target
        self.timeouts = timeouts or Timeouts()
        options = client_channel_options()
        if tls is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self._channel = grpc.aio.secure_channel(target, tls.credentials(), options=options)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
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
            return await method(to_proto(request), timeout=timeout, metadata=self._metadata)
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
        call = self._stub.Download(to_proto(request), timeout=self.timeouts.transfer_s,
                                   metadata=self._metadata)
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
            reply = await self._stub.Upload(messages(), timeout=self.timeouts.transfer_s,
                                           metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise translate(exc) from None
        result: UploadReply = from_proto(reply)
        return result
