"""A probe on a running ``CoordinatorService``: it records every call a client makes and
injects the faults of a ``FaultPlan`` (a cut download, a cut upload, a lost commit reply, a
corrupted upload), so that what the client does next can be checked.

The probe replaces the service's handlers on the instance (the servicer looks them up at each
call), so the coordinator under test is the real one, over real gRPC: a fault looks to the
client exactly like the network or coordinator failure it imitates (``UNAVAILABLE`` mid-stream,
a reply that never came, bytes that do not match their checksum).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fedlink.coordinator.service import CoordinatorService
from fedlink.errors import RemoteError, Unavailable
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    GetTaskRequest,
    Task,
    TaskReply,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
)


@dataclass(frozen=True)
class FaultPlan:
    """Which faults to inject, each at most once per run.

    ``cut_download``: the first full-model ``Download`` stream fails with ``UNAVAILABLE`` after
    its first chunk. ``cut_upload``: the first ``Upload`` stream fails after its first chunk.
    ``lose_commit_reply``: the first ``Commit`` is carried out, then answered ``UNAVAILABLE``
    as if its reply was lost. ``corrupt_upload``: the ``n``-th distinct streamed upload id
    (0: none) has its first byte flipped, so its ``Commit`` is refused with ``DATA_LOSS``.
    """

    cut_download: bool = False
    cut_upload: bool = False
    lose_commit_reply: bool = False
    corrupt_upload: int = 0


@dataclass(frozen=True)
class Call:
    """One call as the coordinator saw it: its name, request fields and outcome."""

    name: str
    fields: dict[str, Any]
    outcome: str = "OK"
    """``OK``, or the status code name it was answered with."""


@dataclass
class CallLog:
    """Every call of a run, in arrival order, and the faults that were injected."""

    calls: list[Call] = field(default_factory=list)
    injected: dict[str, dict[str, Any]] = field(default_factory=dict)

    def of(self, name: str) -> list[Call]:
        """The calls named ``name``."""
        return [c for c in self.calls if c.name == name]


class Probe:
    """Records the calls of one ``CoordinatorService`` and injects ``plan``'s faults."""

    def __init__(self, service: CoordinatorService, plan: FaultPlan) -> None:
        self.service = service
        self.plan = plan
        self.log = CallLog()
        self._upload_ids: list[str] = []

    def install(self) -> CallLog:
        """Wrap the service's handlers; returns the log they fill."""
        service: Any = self.service  # instance attributes shadow the methods
        service.get_task = self._get_task(self.service.get_task)
        service.download = self._download(self.service.download)
        service.upload = self._upload(self.service.upload)
        service.upload_status = self._upload_status(self.service.upload_status)
        service.commit = self._commit(self.service.commit)
        return self.log

    def _take(self, fault: str, **facts: Any) -> bool:
        """Whether ``fault`` is planned and not yet injected (it is marked injected)."""
        if not getattr(self.plan, fault) or fault in self.log.injected:
            return False
        self.log.injected[fault] = facts
        return True

    def _get_task(self, original: Callable[[GetTaskRequest], Awaitable[TaskReply]]
                  ) -> Callable[[GetTaskRequest], Awaitable[TaskReply]]:
        async def get_task(request: GetTaskRequest) -> TaskReply:
            reply = await original(request)
            facts: dict[str, Any] = {"held_version": request.held_version,
                                     "reply": type(reply).__name__}
            if isinstance(reply, Task):
                facts.update(task_id=reply.task_id, model_version=reply.model_version,
                             delta=reply.has_delta, model_inline=bool(reply.model_data),
                             delta_inline=bool(reply.delta_data))
            self.log.calls.append(Call("GetTask", facts))
            return reply

        return get_task

    def _download(self, original: Callable[[DownloadRequest], AsyncIterator[DataChunk]]
                  ) -> Callable[[DownloadRequest], AsyncIterator[DataChunk]]:
        async def download(request: DownloadRequest) -> AsyncIterator[DataChunk]:
            facts = {"task_id": request.task_id, "offset": request.offset,
                     "delta": request.delta}
            cut = not request.delta and self._take("cut_download", **facts)
            outcome = "OK"
            try:
                async for chunk in original(request):
                    yield chunk
                    if cut:
                        raise Unavailable("conformance: download cut on purpose")
            except RemoteError as err:
                outcome = err.code
                raise
            finally:
                self.log.calls.append(Call("Download", facts, outcome))

        return download

    def _upload(self, original: Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]]
                ) -> Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]]:
        async def upload(chunks: AsyncIterator[UploadChunk]) -> UploadReply:
            facts: dict[str, Any] = {}
            try:
                reply = await original(self._watched(chunks, facts))
            except RemoteError as err:
                self.log.calls.append(Call("Upload", facts, err.code))
                raise
            self.log.calls.append(Call("Upload", facts))
            return reply

        return upload

    async def _watched(self, chunks: AsyncIterator[UploadChunk],
                       facts: dict[str, Any]) -> AsyncIterator[UploadChunk]:
        """The stream's chunks, noted in ``facts``; cut or corrupted as planned."""
        cut = False
        async for chunk in chunks:
            if not facts:
                facts.update(upload_id=chunk.upload_id, offset=chunk.offset, bytes=0)
                if chunk.upload_id not in self._upload_ids:
                    self._upload_ids.append(chunk.upload_id)
                cut = self._take("cut_upload", upload_id=chunk.upload_id)
            facts["bytes"] += len(chunk.data)
            yield self._maybe_corrupted(chunk)
            if cut:
                raise Unavailable("conformance: upload stream cut on purpose")

    def _maybe_corrupted(self, chunk: UploadChunk) -> UploadChunk:
        target = self.plan.corrupt_upload
        if (not target or len(self._upload_ids) != target or chunk.offset != 0
                or not chunk.data or chunk.upload_id != self._upload_ids[-1]
                or "corrupt_upload" in self.log.injected):
            return chunk
        self.log.injected["corrupt_upload"] = {"upload_id": chunk.upload_id}
        flipped = bytes([chunk.data[0] ^ 0xFF]) + chunk.data[1:]
        return dataclasses.replace(chunk, data=flipped)

    def _upload_status(self, original: Callable[[UploadStatusRequest], Awaitable[UploadReply]]
                       ) -> Callable[[UploadStatusRequest], Awaitable[UploadReply]]:
        async def upload_status(request: UploadStatusRequest) -> UploadReply:
            reply = await original(request)
            self.log.calls.append(Call("UploadStatus", {
                "upload_id": request.upload_id, "committed_offset": reply.committed_offset}))
            return reply

        return upload_status

    def _commit(self, original: Callable[[CommitRequest], Awaitable[CommitReply]]
                ) -> Callable[[CommitRequest], Awaitable[CommitReply]]:
        async def commit(request: CommitRequest) -> CommitReply:
            facts = {"upload_id": request.upload_id, "task_id": request.task_id,
                     "base_version": request.base_version,
                     "inline": bool(request.update_data)}
            try:
                reply = await original(request)
            except RemoteError as err:
                self.log.calls.append(Call("Commit", facts, err.code))
                raise
            if self._take("lose_commit_reply", **facts):
                self.log.calls.append(Call("Commit", facts, "REPLY_LOST"))
                raise Unavailable("conformance: commit reply lost on purpose")
            self.log.calls.append(Call("Commit", facts))
            return reply

        return commit
