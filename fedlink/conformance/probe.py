"""A probe on a running ``CoordinatorService``: it records every call a client makes and
injects the faults of a ``FaultPlan`` (a cut download, a cut upload, a lost commit reply, a
corrupted upload, a corrupted model, a slow commit, an overload refusal with a retry hint, a
forgotten client, a lost ``SecureMasked`` reply), so that what the client does next can be
checked.

The probe replaces the service's handlers on the instance (the servicer looks them up at each
call), so the coordinator under test is the real one, over real gRPC: a fault looks to the
client exactly like the network or coordinator failure it imitates (``UNAVAILABLE`` mid-stream,
a reply that never came, bytes that do not match their checksum).

The probe judges one client: the calls of ``peers`` (clients the runner itself supplies, by
the name they join with, so that a secure group can fill) reach the service untouched, neither
logged nor given a fault.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
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
    SecureAdvertiseReply,
    SecureAdvertiseRequest,
    SecureMaskedReply,
    SecureMaskedRequest,
    SecureShareReply,
    SecureShareRequest,
    SecureUnmaskReply,
    SecureUnmaskRequest,
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
    client registry. ``lose_masked_reply``: the first ``SecureMasked`` is carried out, then
    answered ``UNAVAILABLE`` as if its reply was lost.
    """

    cut_download: bool = False
    cut_upload: bool = False
    lose_commit_reply: bool = False
    corrupt_upload: int = 0
    corrupt_model: bool = False
    slow_commit_s: float = 0.0
    overload_s: float = 0.0
    forget_client: bool = False
    lose_masked_reply: bool = False


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
    watchers: list[Callable[[Call], None]] = field(default_factory=list)
    """Told of each call as it is noted (a runner that stops a run on what it sees)."""

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
        for watch in self.watchers:
            watch(call)
        return call


class Probe:
    """Records the calls of one ``CoordinatorService`` and injects ``plan``'s faults; the
    calls of the clients that join named in ``peers`` pass through unseen."""

    def __init__(self, service: CoordinatorService, plan: FaultPlan,
                 clock: Clock | None = None, peers: Collection[str] = ()) -> None:
        self.service = service
        self.plan = plan
        self.clock = clock or RealClock()
        self.log = CallLog(clock=self.clock)
        self.peers = frozenset(peers)
        self._peer_ids: set[str] = set()
        self._upload_ids: list[str] = []

    def is_peer(self, client_id: str) -> bool:
        """Whether ``client_id`` is one a peer joined as."""
        return client_id in self._peer_ids

    def install(self) -> CallLog:
        """Wrap the service's handlers; returns the log they fill."""
        service: Any = self.service  # instance attributes shadow the methods
        unary: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "get_task": self._get_task(service.get_task),
            "upload_status": self._upload_status(service.upload_status),
            "commit": self._commit(service.commit),
            "heartbeat": self._plain("Heartbeat", service.heartbeat, _heartbeat_facts),
            "leave": self._plain("Leave", service.leave, _leave_facts),
            "report_evaluation": self._plain("ReportEvaluation", service.report_evaluation,
                                             _report_facts)}
        for attr, probed in unary.items():
            setattr(service, attr, self._unless_peer(getattr(service, attr), probed))
        service.join = self._join(service.join)
        service.download = self._download_unless_peer(service.download,
                                                      self._download(service.download))
        service.upload = self._upload_unless_peer(service.upload, self._upload(service.upload))
        self._install_secure(service.secure_calls)
        return self.log

    def _install_secure(self, calls: Any) -> None:
        """Wrap the four ``Secure*`` calls (the servicer looks them up at each call too)."""
        for attr, name, facts_of, reply_facts in SECURE_CALLS:
            probed = self._secure(name, getattr(calls, attr), facts_of, reply_facts)
            setattr(calls, attr, self._unless_peer(getattr(calls, attr), probed))

    def _unless_peer(self, original: Callable[[Any], Awaitable[Any]],
                     probed: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
        """``probed`` for the client under test, ``original`` for a peer."""
        async def handler(request: Any) -> Any:
            if request.client_id in self._peer_ids:
                return await original(request)
            return await probed(request)

        return handler

    def _download_unless_peer(
            self, original: Callable[[DownloadRequest], AsyncIterator[DataChunk]],
            probed: Callable[[DownloadRequest], AsyncIterator[DataChunk]]
    ) -> Callable[[DownloadRequest], AsyncIterator[DataChunk]]:
        def download(request: DownloadRequest) -> AsyncIterator[DataChunk]:
            return (original if request.client_id in self._peer_ids else probed)(request)

        return download

    def _upload_unless_peer(
            self, original: Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]],
            probed: Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]]
    ) -> Callable[[AsyncIterator[UploadChunk]], Awaitable[UploadReply]]:
        async def upload(chunks: AsyncIterator[UploadChunk]) -> UploadReply:
            first = await anext(chunks, None)  # the stream says whose it is in its chunks
            stream = _prepended(first, chunks)
            if first is not None and first.client_id in self._peer_ids:
                return await original(stream)
            return await probed(stream)

        return upload

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
            if request.client_name in self.peers:
                reply = await original(request)
                self._peer_ids.add(reply.client_id)
                return reply
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

    def _secure(self, name: str, original: Callable[[Any], Awaitable[Any]],
                facts_of: Callable[[Any], dict[str, Any]],
                reply_facts: Callable[[Any], dict[str, Any]]) -> Callable[[Any], Awaitable[Any]]:
        """A ``Secure*`` call, noted with its request's and its answer's facts (a refusal or
        an internal error with its detail); the first ``SecureMasked`` reply lost when
        planned."""
        async def handler(request: Any) -> Any:
            at = self.clock.now()
            facts = facts_of(request)
            try:
                reply = await original(request)
            except RemoteError as err:
                self.log.add(name, {**facts, "detail": str(err)}, at, err.code)
                raise
            except Exception as err:  # the servicer answers it INTERNAL: the client saw that
                self.log.add(name, {**facts, "detail": repr(err)}, at, "INTERNAL")
                raise
            facts.update(reply_facts(reply))
            if name == "SecureMasked" and self._take("lose_masked_reply", **facts):
                self.log.add(name, facts, at, "REPLY_LOST")
                raise Unavailable("conformance: SecureMasked reply lost on purpose")
            self.log.add(name, facts, at)
            return reply

        return handler


