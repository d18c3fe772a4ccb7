"""Where the bytes of uploads live while they arrive: in memory, or in fsynced spool files.

``UploadStore`` keeps one ``Spool`` per upload and never looks at how it stores its bytes. A
spool distinguishes bytes *received* (appended, ``size``) from bytes *durable* (``durable``):
the coordinator reports only durable bytes to clients, so what it has acknowledged survives a
crash of the coordinator process or of the machine.

``MemoryStorage`` holds bytes in a ``bytearray``; every byte is "durable" at once (nothing
survives a restart, which is the in-memory contract). ``FileStorage`` appends to
``<root>/<client_id>/<upload_id>.spool`` and makes bytes durable with ``fsync``. An fsync costs
milliseconds on a real disk, so callers batch: one ``sync`` per ``Upload`` call (at the end of
the stream, or where it was cut), not one per chunk.

After a crash, a spool file may hold bytes past its last fsync. They were appended in order,
so they are the upload's own bytes and are kept; should a power loss have left a torn tail,
the payload checksum verified at ``Commit`` refuses it (``DATA_LOSS``) rather than accept it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path

from fedlink.atomic import fsync_dir
from fedlink.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

SPOOL_SUFFIX = ".spool"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def check_name(value: str, what: str) -> None:
    """``InvalidArgument`` unless ``value`` is 1-128 characters of ``[A-Za-z0-9._:-]``."""
    if not _SAFE_NAME.match(value) or value in (".", ".."):
        raise InvalidArgument(f"{what} must be 1-128 characters of [A-Za-z0-9._:-]")


class Spool(ABC):
    """The bytes of one upload, contiguous from offset 0."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Bytes received (appended), durable or not."""

    @property
    @abstractmethod
    def durable(self) -> int:
        """Bytes that survive a crash; never more than ``size``."""

    @abstractmethod
    def append(self, data: bytes) -> None:
        """Append ``data`` (received, not yet durable)."""

    @abstractmethod
    def sync(self) -> int:
        """Make every appended byte durable; return ``durable``. Safe to call from a thread."""

    @abstractmethod
    def read(self) -> bytes:
        """The durable bytes."""

    @abstractmethod
    def close(self) -> None:
        """Release what the spool holds open (its bytes stay where they are)."""

    @abstractmethod
    def discard(self) -> None:
        """Delete the bytes for good (the upload was settled)."""


class SpoolStorage(ABC):
    """Makes spools for new uploads and finds those a previous process left behind."""

    @abstractmethod
    def create(self, client_id: str, upload_id: str) -> Spool:
        """An empty spool for a new upload."""

    @abstractmethod
    def reopen(self) -> Iterator[tuple[str, str, Spool]]:
        """``(client_id, upload_id, spool)`` for every spool that already exists."""


class MemorySpool(Spool):
    """Bytes in memory; all of them count as durable (nothing survives a restart anyway)."""

    def __init__(self) -> None:
        self._data = bytearray()

    @property
    def size(self) -> int:
        """Bytes held."""
        return len(self._data)

    @property
    def durable(self) -> int:
        """Same as ``size``."""
        return len(self._data)

    def append(self, data: bytes) -> None:
        """Append ``data``."""
        self._data += data

    def sync(self) -> int:
        """Nothing to do."""
        return len(self._data)

    def read(self) -> bytes:
        """A copy of the bytes."""
        return bytes(self._data)

    def close(self) -> None:
        """Nothing to release."""

    def discard(self) -> None:
        """Free the bytes."""
        self._data = bytearray()


class MemoryStorage(SpoolStorage):
    """In-memory spools: the coordinator's default, with no ``state_dir``."""

    def create(self, client_id: str, upload_id: str) -> Spool:
        """A fresh in-memory spool."""
        return MemorySpool()

    def reopen(self) -> Iterator[tuple[str, str, Spool]]:
        """Nothing outlives the process."""
        return iter(())


