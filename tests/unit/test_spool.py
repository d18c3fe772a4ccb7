"""The durable upload spool: bytes are fsynced before they are reported, survive a restart,
and a stream cut by the network keeps what arrived."""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import CoordinatorFactory, run_async, target_of, wait_until

from fedlink.coordinator import CoordinatorConfig, CoordinatorService
from fedlink.coordinator.uploads import UploadStore
from fedlink.errors import InvalidArgument, Unavailable
from fedlink.messages import CommitReply, JoinRequest, UploadChunk, UploadStatusRequest
from fedlink.metrics import EventLog
from fedlink.proto.v1 import coordinator_pb2 as pb
from fedlink.proto.v1 import coordinator_pb2_grpc as pb_grpc

pytestmark = pytest.mark.timeout(60)

DATA = bytes(range(256)) * 8  # 2048 bytes
CHUNK = 256


class FsyncLog:
    """Counts calls of ``os.fsync`` on files and on folders (and still makes them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.files = 0
        self.folders = 0
        self._real = os.fsync
        monkeypatch.setattr(os, "fsync", self)

    def __call__(self, fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            self.folders += 1
        else:
            self.files += 1
        self._real(fd)


def file_store(state_dir: Path) -> UploadStore:
    return UploadStore(max_update_bytes=1 << 20, max_chunk_bytes=1024, state_dir=state_dir)


def spool_files(state_dir: Path) -> list[Path]:
    return sorted((state_dir / "uploads").glob("*/*.spool"))


# -- the store ----------------------------------------------------------------------------------

def test_received_bytes_are_reported_only_once_fsynced(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fsyncs = FsyncLog(monkeypatch)
    store = file_store(tmp_path)
    for offset in range(0, 768, CHUNK):
        session = store.write("c1", "up-1", offset, DATA[offset:offset + CHUNK])
    assert session.received == 768
    assert store.status("c1", "up-1") == 0 and session.committed_offset == 0
    assert store.needs_sync("c1", "up-1") and fsyncs.files == 0

    assert store.sync("c1", "up-1") == 768
    assert fsyncs.files == 1 and fsyncs.folders >= 1  # the file, and its new folder entry
    assert store.status("c1", "up-1") == 768 and not store.needs_sync("c1", "up-1")
    store.sync("c1", "up-1")
    assert fsyncs.files == 1  # nothing new: no fsync
    (path,) = spool_files(tmp_path)
    assert path.read_bytes() == DATA[:768]
    assert path.parent.name == "c1" and path.name == "up-1.spool"


def test_reopened_store_reports_the_same_offset_and_resumes(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.write("c1", "up-1", 0, DATA[:1000])
    store.sync("c1", "up-1")
    store.write("c9", "up-9", 0, DATA[:10])
    store.sync("c9", "up-9")
    store.close()

    restarted = file_store(tmp_path)  # a new coordinator process on the same state_dir
    assert restarted.status("c1", "up-1") == 1000
    assert restarted.status("c9", "up-9") == 10
    # the client resumes from what the coordinator reported (replaying some bytes)
    restarted.write("c1", "up-1", 900, DATA[900:1024])
    restarted.write("c1", "up-1", 1024, DATA[1024:])
    restarted.sync("c1", "up-1")
    assert restarted.get("c1", "up-1").data == DATA
    # scoping survives the restart too: c9's "up-1" is not c1's
    assert restarted.status("c9", "up-1") == 0


def test_bytes_past_the_last_fsync_survive_a_process_crash(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.write("c1", "up-1", 0, DATA[:300])
    store.sync("c1", "up-1")
    store.write("c1", "up-1", 300, DATA[300:500])  # received, not yet fsynced: "crash" now
    restarted = file_store(tmp_path)
    # the kernel still had them: the reopened spool fsyncs and reports all that is there
    assert restarted.status("c1", "up-1") == 500
    assert restarted.get("c1", "up-1").data == DATA[:500]


def test_settle_deletes_the_spool_and_remembers_the_size(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    store.write("c1", "up-1", 0, DATA[:100])
    store.sync("c1", "up-1")
    store.settle("c1", "up-1", CommitReply("up-1", 1, 0))
    assert spool_files(tmp_path) == []
    assert store.status("c1", "up-1") == 100
    with pytest.raises(InvalidArgument, match="already committed"):
        store.write("c1", "up-1", 100, DATA[100:200])


def test_odd_names_are_refused_or_ignored(tmp_path: Path) -> None:
    store = file_store(tmp_path)
    with pytest.raises(InvalidArgument, match="client_id"):
        store.write("../evil", "up-1", 0, b"x")
    with pytest.raises(InvalidArgument, match="upload_id"):
        store.write("c1", "..", 0, b"x")
    stray = tmp_path / "uploads" / "c1" / "not a spool.spool"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_bytes(b"junk")
    assert file_store(tmp_path).status("c1", "up-1") == 0  # ignored, not adopted


def test_failed_write_is_unavailable_and_undone(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    store = file_store(tmp_path)
    store.write("c1", "up-1", 0, DATA[:100])
    real_write = os.write

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data)[:10])  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(Unavailable, match="could not store the chunk"):
        store.write("c1", "up-1", 100, DATA[100:200])
    monkeypatch.setattr(os, "write", real_write)
    store.write("c1", "up-1", 100, DATA[100:200])
    store.sync("c1", "up-1")
    assert store.get("c1", "up-1").data == DATA[:200]


def test_memory_store_needs_no_sync() -> None:
    store = UploadStore(max_update_bytes=1 << 20, max_chunk_bytes=1024)
    store.write("c1", "up-1", 0, DATA[:100])
    assert store.status("c1", "up-1") == 100 and not store.needs_sync("c1", "up-1")
    assert store.sync("c1", "up-1") == 100


# -- the Upload call ----------------------------------------------------------------------------

def service_with_client(state_dir: Path) -> tuple[CoordinatorService, str]:
    config = CoordinatorConfig(state_dir=str(state_dir))
    service = CoordinatorService(config, np.zeros(4, np.float32), EventLog(None))
    joined = run_async(service.join(JoinRequest("a")))
    return service, joined.client_id


def chunks(client_id: str, stop_after: int | None = None,
           cut: BaseException | None = None) -> AsyncIterator[UploadChunk]:
    async def gen() -> AsyncIterator[UploadChunk]:
        for i, offset in enumerate(range(0, len(DATA), CHUNK)):
            if stop_after is not None and i == stop_after:
                assert cut is not None
                raise cut
            yield UploadChunk(client_id, "up-1", offset, DATA[offset:offset + CHUNK])

    return gen()


def test_upload_call_fsyncs_once_per_stream_before_replying(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service, client_id = service_with_client(tmp_path)
    fsyncs = FsyncLog(monkeypatch)
    reply = run_async(service.upload(chunks(client_id)))
    assert reply.committed_offset == len(DATA)
    assert fsyncs.files == 1  # once for the whole stream of 8 chunks
    assert spool_files(tmp_path)[0].read_bytes() == DATA


@pytest.mark.parametrize("cut", [ConnectionResetError("peer reset"), asyncio.CancelledError()],
                         ids=["error", "cancelled"])
def test_cut_stream_keeps_and_fsyncs_what_arrived(tmp_path: Path, cut: BaseException) -> None:
    service, client_id = service_with_client(tmp_path)
    with pytest.raises(type(cut)):
        run_async(service.upload(chunks(client_id, stop_after=3, cut=cut)))
    status = run_async(service.upload_status(UploadStatusRequest(client_id, "up-1")))
    assert status.committed_offset == 3 * CHUNK
    assert spool_files(tmp_path)[0].stat().st_size == 3 * CHUNK


def test_stream_cut_by_a_real_grpc_cancel_keeps_what_arrived(
        coordinator: CoordinatorFactory, tmp_path: Path) -> None:
    """A client whose connection dies mid-stream finds the bytes that arrived on reconnect."""
    config = CoordinatorConfig(state_dir=str(tmp_path))

    async def main() -> None:
        async with coordinator(config, np.zeros(4, np.float32)) as server, \
                grpc.aio.insecure_channel(target_of(server)) as channel:
            stub = pb_grpc.CoordinatorStub(channel)
            joined = await stub.Join(pb.JoinRequest(client_name="a"), timeout=5)
            hold = asyncio.Event()

            async def three_then_hang() -> AsyncIterator[pb.UploadChunk]:
                for offset in range(0, 3 * CHUNK, CHUNK):
                    yield pb.UploadChunk(client_id=joined.client_id, upload_id="up-1",
                                         offset=offset, data=DATA[offset:offset + CHUNK])
                await hold.wait()

            call = stub.Upload(three_then_hang())
            uploads = server.service.uploads
            await wait_until(lambda: (joined.client_id, "up-1") in uploads._sessions
                             and uploads.get(joined.client_id, "up-1").received == 3 * CHUNK,
                             10, "three chunks received")
            call.cancel()  # what a reset looks like to the server
            status = pb.UploadStatusRequest(client_id=joined.client_id, upload_id="up-1")
            await wait_until(lambda: not uploads.needs_sync(joined.client_id, "up-1"), 10,
                             "the fsync")
            reply = await stub.UploadStatus(status, timeout=5)
            assert reply.committed_offset == 3 * CHUNK

    run_async(main())
