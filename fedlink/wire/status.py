"""Rich gRPC status: the retry hint as ``google.rpc.RetryInfo``, the convention other gRPC
clients already read.

A refusal that may be retried after a while (overload: request rate, concurrent uploads,
connected clients, netcheck probes) carries a ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailer whose details hold one ``RetryInfo`` with the
``retry_delay``. ``grpcio-status`` (``grpc_status.rpc_status``) encodes and decodes that
trailer; this module is the one place that builds and reads it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

NANOS_PER_SECOND = 1_000_000_000
M = TypeVar("M", bound=Message)


def rich_status(code: str, detail: str, details: Sequence[Message] = (),
                retry_after_s: float | None = None) -> grpc.Status:
    """A ``grpc.Status`` for status code ``code`` (a ``grpc.StatusCode`` name) with ``detail``,
    ``details`` packed into its ``google.rpc.Status`` (a refusal's code,
    ``fedlink.wire.refusal``) and, when ``retry_after_s`` is given, a ``RetryInfo`` saying to
    wait that long (at least 1 ms: a zero delay would read as "retry at once")."""
    status = status_pb2.Status(code=grpc.StatusCode[code].value[0], message=detail)
    for message in details:
        status.details.add().Pack(message)
    if retry_after_s is not None:
        info = error_details_pb2.RetryInfo()
        info.retry_delay.FromNanoseconds(max(1_000_000, round(retry_after_s * NANOS_PER_SECOND)))
        status.details.add().Pack(info)
    return rpc_status.to_status(status)


def status_detail(call: Any, message_type: type[M]) -> M | None:
    """The first ``message_type`` among the rich-status details of a failed call
    (``grpc.aio.AioRpcError`` or a ``grpc.Call``), or ``None``: no rich status, one whose code
    or message does not match the call's own (so it is not trusted), or no such detail."""
    try:
        status = rpc_status.from_call(call)
    except (ValueError, TypeError):
        return None
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(message_type.DESCRIPTOR):
            message = message_type()
            detail.Unpack(message)
            return message
    return None


def retry_delay(call: Any) -> float | None:
    """The ``RetryInfo.retry_delay`` in seconds that a failed call carried (``None``: none
    that is trusted and usable, see ``status_detail``)."""
    info = status_detail(call, error_details_pb2.RetryInfo)
    if info is None:
        return None
    seconds = info.retry_delay.ToNanoseconds() / NANOS_PER_SECOND
    return seconds if 0 <= seconds < math.inf else None
