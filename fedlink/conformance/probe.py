"""A probe on a running ``CoordinatorService``: it records every call a client makes and
injects the faults of a ``FaultPlan`` (a cut download, a cut upload, a lost commit reply, a
corrupted upload, a corrupted model, a slow commit, an overload refusal with a retry hint, a
forgotten client), so that what the client does next can be checked.

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

from fedlink.clock import Clock, RealClock, sleep_on
from fedlink.coordinator.service import CoordinatorService
from fedlink.errors import RemoteError, ResourceExhausted, Unauthenticated, Unavailable
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    EvaluationReport,
    Finished,
    GetTaskRequest,
    HeartbeatRequest,
    JoinReply,
    JoinRequest,
    LeaveRequest,
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
    ``corrupt_model``: the first full-model ``Download`` from offset 0 has the first byte of
    its first chunk flipped (the bytes no longer match ``model.checksum``). ``slow_commit_s``:
    the first ``Commit`` is held that long before it is carried out (a client that heartbeats
    is heard meanwhile). ``overload_s``: the first ``GetTask`` is refused ``RESOURCE_EXHAUSTED``
    with a ``RetryInfo`` of that many seconds. ``forget_client``: the first ``GetTask`` after
    an accepted update is refused ``UNAUTHENTICATED``, as by a coordinator that lost its
    client registry.
    """

    cut_download: bool = False
    cut_upload: bool = False
    lose_commit_reply: bool = False
    corrupt_upload: int = 0
    corrupt_model: bool = False
    slow_commit_s: float = 0.0
    overload_s: float = 0.0
    forget_client: bool = False


@dataclass(frozen=True)
class Call:
    """One call as the coordinator saw it: its name, request fields and outcome."""

    name: str
    fields: dict[str, Any]
    outcome: str = "OK"
    """``OK``, or the status code name it was answered with."""
    at: float = 0.0
    """When the call arrived (on the log's clock)."""
    done: float = 0.0
    """When it was answered."""


@dataclass
class CallLog:
    """Every call of a run, in arrival order, and the faults that were injected."""

    calls: list[Call] = field(default_factory=list)
    injected: dict[str, dict[str, Any]] = field(default_factory=dict)
    clock: Clock = field(default_factory=RealClock)

    def of(self, name: str) -> list[Call]:
        """The calls named ``name``."""
        return [c for c in self.calls if c.name == name]

    def after(self, moment: float) -> list[Call]:
        """The calls that arrived after ``moment``, in arrival order."""
        return sorted((c for c in self.calls if c.at > moment), key=lambda c: c.at)

    def add(self, name: str, fields: dict[str, Any], at: float, outcome: str = "OK") -> Call:
        """Note a call that arrived at ``at`` and is answered now."""
        call = Call(name, fields, outcome, at, self.clock.now())
        self.calls.append(call)
        return call


