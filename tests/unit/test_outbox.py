"""The outbox: atomic, durable entries that survive a crash, and unreadable ones set aside."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from fedlink.client import DiskOutbox, MemoryOutbox, PendingUpdate
from fedlink.client.outbox import CORRUPT_SUFFIX, MAGIC, PENDING_DIR, open_outbox
from fedlink.compress import get_codec
from fedlink.wire import pack

pytestmark = pytest.mark.timeout(30)


def update(upload_id: str = "c1-t1-v0-abc", created_at: float = 100.0,
           size: int = 32) -> PendingUpdate:
    vector = np.linspace(-1, 1, size, dtype=np.float32)
    return PendingUpdate(
        target="127.0.0.1:5000", run_name="run", client_name="dev0", client_id="c1",
        upload_id=upload_id, task_id="t1-v0", base_version=0, num_examples=10,
        steps_completed=3, steps_planned=4, payload=pack(vector, get_codec("fp32")),
        metrics={"loss": 0.5}, created_at=created_at)


def entry_files(outbox: DiskOutbox) -> list[str]:
    return sorted(p.name for p in outbox.pending_dir.iterdir())


def test_put_then_pending_round_trips_every_field(tmp_path: Path) -> None:
    outbox = DiskOutbox(tmp_path)
    original = update()
    outbox.put(original)
    assert entry_files(outbox) == [f"{original.upload_id}.update"]
    (read,) = DiskOutbox(tmp_path).pending()  # a fresh process reading the same directory
    assert read == original
    assert read.payload.data == original.payload.data


def test_remove_deletes_the_entry_and_ignores_absent_ones(tmp_path: Path) -> None:
    outbox = DiskOutbox(tmp_path)
    outbox.put(update("a"))
    outbox.put(update("b"))
    outbox.remove("a")
    outbox.remove("a")
    outbox.remove("never-there")
    assert [u.upload_id for u in outbox.pending()] == ["b"]


def test_pending_is_oldest_first(tmp_path: Path) -> None:
    outbox = DiskOutbox(tmp_path)
    for name, created in (("zz", 1.0), ("aa", 3.0), ("mm", 2.0)):
        outbox.put(update(name, created_at=created))
    assert [u.upload_id for u in outbox.pending()] == ["zz", "mm", "aa"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fds")
def test_put_fsyncs_the_file_and_the_directory(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = DiskOutbox(tmp_path)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    outbox.put(update("x"))
    assert len(synced) == 2
    assert synced[0].endswith(".tmp")  # the data, before the rename makes it visible
    assert synced[1] == str(outbox.pending_dir)  # the rename itself


def test_a_write_that_fails_leaves_neither_entry_nor_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outbox = DiskOutbox(tmp_path)

    def crash(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        outbox.put(update("x"))
    assert entry_files(outbox) == []


def test_half_written_temporary_is_ignored_and_cleaned(tmp_path: Path) -> None:
    outbox = DiskOutbox(tmp_path)
    outbox.put(update("kept"))
    half = outbox.pending_dir / ".lost.update.k2j3h4.tmp"
    half.write_bytes(MAGIC + b'{"target": "127.0.0')  # a crash in the middle of a write
    reopened = DiskOutbox(tmp_path)
    assert not half.exists()
    assert [u.upload_id for u in reopened.pending()] == ["kept"]


@pytest.mark.parametrize("damage", ["truncated payload", "flipped byte", "no header end",
                                    "bad magic", "bad json", "missing field", "empty"])
def test_unreadable_entry_is_set_aside_and_logged(tmp_path: Path, damage: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    outbox = DiskOutbox(tmp_path)
    outbox.put(update("good", created_at=1.0))
    outbox.put(update("bad", created_at=2.0))
    path = outbox.pending_dir / "bad.update"
    blob = path.read_bytes()
    header_end = blob.index(b"\n", len(MAGIC))
    damaged = {
        "truncated payload": blob[:-10],
        "flipped byte": blob[:-1] + bytes([blob[-1] ^ 0xFF]),
        "no header end": blob[:header_end],
        "bad magic": b"X" + blob[1:],
        "bad json": MAGIC + b"{not json\n" + blob[header_end + 1:],
        "missing field": MAGIC + blob[len(MAGIC):header_end].replace(b'"task_id"', b'"x"')
                         + blob[header_end:],
        "empty": b"",
    }[damage]
    path.write_bytes(damaged)
    with caplog.at_level(logging.WARNING, logger="fedlink.client.outbox"):
        pending = outbox.pending()
    assert [u.upload_id for u in pending] == ["good"]
    assert entry_files(outbox) == ["bad.update" + CORRUPT_SUFFIX, "good.update"]
    assert any("bad.update" in r.getMessage() and "unreadable" in r.getMessage()
               for r in caplog.records)
    assert [u.upload_id for u in outbox.pending()] == ["good"]  # set aside once, not re-read


def test_other_client_state_at_the_top_level_is_left_alone(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{}")
    outbox = DiskOutbox(tmp_path)
    outbox.put(update("x"))
    outbox.remove("x")
    assert state.read_text() == "{}"
    assert (tmp_path / PENDING_DIR).is_dir()


@pytest.mark.parametrize("bad_id", ["", "../escape", ".hidden"])
def test_upload_ids_that_cannot_name_a_file_are_refused(tmp_path: Path, bad_id: str) -> None:
    with pytest.raises(ValueError, match="cannot name an outbox entry"):
        DiskOutbox(tmp_path).put(update(bad_id))


def test_commit_request_carries_the_stored_fields_and_merged_metrics() -> None:
    original = update()
    request = original.commit_request({"retries": 2.0, "loss": 0.25})
    assert (request.client_id, request.upload_id, request.task_id, request.base_version,
            request.num_examples, request.steps_completed, request.steps_planned) == (
        "c1", original.upload_id, "t1-v0", 0, 10, 3, 4)
    assert request.update == original.payload.header
    assert dict(request.metrics) == {"loss": 0.25, "retries": 2.0}


def test_memory_outbox_and_open_outbox(tmp_path: Path) -> None:
    memory = open_outbox(None)
    assert isinstance(memory, MemoryOutbox)
    memory.put(update("b", created_at=2.0))
    memory.put(update("a", created_at=1.0))
    memory.remove("b")
    memory.remove("b")
    assert [u.upload_id for u in memory.pending()] == ["a"]
    assert isinstance(open_outbox(tmp_path / "new" / "dir"), DiskOutbox)
    assert (tmp_path / "new" / "dir" / PENDING_DIR).is_dir()
