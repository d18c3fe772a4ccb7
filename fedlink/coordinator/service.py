"""The coordinator's call handlers, in plain async Python over fedlink's own messages.

The gRPC servicer (``servicer.py``) only converts messages and status codes; what a call means
is here, as the short list of handlers below, each composing the coordinator's pieces:

- ``validation`` bounds every client-chosen field at the edge (``RequestChecks``);
- ``transfers`` streams models down and updates up, spools and inline payloads;
- ``commits`` turns a complete upload into an accepted or refused update, idempotently;
- ``evaluations`` hands out evaluation tasks ahead of training ones and takes their reports;
- ``reporting`` evaluates each new version and logs its ``flush`` event;
- ``lifecycle`` owns the run's phases and its end; ``timekeeper`` applies the time rules.

What they share lives below them as small objects passed in: the durable-commit context
(``journal.Journal``), admission of a caller (``admission.CallerCheck``) and waking long-polls
(``changes.ChangeSignal``). Handlers raise ``fedlink.errors.RemoteError`` subclasses for every
refusal. With a ``state_dir`` every call that changes state journals it and awaits
``state.sync()`` before it answers; a new service restores what a previous process left there
(``fedlink.coordinator.state``).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fedlink.clock import Clock, RealClock
from fedlink.compress import CODECS
from fedlink.coordinator.admission import CallerCheck, JoinGate
from fedlink.coordinator.auth import caller_name
from fedlink.coordinator.changes import ChangeSignal
from fedlink.coordinator.client_metrics import reported_counters
from fedlink.coordinator.commits import Commits
from fedlink.coordinator.config import CoordinatorConfig, LimitsConfig
from fedlink.coordinator.downloads import RESTORED_KINDS, DownloadLedger
from fedlink.coordinator.engine import RoundEngine
from fedlink.coordinator.evaluations import EvaluationDesk, with_capabilities
from fedlink.coordinator.faults import NO_FAULTS, FaultPlan
from fedlink.coordinator.journal import Journal
from fedlink.coordinator.lifecycle import RunLifecycle, StopRule
from fedlink.coordinator.limits import Limiter
from fedlink.coordinator.progress import ProgressLog
from fedlink.coordinator.registry import ClientRegistry
from fedlink.coordinator.reporting import Evaluator, FlushReporter
from fedlink.coordinator.secure_calls import SecureCalls
from fedlink.coordinator.state import SavedState, open_store
from fedlink.coordinator.timekeeper import TimeKeeper
from fedlink.coordinator.transfers import Transfers
from fedlink.coordinator.uploads import UploadBounds, UploadStore
from fedlink.coordinator.validation import RequestChecks
from fedlink.errors import InvalidArgument, Unauthenticated, UpdateRefused
from fedlink.messages import (
    CommitReply,
    CommitRequest,
    DataChunk,
    DownloadRequest,
    EvaluationAck,
    EvaluationReport,
    Finished,
    GetTaskRequest,
    HeartbeatReply,
    HeartbeatRequest,
    JoinReply,
    JoinRequest,
    LeaveReply,
    LeaveRequest,
    RunConfig,
    Task,
    TaskReply,
    UploadChunk,
    UploadReply,
    UploadStatusRequest,
    Wait,
)
from fedlink.metrics import EventLog, kinds
from fedlink.params.base import ParamSpec
from fedlink.refusals import RefusalCode

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

__all__ = ["CoordinatorService", "Evaluator", "announced_limits", "upload_bounds",
           "upload_limits"]


class CoordinatorService:
    """Implements every call of ``fedlink.v1.Coordinator`` on top of a ``RoundEngine``."""

    def __init__(self, config: CoordinatorConfig, initial_model: np.ndarray, events: EventLog,
                 evaluator: Evaluator | None = None, clock: Clock | None = None,
                 stop_rules: Sequence[StopRule] = (), faults: FaultPlan = NO_FAULTS,
                 spec: ParamSpec | None = None) -> None:
        self.config = config
        self.events = events
        self._clock = clock = clock if clock is not None else RealClock()
        self.state = open_store(config.state_dir, faults)
        self.engine = RoundEngine(config, initial_model, events, clock=clock, state=self.state,
                                  spec=spec)
        self.registry = ClientRegistry(clock=clock.now)
        self.uploads = UploadStore(*upload_limits(config, self.engine.num_parameters),
                                   config.state_dir, self.state,
                                   upload_bounds(config, self.engine.num_parameters), clock.now)
        # Real time, not ``clock``: a test's frozen clock must not starve the token buckets.
        self.limiter = Limiter(config.limits)
        self.join_gate = JoinGate(config.limits)
        self.downloads = DownloadLedger()
        self.progress = ProgressLog(config.limits.stuck_after_s)
        self._signal = ChangeSignal()
        self._journal = Journal(self.state, events)
        self.lifecycle = RunLifecycle(self.engine, events, self._journal.durably,
                                      self._signal.notify, stop_rules,
                                      holds=lambda: self.evaluations.final_pending())
        self._callers = CallerCheck(self.registry, self.limiter)
        self.checks = RequestChecks(config.limits)
        self.evaluations = EvaluationDesk(config, self.engine, events, self.registry.name_of,
                                          self.registry.declared_examples, clock.now,
                                          clock.call_at)
        self.evaluations.on_final_change = self.lifecycle.recheck
        self.reporter = FlushReporter(self._journal, events, self.progress, self.lifecycle,
                                      evaluator, self._signal.notify)
        self.transfers = Transfers(config.limits, self.engine, self.uploads, self.downloads,
                                   self._callers, self.checks, events, self.reporter.sent,
                                   self.evaluations.lookup)
        self.commits = Commits(config.limits, self.engine, self.uploads, self._callers,
                               self.checks, self.transfers, self._journal, events,
                               self.progress, faults, self.reporter.made, self._signal.notify)
        self.timekeeper = TimeKeeper(config.limits, clock, self.engine, self.registry,
                                     self.uploads, self.progress, self._journal, events,
                                     self._forget_client, self.reporter.made,
                                     self._signal.notify)
        self.secure_calls = SecureCalls(config, self.engine, clock, self.reporter.made,
                                        self._journal, self.transfers, self.uploads,
                                        self.state, self._callers)
        self.secure = self.secure_calls.desk
        self.restored_version: int | None = None
        self._restore()

    # -- durable state ------------------------------------------------------------------------

    def _restore(self) -> None:
        """Continue the run a previous process left in ``state_dir``, or checkpoint a new one."""
        saved = self.state.load(self.engine.num_parameters)
        for event in saved.unwritten_events if saved else ():
            self.events.replay(event)  # durable, maybe never written: now they are
        with self._journal.durably():
            if saved is None:
                self.engine.save_initial()
            else:
                self._take_back(saved)
        self.state.sync_now()  # before the first call is served

    def _take_back(self, saved: SavedState) -> None:
        """Restore engine, registry and uploads from ``saved``; queue its unreported flushes."""
        self.engine.restore(saved)
        self.registry.restore(saved.clients)
        self.evaluations.restore(saved.clients)
        # the final version's evaluation tasks lived in the process that ended the run
        self.evaluations.final_evaluations = not self.engine.finished
        self.uploads.restore(saved.settled)
        self.downloads.restore(self.events.earlier(RESTORED_KINDS))
        if self.secure is not None:
            self.secure.restore(saved.next_secure_group, saved.secure_accounting,
                                saved.open_secure_groups)
        self.restored_version = self.engine.version
        models = {c.version: c.model for c in saved.checkpoints}
        for record in saved.unreported:
            self.reporter.unreported(record, models.get(record.version, self.engine.model))
        self.lifecycle.resume(saved.unreported[0].version - 1 if saved.unreported
                              else self.engine.version)
        log.info("restored from %s: version %d, %d clients, %d tasks, %d pending updates",
                 self.config.state_dir, self.engine.version, len(saved.clients),
                 len(saved.tasks), len(saved.pending))
        self.events.emit(kinds.CoordinatorRestored.build(
            model_version=self.engine.version, clients=len(saved.clients),
            tasks=len(saved.tasks), pending_updates=len(saved.pending),
            settled_uploads=len(saved.settled), unreported_flushes=len(saved.unreported)))
        outcome = self.engine.due_flush()
        if outcome is not None:
            self.reporter.made(outcome)

    # -- calls --------------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> JoinReply:
        """Register a client; answer with its id and the run configuration."""
        self.checks.join(request)
        if self.config.join_token and not hmac.compare_digest(
                request.token.encode(), self.config.join_token.encode()):
            raise Unauthenticated("join token is missing or wrong")
        # With per-client tokens the id is bound to the token's name, whatever the request says.
        name = caller_name() or request.client_name
        known = self.registry.rejoin(name, request.instance_key)
        if known is not None:  # a repeated Join (its reply lost): the same client
            self.evaluations.joined(known.client_id, request.capabilities)
            await self.state.sync()  # its first Join's record may still be on its way
            return JoinReply(known.client_id, self.run_config())
        self.join_gate.admit(caller_name(), self.registry.live_ids_of)
        self.limiter.check_join(len(self.registry))
        with self._journal.durably():
            record = self.registry.join(name, request.num_examples,
                                        with_capabilities(request.metadata,
                                                          request.capabilities),
                                        request.instance_key)
            self.state.save_client(record)
            self.evaluations.joined(record.client_id, request.capabilities)
            self.events.emit(kinds.ClientJoined.build(client_id=record.client_id, name=record.name,
                                                      num_examples=record.num_examples))
        await self.state.sync()
        return JoinReply(record.client_id, self.run_config())

    def run_config(self) -> RunConfig:
        """What every client is told at ``Join``."""
        training, limits = self.config.training, self.config.limits
        return RunConfig(
            run_name=self.config.run_name,
            num_parameters=self.engine.num_parameters,
            local_steps=training.local_steps,
            local_epochs=training.local_epochs,
            batch_size=training.batch_size,
            learning_rate=training.learning_rate,
            chunk_bytes=limits.chunk_bytes,
            heartbeat_interval_s=limits.heartbeat_interval_s,
            max_staleness=self.config.flush.max_staleness,
            accepted_encodings=CODECS.names(),
            trainer_options=dict(training.trainer_options),
            inline_bytes=limits.inline_limit,
            **announced_limits(limits, self.engine.num_parameters),
            secure=self.secure_calls.settings(),
        )

    async def get_task(self, request: GetTaskRequest) -> TaskReply:
        """A task, or ``Wait``/``Finished``; waits up to ``long_poll_s`` for one to free up.

        Long polling keeps an idle client from hammering the coordinator, and hands out the
        next version's tasks the moment it is published instead of at the next poll.
        """
        self._callers.admit(request.client_id)
        if not -1 <= request.held_version <= self.engine.version:
            raise InvalidArgument(f"held_version {request.held_version} is not a version this "
                                  f"coordinator published (current {self.engine.version}; "
                                  "-1 = none held)")
        reply = self._paced(await self._next_task(request.client_id, request.held_version))
        self.registry.pause(request.client_id)  # a long poll or a Wait: no link gap follows
        if isinstance(reply, Task | Finished):  # a new task, or the run's end, was journaled
            await self.state.sync()
        if isinstance(reply, Task):
            reply = self.transfers.with_inline_payload(request.client_id, reply,
                                                       request.held_version)
        self.lifecycle.check()  # a flush hook may have ended the run
        return reply

    async def _next_task(self, client_id: str, held_version: int) -> TaskReply:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.config.limits.long_poll_s  # the call's I/O timeout
        while True:
            changed = self._signal.changed
            reply = self._issue(client_id, held_version)
            remaining = give_up_at - loop.time()
            if isinstance(reply, Task | Finished) or remaining <= 0:
                return reply
            try:
                await asyncio.wait_for(changed.wait(), timeout=remaining)
            except TimeoutError:
                return self._issue(client_id, held_version)

    def _paced(self, reply: TaskReply) -> TaskReply:
        """``reply``, a ``Wait`` stretched to spread idle clients' check-ins over time
        (``limits.checkins_per_s``: pace steering)."""
        rate = self.config.limits.checkins_per_s
        if not isinstance(reply, Wait) or not rate:
            return reply
        spread = len(self.registry) / rate
        return replace(reply, retry_after_s=spread) if spread > reply.retry_after_s else reply

    def _issue(self, client_id: str, held_version: int) -> TaskReply:
        """An evaluation task when one is due (it takes no place), else the engine's answer."""
        with self._journal.durably():
            evaluation = self.evaluations.offer(client_id, held_version)
            return evaluation or self.engine.issue(client_id, held_version)

    def download(self, request: DownloadRequest) -> AsyncIterator[DataChunk]:
        """Stream a task's model or delta (``Transfers.download``)."""
        return self.transfers.download(request)

    async def upload(self, chunks: AsyncIterator[UploadChunk]) -> UploadReply:
        """Receive chunks of one upload (``Transfers.upload``)."""
        return await self.transfers.upload(chunks)

    async def upload_status(self, request: UploadStatusRequest) -> UploadReply:
        """How many bytes of an upload the coordinator holds (``Transfers.upload_status``)."""
        return await self.transfers.upload_status(request)

    async def commit(self, request: CommitRequest) -> CommitReply:
        """Turn a complete upload into an accepted update (``Commits.commit``)."""
        if self.secure is not None:
            raise UpdateRefused("this run aggregates securely: an update travels masked through "
                                "the Secure* calls, never in the clear", RefusalCode.TASK_CLOSED)
        return await self.commits.commit(request)

    async def report_evaluation(self, request: EvaluationReport) -> EvaluationAck:
        """Take an evaluation task's report, once (``EvaluationDesk.report``)."""
        self._callers.admit(request.client_id)
        self.checks.evaluation(request)
        with self._journal.durably():
            ack = self.evaluations.report(request)
            if not ack.duplicate:  # a score used the bytes it was sent; a decline did not
                self.transfers.downloads_settled(request.client_id, request.task_id,
                                                 not request.declines)
        await self.state.sync()
        return ack

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatReply:
        """Note that the client is alive; say whether its task is still open."""
        self._callers.admit(request.client_id)
        self.checks.heartbeat(request)
        task_open = False
        if request.task_id:
            try:
                _, task_open = self.evaluations.lookup(request.client_id, request.task_id)
            except UpdateRefused:  # forgotten because too stale: closed
                task_open = False
        return HeartbeatReply(self.engine.version, task_open)  # changes nothing: no sync

    async def leave(self, request: LeaveRequest) -> LeaveReply:
        """Forget the client; its open task stops holding a place, its uploads are dropped.

        The resilience counters it reports (what grew since its last ``Commit``) go into
        ``client_left``, so that the run's summary counts them.
        """
        self.checks.leave(request)
        with self._journal.durably():
            self.registry.touch(request.client_id)
            self._forget_client(request.client_id)
            self.events.emit(kinds.ClientLeft.build(client_id=request.client_id,
                                                    reason=request.reason,
                                                    **reported_counters(request.metrics)))
        self._signal.notify()
        await self.state.sync()
        return LeaveReply()

    def _forget_client(self, client_id: str) -> None:
        """Everything the coordinator holds for ``client_id`` goes (Leave, or expiry)."""
        self.registry.remove(client_id)
        self.state.forget_client(client_id)
        self.limiter.forget(client_id)
        self.engine.release_client(client_id)
        self.evaluations.forget_client(client_id)
        self.uploads.drop_client(client_id)
        self.downloads.forget_client(client_id)

    # -- background tasks and the end of the run ----------------------------------------------

    async def keep_time(self) -> None:
        """Apply the time rules as they fall due (``TimeKeeper.keep_time``)."""
        await self.timekeeper.keep_time()

    async def report_flushes(self) -> None:
        """Evaluate and log each new version (``FlushReporter.run``)."""
        await self.reporter.run()

    def all_gone_at(self, silent_after_s: float) -> float | None:
        """When every client that has not left counts as gone (silent for longer than
        ``silent_after_s``) if none calls again; ``None``: all are gone already. Told or not:
        a client whose ``Finished`` reply was lost asks again."""
        now = self._clock.now()
        seen = [self.registry.last_seen(client_id) for client_id in self.registry.ids()]
        here = [t for t in seen if t is not None and now - t <= silent_after_s]
        return max(here) + silent_after_s if here else None

    @property
    def changed(self) -> asyncio.Event:
        """Set at the next change a waiting caller may care about (a place freed, a new
        version, a client left, the run's end); take it before checking, then wait on it."""
        return self._signal.changed

    def close(self) -> None:
        """Release open upload spools (their bytes stay on disk for a restart) and the state."""
        self.uploads.close()
        self.state.close()