class Probe:
    """Records the calls of one ``CoordinatorService`` and injects ``plan``'s faults."""

    def __init__(self, service: CoordinatorService, plan: FaultPlan,
                 clock: Clock | None = None) -> None:
        self.service = service
        self.plan = plan
        self.clock = clock or RealClock()
        self.log = CallLog(clock=self.clock)
        self._upload_ids: list[str] = []

    def install(self) -> CallLog:
        """Wrap the service's handlers; returns the log they fill."""
        service: Any = self.service  # instance attributes shadow the methods
        service.join = self._join(self.service.join)
        service.get_task = self._get_task(self.service.get_task)
        service.download = self._download(self.service.download)
        service.upload = self._upload(self.service.upload)
        service.upload_status = self._upload_status(self.service.upload_status)
        service.commit = self._commit(self.service.commit)
        service.heartbeat = self._plain("Heartbeat", self.service.heartbeat, _heartbeat_facts)
        service.leave = self._plain("Leave", self.service.leave, _leave_facts)
        service.report_evaluation = self._plain("ReportEvaluation",
                                                self.service.report_evaluation, _report_facts)
        return self.log

    def _plain(self, name: str, original: Callable[[Any], Awaitable[Any]],
               facts_of: Callable[[Any], dict[str, Any]]) -> Callable[[Any], Awaitable[Any]]:
        """``original``, noted in the log (no fault is injected into these calls)."""
        async def handler(request: Any) -> Any:
            at = self.clock.now()
            try:
                reply = await original(request)
            except RemoteError as err:
                self.log.add(name, facts_of(request), at, err.code)
                raise
            self.log.add(name, facts_of(request), at)
            return reply

        return handler

    def _join(self, original: Callable[[JoinRequest], Awaitable[JoinReply]]
              ) -> Callable[[JoinRequest], Awaitable[JoinReply]]:
        async def join(request: JoinRequest) -> JoinReply:
            at = self.clock.now()
            facts: dict[str, Any] = {"capabilities": list(request.capabilities),
                                     "name": request.client_name}
            try:
                reply = await original(request)
            except RemoteError as err:
                self.log.add("Join", facts, at, err.code)
                raise
            self.log.add("Join", {**facts, "client_id": reply.client_id}, at)
            return reply

        return join

    def _take(self, fault: str, **facts: Any) -> bool:
        """Whether ``fault`` is planned and not yet injected (it is marked injected)."""
        if not getattr(self.plan, fault) or fault in self.log.injected:
            return False
        self.log.injected[fault] = facts
        return True

    def _get_task(self, original: Callable[[GetTaskRequest], Awaitable[TaskReply]]
                  ) -> Callable[[GetTaskRequest], Awaitable[TaskReply]]:
        async def get_task(request: GetTaskRequest) -> TaskReply:
            at = self.clock.now()
            facts: dict[str, Any] = {"held_version": request.held_version,
                                     "client_id": request.client_id}
            refusal = self._refusal_for_get_task(facts)
            if refusal is not None:
                self.log.add("GetTask", {**facts, "reply": None}, at, refusal.code)
                raise refusal
            reply = await original(request)
            facts["reply"] = type(reply).__name__
            if isinstance(reply, Task):
                facts.update(task_id=reply.task_id, model_version=reply.model_version,
                             delta=reply.has_delta, model_inline=bool(reply.model_data),
                             delta_inline=bool(reply.delta_data), kind=reply.kind.name,
                             model_bytes=reply.model.num_bytes)
            elif isinstance(reply, Finished):
                facts["reason"] = reply.reason
            self.log.add("GetTask", facts, at)
            return reply

        return get_task

    def _refusal_for_get_task(self, facts: dict[str, Any]) -> RemoteError | None:
        """The injected refusal this ``GetTask`` gets, if any (overload, then forgotten)."""
        if self._take("overload_s", retry_after_s=self.plan.overload_s):
            return ResourceExhausted("conformance: overloaded on purpose",
                                     retry_after_s=self.plan.overload_s)
        accepted = any(c.name == "Commit" and c.outcome in ("OK", "REPLY_LOST")
                       for c in self.log.calls)
        if accepted and self._take("forget_client", client_id=facts["client_id"]):
            self.log.injected["forget_client"]["at"] = self.clock.now()
            return Unauthenticated("conformance: this coordinator does not know the client "
                                   "(forgotten on purpose)")
        return None

    def _download(self, original: Callable[[DownloadRequest], AsyncIterator[DataChunk]]
                  ) -> Callable[[DownloadRequest], AsyncIterator[DataChunk]]:
        async def download(request: DownloadRequest) -> AsyncIterator[DataChunk]:
            at = self.clock.now()
            facts: dict[str, Any] = {"task_id": request.task_id, "offset": request.offset,
                                     "delta": request.delta, "bytes": 0}
            cut = not request.delta and self._take("cut_download", **facts)
            corrupt = (not request.delta and request.offset == 0
                       and self._take("corrupt_model", task_id=request.task_id))
            outcome = "OK"
            try:
                async for chunk in original(request):
                    if corrupt and chunk.data:
                        chunk = dataclasses.replace(
                            chunk, data=bytes([chunk.data[0] ^ 0xFF]) + chunk.data[1:])
                        corrupt = False
                    facts["bytes"] += len(chunk.data)
                    yield chunk
                    if cut:
                        raise Unavailable("conformance: download cut on purpose")
            except RemoteError as err:
                outcome = err.code
                raise
            finally:
                self.log.add("Download", facts, at, outcome)

        return download

    def _upload(self, original: Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]]
                ) -> Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]]:
        async def upload(chunks: AsyncIterator[UploadChunk]) -> UploadReply:
            at = self.clock.now()
            facts: dict[str, Any] = {}
            try:
                reply = await original(self._watched(chunks, facts))
            except RemoteError as err:
                self.log.add("Upload", facts, at, err.code)
                raise
            self.log.add("Upload", facts, at)
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
            at = self.clock.now()
            reply = await original(request)
            self.log.add("UploadStatus", {"upload_id": request.upload_id,
                                          "committed_offset": reply.committed_offset}, at)
            return reply

        return upload_status

    def _commit(self, original: Callable[[CommitRequest], Awaitable[CommitReply]]
                ) -> Callable[[CommitRequest], Awaitable[CommitReply]]:
        async def commit(request: CommitRequest) -> CommitReply:
            at = self.clock.now()
            facts = {"upload_id": request.upload_id, "task_id": request.task_id,
                     "base_version": request.base_version,
                     "inline": bool(request.update_data),
                     "encoding": request.update.encoding,
                     "num_bytes": request.update.num_bytes,
                     "values_checksum": bool(request.update.values_checksum),
                     "metrics": dict(request.metrics)}
            if self._take("slow_commit_s", task_id=request.task_id):
                await sleep_on(self.clock, self.plan.slow_commit_s)
            try:
                reply = await original(request)
            except RemoteError as err:
                self.log.add("Commit", facts, at, err.code)
                raise
            if self._take("lose_commit_reply", **facts):
                self.log.add("Commit", facts, at, "REPLY_LOST")
                raise Unavailable("conformance: commit reply lost on purpose")
            self.log.add("Commit", facts, at)
            return reply

        return commit


def _heartbeat_facts(request: HeartbeatRequest) -> dict[str, Any]:
    return {"client_id": request.client_id, "task_id": request.task_id}


def _leave_facts(request: LeaveRequest) -> dict[str, Any]:
    return {"client_id": request.client_id, "reason": request.reason}


def _report_facts(request: EvaluationReport) -> dict[str, Any]:
    return {"task_id": request.task_id, "model_version": request.model_version,
            "metrics": dict(request.metrics)}

