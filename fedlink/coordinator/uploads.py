"""Upload sessions: bytes of an encoded update, received in chunks at offsets, resumable.

An upload is addressed by a client-chosen id that stays the same across reconnects. The store
keeps the bytes contiguous from offset 0: a chunk that overlaps what is held is trimmed (a
replay after a reconnect), a chunk past the end is a gap and refused. Final commit answers are
remembered per upload id so that a repeated ``Commit`` gets the same answer; they are journaled
to the coordinator's ``StateStore`` and given back by ``restore`` after a restart.

Where the bytes live is a ``fedlink.coordinator.spool.SpoolStorage``: in memory, or (with a
``state_dir``) in spool files that are fsynced by ``sync``. ``status`` and ``committed_offset``
report durable bytes only, so a client is never told that the coordinator holds a byte that a
crash could lose. A store built on a folder reopens the spools a previous process left there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from fedlink.coordinator.spool import Spool, check_name, storage_for
from fedlink.coordinator.state import NullStore, SettledUpload, StateStore
from fedlink.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RemoteError,
    ResourceExhausted,
)
from fedlink.messages import CommitReply

log = logging.getLogger(__name__)


@dataclass
class UploadSession:
    """The bytes received so far for one upload."""

    upload_id: str
    client_id: str
    spool: Spool

    @property
    def committed_offset(self) -> int:
        """Durable bytes held, contiguous from 0 (what a client may be told)."""
        return self.spool.durable

    @property
    def received(self) -> int:
        """Bytes received, durable or not (where the next chunk goes)."""
        return self.spool.size

    @property
    def data(self) -> bytes:
        """The durable bytes."""
        return self.spool.read()


class UploadStore:
    """Upload sessions (in memory, or spooled under ``state_dir``) and remembered answers.

    ``write`` appends; ``sync`` makes what was appended durable (one fsync, so callers call it
    once per ``Upload`` stream, not per chunk). With an empty ``state_dir`` every byte is
    durable as soon as it is written.
    """

    def __init__(self, max_update_bytes: int, max_chunk_bytes: int,
                 state_dir: str | Path = "", state: StateStore | None = None) -> None:
        self._state = state if state is not None else NullStore()
        self.max_update_bytes = max_update_bytes
        self.max_chunk_bytes = max_chunk_bytes
        self._storage = storage_for(state_dir)
        self._sessions: dict[str, UploadSession] = {}
        self._answers: dict[str, CommitReply | RemoteError] = {}
        self._owners: dict[str, str] = {}
        self._settled_sizes: dict[str, int] = {}
        self._reopen()

    @property
    def open_sessions(self) -> int:
        """Upload sessions open now (not yet settled)."""
        return len(self._sessions)

    @property
    def held_bytes(self) -> int:
        """Bytes the open upload sessions hold (spooled, or in memory)."""
        return sum(session.received for session in list(self._sessions.values()))

    def _reopen(self) -> None:
        """Adopt the spools a previous coordinator process left behind."""
        for client_id, upload_id, spool in self._storage.reopen():
            if upload_id in self._sessions:
                log.warning("upload %r is spooled twice; keeping the first", upload_id)
                spool.close()
                continue
            self._sessions[upload_id] = UploadSession(upload_id, client_id, spool)
        if self._sessions:
            log.info("reopened %d upload spool(s)", len(self._sessions))

    def write(self, client_id: str, upload_id: str, offset: int, data: bytes) -> UploadSession:
        """Place ``data`` at ``offset`` of the upload; returns the session."""
        if len(data) > self.max_chunk_bytes:
            raise ResourceExhausted(f"chunk of {len(data)} bytes exceeds the limit of "
                                    f"{self.max_chunk_bytes}")
        session = self._session(client_id, upload_id, create=True)
        held = session.received
        if offset > held:
            raise InvalidArgument(f"chunk at offset {offset} leaves a gap: upload "
                                  f"{upload_id!r} holds {held} bytes; resume from there")
        new = data[held - offset:]
        if held + len(new) > self.max_update_bytes:
            raise ResourceExhausted(f"upload would exceed the limit of "
                                    f"{self.max_update_bytes} bytes")
        if new:
            session.spool.append(new)
        return session

    def needs_sync(self, upload_id: str) -> bool:
        """Whether the upload holds bytes that are received but not yet durable."""
        session = self._sessions.get(upload_id)
        return session is not None and session.received > session.committed_offset

    def sync(self, client_id: str, upload_id: str) -> int:
        """Make the bytes received for the upload durable; return the durable offset.

        Blocks for an fsync with a ``state_dir``: run it off the event loop. Unknown and
        settled uploads are left alone (their ``status`` is returned).
        """
        session = self._sessions.get(upload_id)
        if session is None:
            return self.status(client_id, upload_id)
        self._check_owner(session.client_id, client_id, upload_id)
        return session.spool.sync()

    def status(self, client_id: str, upload_id: str) -> int:
        """Bytes held for the upload (0 if it was never started).

        A committed upload reports the size it had, so a client that resumes after a crash sees
        that nothing is left to send and commits again, getting the remembered answer.
        """
        session = self._sessions.get(upload_id)
        if session is None:
            self._check_id(upload_id)
            owner = self._owners.get(upload_id)
            if owner is not None:
                self._check_owner(owner, client_id, upload_id)
                return self._settled_sizes[upload_id]
            return 0
        self._check_owner(session.client_id, client_id, upload_id)
        return session.committed_offset

    def get(self, client_id: str, upload_id: str) -> UploadSession:
        """The session ``upload_id`` of ``client_id`` (``NotFound`` if none)."""
        session = self._session(client_id, upload_id, create=False)
        assert session is not None
        return session

    def answer(self, client_id: str, upload_id: str) -> CommitReply | RemoteError | None:
        """The final commit answer already given for ``upload_id``, if any."""
        owner = self._owners.get(upload_id)
        if owner is not None:
            self._check_owner(owner, client_id, upload_id)
        return self._answers.get(upload_id)

    def settle(self, client_id: str, upload_id: str, answer: CommitReply | RemoteError) -> None:
        """Remember (and journal) the final answer for ``upload_id``; free its bytes."""
        session = self._sessions.pop(upload_id, None)
        size = session.committed_offset if session else 0
        self._remember(SettledUpload(upload_id, client_id, size, answer))
        self._state.save_settled(SettledUpload(upload_id, client_id, size, answer))
        if session is not None:  # the bytes stay until the answer is durable
            self._state.on_durable(session.spool.discard)

    def restore(self, settled: list[SettledUpload]) -> None:
        """Take back the answers a previous process gave; drop spools those uploads left.

        A spool outlives its settled upload when the process died between journaling the
        answer and deleting the file.
        """
        for upload in settled:
            self._remember(upload)
            session = self._sessions.pop(upload.upload_id, None)
            if session is not None:
                self._state.on_durable(session.spool.discard)

    def _remember(self, settled: SettledUpload) -> None:
        self._answers[settled.upload_id] = settled.answer
        self._owners[settled.upload_id] = settled.client_id
        self._settled_sizes[settled.upload_id] = settled.size

    def close(self) -> None:
        """Release open spools; their bytes stay for the next process to reopen."""
        for session in self._sessions.values():
            session.spool.close()

    def _session(self, client_id: str, upload_id: str, create: bool) -> UploadSession:
        session = self._sessions.get(upload_id)
        if session is not None:
            self._check_owner(session.client_id, client_id, upload_id)
            return session
        self._check_id(upload_id)
        if upload_id in self._answers:
            raise InvalidArgument(f"upload {upload_id!r} was already committed")
        if not create:
            raise NotFound(f"unknown upload id {upload_id!r}: nothing was uploaded under it")
        session = UploadSession(upload_id, client_id,
                                self._storage.create(client_id, upload_id))
        self._sessions[upload_id] = session
        return session

    @staticmethod
    def _check_id(upload_id: str) -> None:
        check_name(upload_id, "upload_id")

    @staticmethod
    def _check_owner(owner: str, client_id: str, upload_id: str) -> None:
        if owner != client_id:
            raise PermissionDenied(f"upload {upload_id!r} belongs to another client")