def upload_limits(config: CoordinatorConfig, num_parameters: int) -> tuple[int, int]:
    """``(max_update_bytes, max_chunk_bytes)`` in force for a model of ``num_parameters``."""
    limits = config.limits
    return limits.update_bytes_for(num_parameters), limits.max_chunk_bytes


def upload_bounds(config: CoordinatorConfig, num_parameters: int) -> UploadBounds:
    """What ``config.limits`` lets one client, and all of them, hold in uploads."""
    limits = config.limits
    return UploadBounds(per_client_uploads=limits.max_open_uploads_per_client,
                        per_client_bytes=limits.client_upload_bytes_for(num_parameters),
                        total_bytes=limits.spool_bytes_for(num_parameters),
                        idle_s=limits.upload_idle_s, retry_after_s=limits.retry_after_s)


def announced_limits(limits: LimitsConfig, num_parameters: int) -> dict[str, Any]:
    """The limits a client must respect, as ``RunConfig`` fields (``docs/protocol.md``)."""
    return {"max_chunk_bytes": limits.max_chunk_bytes, "long_poll_s": limits.long_poll_s,
            "max_update_bytes": limits.update_bytes_for(num_parameters),
            "max_string_bytes": limits.max_string_bytes,
            "max_metadata_entries": limits.max_metadata_entries,
            "max_uploads_per_client": limits.max_uploads_per_client,
            "requests_per_s": limits.requests_per_s, "request_burst": limits.request_burst,
            "max_metadata_bytes": limits.max_metadata_bytes,
            "max_examples_per_update": limits.max_examples_per_update,
            "max_open_uploads_per_client": limits.max_open_uploads_per_client}