class FileSpool(Spool):
    """An append-only file; ``sync`` fsyncs it (and its folder entry, the first time).

    The file is opened for each operation and closed after it, never held: a coordinator with
    thousands of uploads in progress holds no descriptor for any of them between calls (one
    hostile client opening upload after upload would otherwise exhaust the process's
    descriptors and fail every honest call with ``EMFILE``).

    ``append`` runs on the event loop and only writes to the page cache; ``sync`` may run in a
    worker thread. A lock per spool orders them (it is contended only when two streams of the
    same upload overlap). The durable mark is set to the size seen *before* the fsync began,
    so it never covers a byte the fsync might have missed.
    """

    def __init__(self, path: Path, size: int, entry_durable: bool) -> None:
        self.path = path
        self._size = size
        self._durable = size if entry_durable else 0
        self._entry_durable = entry_durable
        self._closed = False
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: Path) -> FileSpool:
        """A new, empty spool file at ``path`` (truncating a leftover)."""
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        return cls(path, 0, entry_durable=False)

    @classmethod
    def open_existing(cls, path: Path) -> FileSpool:
        """Reopen a spool file left by a previous process, making all its bytes durable."""
        with _opened(path, os.O_RDWR) as fd:
            os.fsync(fd)
            size = os.fstat(fd).st_size
        return cls(path, size, entry_durable=True)

    @property
    def size(self) -> int:
        """Bytes appended."""
        return self._size

    @property
    def durable(self) -> int:
        """Bytes covered by a completed fsync."""
        return self._durable

    def append(self, data: bytes) -> None:
        """Write ``data`` at the end; a failed write is undone and reported as ``UNAVAILABLE``."""
        with self._lock:
            view = memoryview(data)
            try:
                with _opened(self.path, os.O_WRONLY | os.O_APPEND) as fd:
                    while view:
                        view = view[os.write(fd, view):]
            except OSError as err:
                self._truncate_to(self._size)
                raise Unavailable(f"the coordinator could not store the chunk "
                                  f"({err.strerror}); retry later") from err
            self._size += len(data)

    def sync(self) -> int:
        """fsync the file (and its folder entry once); return the durable size."""
        with self._lock:
            target = self._size
            if self._closed or (target == self._durable and self._entry_durable):
                return self._durable
            try:
                with _opened(self.path, os.O_RDONLY) as fd:
                    os.fsync(fd)
                if not self._entry_durable:
                    fsync_dir(self.path.parent)
                    self._entry_durable = True
            except OSError as err:
                # After a failed fsync the page cache cannot be trusted: drop what was not
                # durable, so the client resends it.
                self._truncate_to(self._durable)
                raise Unavailable(f"the coordinator could not store the upload "
                                  f"({err.strerror}); resume it later") from err
            self._durable = max(self._durable, target)
            return self._durable

    def read(self) -> bytes:
        """The durable bytes, read from the file."""
        wanted = self._durable
        parts: list[bytes] = []
        offset = 0
        with _opened(self.path, os.O_RDONLY) as fd:
            while offset < wanted:
                piece = os.pread(fd, wanted - offset, offset)
                if not piece:
                    raise OSError(f"spool {self.path} is shorter than {wanted} bytes")
                parts.append(piece)
                offset += len(piece)
        return b"".join(parts)

    def close(self) -> None:
        """Stop syncing (idempotent; no descriptor is held between operations)."""
        with self._lock:
            self._closed = True

    def discard(self) -> None:
        """Close and delete the file."""
        self.close()
        self.path.unlink(missing_ok=True)

    def _truncate_to(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (best effort) and forget what lay past it."""
        try:
            os.truncate(self.path, size)
        except OSError:
            log.exception("could not truncate spool %s", self.path)
        self._size = size


@contextlib.contextmanager
def _opened(path: Path, flags: int) -> Iterator[int]:
    """A descriptor of ``path`` for the ``with`` block, closed after it."""
    fd = os.open(path, flags)
    try:
        yield fd
    finally:
        os.close(fd)


class FileStorage(SpoolStorage):
    """Spool files under ``root``: ``<root>/<client_id>/<upload_id>.spool``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)

    def create(self, client_id: str, upload_id: str) -> Spool:
        """A new spool file (the client's folder is made, and fsynced into ``root``)."""
        check_name(client_id, "client_id")
        check_name(upload_id, "upload_id")
        folder = self.root / client_id
        if not folder.is_dir():
            folder.mkdir(mode=0o700, exist_ok=True)
            fsync_dir(self.root)
        return FileSpool.create(folder / f"{upload_id}{SPOOL_SUFFIX}")

    def reopen(self) -> Iterator[tuple[str, str, Spool]]:
        """Every well-named spool file under ``root`` (others are logged and left alone)."""
        for path in sorted(self.root.glob(f"*/*{SPOOL_SUFFIX}")):
            client_id, upload_id = path.parent.name, path.name[:-len(SPOOL_SUFFIX)]
            try:
                check_name(client_id, "client_id")
                check_name(upload_id, "upload_id")
            except InvalidArgument:
                log.warning("ignoring spool file with an unexpected name: %s", path)
                continue
            yield client_id, upload_id, FileSpool.open_existing(path)


def storage_for(state_dir: str | Path) -> SpoolStorage:
    """Spools in memory when ``state_dir`` is empty, else files under ``<state_dir>/uploads``."""
    if state_dir == "":
        return MemoryStorage()
    return FileStorage(Path(state_dir) / "uploads")
