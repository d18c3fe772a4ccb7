"""Refusal codes: the domain enum, its protobuf twin, and the status details that carry it."""

from __future__ import annotations

import pytest
from grpc_status import rpc_status

from fedlink.errors import (
    DataLoss,
    InvalidArgument,
    NotFound,
    RemoteError,
    UpdateRefused,
    UploadIncomplete,
    remote_error,
)
from fedlink.messages import CommitReply
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.refusals import RefusalCode, refusal_code
from fedlink.wire import from_proto, to_proto
from fedlink.wire.convert import refusal_from_proto, refusal_to_proto
from fedlink.wire.refusal import refusal_details, refusal_from_call
from fedlink.wire.status import rich_status


def test_every_code_has_its_protobuf_value_and_back() -> None:
    numbers = {refusal_to_proto(code) for code in RefusalCode}
    assert numbers == set(pb.RefusalReason.values())  # one to one, nothing left out
    for code in RefusalCode:
        assert refusal_from_proto(refusal_to_proto(code)) is code
    assert refusal_to_proto(RefusalCode.NONE) == pb.REFUSAL_REASON_UNSPECIFIED
    assert refusal_from_proto(999) is RefusalCode.NONE  # a newer coordinator's reason


@pytest.mark.parametrize("code", list(RefusalCode))
def test_a_commit_reply_round_trips_with_its_refusal(code: RefusalCode) -> None:
    reply = CommitReply("u1", 3, 1, accepted_version=2, flushed_version=3, refusal=code,
                        refusal_detail="why")
    assert from_proto(to_proto(reply)) == reply


def test_accepted_version_zero_is_told_from_not_set() -> None:
    zero = to_proto(CommitReply("u1", 1, 0, accepted_version=0, flushed_version=1))
    unset = to_proto(CommitReply("u1", 0, 0, refusal=RefusalCode.TOO_STALE))
    assert zero.HasField("accepted_version") and not unset.HasField("accepted_version")
    assert from_proto(zero).accepted_version == 0
    assert from_proto(unset).accepted_version is None
    # a 1.0 reader sees the same bytes as before for a non-zero version
    assert pb.CommitReply.FromString(to_proto(CommitReply("u", 2, 0, 2)).SerializeToString()
                                     ).accepted_version == 2


def test_a_reply_read_back_from_json_gets_its_code_back() -> None:
    assert CommitReply("u", 1, 0, refusal="too_stale").refusal is RefusalCode.TOO_STALE  # type: ignore[arg-type]
    assert refusal_code("no_such_code") is RefusalCode.NONE


def test_errors_carry_their_code_through_a_copy_and_a_status_round_trip() -> None:
    stale = UpdateRefused("too stale: ...", RefusalCode.TOO_STALE)
    assert stale.again().reason is RefusalCode.TOO_STALE and stale.again() is not stale
    assert UploadIncomplete("3 of 4 bytes").refusal is RefusalCode.UPLOAD_INCOMPLETE
    assert UpdateRefused("no reason given").refusal is RefusalCode.NONE
    assert InvalidArgument("bad shape").refusal is RefusalCode.INVALID_UPDATE
    assert DataLoss("checksum").refusal is RefusalCode.CORRUPT_UPDATE
    again = remote_error("FAILED_PRECONDITION", "too stale", reason=RefusalCode.TOO_STALE)
    assert isinstance(again, UpdateRefused) and again.reason is RefusalCode.TOO_STALE
    early = remote_error("FAILED_PRECONDITION", "3 of 4", reason=RefusalCode.UPLOAD_INCOMPLETE)
    assert isinstance(early, UploadIncomplete)


class FailedCall:
    """What ``rpc_status.from_call`` reads of a failed call."""

    def __init__(self, status: object) -> None:
        self._status = status

    def code(self) -> object:
        return self._status.code  # type: ignore[attr-defined]

    def details(self) -> str:
        return self._status.details  # type: ignore[attr-defined, no-any-return]

    def trailing_metadata(self) -> object:
        return self._status.trailing_metadata  # type: ignore[attr-defined]


def test_the_refusal_rides_in_the_status_details_of_a_commit() -> None:
    err = UpdateRefused("too stale: trained on version 0", RefusalCode.TOO_STALE)
    details = refusal_details(err, "Commit")
    status = rich_status(err.code, err.detail, details)
    assert status.details == err.detail  # the readable detail is the status message
    assert refusal_from_call(FailedCall(status)) is RefusalCode.TOO_STALE
    (packed,) = rpc_status.from_call(FailedCall(status)).details  # type: ignore[union-attr]
    reply = pb.CommitReply()
    packed.Unpack(reply)
    assert reply.refusal_detail == err.detail


def test_which_errors_carry_a_code() -> None:
    assert refusal_details(InvalidArgument("bad"), "Commit")  # a refused update
    assert not refusal_details(InvalidArgument("bad"), "Join")  # not an update
    assert refusal_details(UpdateRefused("closed", RefusalCode.TASK_CLOSED), "Download")
    assert not refusal_details(RemoteError("?"), "Commit")  # no code to give
    assert not refusal_details(NotFound("x"), "Heartbeat")


def test_a_status_without_details_or_not_matching_the_call_gives_no_code() -> None:
    plain = rich_status("FAILED_PRECONDITION", "too stale", [])
    assert refusal_from_call(FailedCall(plain)) is None
    forged = rich_status("FAILED_PRECONDITION", "too stale",
                         refusal_details(UpdateRefused("x", RefusalCode.RUN_OVER), "Commit"))

    class Mismatched(FailedCall):
        def details(self) -> str:
            return "another message"

    assert refusal_from_call(Mismatched(forged)) is None
