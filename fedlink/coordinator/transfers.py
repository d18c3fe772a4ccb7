"""Transfers: a task's model (or delta) down, an update up, and what the coordinator holds.

Durability of uploads: chunks are appended to the upload's spool as they arrive and made
durable once per ``Upload`` call, when the stream ends *or breaks* (a ``finally``), before the
reply reports them; ``UploadStatus`` reports only durable bytes. A payload that fits
``inline_limit`` travels inside ``GetTask``'s reply (down) or ``Commit`` (up) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator

from fedlink.coordinator.admission import CallerCheck
from fedlink.coordinator.config import LimitsConfig
from fedlink.coordinator.downloads import DELTA, EVALUATION, MODEL, DownloadLedger
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.records import TaskRecord
from fedlink.coordinator.uploads import UploadStore
from fedlink.coordinator.validation import RequestChecks
from fedlink.errors import InvalidArgument, ResourceExhausted, UpdateRefused
from fedlink.messages import (
    CommitRequest,
    DataChunk,
    DownloadRequest,
    Task,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)
from fedlink.metrics import EventLog, kinds
from fedlink.refusals import RefusalCode
from fedlink.wire import Payload, iter_chunks

TaskLookup = Callable[[str, str], tuple[TaskRecord, bool]]
"""``lookup(client_id, task_id) -> (record, open)``: any task a client may download for."""


class Transfers:
    """``Download``, ``Upload`` and ``UploadStatus``, and the inline payloads.

    ``on_sent(kind, bytes)`` is told every payload byte sent, as it is sent (``kind``:
    ``model``, ``delta`` or ``evaluation``, ``fedlink.coordinator.downloads``): the flush
    reporter counts them into the round's ``bytes_down``. ``lookup`` finds the task a download
    is for (default: the engine's training tasks; the service adds evaluation tasks,
    ``fedlink.coordinator.evaluations``).
    """

    def __init__(self, limits: LimitsConfig, engine: RoundEngine, uploads: UploadStore,
                 downloads: DownloadLedger, callers: CallerCheck, checks: RequestChecks,
                 events: EventLog, on_sent: Callable[[str, int], None],
                 lookup: TaskLookup | None = None) -> None:
        self.limits = limits
        self.engine = engine
        self._lookup = lookup or self._training_task
        self.uploads = uploads
        self.downloads = downloads
        self._callers = callers
        self._checks = checks
        self._events = events
        self._on_sent = on_sent

    # -- down -----------------------------------------------------------------------------

    async def download(self, request: DownloadRequest) -> AsyncIterator[DataChunk]:
        """Stream a task's model, or with ``request.delta`` its delta, from ``request.offset``
        up to ``request.end_offset`` (0: to the end).

        Every chunk sent counts as a sign of life of the client (a slow download is not a
        dead client), and into ``bytes_down`` once gRPC has taken it; the stream's end (or
        cut) logs ``download_finished`` with the bytes it sent
        (``fedlink.coordinator.downloads``).
        """
        self._callers.admit(request.client_id)
        self._checks.download(request)
        record, task_open = self._lookup(request.client_id, request.task_id)
        if not task_open:
            raise UpdateRefused(f"task {request.task_id!r} is closed", RefusalCode.TASK_CLOSED)
        full = self.engine.payload(record.version)
        payload = self.engine.delta_payload(record) if request.delta else full
        end = request.end_offset or len(payload.data)
        if request.offset > end or end > len(payload.data):
            raise InvalidArgument(f"range [{request.offset}, {end}) does not fit in the "
                                  f"{len(payload.data)}-byte {_what(request)}")
        chunk_bytes = min(request.max_chunk_bytes or self.limits.chunk_bytes,
                          self.limits.max_chunk_bytes)
        sent = 0
        registry = self._callers.registry
        registry.transfer_opened(request.client_id)  # an open stream is a sign of life
        try:
            for offset, piece in iter_chunks(payload.data, chunk_bytes, request.offset, end):
                # counted as it is handed to gRPC: a cancel can end the stream before the
                # generator resumes, after the client already has the chunk
                sent += len(piece)
                self._sent(record, full, payload, request.delta, len(piece),
                           to_end=offset + len(piece) == len(payload.data))
                yield DataChunk(offset, piece)
                registry.touch(request.client_id, sample=False)
                self.engine.progressed(record.client_id, record.task_id)
        finally:
            registry.transfer_closed(request.client_id)
            # the stream it held open counted as a sign of life: its quiet time starts now
            self.engine.progressed(record.client_id, record.task_id)
            self._events.emit(kinds.DownloadFinished.build(
                client_id=record.client_id, task_id=record.task_id, bytes=sent,
                offset=request.offset, delta=request.delta,
                evaluation=record.state.evaluation,
                completed=request.offset + sent == len(payload.data)))

    def with_inline_payload(self, client_id: str, task: Task, held_version: int = -1) -> Task:
        """``task`` carrying its delta, else its model, when that fits ``inline_limit``.

        A client that holds the task's version (it just evaluated it) gets no payload: it
        uses the model it has.
        """
        if held_version == task.model_version:
            return task
        limit = self.limits.inline_limit
        record, _ = self._lookup(client_id, task.task_id)
        full = self.engine.payload(record.version)
        if task.has_delta:
            delta = self.engine.delta_payload(record)
            if len(delta.data) <= limit:
                self._sent_inline(record, full, delta, delta=True)
                return dataclasses.replace(task, delta_data=delta.data)
        if len(full.data) <= limit:
            self._sent_inline(record, full, full, delta=False)
            return dataclasses.replace(task, model_data=full.data)
        return task

    def _training_task(self, client_id: str, task_id: str) -> tuple[TaskRecord, bool]:
        record = self.engine.task(client_id, task_id)
        return record, self.engine.is_open(record)

    def downloads_settled(self, client_id: str, task_id: str, used: bool) -> None:
        """The task's result was answered: ``used`` (accepted: the client had the model,
        ``download_used`` is logged once) or not (all its bytes were wasted)."""
        fields = self.downloads.settle(client_id, task_id, used)
        if fields is not None:
            self._events.emit(kinds.DownloadUsed.build(**fields))

    def _sent_inline(self, record: TaskRecord, full: Payload, payload: Payload,
                     delta: bool) -> None:
        """``payload`` goes inside the ``Task`` reply: all of it is sent, now."""
        self._sent(record, full, payload, delta, len(payload.data), to_end=True)
        self._events.emit(kinds.DownloadFinished.build(
            client_id=record.client_id, task_id=record.task_id, bytes=len(payload.data),
            offset=0, delta=delta, inline=True, evaluation=record.state.evaluation,
            completed=True))

    def _sent(self, record: TaskRecord, full: Payload, payload: Payload, delta: bool,
              num_bytes: int, to_end: bool) -> None:
        """``num_bytes`` of ``payload`` (the task's model ``full``, or a delta) were sent."""
        evaluation = record.state.evaluation
        self.downloads.sent(record.client_id, record.task_id, DELTA if delta else MODEL,
                            len(payload.data), num_bytes, evaluation=evaluation,
                            to_end=to_end,
                            bytes_saved=len(full.data) - len(payload.data) if delta else 0,
                            base_version=record.delta_base if delta else None)
        self._on_sent(EVALUATION if evaluation else DELTA if delta else MODEL, num_bytes)

    # -- up -------------------------------------------------------------------------------

    async def upload(self, chunks: AsyncIterator[UploadChunk]) -> UploadReply:
        """Receive chunks of one upload; answer with the durable bytes held.

        What arrived is made durable once, when the stream ends, fails or is cut by the
        network (so ``UploadStatus`` after a reconnect reports it), not once per chunk.
        """
        written: tuple[str, str] | None = None  # (client_id, upload_id) once a chunk landed
        with contextlib.ExitStack() as slot:
            try:
                async for chunk in chunks:
                    if written is None:  # the stream's first chunk names the caller
                        self._callers.admit(chunk.client_id)
                        slot.enter_context(self._callers.limiter.upload_slot(
                            chunk.client_id, chunk.upload_id))
                        slot.enter_context(self._streaming(chunk.client_id))
                    else:
                        self._callers.registry.touch(chunk.client_id, sample=False)
                        if chunk.client_id != written[0] or chunk.upload_id != written[1]:
                            raise InvalidArgument("one Upload stream must carry a single "
                                                  "client_id and upload_id")
                    if chunk.offset < 0:
                        raise InvalidArgument(f"offset must be >= 0, got {chunk.offset}")
                    self.uploads.write(chunk.client_id, chunk.upload_id, chunk.offset,
                                       chunk.data)
                    self.engine.progressed(chunk.client_id)
                    written = (chunk.client_id, chunk.upload_id)
            finally:
                if written is not None:
                    await self.make_durable(*written)
        if written is None:
            raise InvalidArgument("Upload stream carried no chunk")
        return UploadReply(written[1], self.uploads.status(*written))

    @contextlib.contextmanager
    def _streaming(self, client_id: str) -> Iterator[None]:
        """A transfer stream of ``client_id`` is open meanwhile: a sign of life
        (``fedlink.coordinator.heartbeat``)."""
        self._callers.registry.transfer_opened(client_id)
        try:
            yield
        finally:
            self._callers.registry.transfer_closed(client_id)

    async def make_durable(self, client_id: str, upload_id: str) -> None:
        """fsync what the upload received, off the event loop (nothing to do in memory)."""
        if self.uploads.needs_sync(client_id, upload_id):
            await asyncio.to_thread(self.uploads.sync, client_id, upload_id)

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        """How many bytes of an upload the coordinator holds.

        Bytes received but not yet durable (a stream that was just cut, whose ``finally`` may
        not have run or finished its fsync yet) are made durable first, so the answer covers
        everything the coordinator received.
        """
        self._callers.admit(request.client_id)
        await self.make_durable(request.client_id, request.upload_id)
        held = self.uploads.status(request.client_id, request.upload_id)
        return UploadReply(request.upload_id, held)

    def take_inline_update(self, request: CommitRequest) -> None:
        """Hold an update that came inside its ``Commit`` as if it had been uploaded.

        A repeat of an answered commit writes nothing: it gets the remembered answer. Inline
        bytes that disagree with the header's ``num_bytes`` are a malformed request
        (``INVALID_ARGUMENT``): nothing else of them could arrive later to resume.
        """
        limit = self.limits.inline_limit
        if len(request.update_data) > limit:
            raise ResourceExhausted(f"inline update of {len(request.update_data)} bytes "
                                    f"exceeds this coordinator's inline limit of {limit} "
                                    "bytes (RunConfig.inline_bytes); upload it, then commit")
        if self.uploads.answer(request.client_id, request.upload_id) is None:
            if len(request.update_data) != request.update.num_bytes:
                raise InvalidArgument(f"inline update carries {len(request.update_data)} "
                                      f"bytes but its header claims {request.update.num_bytes}")
            self.uploads.write(request.client_id, request.upload_id, 0, request.update_data)


def _what(request: DownloadRequest) -> str:
    return "delta" if request.delta else "model"
