"""UploadStore: resumable chunked uploads, ownership, limits and remembered commit answers."""

from __future__ import annotations

import pytest

from fedlink.coordinator.uploads import UploadStore
from fedlink.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    UpdateRefused,
)
from fedlink.messages import CommitReply

DATA = bytes(range(256)) * 4  # 1024 bytes


@pytest.fixture
def store() -> UploadStore:
    return UploadStore(max_update_bytes=2048, max_chunk_bytes=300)


def test_chunks_in_order_assemble_the_payload(store: UploadStore) -> None:
    for offset in range(0, len(DATA), 300):
        session = store.write("c1", "up-1", offset, DATA[offset:offset + 300])
        assert session.committed_offset == min(offset + 300, len(DATA))
    assert bytes(store.get("c1", "up-1").data) == DATA
    assert store.status("c1", "up-1") == len(DATA)


def test_overlapping_replay_is_trimmed(store: UploadStore) -> None:
    store.write("c1", "up-1", 0, DATA[:200])
    # after a reconnect the client resends from an older offset: only the new bytes count
    session = store.write("c1", "up-1", 100, DATA[100:350])
    assert session.committed_offset == 350
    # a full duplicate changes nothing
    store.write("c1", "up-1", 0, DATA[:100])
    assert bytes(store.get("c1", "up-1").data) == DATA[:350]


def test_gap_is_invalid_argument_and_keeps_what_is_held(store: UploadStore) -> None:
    store.write("c1", "up-1", 0, DATA[:100])
    with pytest.raises(InvalidArgument, match=r"offset 200 leaves a gap.*holds 100 bytes"):
        store.write("c1", "up-1", 200, DATA[200:300])
    assert store.status("c1", "up-1") == 100


def test_gap_on_a_new_upload(store: UploadStore) -> None:
    with pytest.raises(InvalidArgument, match="gap"):
        store.write("c1", "up-new", 5, b"abc")


def test_chunk_limit_is_resource_exhausted(store: UploadStore) -> None:
    with pytest.raises(ResourceExhausted, match="301 bytes exceeds the limit of 300"):
        store.write("c1", "up-1", 0, b"x" * 301)
    assert store.status("c1", "up-1") == 0


def test_total_limit_is_resource_exhausted(store: UploadStore) -> None:
    for offset in range(0, 2048, 256):
        store.write("c1", "up-1", offset, b"y" * 256)
    assert store.status("c1", "up-1") == 2048
    with pytest.raises(ResourceExhausted, match="2048 bytes"):
        store.write("c1", "up-1", 2048, b"z")
    assert store.status("c1", "up-1") == 2048


def test_upload_ids_are_scoped_to_their_client(store: UploadStore) -> None:
    store.write("c1", "up-1", 0, DATA[:10])
    # c2's "up-1" is its own upload: it neither sees nor extends c1's bytes
    with pytest.raises(InvalidArgument, match="gap"):
        store.write("c2", "up-1", 10, DATA[10:20])
    assert store.status("c2", "up-1") == 0
    with pytest.raises(NotFound):
        store.get("c2", "up-1")
    store.write("c2", "up-1", 0, DATA[:3])
    assert store.status("c1", "up-1") == 10 and store.status("c2", "up-1") == 3
    assert store.get("c1", "up-1").data == DATA[:10]


@pytest.mark.parametrize("upload_id", ["", "has space", "slash/y", "é", "x" * 129])
def test_bad_upload_id_is_invalid_argument(store: UploadStore, upload_id: str) -> None:
    with pytest.raises(InvalidArgument, match="upload_id"):
        store.write("c1", upload_id, 0, b"abc")
    with pytest.raises(InvalidArgument, match="upload_id"):
        store.status("c1", upload_id)


def test_good_upload_ids(store: UploadStore) -> None:
    for upload_id in ("a", "c1-t3-v0-0123abcd", "A.b_c:d-9", "x" * 128):
        store.write("c1", upload_id, 0, b"abc")


def test_status_of_unknown_upload_is_zero_and_get_is_not_found(store: UploadStore) -> None:
    assert store.status("c1", "never") == 0
    with pytest.raises(NotFound, match="unknown upload id 'never'"):
        store.get("c1", "never")


def test_answers_are_remembered_and_bytes_freed(store: UploadStore) -> None:
    store.write("c1", "up-1", 0, DATA[:100])
    assert store.answer("c1", "up-1") is None
    reply = CommitReply("up-1", model_version=3, staleness=0)
    store.settle("c1", "up-1", reply)
    assert store.answer("c1", "up-1") == reply
    with pytest.raises(InvalidArgument, match="already committed"):
        store.write("c1", "up-1", 100, DATA[100:200])
    assert store.answer("c2", "up-1") is None  # another client's id: nothing of c1's


def test_refusals_are_remembered_too(store: UploadStore) -> None:
    store.write("c1", "up-2", 0, b"abc")
    refusal = UpdateRefused("too stale")
    store.settle("c1", "up-2", refusal)
    assert store.answer("c1", "up-2") is refusal


def test_committed_upload_reports_its_full_size_for_resuming_clients() -> None:
    store = UploadStore(max_update_bytes=1 << 20, max_chunk_bytes=1 << 16)
    store.write("c1", "up-1", 0, b"x" * 100)
    store.settle("c1", "up-1", CommitReply("up-1", 3, 0))

    assert store.status("c1", "up-1") == 100
    assert store.answer("c1", "up-1") == CommitReply("up-1", 3, 0)
    assert store.status("c2", "up-1") == 0
