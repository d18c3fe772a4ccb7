"""Upload sessions: bytes of an encoded update, received in chunks at offsets, resumable.

An upload is addressed by a client-chosen id that stays the same across reconnects. The store
keeps the bytes contiguous from offset 0: a chunk that overlaps what is held is trimmed (a
replay after a reconnect), a chunk past the end is a gap and refused. Final commit answers are
remembered per upload id so that a repeated ``Commit`` gets the same answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fedlink.errors import (
    InvalidArgument,
    NotFound,
    PermissionDenied,
    RemoteError,
    ResourceExhausted,
)
from fedlink.messages import CommitReply

_UPLOAD_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class UploadSession:
    """The bytes received so far for one upload."""

    upload_id: str
    client_id: str
    data: bytearray = field(default_factory=bytearray)

    @property
    def committed_offset(self) -> int:
        """Bytes held, contiguous from 0."""
        return len(self.data)


class UploadStore:
    """In-memory upload sessions and remembered commit answers."""

    def __init__(self, max_update_bytes: int, max_chunk_bytes: int) -> None:
        self.max_update_bytes = max_update_bytes
        self.max_chunk_bytes = max_chunk_bytes
        self._sessions: dict[str, UploadSession] = {}
        self._answers: dict[str, CommitReply | RemoteError] = {}
        self._owners: dict[str, str] = {}
        self._settled_sizes: dict[str, int] = {}

    def write(self, client_id: str, upload_id: str, offset: int, data: bytes) -> UploadSession:
        """Place ``data`` at ``offset`` of the upload; returns the session."""
        if len(data) > self.max_chunk_bytes:
            raise ResourceExhausted(f"chunk of {len(data)} bytes exceeds the limit of "
                                    f"{self.max_chunk_bytes}")
        session = self._session(client_id, upload_id, create=True)
        held = session.committed_offset
        if offset > held:
            raise InvalidArgument(f"chunk at offset {offset} leaves a gap: upload "
                                  f"{upload_id!r} holds {held} bytes; resume from there")
        new = data[held - offset:]
        if held + len(new) > self.max_update_bytes:
            raise ResourceExhausted(f"upload would exceed the limit of "
                                    f"{self.max_update_bytes} bytes")
        session.data += new
        return session

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
        """Remember the final answer for ``upload_id`` and free its bytes."""
        self._answers[upload_id] = answer
        self._owners[upload_id] = client_id
        session = self._sessions.pop(upload_id, None)
        self._settled_sizes[upload_id] = session.committed_offset if session else 0

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
        session = UploadSession(upload_id, client_id)
        self._sessions[upload_id] = session
        return session

    @staticmethod
    def _check_id(upload_id: str) -> None:
        if not _UPLOAD_ID.match(upload_id):
            raise InvalidArgument("upload_id must be 1-128 characters of [A-Za-z0-9._:-]")

    @staticmethod
    def _check_owner(owner: str, client_id: str, upload_id: str) -> None:
        if owner != client_id:
            raise PermissionDenied(f"upload {upload_id!r} belongs to another client")
