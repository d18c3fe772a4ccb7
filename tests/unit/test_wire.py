"""fedlink.wire: protobuf conversion round trips, payload packing/verification, chunking."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedlink import messages as m
from fedlink.compress import get_codec
from fedlink.errors import DataLoss, InvalidArgument
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.wire import (
    checksum,
    from_proto,
    iter_chunks,
    pack,
    task_reply_from_proto,
    task_reply_to_proto,
    to_proto,
    unpack,
    values_checksum,
)

# -- strategies, by protobuf scalar type ----------------------------------------------------------

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
uint32 = st.integers(0, 2**32 - 1)
uint64 = st.integers(0, 2**64 - 1)
double = st.floats(allow_nan=False, allow_infinity=False)
text = st.text(max_size=20)
small_text_map = st.dictionaries(text, text, max_size=4)

header = st.builds(
    m.TensorHeader,
    encoding=text,
    shape=st.lists(int64, max_size=4).map(tuple),
    dtype=text,
    num_bytes=uint64,
    checksum=text,
    codec_params=small_text_map,
)
run_config = st.builds(
    m.RunConfig,
    run_name=text,
    num_parameters=int64,
    local_steps=int32,
    local_epochs=int32,
    batch_size=int32,
    learning_rate=double,
    chunk_bytes=uint32,
    heartbeat_interval_s=double,
    max_staleness=int32,
    accepted_encodings=st.lists(text, max_size=4).map(tuple),
    trainer_options=small_text_map,
    secure=st.none() | st.builds(m.SecureSettings, modulus_bits=uint32,
                                 quantization_bits=uint32, clip=double, max_clients=uint32,
                                 neighbours=uint32, threshold=double, phase_s=double),
)
secure_share = st.builds(m.SecureShare, sender=uint32, receiver=uint32,
                         ciphertext=st.binary(max_size=64))
shamir_share = st.builds(m.ShamirShare, owner=uint32, x=uint32, y=st.binary(max_size=32))
indices = st.lists(uint32, max_size=4).map(tuple)
task = st.builds(m.Task, task_id=text, model_version=int64, local_steps=int32,
                 local_epochs=int32, deadline_s=double, model=header,
                 delta=st.none() | header, delta_base_version=int64, options=small_text_map,
                 kind=st.sampled_from(m.TaskKind))
wait = st.builds(m.Wait, retry_after_s=double, reason=text)
finished = st.builds(m.Finished, reason=text)

STRATEGIES: dict[type, st.SearchStrategy[Any]] = {
    m.TensorHeader: header,
    m.RunConfig: run_config,
    m.JoinRequest: st.builds(m.JoinRequest, client_name=text, token=text, num_examples=int64,
                             metadata=small_text_map,
                             capabilities=st.lists(text, max_size=3).map(tuple)),
    m.JoinReply: st.builds(m.JoinReply, client_id=text, config=run_config),
    m.GetTaskRequest: st.builds(m.GetTaskRequest, client_id=text, held_version=int64),
    m.Task: task,
    m.Wait: wait,
    m.Finished: finished,
    m.DownloadRequest: st.builds(m.DownloadRequest, client_id=text, task_id=text,
                                 offset=uint64, max_chunk_bytes=uint32, delta=st.booleans(),
                                 end_offset=uint64),
    m.DataChunk: st.builds(m.DataChunk, offset=uint64, data=st.binary(max_size=64)),
    m.UploadChunk: st.builds(m.UploadChunk, client_id=text, upload_id=text, offset=uint64,
                             data=st.binary(max_size=64)),
    m.UploadReply: st.builds(m.UploadReply, upload_id=text, committed_offset=uint64),
    m.UploadStatusRequest: st.builds(m.UploadStatusRequest, client_id=text, upload_id=text),
    m.CommitRequest: st.builds(
        m.CommitRequest, client_id=text, upload_id=text, task_id=text, base_version=int64,
        num_examples=int64, steps_completed=int32, steps_planned=int32, update=header,
        metrics=st.dictionaries(text, double, max_size=4)),
    m.CommitReply: st.builds(m.CommitReply, upload_id=text, model_version=int64,
                             staleness=int32),
    m.HeartbeatRequest: st.builds(m.HeartbeatRequest, client_id=text, task_id=text),
    m.HeartbeatReply: st.builds(m.HeartbeatReply, model_version=int64, task_open=st.booleans()),
    m.LeaveRequest: st.builds(m.LeaveRequest, client_id=text, reason=text),
    m.LeaveReply: st.builds(m.LeaveReply),
    m.EvaluationReport: st.builds(m.EvaluationReport, client_id=text, task_id=text,
                                  model_version=int64, num_examples=int64,
                                  metrics=st.dictionaries(text, double, max_size=4)),
    m.EvaluationAck: st.builds(m.EvaluationAck, task_id=text, duplicate=st.booleans()),
    m.SecureSettings: st.builds(m.SecureSettings, modulus_bits=uint32, clip=double,
                                threshold=double, phase_s=double),
    m.SecureMember: st.builds(m.SecureMember, index=uint32, cipher_public=st.binary(max_size=32),
                              mask_public=st.binary(max_size=32)),
    m.SecureAdvertiseRequest: st.builds(m.SecureAdvertiseRequest, client_id=text, task_id=text,
                                        cipher_public=st.binary(max_size=32),
                                        mask_public=st.binary(max_size=32)),
    m.SecureAdvertiseReply: st.builds(
        m.SecureAdvertiseReply, index=uint32, round_id=int64, graph_seed=int64,
        members=st.lists(st.builds(m.SecureMember, index=uint32,
                                   cipher_public=st.binary(max_size=32),
                                   mask_public=st.binary(max_size=32)), max_size=3).map(tuple)),
    m.SecureShare: secure_share,
    m.SecureShareRequest: st.builds(m.SecureShareRequest, client_id=text, task_id=text,
                                    shares=st.lists(secure_share, max_size=3).map(tuple)),
    m.SecureShareReply: st.builds(m.SecureShareReply,
                                  shares=st.lists(secure_share, max_size=3).map(tuple)),
    m.SecureMaskedRequest: st.builds(m.SecureMaskedRequest, client_id=text, task_id=text,
                                     values=st.binary(max_size=64), num_values=uint32,
                                     num_examples=int64, steps_completed=int64,
                                     steps_planned=int64, upload_id=text),
    m.SecureMaskedReply: st.builds(m.SecureMaskedReply, survivors=indices, dropped=indices),
    m.ShamirShare: shamir_share,
    m.SecureUnmaskRequest: st.builds(m.SecureUnmaskRequest, client_id=text, task_id=text,
                                     seed_shares=st.lists(shamir_share, max_size=3).map(tuple),
                                     key_shares=st.lists(shamir_share, max_size=3).map(tuple)),
    m.SecureUnmaskReply: st.builds(m.SecureUnmaskReply, flushed_version=int64),
}


def test_every_message_type_has_a_strategy() -> None:
    """Adding a message to fedlink.messages without a round-trip strategy fails here."""
    message_types = {obj for _, obj in inspect.getmembers(m, inspect.isclass)
                     if dataclasses.is_dataclass(obj) and obj.__module__ == m.__name__}
    assert message_types == set(STRATEGIES)


@pytest.mark.parametrize("cls", list(STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    obj = data.draw(STRATEGIES[cls])
    proto = to_proto(obj)
    assert type(proto).__name__ == cls.__name__
    back = from_proto(proto)
    assert type(back) is cls
    assert back == obj
    # and through bytes, as it travels
    again = from_proto(type(proto).FromString(proto.SerializeToString()))
    assert again == obj


@settings(max_examples=30, deadline=None)
@given(reply=st.one_of(task, wait, finished))
def test_task_reply_oneof_round_trip(reply: m.TaskReply) -> None:
    proto = task_reply_to_proto(reply)
    expected_slot = {m.Task: "task", m.Wait: "wait", m.Finished: "finished"}[type(reply)]
    assert proto.WhichOneof("outcome") == expected_slot
    wire = pb.GetTaskReply.FromString(proto.SerializeToString())
    assert task_reply_from_proto(wire) == reply


def test_empty_task_reply_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="neither a task"):
        task_reply_from_proto(pb.GetTaskReply())


def test_default_finished_is_not_an_empty_oneof() -> None:
    """``Finished()`` has no set fields but must still occupy the oneof."""
    proto = task_reply_to_proto(m.Finished())
    wire = pb.GetTaskReply.FromString(proto.SerializeToString())
    assert task_reply_from_proto(wire) == m.Finished()


def test_task_kind_defaults_to_train_and_an_unknown_kind_is_refused() -> None:
    """A coordinator before 0.3 sends no kind: its tasks are training tasks."""
    old = pb.GetTaskReply(task=pb.Task(task_id="t1-v0", model=pb.TensorHeader()))
    assert task_reply_from_proto(old).kind is m.TaskKind.TRAIN
    newer = pb.GetTaskReply(task=pb.Task(task_id="t1-v0", model=pb.TensorHeader(), kind=7))
    with pytest.raises(InvalidArgument, match="unknown task kind 7"):
        task_reply_from_proto(newer)


def test_to_proto_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        to_proto(object())
    with pytest.raises(TypeError):
        from_proto(pb.GetTaskReply())


# -- payloads -------------------------------------------------------------------------------------

FP32 = get_codec("fp32")
finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=50, deadline=None)
@given(values=st.lists(finite_f32, min_size=0, max_size=200))
def test_pack_unpack_round_trip_is_exact(values: list[float]) -> None:
    vector = np.array(values, dtype=np.float32)
    payload = pack(vector, FP32)
    assert payload.header.shape == (vector.size,)
    assert payload.header.dtype == "float32"
    assert payload.header.num_bytes == len(payload.data)
    assert payload.header.checksum == checksum(payload.data)
    out = unpack(payload.header, payload.data, vector.size)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.view(np.uint32), vector.view(np.uint32))  # bit-exact


def test_pack_flattens_and_converts() -> None:
    payload = pack(np.arange(6, dtype=np.float64).reshape(2, 3), FP32)
    assert payload.header.shape == (6,)
    np.testing.assert_array_equal(unpack(payload.header, payload.data, 6),
                                  np.arange(6, dtype=np.float32))


def test_checksum_format() -> None:
    assert checksum(b"") == ("sha256:e3b0c44298fc1c149afbf4c8996fb924"
                             "27ae41e4649b934ca495991b7852b855")


@pytest.fixture
def good() -> tuple[m.TensorHeader, bytes]:
    payload = pack(np.linspace(-1, 1, 16, dtype=np.float32), FP32)
    return payload.header, payload.data


def test_checksum_mismatch_is_data_loss(good: tuple[m.TensorHeader, bytes]) -> None:
    hdr, data = good
    corrupted = bytes([data[0] ^ 0x01]) + data[1:]
    with pytest.raises(DataLoss, match="checksum mismatch"):
        unpack(hdr, corrupted, 16)


def test_wrong_size_is_invalid_argument(good: tuple[m.TensorHeader, bytes]) -> None:
    hdr, data = good
    with pytest.raises(InvalidArgument, match="bytes"):
        unpack(hdr, data[:-4], 16)


def test_wrong_shape_is_invalid_argument(good: tuple[m.TensorHeader, bytes]) -> None:
    hdr, data = good
    with pytest.raises(InvalidArgument, match=r"expected \[17\]"):
        unpack(hdr, data, 17)
    two_d = dataclasses.replace(hdr, shape=(4, 4))
    with pytest.raises(InvalidArgument, match="shape"):
        unpack(two_d, data, 16)


def test_wrong_dtype_is_invalid_argument(good: tuple[m.TensorHeader, bytes]) -> None:
    hdr, data = good
    with pytest.raises(InvalidArgument, match="float64"):
        unpack(dataclasses.replace(hdr, dtype="float64"), data, 16)


def test_unknown_encoding_is_invalid_argument(good: tuple[m.TensorHeader, bytes]) -> None:
    hdr, data = good
    with pytest.raises(InvalidArgument, match="unknown encoding 'zstd-magic'"):
        unpack(dataclasses.replace(hdr, encoding="zstd-magic"), data, 16)


def test_bad_checksum_algorithm_is_invalid_argument(good: tuple[m.TensorHeader, bytes]) -> None:
    hdr, data = good
    with pytest.raises(InvalidArgument, match="checksum"):
        unpack(dataclasses.replace(hdr, checksum="md5:abc"), data, 16)


def test_codec_length_mismatch_is_invalid_argument() -> None:
    """Header and checksum agree, but the bytes cannot hold the declared number of values."""
    data = b"\x00" * 10
    hdr = m.TensorHeader("fp32", (3,), "float32", len(data), checksum(data))
    with pytest.raises(InvalidArgument, match="12"):
        unpack(hdr, data, 3)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_values_are_invalid_argument(bad: float) -> None:
    vector = np.ones(8, dtype=np.float32)
    vector[3] = bad
    payload = pack(vector, FP32)  # a valid encoding of a bad vector
    with pytest.raises(InvalidArgument, match="non-finite"):
        unpack(payload.header, payload.data, 8)


def test_raw_fp32_values_checksum_is_the_bytes_checksum_and_still_checked(
        good: tuple[m.TensorHeader, bytes]) -> None:
    """fp32's bytes are its values: one hash serves both checksums, and a header whose
    values_checksum disagrees with its (correct) bytes checksum is still refused."""
    hdr, data = good
    assert hdr.values_checksum == hdr.checksum == values_checksum(
        np.frombuffer(data, dtype="<f4"))
    wrong = dataclasses.replace(hdr, values_checksum=checksum(b"other values"))
    with pytest.raises(DataLoss, match="values_checksum"):
        unpack(wrong, data, 16)


def test_other_codecs_keep_a_values_checksum_of_their_decoded_values() -> None:
    vector = np.linspace(-1, 1, 64, dtype=np.float32)
    for name in ("fp16", "fp32-zlib", "topk"):
        codec = get_codec(name)
        payload = pack(vector, codec)
        decoded = codec.decode(payload.data, payload.header.codec_params, vector.size)
        assert payload.header.values_checksum == values_checksum(decoded), name
        assert payload.header.checksum == checksum(payload.data), name


def test_unverified_unpack_skips_checksums_but_not_the_finite_check(
        good: tuple[m.TensorHeader, bytes]) -> None:
    """verify=False is for bytes packed in the same run (virtual mode): no hashing, but a
    non-finite update is refused as a real coordinator refuses it."""
    hdr, data = good
    stale = dataclasses.replace(hdr, checksum=checksum(b"x"), values_checksum=checksum(b"y"))
    np.testing.assert_array_equal(unpack(stale, data, 16, verify=False),
                                  unpack(hdr, data, 16))
    bad = np.ones(8, dtype=np.float32)
    bad[2] = np.nan
    payload = pack(bad, FP32)
    with pytest.raises(InvalidArgument, match="non-finite"):
        unpack(payload.header, payload.data, 8, verify=False)


# -- chunking -------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=300), chunk=st.integers(1, 64), offset_frac=st.floats(0, 1))
def test_iter_chunks_covers_data_exactly_from_offset(data: bytes, chunk: int,
                                                     offset_frac: float) -> None:
    offset = int(offset_frac * len(data))
    pieces = list(iter_chunks(data, chunk, offset))
    expected_pos = offset
    for pos, piece in pieces:
        assert pos == expected_pos
        assert 0 < len(piece) <= chunk
        expected_pos += len(piece)
    assert b"".join(p for _, p in pieces) == data[offset:]
    assert all(len(p) == chunk for _, p in pieces[:-1])


def test_iter_chunks_at_end_yields_nothing() -> None:
    assert list(iter_chunks(b"abc", 2, 3)) == []
    assert list(iter_chunks(b"", 2)) == []


def test_iter_chunks_rejects_non_positive_size() -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        list(iter_chunks(b"abc", 0))


@pytest.mark.parametrize("codec", ["fp32", "qsgd"])
def test_a_payload_packed_without_checksums_decodes_the_same_unverified(codec: str) -> None:
    """A virtual run's update crosses no wire: packed without checksums (both left empty),
    it decodes, unverified, to what the checksummed payload decodes to; a verifying receiver
    refuses it."""
    vector = np.random.default_rng(3).normal(size=50).astype(np.float32)
    full = pack(vector, get_codec(codec), np.random.default_rng(1))
    bare = pack(vector, get_codec(codec), np.random.default_rng(1), checksums=False)
    assert (bare.header.checksum, bare.header.values_checksum) == ("", "")
    assert bare.data == full.data
    assert np.array_equal(unpack(bare.header, bare.data, 50, verify=False),
                          unpack(full.header, full.data, 50))
    with pytest.raises(InvalidArgument, match="checksum"):
        unpack(bare.header, bare.data, 50)
