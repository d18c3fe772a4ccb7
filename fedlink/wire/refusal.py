"""A refusal's code on the wire: a ``CommitReply`` with ``refusal`` set, in the status details.

A refused commit (or a transfer refused for one of ``RefusalCode``'s reasons) still fails with
its gRPC status code and readable detail; the coordinator adds a ``google.rpc.Status`` in the
``grpc-status-details-bin`` trailer (the gRPC rich-status convention, ``grpcio-status``) whose
``details`` hold a ``fedlink.v1.CommitReply`` with ``refusal`` and ``refusal_detail`` set. A
client that reads it acts on the code; one that does not still has the status and its text.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import Message

from fedlink.errors import RemoteError, UpdateRefused
from fedlink.messages import CommitReply
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.refusals import RefusalCode
from fedlink.wire.convert import from_proto, to_proto
from fedlink.wire.status import rich_status, status_detail


def refusal_reply(err: RemoteError) -> CommitReply:
    """The ``CommitReply`` that says why ``err`` refused an update."""
    return CommitReply(upload_id="", model_version=0, staleness=0, refusal=err.refusal,
                       refusal_detail=err.detail)


def refusal_details(err: RemoteError, call: str) -> list[Message]:
    """The status details that carry ``err``'s refusal code: for a refused ``Commit``, or an
    ``UpdateRefused`` of any call; none when the error has no refusal code."""
    if err.refusal is RefusalCode.NONE:
        return []
    if call != "Commit" and not isinstance(err, UpdateRefused):
        return []
    return [to_proto(refusal_reply(err))]


def refusal_bytes(err: RemoteError, call: str) -> int:
    """The bytes a refused ``call`` answers with: its status text and the rich status its
    trailers carry (what virtual mode moves down the link, as it does a reply)."""
    status = rich_status(err.code, err.detail, refusal_details(err, call), err.retry_after_s)
    return len(err.detail.encode()) + sum(len(value) for _, value in status.trailing_metadata)


def refusal_from_call(call: Any) -> RefusalCode | None:
    """The refusal code a failed call (``grpc.aio.AioRpcError``) carried in its status
    details, or None: no trusted rich status, or no ``CommitReply`` among its details
    (``fedlink.wire.status.status_detail``)."""
    reply = status_detail(call, pb.CommitReply)
    if reply is None:
        return None
    refusal: RefusalCode = from_proto(reply).refusal
    return refusal
