"""Upload sessions: bytes of an encoded update, received in chunks at offsets, resumable.

An upload is addressed by a client-chosen id that stays the same across reconnects, scoped to its
client: the store keys everything by ``(client_id, upload_id)``, so two clients may pick the same
id and neither can squat, read or claim the other's upload (a predictable id is no handle on
someone else's update). The store
keeps the bytes contiguous from offset 0: a chunk that overlaps what is held is trimmed (a
replay after a reconnect), a chunk past the end is a gap and refused. Final commit answers are
remembered per upload id so that a repeated ``Commit`` gets the same answer; they are journaled
to the coordinator's ``StateStore`` and given back by ``restore`` after a restart.

Where the bytes live is a ``fedlink.coordinator.spool.SpoolStorage``: in memory, or (with a
``state_dir``) in spool files that are fsynced by ``sync``. ``status`` and ``committed_offset``
report durable bytes only, so a client is never told that the coordinator holds a byte that a
crash could lose. A store built on a folder reopens the spools a previous process left there.

Everything a client can make the store hold is bounded (``UploadBounds``): bytes per upload,
open uploads and bytes per client (beyond, the client's own least recently written upload is
dropped), bytes in all (beyond, ``RESOURCE_EXHAUSTED``); an upload idle for ``idle_s`` is dropped
(``expire_idle``), and so are a client's uploads when it leaves or expires (``drop_client``).
A chunk that is refused (a gap, a cap) creates nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fedlink.clock import RealClock
from fedlink.coordinator.spool import Spool, check_name, storage_for
from fedlink.coordinator.state import NullStore, SettledUpload, StateStore
from fedlink.errors import (
    InvalidArgument,
    NotFound,
    RemoteError,
    ResourceExhausted,
)
from fedlink.messages import CommitReply

log = logging.getLogger(__name__)

Key = tuple[str, str]
"""``(client_id, upload_id)``: what names one upload."""


@dataclass(frozen=True)
class UploadBounds:
    """What one client, and all of them, may make the store hold (0: no limit).

    ``per_client_uploads`` open uploads and ``per_client_bytes`` bytes per client,
    ``total_bytes`` in all; ``idle_s``: an upload not written to for this long is dropped by
    ``expire_idle``. ``retry_after_s``: the hint sent with a refusal for the total cap.
    """

    per_client_uploads: int = 0
    per_client_bytes: int = 0
    total_bytes: int = 0
    idle_s: float = 0.0
    retry_after_s: float = 1.0


@dataclass
class UploadSession:
    """The bytes received so far for one upload."""

    upload_id: str
    client_id: str
    spool: Spool
    last_write: float = field(default=0.0)

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
                 state_dir: str | Path = "", state: StateStore | None = None,
                 bounds: UploadBounds | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self._state = state if state is not None else NullStore()
        self.max_update_bytes = max_update_bytes
        self.max_chunk_bytes = max_chunk_bytes
        self.bounds = bounds if bounds is not None else UploadBounds()
        self._clock = clock if clock is not None else RealClock().now
        self._storage = storage_for(state_dir)
        # keyed by (client_id, upload_id): an upload id means something only for its client
        self._sessions: dict[Key, UploadSession] = {}
        self._answers: dict[Key, CommitReply | RemoteError] = {}
        self._settled_sizes: dict[Key, int] = {}
        self._reopen()

    def _reopen(self) -> None:
        """Adopt the spools a previous coordinator process left behind."""
        for client_id, upload_id, spool in self._storage.reopen():
            if (client_id, upload_id) in self._sessions:
                log.warning("upload %r is spooled twice; keeping the first", upload_id)
                spool.close()
                continue
            self._sessions[client_id, upload_id] = UploadSession(upload_id, client_id, spool,
                                                                 self._clock())
        if self._sessions:
            log.info("reopened %d upload spool(s)", len(self._sessions))

    def write(self, client_id: str, upload_id: str, offset: int, data: bytes) -> UploadSession:
        """Place ``data`` at ``offset`` of the upload; returns the session."""
        if len(data) > self.max_chunk_bytes:
            raise ResourceExhausted(f"chunk of {len(data)} bytes exceeds the limit of "
                                    f"{self.max_chunk_bytes}")
        existing = self._sessions.get((client_id, upload_id))
        if existing is None:
            self._check_new(client_id, upload_id)
        held = 0 if existing is None else existing.received
        if offset > held:
            raise InvalidArgument(f"chunk at offset {offset} leaves a gap: upload "
                                  f"{upload_id[:64]!r} holds {held} bytes; resume from there")
        new = data[held - offset:]
        if held + len(new) > self.max_update_bytes:
            raise ResourceExhausted(f"upload would exceed the limit of "
                                    f"{self.max_update_bytes} bytes")
        if existing is None:
            self._make_room_for_upload(client_id)
        self._make_room_for_bytes(client_id, upload_id, len(new))
        session = self._session(client_id, upload_id, create=True)
        if new:
            session.spool.append(new)
        session.last_write = self._clock()
        return session

    def _make_room_for_upload(self, client_id: str) -> None:
        """At ``per_client_uploads``, drop the client's least recently written upload.

        Evicting rather than refusing: an honest client that abandoned an upload (its task
        went stale, say) is never locked out until the idle TTL, and a hoarder only ever
        evicts its own.
        """
        cap = self.bounds.per_client_uploads
        while cap and len(self._uploads_of(client_id)) >= cap:
            self._evict_oldest(client_id, keep="")

    def _make_room_for_bytes(self, client_id: str, upload_id: str, more: int) -> None:
        """Make ``more`` bytes fit the client's cap (evicting its other uploads, oldest first)
        and the global cap (``ResourceExhausted`` with a retry hint: others' are not ours)."""
        if not more:
            return
        cap = self.bounds.per_client_bytes
        while cap and self.held_by(client_id) + more > cap:
            if not self._evict_oldest(client_id, keep=upload_id):
                raise ResourceExhausted(f"upload would hold more than the {cap} bytes one "
                                        "client may hold", retry_after_s=None)
        total = self.bounds.total_bytes
        if total and self.held_bytes() + more > total:
            raise ResourceExhausted(f"the coordinator holds its maximum of {total} upload "
                                    "bytes; retry later",
                                    retry_after_s=self.bounds.retry_after_s)

    def _uploads_of(self, client_id: str) -> list[UploadSession]:
        return [s for s in self._sessions.values() if s.client_id == client_id]

    def _evict_oldest(self, client_id: str, keep: str) -> bool:
        """Drop the least recently written upload of ``client_id`` but ``keep``; any left?"""
        others = [s for s in self._uploads_of(client_id) if s.upload_id != keep]
        if not others:
            return False
        oldest = min(others, key=lambda s: s.last_write)
        log.info("dropping upload %r of client %r to make room for a new one",
                 oldest.upload_id, client_id)
        self._drop((client_id, oldest.upload_id))
        return True

    def held_by(self, client_id: str) -> int:
        """Bytes the open uploads of ``client_id`` hold."""
        return sum(s.received for s in self._sessions.values() if s.client_id == client_id)

    def held_bytes(self) -> int:
        """Bytes all open uploads hold."""
        return sum(s.received for s in self._sessions.values())

    def open_uploads(self) -> int:
        """How many uploads are open (received bytes, not yet committed)."""
        return len(self._sessions)

    def expire_idle(self) -> list[str]:
        """Drop the uploads nobody wrote to for ``bounds.idle_s``; returns their ids."""
        if not self.bounds.idle_s:
            return []
        stale_before = self._clock() - self.bounds.idle_s
        stale = [key for key, s in self._sessions.items() if s.last_write < stale_before]
        for key in stale:
            self._drop(key)
        return [upload_id for _, upload_id in stale]

    def next_expiry(self) -> float | None:
        """When the first open upload becomes idle for ``bounds.idle_s`` (``None``: never)."""
        if not self.bounds.idle_s or not self._sessions:
            return None
        return min(s.last_write for s in self._sessions.values()) + self.bounds.idle_s

    def drop_client(self, client_id: str) -> list[str]:
        """Drop every open upload of ``client_id`` (it left or expired); returns their ids."""
        gone = [key for key, s in self._sessions.items() if s.client_id == client_id]
        for key in gone:
            self._drop(key)
        return [upload_id for _, upload_id in gone]

    def _drop(self, key: Key) -> None:
        session = self._sessions.pop(key)
        session.spool.discard()

    def needs_sync(self, client_id: str, upload_id: str) -> bool:
        """Whether the upload holds bytes that are received but not yet durable."""
        session = self._sessions.get((client_id, upload_id))
        return session is not None and session.received > session.committed_offset

    def sync(self, client_id: str, upload_id: str) -> int:
        """Make the bytes received for the upload durable; return the durable offset.

        Blocks for an fsync with a ``state_dir``: run it off the event loop. Unknown and
        settled uploads are left alone (their ``status`` is returned).
        """
        session = self._sessions.get((client_id, upload_id))
        if session is None:
            return self.status(client_id, upload_id)
        return session.spool.sync()

    def status(self, client_id: str, upload_id: str) -> int:
        """Bytes held for the upload (0 if it was never started).

        A committed upload reports the size it had, so a client that resumes after a crash sees
        that nothing is left to send and commits again, getting the remembered answer.
        """
        session = self._sessions.get((client_id, upload_id))
        if session is None:
            self._check_id(upload_id)
            return self._settled_sizes.get((client_id, upload_id), 0)
        return session.committed_offset

    def get(self, client_id: str, upload_id: str) -> UploadSession:
        """The session ``upload_id`` of ``client_id`` (``NotFound`` if none)."""
        session = self._session(client_id, upload_id, create=False)
        assert session is not None
        return session

    def answer(self, client_id: str, upload_id: str) -> CommitReply | RemoteError | None:
        """The final commit answer already given for ``upload_id``, if any."""
        return self._answers.get((client_id, upload_id))

    def settle(self, client_id: str, upload_id: str, answer: CommitReply | RemoteError) -> None:
        """Remember (and journal) the final answer for ``upload_id``; free its bytes."""
        session = self._sessions.pop((client_id, upload_id), None)
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
            session = self._sessions.pop((upload.client_id, upload.upload_id), None)
            if session is not None:
                self._state.on_durable(session.spool.discard)

    def _remember(self, settled: SettledUpload) -> None:
        key = (settled.client_id, settled.upload_id)
        self._answers[key] = settled.answer
        self._settled_sizes[key] = settled.size

    def close(self) -> None:
        """Release open spools; their bytes stay for the next process to reopen."""
        for session in self._sessions.values():
            session.spool.close()

    def _session(self, client_id: str, upload_id: str, create: bool) -> UploadSession:
        session = self._sessions.get((client_id, upload_id))
        if session is not None:
            return session
        self._check_new(client_id, upload_id)
        if not create:
            raise NotFound(f"unknown upload id {upload_id!r}: nothing was uploaded under it")
        session = UploadSession(upload_id, client_id,
                                self._storage.create(client_id, upload_id))
        self._sessions[client_id, upload_id] = session
        return session

    def _check_new(self, client_id: str, upload_id: str) -> None:
        """``InvalidArgument`` for a malformed id, or one whose upload was committed."""
        self._check_id(upload_id)
        if (client_id, upload_id) in self._answers:
            raise InvalidArgument(f"upload {upload_id!r} was already committed (its answer, "
                                  "accepted or refused, is final): send a new update under a "
                                  "new upload id")

    @staticmethod
    def _check_id(upload_id: str) -> None:
        check_name(upload_id, "upload_id")
