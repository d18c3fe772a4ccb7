"""``to_proto`` / ``from_proto``: the only conversion between protobuf and fedlink messages.

Each fedlink message in ``fedlink.messages`` pairs with one protobuf message of the same name;
fields convert by name. Repeated fields become tuples, maps become dicts, nested messages
convert recursively. ``GetTaskReply``'s ``oneof`` has its own pair of functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from fedlink import messages as m
from fedlink.errors import InvalidArgument
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.refusals import RefusalCode

_PAIRS: tuple[tuple[type, type[Message]], ...] = (
    (m.TensorHeader, pb.TensorHeader),
    (m.RunConfig, pb.RunConfig),
    (m.JoinRequest, pb.JoinRequest),
    (m.JoinReply, pb.JoinReply),
    (m.GetTaskRequest, pb.GetTaskRequest),
    (m.Task, pb.Task),
    (m.Wait, pb.Wait),
    (m.Finished, pb.Finished),
    (m.DownloadRequest, pb.DownloadRequest),
    (m.DataChunk, pb.DataChunk),
    (m.UploadChunk, pb.UploadChunk),
    (m.UploadReply, pb.UploadReply),
    (m.UploadStatusRequest, pb.UploadStatusRequest),
    (m.CommitRequest, pb.CommitRequest),
    (m.CommitReply, pb.CommitReply),
    (m.HeartbeatRequest, pb.HeartbeatRequest),
    (m.HeartbeatReply, pb.HeartbeatReply),
    (m.LeaveRequest, pb.LeaveRequest),
    (m.LeaveReply, pb.LeaveReply),
    (m.EvaluationReport, pb.EvaluationReport),
    (m.EvaluationAck, pb.EvaluationAck),
    (m.SecureSettings, pb.SecureSettings),
    (m.SecureMember, pb.SecureMember),
    (m.SecureAdvertiseRequest, pb.SecureAdvertiseRequest),
    (m.SecureAdvertiseReply, pb.SecureAdvertiseReply),
    (m.SecureShare, pb.SecureShare),
    (m.SecureShareRequest, pb.SecureShareRequest),
    (m.SecureShareReply, pb.SecureShareReply),
    (m.SecureMaskedRequest, pb.SecureMaskedRequest),
    (m.SecureMaskedReply, pb.SecureMaskedReply),
    (m.ShamirShare, pb.ShamirShare),
    (m.SecureUnmaskRequest, pb.SecureUnmaskRequest),
    (m.SecureUnmaskReply, pb.SecureUnmaskReply),
)
PROTO_OF: dict[type, type[Message]] = dict(_PAIRS)
DOMAIN_OF: dict[type[Message], type] = {proto: dom for dom, proto in _PAIRS}


def to_proto(obj: Any) -> Message:
    """The protobuf message for a fedlink message."""
    proto_cls = PROTO_OF.get(type(obj))
    if proto_cls is None:
        raise TypeError(f"no protobuf message for {type(obj).__name__}")
    return proto_cls(**{f.name: _value_to_proto(getattr(obj, f.name))
                        for f in dataclasses.fields(obj)})


def _value_to_proto(value: Any) -> Any:
    if isinstance(value, RefusalCode):
        return refusal_to_proto(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_proto(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):  # repeated: scalars, or messages converted one by one
        return [_value_to_proto(v) for v in value]
    return value


def from_proto(msg: Message) -> Any:
    """The fedlink message for a protobuf message."""
    domain_cls = DOMAIN_OF.get(type(msg))
    if domain_cls is None:
        raise TypeError(f"no fedlink message for {type(msg).__name__}")
    fields_by_name = msg.DESCRIPTOR.fields_by_name
    return domain_cls(**{f.name: _field_from_proto(msg, fields_by_name[f.name], f)
                         for f in dataclasses.fields(domain_cls)})


def _field_from_proto(msg: Message, descriptor: FieldDescriptor,
                      field: dataclasses.Field[Any]) -> Any:
    # A field with presence (a nested message, a proto3 ``optional`` scalar) whose fedlink
    # default is None and that is unset stays None: 0 and "not set" differ there.
    if (field.default is None and not descriptor.is_repeated and descriptor.has_presence
            and not msg.HasField(descriptor.name)):
        return None
    return _value_from_proto(descriptor, getattr(msg, descriptor.name))


def _value_from_proto(descriptor: FieldDescriptor, value: Any) -> Any:
    is_message = descriptor.type == FieldDescriptor.TYPE_MESSAGE
    if is_message and descriptor.message_type.GetOptions().map_entry:
        return dict(value)
    if descriptor.is_repeated:
        return tuple(from_proto(v) if is_message else v for v in value)
    if is_message:
        return from_proto(value)
    if descriptor.enum_type is pb.RefusalReason.DESCRIPTOR:
        return refusal_from_proto(value)
    if descriptor.enum_type is pb.TaskKind.DESCRIPTOR:
        return task_kind_from_proto(value)
    return value


def task_kind_from_proto(number: int) -> m.TaskKind:
    """The task kind of a ``fedlink.v1.TaskKind`` number (``InvalidArgument`` for a kind this
    version does not know: a coordinator sends only the kinds its client advertised)."""
    try:
        return m.TaskKind(number)
    except ValueError:
        raise InvalidArgument(f"unknown task kind {number}") from None


_PROTO_PREFIX = "REFUSAL_REASON_"


def refusal_to_proto(code: RefusalCode) -> int:
    """The ``fedlink.v1.RefusalReason`` number of a refusal code (``NONE``: UNSPECIFIED)."""
    name = "UNSPECIFIED" if code is RefusalCode.NONE else code.name
    return int(pb.RefusalReason.Value(_PROTO_PREFIX + name))


def refusal_from_proto(number: int) -> RefusalCode:
    """The refusal code of a ``fedlink.v1.RefusalReason`` number; ``NONE`` for UNSPECIFIED
    and for a number this version does not know (a newer coordinator's reason)."""
    try:
        name = pb.RefusalReason.Name(number).removeprefix(_PROTO_PREFIX)
    except ValueError:
        return RefusalCode.NONE
    return RefusalCode.__members__.get(name, RefusalCode.NONE)


def task_reply_to_proto(reply: m.TaskReply) -> pb.GetTaskReply:
    """Wrap a ``Task``, ``Wait`` or ``Finished`` in ``GetTaskReply``'s oneof."""
    slot = {m.Task: "task", m.Wait: "wait", m.Finished: "finished"}[type(reply)]
    return pb.GetTaskReply(**{slot: to_proto(reply)})


def task_reply_from_proto(msg: pb.GetTaskReply) -> m.TaskReply:
    """Unwrap ``GetTaskReply``'s oneof (``InvalidArgument`` when it is empty)."""
    slot = msg.WhichOneof("outcome")
    if slot is None:
        raise InvalidArgument("GetTaskReply carries neither a task, a wait nor a finish")
    result: m.TaskReply = from_proto(getattr(msg, slot))
    return result


def to_json(obj: Any) -> dict[str, Any]:
    """A fedlink message (``GetTaskReply``'s outcomes included) as proto3 JSON: lowerCamelCase
    names, int64 as strings, bytes as base64, default values omitted."""
    from google.protobuf import json_format  # deferred: slow to import, rarely needed

    proto = task_reply_to_proto(obj) if isinstance(obj, m.Task | m.Wait | m.Finished) \
        else to_proto(obj)
    result: dict[str, Any] = json_format.MessageToDict(proto)
    return result
