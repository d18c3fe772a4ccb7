"""Crash-safe files: a file is wholly the old one or wholly the new one, and stays so.

``write_atomic`` writes to a temporary file in the same folder (``.<name>.<random>.tmp``),
fsyncs it, renames it over ``path`` and fsyncs the folder, so that neither a killed process nor
a power loss leaves a half-written file or loses the rename. The client's outbox and error
feedback memory, the coordinator's model checkpoints and a run's final model all write this way.

The file is created ``0600`` (``tempfile.mkstemp``), whatever the umask, and keeps that mode
through the rename: a file written here is private from its first byte (``fedlink.private``).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

TEMP_SUFFIX = ".tmp"
"""Suffix of ``write_atomic``'s temporary files (left behind only by a crash mid-write)."""


def write_atomic(path: Path, parts: Iterable[bytes | memoryview]) -> None:
    """Write ``parts`` to ``path`` so that it is either complete or absent, even after a crash.

    The parent folder is created if missing.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    import tempfile  # deferred: it imports shutil, bz2, lzma (slow start-up on a device)

    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            for part in parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    fsync_dir(path.parent)


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write_atomic`` for a writer that wants a file object (``np.save``, ``torch.save``):
    ``write(buffer)`` fills a memory buffer whose bytes then go to ``path`` atomically, 0600."""
    buffer = io.BytesIO()
    write(buffer)
    write_atomic(path, [buffer.getbuffer()])


def fsync_dir(directory: Path) -> None:
    """Make a create, rename or unlink in ``directory`` durable (POSIX; a no-op elsewhere)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