async def _prepended(first: UploadChunk | None,
                     rest: AsyncIterator[UploadChunk]) -> AsyncIterator[UploadChunk]:
    """``first`` (unless None), then ``rest``."""
    if first is not None:
        yield first
    async for chunk in rest:
        yield chunk


def _advertise_facts(request: SecureAdvertiseRequest) -> dict[str, Any]:
    return {"task_id": request.task_id}


def _advertise_reply_facts(reply: SecureAdvertiseReply) -> dict[str, Any]:
    return {"group": reply.round_id, "index": reply.index, "members": len(reply.members),
            "weight": reply.weight}


def _share_facts(request: SecureShareRequest) -> dict[str, Any]:
    return {"task_id": request.task_id, "shares": len(request.shares)}


def _share_reply_facts(reply: SecureShareReply) -> dict[str, Any]:
    return {"received": len(reply.shares)}


def _masked_facts(request: SecureMaskedRequest) -> dict[str, Any]:
    # a digest, not the values: enough to tell a retry with the same content from another
    content = hashlib.sha256(request.values).hexdigest()[:16] if request.values \
        else f"upload {request.upload_id}"
    return {"task_id": request.task_id, "num_values": request.num_values,
            "upload_id": request.upload_id, "content": content}


def _masked_reply_facts(reply: SecureMaskedReply) -> dict[str, Any]:
    return {"survivors": list(reply.survivors), "dropped": list(reply.dropped)}


def _unmask_facts(request: SecureUnmaskRequest) -> dict[str, Any]:
    return {"task_id": request.task_id,
            "seed_owners": sorted(s.owner for s in request.seed_shares),
            "key_owners": sorted(s.owner for s in request.key_shares)}


def _unmask_reply_facts(reply: SecureUnmaskReply) -> dict[str, Any]:
    return {"flushed_version": reply.flushed_version}


SECURE_CALLS: tuple[tuple[str, str, Callable[[Any], dict[str, Any]],
                          Callable[[Any], dict[str, Any]]], ...] = (
    ("advertise", "SecureAdvertise", _advertise_facts, _advertise_reply_facts),
    ("share", "SecureShare", _share_facts, _share_reply_facts),
    ("masked", "SecureMasked", _masked_facts, _masked_reply_facts),
    ("unmask", "SecureUnmask", _unmask_facts, _unmask_reply_facts))
"""The secure calls: ``SecureCalls`` attribute, call name, request facts, answer facts."""


def _heartbeat_facts(request: HeartbeatRequest) -> dict[str, Any]:
    return {"client_id": request.client_id, "task_id": request.task_id}


def _leave_facts(request: LeaveRequest) -> dict[str, Any]:
    return {"client_id": request.client_id, "reason": request.reason}


def _report_facts(request: EvaluationReport) -> dict[str, Any]:
    return {"task_id": request.task_id, "model_version": request.model_version,
            "metrics": dict(request.metrics)}

