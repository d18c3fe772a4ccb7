"""The outbox: trained, encoded updates kept on disk until the coordinator has them.

A client writes each update to its outbox before uploading it, and removes it only once the
coordinator has committed it (or refused it for good). A client process that dies anywhere in
between finds the update there when it starts again with the same outbox directory, and delivers
it (see ``ClientSession``): the work it did is not lost, and because the entry keeps its upload
id, and commits are idempotent by upload id, it is not counted twice either.

Layout of an outbox directory (one client per directory)::

    <outbox_dir>/
        pending/<upload_id>.update    one pending update per file
        pending/.<name>.<random>.tmp  a write in progress (removed when the outbox is opened)
        pending/<name>.corrupt        an unreadable entry, set aside and logged

The top level is left for other client state that must survive a restart (compression error
feedback will live in ``<outbox_dir>/state.json``).

An entry file is written atomically (temporary file, fsync, rename, fsync of the directory), so
it is either complete or absent. Its format: the line ``FEDLINK-OUTBOX 1``, one line of JSON
with the commit fields and the payload header, then the payload bytes, which are verified
against the header's size and checksum when read back.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from fedlink.atomic import TEMP_SUFFIX, fsync_dir, write_atomic
from fedlink.messages import CommitRequest, TensorHeader
from fedlink.wire import Payload, checksum

log = logging.getLogger(__name__)

MAGIC = b"FEDLINK-OUTBOX 1\n"
PENDING_DIR = "pending"
SUFFIX = ".update"
CORRUPT_SUFFIX = ".corrupt"


@dataclass(frozen=True)
class PendingUpdate:
    """A trained, encoded update on its way to a coordinator, with everything its commit needs.

    ``client_id`` is the id the coordinator gave the client that trained it (the task and the
    upload belong to that id); ``target``, ``run_name`` and ``client_name`` say which
    coordinator, run and client it is for; ``created_at`` is a wall-clock ``time.time()``.
    """

    target: str
    run_name: str
    client_name: str
    client_id: str
    upload_id: str
    task_id: str
    base_version: int
    num_examples: int
    steps_completed: int
    steps_planned: int
    payload: Payload
    metrics: Mapping[str, float] = field(default_factory=dict)
    created_at: float = 0.0

    def commit_request(self, extra_metrics: Mapping[str, float],
                       inline: bool = False) -> CommitRequest:
        """The ``Commit`` for this update; ``extra_metrics`` join the trainer's metrics.

        ``inline`` carries the payload in the request itself (no ``Upload``).
        """
        return CommitRequest(
            client_id=self.client_id, upload_id=self.upload_id, task_id=self.task_id,
            base_version=self.base_version, num_examples=self.num_examples,
            steps_completed=self.steps_completed, steps_planned=self.steps_planned,
            update=self.payload.header, metrics={**self.metrics, **extra_metrics},
            update_data=self.payload.data if inline else b"")


class Outbox(Protocol):
    """Where pending updates wait until they are delivered.

    ``blocks``: whether its calls wait on the disk, so that the session runs them off the
    event loop (an outbox without the attribute is taken to block).
    """

    blocks: bool

    def put(self, update: PendingUpdate) -> None:
        """Keep ``update`` (durably, where the outbox is on disk) before it is uploaded."""
        ...

    def pending(self) -> list[PendingUpdate]:
        """The updates kept, oldest first."""
        ...

    def remove(self, upload_id: str) -> None:
        """Forget the update ``upload_id`` (committed or refused for good); no error if absent."""
        ...


class MemoryOutbox:
    """An outbox that lives as long as the process: nothing survives a restart."""

    blocks = False

    def __init__(self) -> None:
        self._updates: dict[str, PendingUpdate] = {}

    def put(self, update: PendingUpdate) -> None:
        """Keep ``update``."""
        self._updates[update.upload_id] = update

    def pending(self) -> list[PendingUpdate]:
        """The updates kept, oldest first."""
        return sorted(self._updates.values(), key=lambda u: u.created_at)

    def remove(self, upload_id: str) -> None:
        """Forget ``upload_id``."""
        self._updates.pop(upload_id, None)


class DiskOutbox:
    """An outbox directory on disk (see the module docstring for its layout and format).

    Opening it removes temporary files left by a write that a crash interrupted.
    """

    blocks = True

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.pending_dir = self.directory / PENDING_DIR
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self._remove_temporaries()

    def put(self, update: PendingUpdate) -> None:
        """Write ``update`` atomically and durably."""
        write_atomic(self._path(update.upload_id), (MAGIC, _encode(update), b"\n",
                                                     update.payload.data))

    def pending(self) -> list[PendingUpdate]:
        """The updates kept, oldest first; unreadable entries are set aside and logged."""
        updates = []
        for path in sorted(self.pending_dir.glob(f"*{SUFFIX}")):
            try:
                updates.append(_read(path))
            except (OSError, ValueError) as exc:
                self._set_aside(path, exc)
        return sorted(updates, key=lambda u: u.created_at)

    def remove(self, upload_id: str) -> None:
        """Delete the entry of ``upload_id`` (durably)."""
        with contextlib.suppress(FileNotFoundError):
            self._path(upload_id).unlink()
            fsync_dir(self.pending_dir)

    def _path(self, upload_id: str) -> Path:
        if not upload_id or "/" in upload_id or upload_id.startswith("."):
            raise ValueError(f"upload id {upload_id!r} cannot name an outbox entry")
        return self.pending_dir / f"{upload_id}{SUFFIX}"

    def _remove_temporaries(self) -> None:
        for path in self.pending_dir.glob(f".*{TEMP_SUFFIX}"):
            log.info("outbox: removing %s, left by an interrupted write", path.name)
            path.unlink(missing_ok=True)

    def _set_aside(self, path: Path, exc: Exception) -> None:
        log.warning("outbox: entry %s is unreadable (%s); set aside as %s%s", path.name, exc,
                    path.name, CORRUPT_SUFFIX)
        path.replace(path.with_name(path.name + CORRUPT_SUFFIX))


def open_outbox(directory: Path | None) -> Outbox:
    """A ``DiskOutbox`` in ``directory``, or a ``MemoryOutbox`` when it is ``None``."""
    return MemoryOutbox() if directory is None else DiskOutbox(directory)


# -- the entry format ----------------------------------------------------------------------------


def _encode(update: PendingUpdate) -> bytes:
    header = update.payload.header
    record: dict[str, Any] = {
        "target": update.target, "run_name": update.run_name,
        "client_name": update.client_name, "client_id": update.client_id,
        "upload_id": update.upload_id, "task_id": update.task_id,
        "base_version": update.base_version, "num_examples": update.num_examples,
        "steps_completed": update.steps_completed, "steps_planned": update.steps_planned,
        "metrics": dict(update.metrics), "created_at": update.created_at,
        "header": {"encoding": header.encoding, "shape": list(header.shape),
                   "dtype": header.dtype, "num_bytes": header.num_bytes,
                   "checksum": header.checksum, "codec_params": dict(header.codec_params),
                   "values_checksum": header.values_checksum},
    }
    return json.dumps(record, separators=(",", ":")).encode()


def _read(path: Path) -> PendingUpdate:
    """The update in ``path`` (``ValueError`` when it is not a complete, intact entry)."""
    blob = path.read_bytes()
    if not blob.startswith(MAGIC):
        raise ValueError("not an outbox entry (bad first line)")
    line_end = blob.find(b"\n", len(MAGIC))
    if line_end < 0:
        raise ValueError("truncated before the end of its header")
    record = json.loads(blob[len(MAGIC):line_end])
    data = blob[line_end + 1:]
    try:
        update = _decode(record, data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed header: {exc!r}") from exc
    header = update.payload.header
    if len(data) != header.num_bytes or checksum(data) != header.checksum:
        raise ValueError(f"payload of {len(data)} bytes does not match its header "
                         f"({header.num_bytes} bytes, {header.checksum})")
    return update


def _decode(record: Mapping[str, Any], data: bytes) -> PendingUpdate:
    h = record["header"]
    header = TensorHeader(encoding=str(h["encoding"]), shape=tuple(int(n) for n in h["shape"]),
                          dtype=str(h["dtype"]), num_bytes=int(h["num_bytes"]),
                          checksum=str(h["checksum"]),
                          codec_params={str(k): str(v) for k, v in h["codec_params"].items()},
                          values_checksum=str(h.get("values_checksum", "")))  # "" before 0.2
    return PendingUpdate(
        target=str(record["target"]), run_name=str(record["run_name"]),
        client_name=str(record["client_name"]), client_id=str(record["client_id"]),
        upload_id=str(record["upload_id"]), task_id=str(record["task_id"]),
        base_version=int(record["base_version"]), num_examples=int(record["num_examples"]),
        steps_completed=int(record["steps_completed"]),
        steps_planned=int(record["steps_planned"]), payload=Payload(header, data),
        metrics={str(k): float(v) for k, v in record["metrics"].items()},
        created_at=float(record["created_at"]))
